//! JSON payload → positional values (CONTRACT.md rule 12, rule 1 for `arrival`).
//!
//! Checks run in a fixed order and the first failure names the dead-letter reason:
//! `invalid_utf8`, `invalid_json`, `not_an_object`, `bad_arrival`, then every declared field in
//! declaration order (`missing_field:F` / `wrong_type:F`), then the event time (`bad_time:F`,
//! `time_out_of_range` for a time outside int64). The window check against processing time
//! (`max_age`, `max_skew`) needs the line's final arrival and is [`check_time_window`].
//! The event time is read even from a line that fails another check: the merge order uses it as
//! the line's arrival when the line has none of its own.

mod scan;

use std::borrow::Cow;

use super::view::ValueRef;
use super::{FieldType, Schema, TimeSpec, TimeUnit, Value};
use scan::{Scalar, Scanned};

/// Doubles that convert to an i64 exactly: [−2^63, 2^63) (both ends are exact doubles).
const I64_AS_F64_RANGE: std::ops::Range<f64> = -9_223_372_036_854_775_808.0..9_223_372_036_854_775_808.0;

/// Why a line could not be used; written as `_reason` in `dead_letter`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    InvalidUtf8,
    InvalidJson,
    NotAnObject,
    BadArrival,
    /// The declared field at this position is absent or null.
    MissingField(usize),
    WrongType(usize),
    BadTime(usize),
    TimeOutOfRange,
    Oversized,
    /// Decoded, but its row is larger than the shard rings carry
    /// ([`MAX_ROW_BYTES`](crate::shard::MAX_ROW_BYTES) with the default rings).
    TooLarge,
    /// The payload's value of a field captured from the MQTT topic differs from the topic's.
    TopicPayloadMismatch(usize),
}

impl Reason {
    /// The `_reason` text, e.g. `missing_field:ts`.
    pub fn label(self, schema: &Schema) -> String {
        let field = |pos: usize| schema.fields[pos].name.as_str();
        match self {
            Reason::InvalidUtf8 => "invalid_utf8".into(),
            Reason::InvalidJson => "invalid_json".into(),
            Reason::NotAnObject => "not_an_object".into(),
            Reason::BadArrival => "bad_arrival".into(),
            Reason::MissingField(p) => format!("missing_field:{}", field(p)),
            Reason::WrongType(p) => format!("wrong_type:{}", field(p)),
            Reason::BadTime(p) => format!("bad_time:{}", field(p)),
            Reason::TimeOutOfRange => "time_out_of_range".into(),
            Reason::Oversized => "oversized".into(),
            Reason::TooLarge => TOO_LARGE.into(),
            Reason::TopicPayloadMismatch(p) => format!("topic_payload_mismatch:{}", field(p)),
        }
    }
}

/// The `_reason` of a row or result larger than the shard rings carry.
pub const TOO_LARGE: &str = "too_large";

/// `dead_letter`'s `raw` for an unusable line or payload: its text, invalid UTF-8 replaced; of an
/// oversized or too large one only the first KiB (CONTRACT.md "Replay").
pub fn dead_letter_raw(bytes: &[u8], reason: Reason) -> std::borrow::Cow<'_, str> {
    const OVERSIZED_RAW_BYTES: usize = 1024;
    let cut = matches!(reason, Reason::Oversized | Reason::TooLarge);
    let bytes = if cut { &bytes[..bytes.len().min(OVERSIZED_RAW_BYTES)] } else { bytes };
    String::from_utf8_lossy(bytes)
}

/// What one line holds: its arrival when it can be read, and its values or why it is unusable.
#[derive(Debug)]
pub struct Decoded {
    pub arrival: Option<i64>,
    pub outcome: Result<Fields, Reason>,
}

#[derive(Debug)]
pub struct Fields {
    /// Every declared field, in declaration order, of its declared type.
    pub values: Vec<FieldValue>,
    /// The event time; `None` for an ingest-time stream (its arrival is its event time).
    pub ts: Option<i64>,
}

