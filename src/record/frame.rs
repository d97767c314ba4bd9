//! Row frames: a [`Row`] archived with rkyv, as it travels through a ring (and, later, lies in a
//! state arena), read in place as [`&ArchivedRow`](ArchivedRow).
//!
//! Format (rkyv 0.8, features `little_endian`, `aligned`, `pointer_width_32`: the bytes are the
//! same on every platform braid runs on). A payload is the archive exactly as rkyv writes it — no
//! header of its own: the ring's frame header already carries the length and a crc32c, and the
//! archive's root sits in its last `size_of::<ArchivedRow>()` bytes, so the length must be exact.
//!
//! ```text
//! [out-of-line data: the key string, then the values' strings and id lists, then the values
//!  array (16 B per value)] [ArchivedRow: ts i64 | key (tag u8, i64 or rel ptr + len) |
//!  key_hash u64 | id u64 | values (rel ptr i32 + len u32)]   — 48 B, at the end
//! ```
//!
//! - Every integer is little endian and naturally aligned; relative pointers are i32 offsets
//!   from the pointer's own position, lengths u32. The highest alignment inside is 8; payloads
//!   start 16-byte aligned (the ring pads every frame to 16, [`RowEncoder`] writes into a
//!   16-aligned buffer), which is what [`access`] checks.
//! - `Value`: a 16-byte enum (tag u8 in declaration order: Null, Bool, Int, Float, Str, IdList;
//!   then the payload at offset 8). Strings and id lists are out of line (rkyv's `Box<str>` never
//!   inlines). A gateway `command` row (string key, 5 values, 50 bytes of strings) is 184 bytes
//!   of payload: 56 of strings, 80 of values, 48 of root; 208 in the ring with header and padding.
//! - Changing `Row`, `Value` or `Key` (a field, a variant, their order) changes the format: a ring
//!   or arena written by an older braid must then be refused at open, not misread.
//!
//! Reading (STYLE.md 8): [`access`] validates the bytes (bounds, alignment, enum tags, UTF-8,
//! non-overlapping subtrees) and is what recovery uses on frames read back after a restart.
//! [`access_unchecked`] skips all of it, for frames this process wrote itself. [`to_row`] turns an
//! archived row back into a heap [`Row`] — needed while operators take `Row`s; it costs the
//! allocations of a `Row` (the values array and each string), the very thing frames are meant to
//! save, so it goes once operators read `&ArchivedRow` directly.

use rkyv::rancor;
#[cfg(test)]
use rkyv::ser::allocator::Arena;
#[cfg(test)]
use rkyv::util::AlignedVec;
use thiserror::Error;

use super::archiver::RowArchives;
use super::view::{RowView, ValueRef};

pub use super::{ArchivedKey, ArchivedRow, ArchivedValue};
use super::{Key, Row, Value};

/// Alignment of a payload: the ring's frame alignment; at least `align_of::<ArchivedRow>()`.
pub const PAYLOAD_ALIGN: usize = 16;

#[derive(Debug, Error)]
pub enum FrameError {
    /// The row could not be archived (only an archive past rkyv's 2 GiB offsets can do this).
    #[error("row cannot be archived: {0}")]
    Encode(rancor::Error),
    /// The bytes are not a valid archived row: damaged, misaligned or from another format.
    #[error("invalid row frame: {0}")]
    Invalid(rancor::Error),
}

/// Archives rows into one buffer it keeps: after the first rows of the largest size, encoding
/// allocates nothing. The bytes are rkyv's for the row, written by [`RowArchives`] (a third of
/// the instructions of rkyv's generic serializer, which the tests hold it to).
#[derive(Default)]
pub struct RowEncoder {
    archives: RowArchives,
}

impl RowEncoder {
    pub fn new() -> RowEncoder {
        RowEncoder::default()
    }

