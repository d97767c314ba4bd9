//! Records: what a row is once it has entered braid.
//!
//! A row is positional: `values[i]` is the value of field `i` of its stream's [`Schema`] (names are
//! resolved to positions once, at plan time). Besides its values a row carries its event time, its
//! key (one of its values, or nothing for a broadcast stream), the key's stable hash (routing) and
//! a stable id (CONTRACT.md rule 10). Operators compare key values, never only hashes.

pub mod archiver;
pub mod decode;
pub mod frame;
pub mod id;
pub mod input;
pub mod json;
pub mod key;
pub mod schema;
pub mod view;

pub use schema::{FieldType, Schema, TimeSpec, TimeUnit};

/// One field value. `bytes` fields keep their canonical base64 text, as they are written back out.
#[derive(Clone, Debug, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub enum Value {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(Box<str>),
    /// Result ids (`_supersedes` of a merged cogroup session): a JSON array of `_id` strings,
    /// left out of the JSON object when empty.
    IdList(Box<[u64]>),
}

impl Value {
    /// Approximate bytes this value holds, for the state-size gauges.
    pub fn heap_bytes(&self) -> usize {
        match self {
            Value::Str(s) => s.len(),
            Value::IdList(ids) => ids.len() * std::mem::size_of::<u64>(),
            _ => 0,
        }
    }
}

/// A key value: join partners must have equal keys (string and int keys never meet; config
/// validation refuses joins whose sides disagree on the key type, field by field).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub enum Key {
    /// The stream is broadcast (`key = "*"`): the row goes to every shard.
    Broadcast,
    Int(i64),
    Str(Box<str>),
    /// A composite key (`key = ["site", "device"]`): its fields' values in the key's order, in
    /// the canonical encoding of [`key`] — hashed and compared as one key.
    Composite(Box<[u8]>),
}

/// Compares an int with a double exactly, as Python does (the int is not rounded to a double);
/// `None` when the double is NaN. Shared by `where` expressions and connect's threshold.
pub fn cmp_int_float(i: i64, f: f64) -> Option<std::cmp::Ordering> {
    use std::cmp::Ordering;
    const TWO_63: f64 = 9_223_372_036_854_775_808.0;
    if f.is_nan() {
        return None;
    }
    if f >= TWO_63 {
        return Some(Ordering::Less);
    }
    if f < -TWO_63 {
        return Some(Ordering::Greater);
    }
    let whole = f.trunc();
    // In [-2^63, 2^63) and integral: the conversion is exact.
    let t = whole as i64;
    Some(i.cmp(&t).then_with(|| 0.0_f64.partial_cmp(&(f - whole)).unwrap_or(Ordering::Equal)))
}

impl Key {
    /// The key held by `value`, if it is a string or an int.
    pub fn from_value(value: &Value) -> Option<Key> {
        match value {
            Value::Int(i) => Some(Key::Int(*i)),
            Value::Str(s) => Some(Key::Str(s.clone())),
            _ => None,
        }
    }

    /// The key held by `values` at the key positions `fields` (a schema's `key`): one field's
    /// value, or for several a composite of them; `None` when there are no key fields (broadcast)
    /// or one of them holds no string or int.
    pub fn from_values(values: &[Value], fields: &[usize]) -> Option<Key> {
        let value = |pos: usize| values.get(pos).map_or(view::ValueRef::Null, view::ValueRef::of);
        key::key_of(fields, value, &mut Vec::new()).map(view::KeyRef::to_key)
    }

    /// The value of a one-field key (null for broadcast; a composite key's values are its
    /// [`parts`](view::KeyRef::parts)).
    pub fn to_value(&self) -> Value {
        self.key_ref().to_value()
    }
}

/// A row of an input stream or an operator's result.
#[derive(Clone, Debug, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct Row {
    /// Event time, ms since the epoch.
    pub ts: i64,
    pub key: Key,
    /// Stable hash of `key` ([`id::key_hash`]): decides the shard.
    pub key_hash: u64,
    /// Stable id ([`id`]): same stream and values → same id, on every run and platform.
    pub id: u64,
    pub values: Box<[Value]>,
}

impl Row {
    /// Approximate bytes held by this row, for the state-size gauges.
    pub fn size_bytes(&self) -> usize {
        std::mem::size_of::<Row>()
            + self.values.len() * std::mem::size_of::<Value>()
            + self.values.iter().map(Value::heap_bytes).sum::<usize>()
    }
}