impl Fields {
    /// The values as heap values (`line`: the text they were decoded from).
    pub fn to_values(&self, line: &str) -> Vec<Value> {
        self.values.iter().map(|v| v.get(line).to_value()).collect()
    }
}

/// A declared field's value, detached from the line it was decoded from so that it can wait
/// beside the line (replay's merge) without borrowing it: a string without escapes is only where
/// it lies in the line, not a copy.
#[derive(Clone, Debug, PartialEq)]
pub enum FieldValue {
    Bool(bool),
    Int(i64),
    Float(f64),
    /// The string at these bytes of the line.
    InLine(std::ops::Range<usize>),
    /// A string that held escapes, or came from the topic.
    Owned(Box<str>),
}

impl FieldValue {
    /// The value, reading a string in `line`, which must be the text it was decoded from.
    pub fn get<'a>(&'a self, line: &'a str) -> ValueRef<'a> {
        match self {
            FieldValue::Bool(b) => ValueRef::Bool(*b),
            FieldValue::Int(i) => ValueRef::Int(*i),
            FieldValue::Float(f) => ValueRef::Float(*f),
            // Only ever out of the line when handed another line: read as null then.
            FieldValue::InLine(range) => line.get(range.clone()).map_or(ValueRef::Null, ValueRef::Str),
            FieldValue::Owned(s) => ValueRef::Str(s),
        }
    }

    /// A string of `text` as a field value: by its place when it is a slice of `text`.
    fn string(s: Cow<'_, str>, text: &str) -> FieldValue {
        match s {
            Cow::Borrowed(part) => {
                place_in(text, part).map_or_else(|| FieldValue::Owned(part.into()), FieldValue::InLine)
            }
            Cow::Owned(owned) => FieldValue::Owned(owned.into()),
        }
    }
}

/// Where `part` lies in `text`, when it is a slice of it.
fn place_in(text: &str, part: &str) -> Option<std::ops::Range<usize>> {
    let start = (part.as_ptr() as usize).checked_sub(text.as_ptr() as usize)?;
    let range = start..start + part.len();
    text.get(range.clone()).is_some_and(|s| std::ptr::eq(s, part)).then_some(range)
}

/// Decodes one line (a trailing CR already removed) of a stream with `schema`.
pub fn decode_line(schema: &Schema, line: &[u8], max_payload: u64) -> Decoded {
    decode_payload(schema, line, max_payload, &[])
}

/// The allocation of a decoded line's values, handed back to decode the next line in
/// ([`decode_payload_in`]): the MQTT intake decodes message after message without allocating.
/// Lines whose values must wait (replay's merge) keep theirs and decode without one.
#[derive(Debug, Default)]
pub struct FieldRoom(Vec<FieldValue>);

impl FieldRoom {
    /// Takes back the allocation of values that are no longer needed.
    pub fn keep(&mut self, fields: Fields) {
        self.0 = fields.values;
    }

    /// The allocation, emptied, as room for the scanned values of text of any lifetime.
    fn take<'a>(&mut self) -> Vec<Option<Scalar<'a>>> {
        // Every value dropped, the rest collected in place (the layouts agree, asserted at
        // `decode_fields`): the vector changes its element type in its own allocation.
        std::mem::take(&mut self.0).into_iter().filter_map(|_| None).collect()
    }
}

