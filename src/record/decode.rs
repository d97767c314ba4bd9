//! JSON payload → positional values (CONTRACT.md rule 12, rule 1 for `arrival`).
//!
//! Checks run in a fixed order and the first failure names the dead-letter reason:
//! `invalid_utf8`, `invalid_json`, `not_an_object`, `bad_arrival`, then every declared field in
//! declaration order (`missing_field:F` / `wrong_type:F`), then the event time (`bad_time:F`,
//! `time_out_of_range` for a time outside int64). The window check against processing time
//! (`max_age`, `max_skew`) needs the line's final arrival and is [`check_time_window`].
//! The event time is read even from a line that fails another check: the merge order uses it as
//! the line's arrival when the line has none of its own.

use base64::Engine as _;
use serde_json::{Map, Number, Value as Json};

use super::{FieldType, Schema, TimeSpec, TimeUnit, Value};

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
        }
    }
}

/// What one line holds: its arrival when it can be read, and its values or why it is unusable.
#[derive(Debug)]
pub struct Decoded {
    pub arrival: Option<i64>,
    pub outcome: Result<Fields, Reason>,
}

#[derive(Debug)]
pub struct Fields {
    pub values: Vec<Value>,
    /// The event time; `None` for an ingest-time stream (its arrival is its event time).
    pub ts: Option<i64>,
}

/// Decodes one line (a trailing CR already removed) of a stream with `schema`.
pub fn decode_line(schema: &Schema, line: &[u8], max_payload: u64) -> Decoded {
    let unusable = |reason| Decoded { arrival: None, outcome: Err(reason) };
    if line.len() as u64 > max_payload {
        return unusable(Reason::Oversized);
    }
    let Ok(text) = std::str::from_utf8(line) else {
        return unusable(Reason::InvalidUtf8);
    };
    // serde_json refuses lone surrogate escapes and numbers beyond a double: both invalid_json.
    let Ok(json) = serde_json::from_str::<Json>(text) else {
        return unusable(Reason::InvalidJson);
    };
    let Json::Object(object) = json else {
        return unusable(Reason::NotAnObject);
    };
    decode_object(schema, &object)
}

fn decode_object(schema: &Schema, object: &Map<String, Json>) -> Decoded {
    let time = event_time(schema, object);
    let readable_ts = time.ok().flatten();
    let arrival = match object.get("arrival") {
        None | Some(Json::Null) => None,
        Some(a) => match json_integer(a) {
            Some(a) => Some(a),
            None => return Decoded { arrival: readable_ts, outcome: Err(Reason::BadArrival) },
        },
    };
    let arrival = arrival.or(readable_ts);
    let outcome = decode_fields(schema, object).and_then(|values| Ok(Fields { values, ts: time? }));
    Decoded { arrival, outcome }
}

fn decode_fields(schema: &Schema, object: &Map<String, Json>) -> Result<Vec<Value>, Reason> {
    let mut values = Vec::with_capacity(schema.fields.len());
    for (pos, field) in schema.fields.iter().enumerate() {
        let json = match object.get(&field.name) {
            None | Some(Json::Null) => return Err(Reason::MissingField(pos)),
            Some(v) => v,
        };
        values.push(typed_value(field.ty, json).ok_or(Reason::WrongType(pos))?);
    }
    Ok(values)
}

/// The value of `json` as a field of type `ty`, or `None` when it is of another type.
pub fn typed_value(ty: FieldType, json: &Json) -> Option<Value> {
    Some(match (ty, json) {
        (FieldType::String, Json::String(s)) => Value::Str(s.as_str().into()),
        (FieldType::Bytes, Json::String(s)) if is_canonical_base64(s) => Value::Str(s.as_str().into()),
        (FieldType::Int, Json::Number(n)) => Value::Int(json_int(n)?),
        (FieldType::Float, Json::Number(n)) => Value::Float(n.as_f64()?),
        (FieldType::Bool, Json::Bool(b)) => Value::Bool(*b),
        _ => return None,
    })
}

/// A JSON integer within int64. serde_json reads the integer `-0` as the double −0.0 (to keep its
/// sign), so a zero double counts as 0; the cost is that `0.0` and `-0.0` are taken as ints too.
fn json_int(n: &Number) -> Option<i64> {
    n.as_i64().or_else(|| (n.as_f64() == Some(0.0)).then_some(0))
}

fn is_canonical_base64(s: &str) -> bool {
    let engine = base64::engine::general_purpose::STANDARD;
    engine.decode(s).is_ok_and(|bytes| engine.encode(bytes) == s)
}

/// Doubles that convert to an i64 exactly: [−2^63, 2^63) (both ends are exact doubles).
const I64_AS_F64_RANGE: std::ops::Range<f64> = -9_223_372_036_854_775_808.0..9_223_372_036_854_775_808.0;

/// `arrival`: an integral number within int64 (`5.0` counts, `5.5` and `true` do not).
fn json_integer(json: &Json) -> Option<i64> {
    let Json::Number(n) = json else { return None };
    number_as_integral_i64(n)
}

fn number_as_integral_i64(n: &Number) -> Option<i64> {
    if let Some(i) = n.as_i64() {
        return Some(i);
    }
    let f = n.as_f64()?;
    // 2^63 is exactly representable; every double below it and ≥ −2^63 fits an i64.
    (f.fract() == 0.0 && I64_AS_F64_RANGE.contains(&f)).then_some(f as i64)
}

