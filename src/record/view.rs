//! Rows and keys read in place: on the heap, or archived in a ring frame or an arena record.
//!
//! Operators on the row path see an incoming frame as a [`RowView`] and read its event time, key
//! and the values they select without copying the row out ([`frame::to_row`](super::frame::to_row)
//! is one allocation for the values and one per string); stores compare keys as [`KeyRef`]s.

use std::borrow::Cow;

use super::frame::{to_row, to_value};
use super::input::InputRow;
use super::{ArchivedKey, ArchivedRow, ArchivedValue, Key, Row, Value};

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
        KeyRef::from_value_ref(ValueRef::of(value))
    }

    /// [`from_value`](Self::from_value) of a borrowed value.
    pub fn from_value_ref(value: ValueRef<'a>) -> Option<KeyRef<'a>> {
        match value {
            ValueRef::Int(i) => Some(KeyRef::Int(i)),
            ValueRef::Str(s) => Some(KeyRef::Str(s)),
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

/// A row, borrowed: on the heap, archived, or an input row still in its line.
#[derive(Clone, Copy)]
pub enum RowView<'a> {
    Heap(&'a Row),
    Archived(&'a ArchivedRow),
    Input(&'a InputRow<'a>),
}

impl<'a> From<&'a Row> for RowView<'a> {
    fn from(row: &'a Row) -> RowView<'a> {
        RowView::Heap(row)
    }
}

impl<'a> From<&'a InputRow<'a>> for RowView<'a> {
    fn from(row: &'a InputRow<'a>) -> RowView<'a> {
        RowView::Input(row)
    }
}

impl<'a> RowView<'a> {
    pub fn ts(self) -> i64 {
        match self {
            RowView::Heap(row) => row.ts,
            RowView::Archived(row) => row.ts.to_native(),
            RowView::Input(row) => row.ts,
        }
    }

    pub fn id(self) -> u64 {
        match self {
            RowView::Heap(row) => row.id,
            RowView::Archived(row) => row.id.to_native(),
            RowView::Input(row) => row.id,
        }
    }

    pub fn key(self) -> KeyRef<'a> {
        match self {
            RowView::Heap(row) => row.key.key_ref(),
            RowView::Archived(row) => KeyRef::archived(&row.key),
            RowView::Input(row) => row.key,
        }
    }

    pub fn key_hash(self) -> u64 {
        match self {
            RowView::Heap(row) => row.key_hash,
            RowView::Archived(row) => row.key_hash.to_native(),
            RowView::Input(row) => row.key_hash,
        }
    }

    /// The value at `pos` (a copy: what a result needs).
    pub fn value(self, pos: usize) -> Value {
        match self {
            RowView::Heap(row) => row.values[pos].clone(),
            RowView::Archived(row) => to_value(&row.values[pos]),
            RowView::Input(row) => row.value_ref(pos).to_value(),
        }
    }

    /// The value at `pos`, borrowed (what a result frame or a JSON line is written from).
    /// Inlined into a projection's loop, where the call cost as much as the read.
    #[inline(always)]
    pub fn value_ref(self, pos: usize) -> ValueRef<'a> {
        match self {
            RowView::Heap(row) => ValueRef::of(&row.values[pos]),
            RowView::Archived(row) => ValueRef::archived(&row.values[pos]),
            RowView::Input(row) => row.value_ref(pos),
        }
    }

    /// How many values the row has.
    pub fn len(self) -> usize {
        match self {
            RowView::Heap(row) => row.values.len(),
            RowView::Archived(row) => row.values.len(),
            RowView::Input(row) => row.len(),
        }
    }

    /// Whether the row has no values.
    pub fn is_empty(self) -> bool {
        self.len() == 0
    }

    /// The row's values, borrowed, in order.
    pub fn values(self) -> impl Iterator<Item = ValueRef<'a>> {
        (0..self.len()).map(move |pos| self.value_ref(pos))
    }

    /// The row itself: borrowed from the heap, copied out of an archive.
    pub fn to_row(self) -> Cow<'a, Row> {
        match self {
            RowView::Heap(row) => Cow::Borrowed(row),
            RowView::Archived(row) => Cow::Owned(to_row(row)),
            RowView::Input(_) => Cow::Owned(Row {
                ts: self.ts(),
                key: self.key().to_key(),
                key_hash: self.key_hash(),
                id: self.id(),
                values: self.values().map(ValueRef::to_value).collect(),
            }),
        }
    }
}

/// A value, borrowed: from a heap [`Value`] or read in place from an archive.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ValueRef<'a> {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(&'a str),
    IdList(IdsRef<'a>),
}

/// An id list, borrowed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum IdsRef<'a> {
    Heap(&'a [u64]),
    Archived(&'a [rkyv::Archived<u64>]),
}

impl<'a> IdsRef<'a> {
    pub fn len(self) -> usize {
        match self {
            IdsRef::Heap(ids) => ids.len(),
            IdsRef::Archived(ids) => ids.len(),
        }
    }

    pub fn is_empty(self) -> bool {
        self.len() == 0
    }

    pub fn iter(self) -> impl Iterator<Item = u64> + 'a {
        let (heap, archived) = match self {
            IdsRef::Heap(ids) => (ids, &[][..]),
            IdsRef::Archived(ids) => (&[][..], ids),
        };
        heap.iter().copied().chain(archived.iter().map(|id| id.to_native()))
    }
}

impl<'a> ValueRef<'a> {
    pub fn of(value: &'a Value) -> ValueRef<'a> {
        match value {
            Value::Null => ValueRef::Null,
            Value::Bool(b) => ValueRef::Bool(*b),
            Value::Int(i) => ValueRef::Int(*i),
            Value::Float(f) => ValueRef::Float(*f),
            Value::Str(s) => ValueRef::Str(s),
            Value::IdList(ids) => ValueRef::IdList(IdsRef::Heap(ids)),
        }
    }

    #[inline]
    pub fn archived(value: &'a ArchivedValue) -> ValueRef<'a> {
        match value {
            ArchivedValue::Null => ValueRef::Null,
            ArchivedValue::Bool(b) => ValueRef::Bool(*b),
            ArchivedValue::Int(i) => ValueRef::Int(i.to_native()),
            ArchivedValue::Float(f) => ValueRef::Float(f.to_native()),
            ArchivedValue::Str(s) => ValueRef::Str(s),
            ArchivedValue::IdList(ids) => ValueRef::IdList(IdsRef::Archived(ids)),
        }
    }

    /// The value copied out to the heap.
    pub fn to_value(self) -> Value {
        match self {
            ValueRef::Null => Value::Null,
            ValueRef::Bool(b) => Value::Bool(b),
            ValueRef::Int(i) => Value::Int(i),
            ValueRef::Float(f) => Value::Float(f),
            ValueRef::Str(s) => Value::Str(s.into()),
            ValueRef::IdList(ids) => Value::IdList(ids.iter().collect()),
        }
    }

    /// A one-field key's value as a value (null for broadcast and composite keys, as
    /// [`KeyRef::to_value`]).
    pub fn of_key(key: KeyRef<'a>) -> ValueRef<'a> {
        match key {
            KeyRef::Broadcast | KeyRef::Composite(_) => ValueRef::Null,
            KeyRef::Int(i) => ValueRef::Int(i),
            KeyRef::Str(s) => ValueRef::Str(s),
        }
    }
}