/// Decodes an MQTT payload whose topic captured `captures` (field position, typed value;
/// `source::route`): a captured field the payload leaves out is filled from the topic; one the
/// payload carries must hold the same value (else `topic_payload_mismatch:FIELD`, or
/// `wrong_type:FIELD` when it is not even of the field's type). Neither side quietly wins: the
/// topic is what the broker's access rules tie to a device, and the key decides whose state a
/// row joins.
pub fn decode_payload(schema: &Schema, line: &[u8], max_payload: u64, captures: &[(usize, ValueRef<'_>)]) -> Decoded {
    decode_payload_in(schema, line, max_payload, captures, &mut FieldRoom::default())
}

/// [`decode_payload`], the values kept in `room`'s allocation (hand it back with
/// [`FieldRoom::keep`] once they are used).
pub fn decode_payload_in(
    schema: &Schema,
    line: &[u8],
    max_payload: u64,
    captures: &[(usize, ValueRef<'_>)],
    room: &mut FieldRoom,
) -> Decoded {
    let unusable = |reason| Decoded { arrival: None, outcome: Err(reason) };
    if line.len() as u64 > max_payload {
        return unusable(Reason::Oversized);
    }
    let Ok(text) = std::str::from_utf8(line) else {
        return unusable(Reason::InvalidUtf8);
    };
    match scan::scan_object(schema, text, room.take()) {
        Err(scan::NotAnObject::InvalidJson) => unusable(Reason::InvalidJson),
        Err(scan::NotAnObject::OtherValue) => unusable(Reason::NotAnObject),
        Ok(mut object) => match fill_captures(schema, &mut object, captures, text) {
            Ok(()) => decode_object(schema, object, text),
            Err(reason) => unusable(reason),
        },
    }
}

/// Puts the topic's captures into the scanned fields, checking those the payload (`text`) also has.
/// A payload that carries the captured value keeps its own (the same value, read in place); one
/// that leaves it out gets the topic's, borrowed until the row is built. No allocation either way.
fn fill_captures<'a>(
    schema: &Schema,
    object: &mut Scanned<'a>,
    captures: &[(usize, ValueRef<'a>)],
    text: &str,
) -> Result<(), Reason> {
    for &(pos, captured) in captures {
        let from_topic = match captured {
            ValueRef::Int(i) => Scalar::Int(i),
            ValueRef::Str(s) => Scalar::Str(Cow::Borrowed(s)),
            // Captures are strings or ints (config validation).
            _ => return Err(Reason::WrongType(pos)),
        };
        object.fields[pos] = Some(match object.fields[pos].take() {
            None | Some(Scalar::Null) => from_topic,
            Some(scalar) => {
                let value = scalar.clone().into_typed(schema.fields[pos].ty, text).ok_or(Reason::WrongType(pos))?;
                if value.get(text) != captured {
                    return Err(Reason::TopicPayloadMismatch(pos));
                }
                scalar
            }
        });
    }
    Ok(())
}

/// The arrival [`decode_line`] gives the line, without building its values: replay's first pass
/// over a file (`replay::input`), which only needs to know whether arrivals ever decrease.
/// `timing`: the stream schema's [`time_only`](Schema::time_only) (the other declared fields
/// change nothing here: every value is parsed and checked alike, declared or not).
pub fn arrival_of_line(timing: &Schema, line: &[u8], max_payload: u64) -> Option<i64> {
    if line.len() as u64 > max_payload {
        return None;
    }
    let object = scan::scan_object(timing, std::str::from_utf8(line).ok()?, Vec::new()).ok()?;
    arrival_of_object(timing, &object)
}

/// A line's arrival for replay's first pass to learn whether a file is in order: the arrival
/// [`arrival_of_line`] gives whenever that gives one, read without checking what the arrival does
/// not depend on (the UTF-8 outside keys and the time's and `arrival`'s values, the other values,
/// what follows the object: [`scan::declared_only`]). A line the decoder refuses may still get
/// an arrival here. That can only make a file look out of order when it is not: it is then sorted,
/// which gives its lines the same order, not a wrong one. So the first arrival of a file, which the
/// lines before it take, must come from [`arrival_of_line`].
pub fn ordering_arrival(timing: &Schema, line: &[u8], max_payload: u64) -> Option<i64> {
    if line.len() as u64 > max_payload {
        return None;
    }
    match scan::declared_only(timing, line) {
        Some(object) => arrival_of_object(timing, &object),
        None => arrival_of_line(timing, line, max_payload),
    }
}

/// The arrival of a scanned object: its `arrival`, else (also when `arrival` is unusable) its
/// readable event time.
fn arrival_of_object(timing: &Schema, object: &Scanned) -> Option<i64> {
    let readable_ts = event_time(timing, object).ok().flatten();
    arrival(object, readable_ts).unwrap_or(readable_ts)
}

/// The `arrival` field: `Err` when it is there but no integral number; else it, or the event
/// time `readable_ts` without one.
fn arrival(object: &Scanned, readable_ts: Option<i64>) -> Result<Option<i64>, ()> {
    match &object.arrival {
        None | Some(Scalar::Null) => Ok(readable_ts),
        Some(a) => a.as_integral_i64().map(Some).ok_or(()),
    }
}

fn decode_object(schema: &Schema, object: Scanned, text: &str) -> Decoded {
    let time = event_time(schema, &object);
    let readable_ts = time.ok().flatten();
    let Ok(arrival) = arrival(&object, readable_ts) else {
        return Decoded { arrival: readable_ts, outcome: Err(Reason::BadArrival) };
    };
    let outcome = decode_fields(schema, object, text).and_then(|values| Ok(Fields { values, ts: time? }));
    Decoded { arrival, outcome }
}

/// `decode_fields` (and [`FieldRoom`] the other way) collects in place only while a scanned value
/// and a typed one share a layout.
const _: () = assert!(
    size_of::<Option<Scalar<'static>>>() == size_of::<FieldValue>()
        && align_of::<Option<Scalar<'static>>>() == align_of::<FieldValue>()
);

fn decode_fields(schema: &Schema, object: Scanned, text: &str) -> Result<Vec<FieldValue>, Reason> {
    // One chain of adapters over the scanned values, so that `collect` writes the typed values
    // into the scanned values' own buffer (std's in-place collection): one allocation a line.
    object
        .fields
        .into_iter()
        .zip(&schema.fields)
        .enumerate()
        .map(|(pos, (scalar, field))| match scalar {
            None | Some(Scalar::Null) => Err(Reason::MissingField(pos)),
            Some(v) => v.into_typed(field.ty, text).ok_or(Reason::WrongType(pos)),
        })
        .collect()
}

/// The event time of the line: `Ok(None)` for ingest time, `Err` when the field is unusable.
fn event_time(schema: &Schema, object: &Scanned) -> Result<Option<i64>, Reason> {
    let TimeSpec::Field { pos, unit } = schema.time else {
        return Ok(None);
    };
    let scalar = match &object.fields[pos] {
        None | Some(Scalar::Null) => return Err(Reason::MissingField(pos)),
        Some(v) => v,
    };
    match (unit, scalar) {
        (TimeUnit::Ms, _) => scalar.as_int().map(Some).ok_or(Reason::WrongType(pos)),
        (TimeUnit::S, _) if schema.fields[pos].ty == FieldType::Int => {
            scalar.as_int().ok_or(Reason::WrongType(pos))?.checked_mul(1000).map(Some).ok_or(Reason::TimeOutOfRange)
        }
        (TimeUnit::S, _) => {
            seconds_to_ms(scalar.as_float().ok_or(Reason::WrongType(pos))?).map(Some).ok_or(Reason::TimeOutOfRange)
        }
        (TimeUnit::Rfc3339, Scalar::Str(s)) => crate::time::rfc3339::parse_ms(s).map(Some).ok_or(Reason::BadTime(pos)),
        // Config validation ties each unit to its field types.
        (TimeUnit::Rfc3339, _) => Err(Reason::WrongType(pos)),
    }
}

/// Seconds as a double → ms: the double product rounded to the nearest ms, halves away from zero.
fn seconds_to_ms(s: f64) -> Option<i64> {
    let ms = (s * 1000.0).round();
    I64_AS_F64_RANGE.contains(&ms).then_some(ms as i64)
}

/// Whether `ts` lies in [arrival − max_age, arrival + max_skew] (else `time_out_of_range`).
pub fn check_time_window(ts: i64, arrival: i64, max_age: i64, max_skew: i64) -> Result<(), Reason> {
    let (ts, arrival) = (i128::from(ts), i128::from(arrival));
    if arrival - i128::from(max_age) <= ts && ts <= arrival + i128::from(max_skew) {
        Ok(())
    } else {
        Err(Reason::TimeOutOfRange)
    }
}

#[cfg(test)]
mod tests;