    /// Archives `row`; the bytes (a frame payload, 16-byte aligned) are valid until the next call.
    pub fn encode<'r>(&mut self, row: impl Into<RowView<'r>>) -> Result<&[u8], FrameError> {
        let row = row.into();
        self.archives.clear();
        self.archives.begin(row.key());
        row.values().for_each(|value| self.archives.value(value));
        let i = self.archives.end(row.ts(), row.key_hash(), row.id());
        Ok(self.archives.bytes(i))
    }
}

/// Archives `row` with rkyv's own serializer: what [`RowEncoder`] must write (tests).
#[cfg(test)]
pub fn rkyv_bytes(row: &Row) -> AlignedVec<PAYLOAD_ALIGN> {
    let mut buf = AlignedVec::new();
    rkyv::api::high::to_bytes_in_with_alloc::<_, _, rancor::Error>(row, &mut buf, Arena::new().acquire())
        .unwrap_or_else(|e| panic!("{e}"));
    buf
}

/// Validates `payload` as an archived row and reads it in place. Never panics and never reads
/// out of bounds, whatever the bytes: this is the path for frames read back after a restart.
pub fn access(payload: &[u8]) -> Result<&ArchivedRow, FrameError> {
    rkyv::access::<ArchivedRow, rancor::Error>(payload).map_err(FrameError::Invalid)
}

/// Reads `payload` as an archived row in place, without validation.
///
/// # Safety
///
/// `payload` must be exactly the bytes [`RowEncoder::encode`] returned (this build of braid, so
/// this format), unchanged since, starting at an address aligned to [`PAYLOAD_ALIGN`]: a `Row`
/// frame this process pushed into a ring and reads back in the same run, or bytes [`access`] has
/// already accepted. Anything else (a frame from a file opened after a restart, which only its crc
/// vouches for) must go through [`access`]. Debug builds validate anyway and panic on bytes that
/// fail, so a broken caller shows up in tests.
pub unsafe fn access_unchecked(payload: &[u8]) -> &ArchivedRow {
    debug_assert!(access(payload).is_ok(), "access_unchecked on bytes that are not a valid row frame");
    // SAFETY: the caller guarantees `payload` is a whole archive of a `Row` written by rkyv with
    // this crate's features and left unchanged, aligned for `ArchivedRow` (16 ≥ its alignment of
    // 8): exactly what `rkyv::access_unchecked` requires — the root is the last
    // `size_of::<ArchivedRow>()` bytes, and every relative pointer in it stays inside `payload`.
    unsafe { rkyv::access_unchecked::<ArchivedRow>(payload) }
}

/// A heap [`Row`] with the same contents as `archived` (one allocation for the values array and
/// one per string or id list).
pub fn to_row(archived: &ArchivedRow) -> Row {
    Row {
        ts: archived.ts.to_native(),
        key: to_key(&archived.key),
        key_hash: archived.key_hash.to_native(),
        id: archived.id.to_native(),
        values: archived.values.iter().map(to_value).collect(),
    }
}

pub fn to_key(archived: &ArchivedKey) -> Key {
    super::view::KeyRef::archived(archived).to_key()
}

