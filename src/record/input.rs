//! An input row as decoded, read where it lies in its line: what replay and `braid run` hand the
//! runtime, which archives it straight into a feed frame. No heap [`Row`](super::Row) is built
//! for it, and none dropped: its strings stay in the line they were read from.

use super::decode::FieldValue;
use super::id::{IdHasher, key_ref_hash};
use super::key::key_of;
use super::view::{KeyRef, ValueRef};
use crate::config::StreamDef;

/// A decoded input row: its values in the line, the key, key hash and `_id` they give.
#[derive(Clone, Copy, Debug)]
pub struct InputRow<'a> {
    pub ts: i64,
    pub key: KeyRef<'a>,
    pub key_hash: u64,
    pub id: u64,
    values: &'a [FieldValue],
    line: &'a str,
}

impl<'a> InputRow<'a> {
    pub fn value_ref(&self, pos: usize) -> ValueRef<'a> {
        self.values[pos].get(self.line)
    }

    pub fn len(&self) -> usize {
        self.values.len()
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}

/// Gives decoded values their key, key hash and `_id` (CONTRACT.md rule 10), reusing its buffers
/// from row to row (one per thread of work).
#[derive(Default)]
pub struct InputRows {
    ids: IdHasher,
    composite_key: Vec<u8>,
}

impl InputRows {
    /// The row of stream `def` with event time `ts` whose `values` were decoded from `line`.
    pub fn row<'a>(&'a mut self, def: &StreamDef, values: &'a [FieldValue], ts: i64, line: &'a [u8]) -> InputRow<'a> {
        // The values were decoded from `line`, so it is UTF-8; any other line reads as empty.
        let line = std::str::from_utf8(line).unwrap_or_default();
        let (key, key_hash, id) = self.identify(def, |pos| values.get(pos).map_or(ValueRef::Null, |v| v.get(line)));
        InputRow { ts, key, key_hash, id, values, line }
    }

    /// The key, key hash and `_id` of a row of stream `def` whose field `pos` holds `value(pos)`.
    pub fn identify<'a>(
        &'a mut self,
        def: &StreamDef,
        value: impl Fn(usize) -> ValueRef<'a>,
    ) -> (KeyRef<'a>, u64, u64) {
        self.ids.begin().str(&def.name);
        for &pos in &def.schema.id_order {
            self.ids.value_ref(value(pos));
        }
        let id = self.ids.finish();
        let key = key_of(&def.schema.key, value, &mut self.composite_key).unwrap_or(KeyRef::Broadcast);
        (key, key_ref_hash(key), id)
    }
}
