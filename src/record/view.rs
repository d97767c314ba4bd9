//! Rows and keys read in place: on the heap, or archived in a ring frame or an arena record.
//!
//! Operators on the row path see an incoming frame as a [`RowView`] and read its event time, key
//! and the values they select without copying the row out ([`frame::to_row`](super::frame::to_row)
//! is one allocation for the values and one per string); stores compare keys as [`KeyRef`]s.

use std::borrow::Cow;

use super::frame::{to_row, to_value};
use super::{ArchivedKey, ArchivedRow, Key, Row, Value};

/// A key, borrowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyRef<'a> {
    Broadcast,
    Int(i64),
    Str(&'a str),
    /// A composite key's encoded parts ([`super::key`]).
    Composite(&'a [u8]),
}

impl<'a> KeyRef<'a> {
    pub fn archived(key: &'a ArchivedKey) -> KeyRef<'a> {
        match key {
            ArchivedKey::Broadcast => KeyRef::Broadcast,
            ArchivedKey::Int(i) => KeyRef::Int(i.to_native()),
            ArchivedKey::Str(s) => KeyRef::Str(s),
            ArchivedKey::Composite(bytes) => KeyRef::Composite(bytes),
        }
    }

    /// The key held by `value`, if it is a string or an int ([`Key::from_value`], borrowed).
    pub fn from_value(value: &'a Value) -> Option<KeyRef<'a>> {
        match value {
            Value::Int(i) => Some(KeyRef::Int(*i)),
            Value::Str(s) => Some(KeyRef::Str(s)),
            _ => None,
        }
    }

    pub fn to_key(self) -> Key {
        match self {
            KeyRef::Broadcast => Key::Broadcast,
            KeyRef::Int(i) => Key::Int(i),
            KeyRef::Str(s) => Key::Str(s.into()),
            KeyRef::Composite(bytes) => Key::Composite(bytes.into()),
        }
    }

    /// The value of a one-field key (null for broadcast and for a composite key: see
    /// [`parts`](Self::parts)).
    pub fn to_value(self) -> Value {
        match self {
            KeyRef::Broadcast | KeyRef::Composite(_) => Value::Null,
            KeyRef::Int(i) => Value::Int(i),
            KeyRef::Str(s) => Value::Str(s.into()),
        }
    }

    /// The key's field values in the key's order: a composite key's parts, else the key itself
    /// (nothing for broadcast).
    pub fn parts(self) -> impl Iterator<Item = KeyRef<'a>> {
        let (single, composite) = match self {
            KeyRef::Broadcast => (None, &[][..]),
            KeyRef::Composite(bytes) => (None, bytes),
            one => (Some(one), &[][..]),
        };
        single.into_iter().chain(super::key::Parts::new(composite))
    }

    /// The value of the key's field number `part` (in the key's order; null past the end).
    pub fn part(self, part: usize) -> Value {
        match self {
            KeyRef::Composite(bytes) => super::key::Parts::new(bytes).nth(part).map_or(Value::Null, KeyRef::to_value),
            // A one-field key (the hot path): its value, no iterator.
            one if part == 0 => one.to_value(),
            _ => Value::Null,
        }
    }

    /// The key as a person reads it: the value, a composite key's values joined by `,`.
    pub fn text(self) -> String {
        let parts: Vec<String> = self
            .parts()
            .map(|p| match p {
                KeyRef::Int(i) => i.to_string(),
                KeyRef::Str(s) => s.to_owned(),
                KeyRef::Broadcast | KeyRef::Composite(_) => String::new(),
            })
            .collect();
        if self == KeyRef::Broadcast { "*".into() } else { parts.join(",") }
    }
}

impl Key {
    pub fn key_ref(&self) -> KeyRef<'_> {
        match self {
            Key::Broadcast => KeyRef::Broadcast,
            Key::Int(i) => KeyRef::Int(*i),
            Key::Str(s) => KeyRef::Str(s),
            Key::Composite(bytes) => KeyRef::Composite(bytes),
        }
    }
}

/// A row, borrowed: on the heap or archived.
#[derive(Clone, Copy)]
pub enum RowView<'a> {
    Heap(&'a Row),
    Archived(&'a ArchivedRow),
}

impl<'a> RowView<'a> {
    pub fn ts(self) -> i64 {
        match self {
            RowView::Heap(row) => row.ts,
            RowView::Archived(row) => row.ts.to_native(),
        }
    }

    pub fn id(self) -> u64 {
        match self {
            RowView::Heap(row) => row.id,
            RowView::Archived(row) => row.id.to_native(),
        }
    }

    pub fn key(self) -> KeyRef<'a> {
        match self {
            RowView::Heap(row) => row.key.key_ref(),
            RowView::Archived(row) => KeyRef::archived(&row.key),
        }
    }

    pub fn key_hash(self) -> u64 {
        match self {
            RowView::Heap(row) => row.key_hash,
            RowView::Archived(row) => row.key_hash.to_native(),
        }
    }

    /// The value at `pos` (a copy: what a result needs).
    pub fn value(self, pos: usize) -> Value {
        match self {
            RowView::Heap(row) => row.values[pos].clone(),
            RowView::Archived(row) => to_value(&row.values[pos]),
        }
    }

    /// The row itself: borrowed from the heap, copied out of an archive.
    pub fn to_row(self) -> Cow<'a, Row> {
        match self {
            RowView::Heap(row) => Cow::Borrowed(row),
            RowView::Archived(row) => Cow::Owned(to_row(row)),
        }
    }
}
