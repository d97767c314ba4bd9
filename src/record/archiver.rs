//! Row archives written from borrowed parts: a result projected straight from the rows it joins
//! (read in place from a ring frame or an arena) into the bytes of its output frame, with no heap
//! [`Row`](super::Row) in between — no allocation per value or string, nothing to drop.
//!
//! [`RowArchives`] writes **exactly the bytes rkyv's serializer writes for the equal row** (the
//! tests hold it to that on every value and key kind; [`RowEncoder`](super::frame::RowEncoder)
//! encodes with it), so an archive written here is read like any other frame, with
//! [`access_unchecked`]. rkyv's serializer, for a `Row`, writes (each
//! step padded with zeros to the alignment it needs, relative to the archive's start, which is
//! 16-byte aligned):
//!
//! 1. the key's out-of-line bytes (a string's or a composite key's bytes; nothing for an int or
//!    broadcast key);
//! 2. each value's out-of-line bytes in order: a string's bytes; an id list aligned to 8, its
//!    ids as u64 little endian;
//! 3. aligned to 8, the values array: 16 bytes a value — tag u8 (Null 0, Bool 1, Int 2, Float 3,
//!    Str 4, IdList 5); a bool at byte 1; an int or float at byte 8; a string or id list as a
//!    relative pointer (i32 at byte 4, from that field's own position) and a length (u32 at 8);
//! 4. aligned to 8, the 48-byte root: ts i64 | key (tag u8: Broadcast 0, Int 1, Str 2,
//!    Composite 3; an int at byte 8 of it, a relative pointer at 4 and length at 8) | key_hash |
//!    id | values (relative pointer i32, length u32).

use std::ops::Range;

use rkyv::util::AlignedVec;

use super::ArchivedRow;
use super::frame::{PAYLOAD_ALIGN, access_unchecked};
use super::view::{IdsRef, KeyRef, ValueRef};

/// Bytes of an archived value in the values array.
const VALUE_BYTES: usize = 16;
/// Bytes of the root (step 4 of the module doc).
const ROOT_BYTES: usize = std::mem::size_of::<ArchivedRow>();
const _: () = assert!(ROOT_BYTES == 48);
/// Tags of the two value kinds whose bytes lie out of line (a string, an id list): their slot
/// holds a relative pointer.
const STR_TAG: u8 = 4;
const IDS_TAG: u8 = 5;

/// Archived rows back to back in one 16-aligned buffer, each starting 16-byte aligned. Write one
/// with [`begin`](Self::begin), a [`value`](Self::value) per value, [`end`](Self::end).
#[derive(Default)]
pub struct RowArchives {
    buf: AlignedVec<PAYLOAD_ALIGN>,
    spans: Vec<Range<usize>>,
    /// The row being written: its start, its key's tag and out-of-line place, its values.
    start: usize,
    key: (u8, usize, u32, i64),
    /// The row's values array as [`end`](Self::end) writes it, but for one thing: an
    /// out-of-line value's offset field holds where its bytes are (from the row's start), as
    /// the array's own place, which the pointer is relative to, is known only once every value's
    /// out-of-line bytes are written. Building the final bytes here keeps `end` to one fix-up per
    /// string and one copy of the whole array.
    slots: Vec<[u8; VALUE_BYTES]>,
}

impl std::fmt::Debug for RowArchives {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RowArchives").field("rows", &self.spans.len()).field("bytes", &self.buf.len()).finish()
    }
}

impl RowArchives {
    /// Starts a row keyed by `key`.
    #[inline]
    pub fn begin(&mut self, key: KeyRef<'_>) {
        self.pad_to(PAYLOAD_ALIGN);
        self.start = self.buf.len();
        self.slots.clear();
        self.key = match key {
            KeyRef::Broadcast => (0, 0, 0, 0),
            KeyRef::Int(i) => (1, 0, 0, i),
            KeyRef::Str(s) => {
                let at = self.out_of_line(s.as_bytes());
                (2, at, s.len() as u32, 0)
            }
            KeyRef::Composite(bytes) => {
                let at = self.out_of_line(bytes);
                (3, at, bytes.len() as u32, 0)
            }
        };
    }

