//! One pass over a JSON line that keeps only what the schema declares.
//!
//! Parsing into `serde_json::Value` first built a map of owned keys and values for every line,
//! then copied the declared ones again (44 % of replay's instructions, BENCHMARKS.md). Here the
//! object is walked once with serde's visitor API: keys are compared in place with the declared
//! field names (no allocation), declared values are kept as [`Scalar`]s, and every other value is
//! still parsed — not skipped — so that what makes `serde_json::Value` refuse a line (a number
//! beyond a double, a lone surrogate escape, bad syntax anywhere, trailing text) still makes the
//! line `invalid_json`. Duplicate keys: the last one wins, as with `serde_json::Value`.

mod flat;

pub use flat::declared_only;

use std::borrow::Cow;
use std::fmt;

use base64::Engine as _;
use serde::Deserializer as _;
use serde::de::{DeserializeSeed, MapAccess, SeqAccess, Visitor};

use super::FieldValue;
use super::I64_AS_F64_RANGE;
use crate::record::{FieldType, Schema};

/// A declared field's JSON value, before it is checked against the field's type.
#[derive(Clone, Debug, PartialEq)]
pub enum Scalar<'a> {
    Null,
    Bool(bool),
    Int(i64),
    /// An integer above `i64::MAX` that fits a u64.
    BigUint(u64),
    Float(f64),
    /// Borrowed from the line unless it held escapes.
    Str(Cow<'a, str>),
    /// An array or an object: never of a declared type.
    Compound,
}

impl Scalar<'_> {
    /// As a field of type `ty` (a string kept by its place in `text` when it lies there), or
    /// `None` when it is of another type.
    pub fn into_typed(self, ty: FieldType, text: &str) -> Option<FieldValue> {
        match (ty, self) {
            (FieldType::String, Scalar::Str(s)) => Some(FieldValue::string(s, text)),
            (FieldType::Bytes, Scalar::Str(s)) if is_canonical_base64(&s) => Some(FieldValue::string(s, text)),
            (FieldType::Int, scalar) => scalar.as_int().map(FieldValue::Int),
            (FieldType::Float, scalar) => scalar.as_float().map(FieldValue::Float),
            (FieldType::Bool, Scalar::Bool(b)) => Some(FieldValue::Bool(b)),
            _ => None,
        }
    }

    /// A JSON integer within int64. serde_json reads the integer `-0` as the double −0.0 (to keep
    /// its sign), so a zero double counts as 0; the cost is that `0.0` and `-0.0` count as ints.
    pub fn as_int(&self) -> Option<i64> {
        match *self {
            Scalar::Int(i) => Some(i),
            Scalar::Float(0.0) => Some(0), // matches -0.0 too (float patterns compare with ==)
            _ => None,
        }
    }

    /// Any number, as a double.
    pub fn as_float(&self) -> Option<f64> {
        match *self {
            Scalar::Int(i) => Some(i as f64),
            Scalar::BigUint(u) => Some(u as f64),
            Scalar::Float(f) => Some(f),
            _ => None,
        }
    }

    /// `arrival`: an integral number within int64 (`5.0` counts, `5.5` and `true` do not).
    pub fn as_integral_i64(&self) -> Option<i64> {
        match *self {
            Scalar::Int(i) => Some(i),
            _ => self.as_float().filter(|f| f.fract() == 0.0 && I64_AS_F64_RANGE.contains(f)).map(|f| f as i64),
        }
    }
}

fn is_canonical_base64(s: &str) -> bool {
    let engine = base64::engine::general_purpose::STANDARD;
    engine.decode(s).is_ok_and(|bytes| engine.encode(bytes) == s)
}

/// The declared fields of one object (by schema position; `None`: absent) and its `arrival`.
#[derive(Debug, PartialEq)]
pub struct Scanned<'a> {
    pub fields: Vec<Option<Scalar<'a>>>,
    pub arrival: Option<Scalar<'a>>,
}

impl<'a> Scanned<'a> {
    /// No value read yet, the fields kept in `room`'s allocation (emptied first): a caller that
    /// decodes line after line hands back the last line's (`decode::FieldRoom`).
    fn new(schema: &Schema, mut room: Vec<Option<Scalar<'a>>>) -> Scanned<'a> {
        room.clear();
        room.resize_with(schema.fields.len(), || None);
        Scanned { fields: room, arrival: None }
    }

    /// Keeps the value of a declared key; a later duplicate replaces it, as in `serde_json::Value`.
    fn put(&mut self, key: Key, scalar: Scalar<'a>) {
        match key {
            Key::Other => {}
            Key::Field(pos) => self.fields[pos] = Some(scalar),
            Key::Arrival => self.arrival = Some(scalar),
            Key::FieldAndArrival(pos) => {
                self.arrival = Some(copy_scalar(&scalar));
                self.fields[pos] = Some(scalar);
            }
        }
    }
}

/// Why a line holds no object to decode.
#[derive(Debug, PartialEq, Eq)]
pub enum NotAnObject {
    InvalidJson,
    /// Valid JSON, but an array, a string, a number, …
    OtherValue,
}

/// Scans `text`, which must be one JSON value and nothing else: through [`flat`] when the line
/// is a flat object it reads to the end, else through serde_json, which also names the error.
/// The fields are kept in `room`'s allocation on the flat path (the common one); serde_json's
/// path allocates its own.
pub fn scan_object<'a>(
    schema: &Schema,
    text: &'a str,
    room: Vec<Option<Scalar<'a>>>,
) -> Result<Scanned<'a>, NotAnObject> {
    match flat::scan(schema, text, room) {
        Some(scanned) => Ok(scanned),
        None => scan_with_serde(schema, text),
    }
}