pub fn to_value(archived: &ArchivedValue) -> Value {
    ValueRef::archived(archived).to_value()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::record::id::key_hash;
    use crate::ring::{FrameKind, Ring};

    fn row(key: Key, values: Vec<Value>) -> Row {
        Row { ts: 1_700_000_000_123, key_hash: key_hash(&key), key, id: 0xdead_beef_0bad_f00d, values: values.into() }
    }

    /// Every value kind, with edge values.
    pub(crate) fn sample_values() -> Vec<Value> {
        vec![
            Value::Null,
            Value::Bool(true),
            Value::Bool(false),
            Value::Int(i64::MIN),
            Value::Int(-1),
            Value::Float(-273.15),
            Value::Float(f64::INFINITY),
            Value::Str("".into()),
            Value::Str("dev-000042 ✓ ünïcødé".into()),
            Value::Str("x".repeat(300).into()),
            Value::IdList(Box::new([])),
            Value::IdList(Box::new([1, u64::MAX, 0x0123_4567_89ab_cdef])),
        ]
    }

    /// Every value kind under every key kind, plus edge values.
    fn samples() -> Vec<Row> {
        let values = sample_values();
        let mut rows = Vec::new();
        for key in
            [Key::Broadcast, Key::Int(-7), Key::Int(i64::MAX), Key::Str("".into()), Key::Str("dev-000042".into())]
        {
            rows.push(row(key.clone(), values.clone()));
            rows.push(row(key, Vec::new()));
        }
        rows.push(Row { ts: i64::MIN, key: Key::Broadcast, key_hash: 0, id: 0, values: Box::new([Value::Null]) });
        rows
    }

    #[test]
    fn every_value_and_key_kind_round_trips() {
        let mut enc = RowEncoder::new();
        for original in samples() {
            let bytes = enc.encode(&original).unwrap().to_vec();
            assert_eq!(bytes, rkyv_bytes(&original).as_slice(), "rkyv's bytes");
            let mut aligned = AlignedVec::<PAYLOAD_ALIGN>::new();
            aligned.extend_from_slice(&bytes);
            let checked = access(&aligned).unwrap();
            assert_eq!(to_row(checked), original);
            // SAFETY: `aligned` holds exactly what `encode` wrote, 16-byte aligned.
            let unchecked = unsafe { access_unchecked(&aligned) };
            assert_eq!(to_row(unchecked), original);
            // The derived rkyv deserializer agrees with the hand-written conversion.
            assert_eq!(rkyv::deserialize::<Row, rancor::Error>(checked).unwrap(), original);
        }
    }

    #[test]
    fn float_bits_survive_including_nan() {
        let mut enc = RowEncoder::new();
        let nan = f64::from_bits(0x7ff8_0000_dead_beef);
        let r = row(Key::Int(1), vec![Value::Float(nan), Value::Float(-0.0)]);
        let a = to_row(access(enc.encode(&r).unwrap()).unwrap());
        let bits: Vec<u64> = a.values.iter().map(|v| if let Value::Float(f) = v { f.to_bits() } else { 0 }).collect();
        assert_eq!(bits, [nan.to_bits(), (-0.0f64).to_bits()]);
    }

    #[test]
    fn layout_is_as_documented() {
        assert_eq!(std::mem::size_of::<ArchivedRow>(), 48);
        assert_eq!(std::mem::align_of::<ArchivedRow>(), 8);
        assert_eq!(std::mem::size_of::<ArchivedValue>(), 16);
        assert!(PAYLOAD_ALIGN.is_multiple_of(std::mem::align_of::<ArchivedRow>()));
        assert_eq!(PAYLOAD_ALIGN, crate::ring::FRAME_HEADER);
        // The gateway `command` row of benches/interval_join.rs.
        let command = row(
            Key::Str("dev-000042".into()),
            vec![
                Value::Str("dev-000042".into()),
                Value::Int(1_700_000_000_123),
                Value::Str("set_mode".into()),
                Value::Str("v=42".into()),
                Value::Str("c-0123456789abcdef".into()),
            ],
        );
        let mut enc = RowEncoder::new();
        assert_eq!(enc.encode(&command).unwrap().len(), 184);
        // The encoder's buffer is 16-byte aligned, so its output can be accessed in place.
        assert!(enc.encode(&command).unwrap().as_ptr().addr().is_multiple_of(PAYLOAD_ALIGN));
    }

    #[test]
    fn damaged_payloads_are_refused_not_misread() {
        let original = &samples()[8]; // a string key and every value kind
        let good = RowEncoder::new().encode(original).unwrap().to_vec();
        let mut buf = AlignedVec::<PAYLOAD_ALIGN>::new();
        let mut check = |bytes: &[u8]| -> Option<Row> {
            buf.clear();
            buf.extend_from_slice(bytes);
            access(&buf).ok().map(to_row)
        };
        assert_eq!(check(&good).as_ref(), Some(original));
        // Empty, too short for the root, truncated at either end, random bytes.
        assert!(check(&[]).is_none());
        assert!(check(&good[good.len() - 47..]).is_none());
        for cut in [1, 16, 48, good.len() / 2] {
            assert!(check(&good[..good.len() - cut]).is_none(), "truncated by {cut} at the end");
        }
        assert!(check(&[0xff; 64]).is_none());
        // Every single-byte change: each is refused or reads back as some row — never a panic,
        // never an out-of-bounds read (which would be UB, caught under miri or as a crash here).
        let (mut refused, mut accepted) = (0, 0);
        for i in 0..good.len() {
            for flip in [0x01u8, 0x80, 0xff] {
                let mut bad = good.clone();
                bad[i] ^= flip;
                match check(&bad) {
                    None => refused += 1,
                    Some(_) => accepted += 1,
                }
            }
        }
        assert!(refused > 0 && accepted > 0, "{refused} refused, {accepted} accepted");
        // Structural damage in particular: an enum tag out of range, a relative pointer off the end.
        let root = good.len() - std::mem::size_of::<ArchivedRow>();
        let mut bad_tag = good.clone();
        bad_tag[root + 8] = 9; // the key's tag: Broadcast, Int, Str are 0..=2
        assert!(check(&bad_tag).is_none());
        let mut wild_ptr = good.clone();
        wild_ptr[root + 40..root + 44].copy_from_slice(&i32::MAX.to_le_bytes()); // values' offset
        assert!(check(&wild_ptr).is_none());
        let mut long_len = good.clone();
        long_len[root + 44..root + 48].copy_from_slice(&u32::MAX.to_le_bytes()); // values' length
        assert!(check(&long_len).is_none());
    }

    #[test]
    fn a_misaligned_payload_is_refused() {
        let good = RowEncoder::new().encode(&samples()[9]).unwrap().to_vec();
        let mut buf = AlignedVec::<PAYLOAD_ALIGN>::new();
        buf.push(0);
        buf.extend_from_slice(&good);
        assert!(access(&buf[1..]).is_err());
    }

    #[test]
    fn frames_pushed_through_a_real_ring_are_aligned_and_read_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ring");
        let (mut producer, mut consumer) = Ring::create(&path, 4096).unwrap();
        let rows = samples();
        let mut enc = RowEncoder::new();
        let mut pushed = 0;
        let mut read = Vec::new();
        // Several laps of a small ring, so frames also land right after a wrap.
        for _ in 0..5 {
            for r in &rows {
                let payload = enc.encode(r).unwrap();
                if producer.push(FrameKind::Row, payload).is_err() {
                    producer.commit();
                    consumer.read_batch(|f| read.push(read_frame(f.payload)));
                    producer.push(FrameKind::Row, enc.encode(r).unwrap()).unwrap();
                }
                pushed += 1;
            }
        }
        producer.commit();
        consumer.read_batch(|f| read.push(read_frame(f.payload)));
        assert_eq!(read.len(), pushed);
        assert!(read.iter().zip(rows.iter().cycle()).all(|(a, b)| a == b));

        // After a restart, the frames left in the ring are read back with validation.
        for r in &rows[..3] {
            producer.push(FrameKind::Row, enc.encode(r).unwrap()).unwrap();
        }
        producer.commit();
        drop((producer, consumer));
        let (_producer, mut consumer) = Ring::open(&path).unwrap();
        let mut recovered = Vec::new();
        consumer.read_batch(|f| recovered.push(access(f.payload).map(to_row).unwrap()));
        assert_eq!(recovered, rows[..3]);
    }

    fn read_frame(payload: &[u8]) -> Row {
        assert!(payload.as_ptr().addr().is_multiple_of(PAYLOAD_ALIGN), "ring payloads are 16-byte aligned");
        let checked = to_row(access(payload).unwrap());
        // SAFETY: this test pushed the payload from `RowEncoder::encode` into the ring itself.
        let unchecked = to_row(unsafe { access_unchecked(payload) });
        assert_eq!(checked, unchecked);
        checked
    }
}