    /// The row's next value. Inlined into its two callers (a projection's loop, the encoder's):
    /// a call cost a fifth of the value.
    #[inline(always)]
    pub fn value(&mut self, value: ValueRef<'_>) {
        let mut slot = [0u8; VALUE_BYTES];
        match value {
            ValueRef::Null => {}
            ValueRef::Bool(b) => slot[..2].copy_from_slice(&[1, u8::from(b)]),
            ValueRef::Int(i) => word_slot(&mut slot, 2, i.to_le_bytes()),
            ValueRef::Float(f) => word_slot(&mut slot, 3, f.to_bits().to_le_bytes()),
            ValueRef::Str(s) => {
                let at = self.out_of_line(s.as_bytes());
                out_of_line_slot(&mut slot, STR_TAG, at, s.len());
            }
            ValueRef::IdList(ids) => {
                self.pad_to(8);
                let at = self.buf.len() - self.start;
                match ids {
                    IdsRef::Heap(ids) => ids.iter().for_each(|id| self.buf.extend_from_slice(&id.to_le_bytes())),
                    IdsRef::Archived(ids) => {
                        ids.iter().for_each(|id| self.buf.extend_from_slice(&id.to_native().to_le_bytes()))
                    }
                }
                out_of_line_slot(&mut slot, IDS_TAG, at, ids.len());
            }
        }
        self.slots.push(slot);
    }

    /// Ends the row: its values array and root. Returns its index. Inlined into a projection's
    /// `archive`, once per result: the call and its frame cost 19 instructions a result.
    #[inline(always)]
    pub fn end(&mut self, ts: i64, key_hash: u64, id: u64) -> usize {
        self.pad_to(8);
        let values_at = self.buf.len() - self.start;
        let root = values_at + self.slots.len() * VALUE_BYTES;
        for (i, slot) in self.slots.iter_mut().enumerate() {
            if slot[0] == STR_TAG || slot[0] == IDS_TAG {
                let target = u32::from_le_bytes([slot[4], slot[5], slot[6], slot[7]]) as usize;
                let from = values_at + i * VALUE_BYTES + 4;
                slot[4..8].copy_from_slice(&relative_offset(from, target).to_le_bytes());
            }
        }
        self.buf.reserve(root - values_at + ROOT_BYTES);
        self.buf.extend_from_slice(self.slots.as_flattened());
        let mut archived = [0u8; ROOT_BYTES];
        archived[..8].copy_from_slice(&ts.to_le_bytes());
        let (tag, key_at, key_len, int) = self.key;
        archived[8] = tag;
        match tag {
            1 => archived[16..24].copy_from_slice(&int.to_le_bytes()),
            2 | 3 => relative_pointer(&mut archived[12..20], root + 12, key_at, key_len),
            _ => {}
        }
        archived[24..32].copy_from_slice(&key_hash.to_le_bytes());
        archived[32..40].copy_from_slice(&id.to_le_bytes());
        relative_pointer(&mut archived[40..48], root + 40, values_at, self.slots.len() as u32);
        self.buf.extend_from_slice(&archived);
        self.spans.push(self.start..self.buf.len());
        self.spans.len() - 1
    }

    /// The archive of row `i` (a frame payload, 16-byte aligned).
    pub fn bytes(&self, i: usize) -> &[u8] {
        &self.buf[self.spans[i].clone()]
    }

    /// Row `i`, read in place.
    pub fn row(&self, i: usize) -> &ArchivedRow {
        // SAFETY: the span is a whole archive this module wrote into `buf` and nothing changed
        // since; every archive starts at a multiple of 16 of a 16-aligned buffer, and holds the
        // bytes rkyv writes for the equal row (module doc; the tests compare them), which is what
        // `RowEncoder::encode` returns — what `access_unchecked` requires. Debug builds validate
        // it there anyway.
        unsafe { access_unchecked(self.bytes(i)) }
    }

    pub fn len(&self) -> usize {
        self.spans.len()
    }

    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// Forgets every row, keeping the buffers' capacity.
    pub fn clear(&mut self) {
        self.buf.clear();
        self.spans.clear();
    }

    /// Writes `bytes` out of line; their position from the row's start.
    fn out_of_line(&mut self, bytes: &[u8]) -> usize {
        let at = self.buf.len() - self.start;
        self.buf.extend_from_slice(bytes);
        at
    }