fn scan_with_serde<'a>(schema: &Schema, text: &'a str) -> Result<Scanned<'a>, NotAnObject> {
    let mut de = serde_json::Deserializer::from_str(text);
    let scanned = de.deserialize_any(TopLevel { schema }).map_err(|_| NotAnObject::InvalidJson)?;
    de.end().map_err(|_| NotAnObject::InvalidJson)?;
    scanned.ok_or(NotAnObject::OtherValue)
}

/// The line's value: `Some` for an object, `None` for any other (fully parsed) value.
struct TopLevel<'s> {
    schema: &'s Schema,
}

impl<'de> Visitor<'de> for TopLevel<'_> {
    type Value = Option<Scanned<'de>>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut scanned = Scanned::new(self.schema, Vec::new());
        while let Some(key) = map.next_key_seed(KeySeed { schema: self.schema })? {
            match key {
                Key::Other => map.next_value_seed(Validated)?,
                key => scanned.put(key, map.next_value_seed(ScalarSeed)?),
            }
        }
        Ok(Some(scanned))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element_seed(Validated)?.is_some() {}
        Ok(None)
    }

    fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
}

/// A field both declared and named `arrival` feeds both; only scalars matter to `arrival`.
fn copy_scalar<'a>(scalar: &Scalar<'a>) -> Scalar<'a> {
    match scalar {
        Scalar::Null => Scalar::Null,
        Scalar::Bool(b) => Scalar::Bool(*b),
        Scalar::Int(i) => Scalar::Int(*i),
        Scalar::BigUint(u) => Scalar::BigUint(*u),
        Scalar::Float(f) => Scalar::Float(*f),
        Scalar::Str(s) => Scalar::Str(s.clone()),
        Scalar::Compound => Scalar::Compound,
    }
}

/// What an object key names.
#[derive(Clone, Copy)]
enum Key {
    Field(usize),
    Arrival,
    FieldAndArrival(usize),
    Other,
}

struct KeySeed<'s> {
    schema: &'s Schema,
}

impl<'de> DeserializeSeed<'de> for KeySeed<'_> {
    type Value = Key;

    fn deserialize<D: serde::Deserializer<'de>>(self, de: D) -> Result<Key, D::Error> {
        de.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeySeed<'_> {
    type Value = Key;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }

    fn visit_str<E: serde::de::Error>(self, key: &str) -> Result<Key, E> {
        Ok(Key::named(self.schema, key))
    }
}

impl Key {
    fn named(schema: &Schema, key: &str) -> Key {
        Key::named_after(schema, key.as_bytes(), 0)
    }

    /// As [`named`](Self::named), of the key's bytes, trying field `guess` first: lines usually
    /// hold the declared fields in declaration order, so the field after the previous key is a
    /// good guess.
    fn named_after(schema: &Schema, key: &[u8], guess: usize) -> Key {
        let named = |f: &crate::record::schema::Field| f.name.as_bytes() == key;
        let guessed = schema.fields.get(guess).is_some_and(named);
        let field = if guessed { Some(guess) } else { schema.fields.iter().position(named) };
        match (field, key == b"arrival") {
            (Some(pos), false) => Key::Field(pos),
            (Some(pos), true) => Key::FieldAndArrival(pos),
            (None, true) => Key::Arrival,
            (None, false) => Key::Other,
        }
    }
}

/// A declared value.
struct ScalarSeed;

impl<'de> DeserializeSeed<'de> for ScalarSeed {
    type Value = Scalar<'de>;

    fn deserialize<D: serde::Deserializer<'de>>(self, de: D) -> Result<Scalar<'de>, D::Error> {
        de.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ScalarSeed {
    type Value = Scalar<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<Scalar<'de>, E> {
        Ok(Scalar::Null)
    }

    fn visit_bool<E: serde::de::Error>(self, b: bool) -> Result<Scalar<'de>, E> {
        Ok(Scalar::Bool(b))
    }

    fn visit_i64<E: serde::de::Error>(self, i: i64) -> Result<Scalar<'de>, E> {
        Ok(Scalar::Int(i))
    }

    fn visit_u64<E: serde::de::Error>(self, u: u64) -> Result<Scalar<'de>, E> {
        Ok(i64::try_from(u).map_or(Scalar::BigUint(u), Scalar::Int))
    }

    fn visit_f64<E: serde::de::Error>(self, f: f64) -> Result<Scalar<'de>, E> {
        if f.is_finite() { Ok(Scalar::Float(f)) } else { Err(E::custom("number out of range")) }
    }

    fn visit_borrowed_str<E: serde::de::Error>(self, s: &'de str) -> Result<Scalar<'de>, E> {
        Ok(Scalar::Str(Cow::Borrowed(s)))
    }

    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Scalar<'de>, E> {
        Ok(Scalar::Str(Cow::Owned(s.into())))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Scalar<'de>, A::Error> {
        while seq.next_element_seed(Validated)?.is_some() {}
        Ok(Scalar::Compound)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Scalar<'de>, A::Error> {
        while map.next_entry_seed(Validated, Validated)?.is_some() {}
        Ok(Scalar::Compound)
    }
}

/// An undeclared value: parsed as strictly as `serde_json::Value` would, then dropped.
/// (serde's `IgnoredAny` would skip numbers and strings without checking their range and escapes.)
struct Validated;

impl<'de> DeserializeSeed<'de> for Validated {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, de: D) -> Result<(), D::Error> {
        de.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Validated {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E: serde::de::Error>(self, f: f64) -> Result<(), E> {
        if f.is_finite() { Ok(()) } else { Err(E::custom("number out of range")) }
    }

    fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(Validated)?.is_some() {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while map.next_entry_seed(Validated, Validated)?.is_some() {}
        Ok(())
    }
}