/// The event time of the line: `Ok(None)` for ingest time, `Err` when the field is unusable.
fn event_time(schema: &Schema, object: &Map<String, Json>) -> Result<Option<i64>, Reason> {
    let TimeSpec::Field { pos, unit } = schema.time else {
        return Ok(None);
    };
    let json = match object.get(&schema.fields[pos].name) {
        None | Some(Json::Null) => return Err(Reason::MissingField(pos)),
        Some(v) => v,
    };
    let value = typed_value(schema.fields[pos].ty, json).ok_or(Reason::WrongType(pos))?;
    match (unit, value) {
        (TimeUnit::Ms, Value::Int(ms)) => Ok(Some(ms)),
        (TimeUnit::S, Value::Int(s)) => s.checked_mul(1000).map(Some).ok_or(Reason::TimeOutOfRange),
        (TimeUnit::S, Value::Float(s)) => seconds_to_ms(s).map(Some).ok_or(Reason::TimeOutOfRange),
        (TimeUnit::Rfc3339, Value::Str(s)) => crate::time::rfc3339::parse_ms(&s).map(Some).ok_or(Reason::BadTime(pos)),
        // Config validation ties each unit to its field types.
        _ => Err(Reason::WrongType(pos)),
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
mod tests {
    use super::*;
    use crate::record::schema::Field;

    fn schema(unit: TimeUnit, time_ty: FieldType) -> Schema {
        let field = |name: &str, ty| Field { name: name.into(), ty, nullable: false };
        Schema::new(
            vec![field("device", FieldType::String), field("ts", time_ty), field("n", FieldType::Int)],
            Some(0),
            TimeSpec::Field { pos: 1, unit },
        )
    }

    fn reason(line: &str) -> Option<String> {
        let s = schema(TimeUnit::Ms, FieldType::Int);
        decode_line(&s, line.as_bytes(), 1 << 20).outcome.err().map(|r| r.label(&s))
    }

    #[test]
    fn reasons_in_contract_order() {
        assert_eq!(reason("{"), Some("invalid_json".into()));
        assert_eq!(reason("[1]"), Some("not_an_object".into()));
        assert_eq!(reason(r#"{"arrival":1.5,"device":"a","ts":1,"n":1}"#), Some("bad_arrival".into()));
        assert_eq!(reason(r#"{"arrival":true}"#), Some("bad_arrival".into()));
        assert_eq!(reason(r#"{"ts":1,"n":1}"#), Some("missing_field:device".into()));
        assert_eq!(reason(r#"{"device":null,"ts":1,"n":1}"#), Some("missing_field:device".into()));
        assert_eq!(reason(r#"{"device":"a","ts":1,"n":1.0}"#), Some("wrong_type:n".into()));
        assert_eq!(reason(r#"{"device":"a","ts":1,"n":1e3}"#), Some("wrong_type:n".into()));
        assert_eq!(reason(r#"{"device":"a","ts":1,"n":9223372036854775808}"#), Some("wrong_type:n".into()));
        assert_eq!(reason(r#"{"device":"a","ts":1,"n":1e999}"#), Some("invalid_json".into()));
        assert_eq!(reason(r#"{"device":"\ud800","ts":1,"n":1}"#), Some("invalid_json".into()));
        assert_eq!(reason(r#"{"device":"a","ts":1,"n":-9223372036854775808,"x":[]}"#), None);
        assert_eq!(reason(r#"{"device":"a","ts":-0,"n":-0}"#), None);
    }

    #[test]
    fn arrival_falls_back_to_event_time_even_on_a_dead_letter() {
        let s = schema(TimeUnit::Ms, FieldType::Int);
        let d = decode_line(&s, br#"{"device":1,"ts":500}"#, 1 << 20);
        assert_eq!((d.arrival, d.outcome.is_err()), (Some(500), true));
        let d = decode_line(&s, br#"{"device":"a","ts":500,"n":1,"arrival":7.0}"#, 1 << 20);
        assert_eq!(d.arrival, Some(7));
        let d = decode_line(&s, br#"{"arrival":"x","ts":9}"#, 1 << 20);
        assert_eq!((d.arrival, d.outcome.unwrap_err()), (Some(9), Reason::BadArrival));
    }

    #[test]
    fn seconds_round_half_away_from_zero() {
        let s = schema(TimeUnit::S, FieldType::Float);
        let ts = |line: &str| decode_line(&s, line.as_bytes(), 1 << 20).outcome.unwrap().ts;
        assert_eq!(ts(r#"{"device":"a","ts":1.0005,"n":1}"#), Some((1.0005f64 * 1000.0).round() as i64));
        assert_eq!(ts(r#"{"device":"a","ts":0.0025,"n":1}"#), Some(3));
        assert_eq!(ts(r#"{"device":"a","ts":-0.0025,"n":1}"#), Some(-3));
        assert_eq!(ts(r#"{"device":"a","ts":2,"n":1}"#), Some(2000));
        let big = decode_line(&s, br#"{"device":"a","ts":1e300,"n":1}"#, 1 << 20);
        assert_eq!(big.outcome.unwrap_err(), Reason::TimeOutOfRange);
    }

    #[test]
    fn bytes_must_be_canonical_base64() {
        assert_eq!(typed_value(FieldType::Bytes, &Json::from("aGk=")), Some(Value::Str("aGk=".into())));
        assert_eq!(typed_value(FieldType::Bytes, &Json::from("aGk")), None);
        assert_eq!(typed_value(FieldType::Bytes, &Json::from("aGl=")), None);
        assert_eq!(typed_value(FieldType::Bytes, &Json::from("")), Some(Value::Str("".into())));
    }

    #[test]
    fn oversized_and_invalid_utf8() {
        let s = schema(TimeUnit::Ms, FieldType::Int);
        assert_eq!(decode_line(&s, b"{}", 1).outcome.unwrap_err(), Reason::Oversized);
        assert_eq!(decode_line(&s, b"{\"a\":\"\xff\"}", 100).outcome.unwrap_err(), Reason::InvalidUtf8);
    }
}