    /// Zeros up to a multiple of `align` (from the buffer's start, which is as aligned as a
    /// row's start).
    fn pad_to(&mut self, align: usize) {
        let padded = self.buf.len().next_multiple_of(align);
        if padded > self.buf.len() {
            self.buf.resize(padded, 0);
        }
    }
}

/// rkyv's relative pointer in `field` (8 bytes: offset i32, length u32), at position `from`,
/// pointing to `to` (both from the archive's start).
fn relative_pointer(field: &mut [u8], from: usize, to: usize, len: u32) {
    field[..4].copy_from_slice(&relative_offset(from, to).to_le_bytes());
    field[4..8].copy_from_slice(&len.to_le_bytes());
}

fn relative_offset(from: usize, to: usize) -> i32 {
    // Archives are far below 2 GiB (a ring's largest frame): the offset fits an i32.
    (to as i64 - from as i64) as i32
}

/// An int's or a float's slot: its tag, its eight bytes at offset 8.
fn word_slot(slot: &mut [u8; VALUE_BYTES], tag: u8, word: [u8; 8]) {
    slot[0] = tag;
    slot[8..].copy_from_slice(&word);
}

/// A string's or an id list's slot before [`RowArchives::end`] makes its pointer relative: its
/// tag, where its bytes are (from the row's start; below 2 GiB, as `relative_offset` says) in the
/// offset field, its length.
fn out_of_line_slot(slot: &mut [u8; VALUE_BYTES], tag: u8, at: usize, len: usize) {
    slot[0] = tag;
    slot[4..8].copy_from_slice(&(at as u32).to_le_bytes());
    slot[8..12].copy_from_slice(&(len as u32).to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::frame::{rkyv_bytes, to_row};
    use crate::record::{Key, Row, Value};

    /// Every value kind, with a NaN and a string of odd length after an id list (every
    /// alignment case).
    fn values() -> Vec<Value> {
        let mut values = crate::record::frame::tests::sample_values();
        values.push(Value::Float(f64::from_bits(0x7ff8_0000_dead_beef)));
        values.push(Value::Str("odd".into()));
        values.push(Value::IdList(Box::new([7])));
        values
    }

    fn write(archives: &mut RowArchives, row: &Row) -> usize {
        archives.begin(row.key.key_ref());
        row.values.iter().for_each(|v| archives.value(ValueRef::of(v)));
        archives.end(row.ts, row.key_hash, row.id)
    }

    /// Every key kind with every run of values (every alignment case: strings of odd length
    /// before an id list, an empty row), several rows into one buffer: the bytes are rkyv's.
    #[test]
    fn writes_the_bytes_rkyv_writes() {
        let keys = [
            Key::Broadcast,
            Key::Int(-7),
            Key::Str("".into()),
            Key::Str("dev-1".into()),
            Key::Composite(Box::new([1, 2, 3])),
        ];
        let all = values();
        let mut archives = RowArchives::default();
        let mut rows = Vec::new();
        for key in keys {
            for start in 0..all.len() {
                for len in [0, 1, 2, 3, all.len() - start] {
                    let values: Box<[Value]> = all[start..(start + len).min(all.len())].into();
                    rows.push(Row {
                        ts: 1_700_000_000_123 + start as i64,
                        key: key.clone(),
                        key_hash: 9,
                        id: 11,
                        values,
                    });
                }
            }
        }
        for row in &rows {
            let i = write(&mut archives, row);
            assert_eq!(archives.bytes(i), rkyv_bytes(row).as_slice(), "{row:?}");
        }
        // Read back (compared as text: a NaN is not equal to itself).
        let text = |row: &Row| format!("{row:?}");
        for (i, row) in rows.iter().enumerate() {
            assert_eq!(text(&to_row(crate::record::frame::access(archives.bytes(i)).unwrap())), text(row));
            assert_eq!(text(&to_row(archives.row(i))), text(row));
        }
        // Values copied from an archive write the same bytes again.
        let mut again = RowArchives::default();
        for i in 0..rows.len() {
            let row = archives.row(i);
            again.begin(KeyRef::archived(&row.key));
            row.values.iter().for_each(|v| again.value(ValueRef::archived(v)));
            again.end(row.ts.to_native(), row.key_hash.to_native(), row.id.to_native());
            assert_eq!(again.bytes(i), archives.bytes(i));
        }
        archives.clear();
        assert!(archives.is_empty());
    }
}
