//! Snapshots of in-memory state, for checkpoints (DESIGN.md "State", issue "Checkpoints").
//!
//! Everything an operator's output depends on — its stored rows with their handles and matched
//! flags, timers, open windows and aggregates, per-key state, its clock and counters — is written
//! into a snapshot when a checkpoint barrier passes it, and read back into a freshly built
//! instance of the same operator at a restart. A snapshot is an rkyv archive of a plain struct
//! (vectors, not maps or heaps: the containers rebuild their order on restore), followed by the
//! crc32c of the archive (4 bytes, little endian). Reading checks the crc, then the archive with
//! bytecheck, so a damaged snapshot — truncated, a byte flipped anywhere — or a foreign one is an
//! error, never a misread: bytecheck alone would take a flipped byte inside a number for another
//! number. (Snapshots nest — an operator's inside its host's — so inner ones are checked twice;
//! crc32c runs at several GB/s, a small price for every layer checking what it reads.)
//!
//! # Stored rows
//!
//! Rows an operator keeps in a [`KeyedStore`] go into its snapshot as a [`SavedStore`] — per row
//! the handle its timers name the row by, the matched flag, the row's archive — in the store's
//! [`export`](KeyedStore::export) order ([`save_store`]), and come back with the same handles
//! ([`check_store`], then [`load_store`]), so timers and other references restored with them
//! still name the same rows; handles the store hands out later are new ones, past every handle
//! the snapshotted store had handed out ([`SavedStore::issued`]), so a handle an operator kept
//! for a row removed before the snapshot never names a later row. Rows are restored into an empty store: an arena directory
//! restored into is a fresh one (the rows are written anew; an arena keeps no pointer into old
//! files). A snapshot of arena rows restores into a memory store and the other way round.
//!
//! # Restoring
//!
//! `restore` takes a snapshot into a freshly built instance of the same operator spec. Each kind
//! decodes and checks everything — lengths against its spec (inputs, slots, aggregates),
//! positions and numbers that index its own tables, row handles — before it changes anything,
//! so a snapshot that does not fit is refused with [`SnapshotError::Mismatch`] or
//! [`SnapshotError::Decode`] and the instance stays as built. What the operator does not keep
//! (its spec, scratch buffers) comes from the instance, never from the snapshot.

use rkyv::api::high::{HighDeserializer, HighSerializer, HighValidator};
use rkyv::bytecheck::CheckBytes;
use rkyv::rancor;
use rkyv::ser::allocator::ArenaHandle;
use rkyv::util::AlignedVec;
use thiserror::Error;

use super::{KeyedStore, RowHandle};

/// Bytes of the crc32c after the archive.
const CRC_LEN: usize = 4;
/// The alignment an archive is read at (rkyv's, and [`AlignedVec`]'s default).
const ARCHIVE_ALIGN: usize = 16;

#[derive(Debug, Error)]
pub enum SnapshotError {
    /// The bytes are not a snapshot of this kind (damaged, or written by another version).
    #[error("snapshot does not decode: {0}")]
    Decode(String),
    /// A snapshot of something else: another kind of operator, another number of inputs.
    #[error("snapshot is of {found}, expected {expected}")]
    Mismatch { expected: String, found: String },
    #[error("encoding a snapshot: {0}")]
    Encode(String),
}

/// Encodes `value` as an rkyv archive followed by its crc32c.
pub fn encode<T>(value: &T) -> Result<Vec<u8>, SnapshotError>
where
    T: for<'a> rkyv::Serialize<HighSerializer<Vec<u8>, ArenaHandle<'a>, rancor::Error>>,
{
    encode_sized(value, 0)
}

/// [`encode`] into a buffer of `capacity` bytes from the start: a snapshot holding others (or
/// many rows) knows about how large it is, and a buffer grown by doubling would copy it again
/// and again (checkpoints of hundreds of MB).
///
/// The archive is written straight into the `Vec` it is returned in (the bytes are those an
/// `AlignedVec` would get: positions count from the buffer's start). An `AlignedVec` and a copy
/// out of it cost a copy of the state per level of nesting at every checkpoint; the alignment
/// matters only to whoever reads the archive in place, and [`decode`] copies a misaligned one.
pub fn encode_sized<T>(value: &T, capacity: usize) -> Result<Vec<u8>, SnapshotError>
where
    T: for<'a> rkyv::Serialize<HighSerializer<Vec<u8>, ArenaHandle<'a>, rancor::Error>>,
{
    let mut bytes = rkyv::api::high::to_bytes_in::<_, rancor::Error>(value, Vec::with_capacity(capacity))
        .map_err(|e| SnapshotError::Encode(e.to_string()))?;
    let crc = archive_crc(&bytes);
    bytes.extend_from_slice(&crc);
    Ok(bytes)
}

/// The crc32c that follows an archive, as [`decode`] checks it.
fn archive_crc(archive: &[u8]) -> [u8; CRC_LEN] {
    crc32c::crc32c(archive).to_le_bytes()
}

/// Appends the archive of `value` and its crc32c to `buffer`, whose length is a multiple of 16
/// (a file's header, say), so the archive starts aligned.
pub fn encode_after<T>(value: &T, buffer: AlignedVec) -> Result<AlignedVec, SnapshotError>
where
    T: for<'a> rkyv::Serialize<HighSerializer<AlignedVec, ArenaHandle<'a>, rancor::Error>>,
{
    let start = buffer.len();
    debug_assert!(start.is_multiple_of(ARCHIVE_ALIGN), "an archive after {start} bytes is not aligned");
    let mut bytes = rkyv::api::high::to_bytes_in::<_, rancor::Error>(value, buffer)
        .map_err(|e| SnapshotError::Encode(e.to_string()))?;
    let crc = archive_crc(&bytes[start..]);
    bytes.extend_from_slice(&crc);
    Ok(bytes)
}

/// Decodes what [`encode`] wrote, checking its crc and then the archive (any alignment of
/// `bytes`).
pub fn decode<T>(bytes: &[u8]) -> Result<T, SnapshotError>
where
    T: rkyv::Archive,
    T::Archived:
        for<'a> CheckBytes<HighValidator<'a, rancor::Error>> + rkyv::Deserialize<T, HighDeserializer<rancor::Error>>,
{
    let Some((archive, crc)) = bytes.split_last_chunk::<CRC_LEN>() else {
        return Err(SnapshotError::Decode(format!("{} bytes is too short for a snapshot", bytes.len())));
    };
    if archive_crc(archive) != *crc {
        return Err(SnapshotError::Decode("checksum mismatch (damaged or truncated)".into()));
    }
    let decoded = if archive.as_ptr().align_offset(ARCHIVE_ALIGN) == 0 {
        // A snapshot nested in another (its bytes a `Vec` the outer one decoded into, which the
        // allocator aligns) or a buffer read whole: read in place, no copy.
        rkyv::from_bytes::<T, rancor::Error>(archive)
    } else {
        let mut aligned = AlignedVec::<ARCHIVE_ALIGN>::with_capacity(archive.len());
        aligned.extend_from_slice(archive);
        rkyv::from_bytes::<T, rancor::Error>(&aligned)
    };
    decoded.map_err(|e| SnapshotError::Decode(e.to_string()))
}

/// A [`KeyedStore`] as a snapshot keeps it: its live rows in export order (module doc, "Stored
/// rows") and the bounds of the handles it handed out. A row is kept as its archive — the bytes
/// an arena record holds (`RowEncoder`'s) — so taking and restoring a snapshot copies bytes,
/// never decodes and re-encodes a row; the archives lie one after another in `archives`.
#[derive(Clone, Debug, Default, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct SavedStore {
    pub rows: Vec<SavedRow>,
    pub archives: Vec<u8>,
    pub issued: Vec<RowHandle>,
}

/// One stored row of a [`SavedStore`]: the handle the operator's timers name it by, its matched
/// flag and the length of its archive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct SavedRow {
    pub handle: RowHandle,
    pub len: u32,
    pub matched: bool,
}

impl SavedStore {
    /// About the bytes its archive takes.
    pub fn bytes(&self) -> usize {
        self.archives.len() + self.rows.len() * std::mem::size_of::<SavedRow>() + self.issued.len() * 8
    }

    /// Each row's handle, matched flag and archive, in order. [`check_store`] has made sure the
    /// lengths add up; a store that does not stops early (and `import` then reports it).
    pub fn iter(&self) -> impl Iterator<Item = (RowHandle, bool, &[u8])> + '_ {
        let mut at = 0usize;
        self.rows.iter().map_while(move |row| {
            let archive = self.archives.get(at..at.checked_add(row.len as usize)?)?;
            at += row.len as usize;
            Some((row.handle, row.matched, archive))
        })
    }
}

/// Every live row of `store` and the bounds of its handles.
pub fn save_store(store: &dyn KeyedStore) -> Result<SavedStore, SnapshotError> {
    let mut saved = SavedStore {
        rows: Vec::with_capacity(store.rows()),
        archives: Vec::with_capacity(store.bytes()),
        issued: store.handles_issued(),
    };
    store
        .export(&mut |handle, matched, archive| {
            saved.rows.push(SavedRow { handle, len: archive.len() as u32, matched });
            saved.archives.extend_from_slice(archive);
        })
        .map_err(|e| SnapshotError::Encode(e.to_string()))?;
    Ok(saved)
}

/// Checks that `saved` can be imported into `store`: the store is empty (a freshly built
/// instance's), the archives' lengths add up, and the handles are distinct and such as a store
/// hands out (not `u64::MAX`, so a store can count on past every one). Each archive is checked
/// as it is imported.
pub fn check_store(store: &dyn KeyedStore, saved: &SavedStore) -> Result<(), SnapshotError> {
    if store.rows() > 0 {
        return Err(SnapshotError::Mismatch {
            expected: "a freshly built instance (empty stores)".into(),
            found: format!("a store holding {} rows", store.rows()),
        });
    }
    let lengths: u64 = saved.rows.iter().map(|r| u64::from(r.len)).sum();
    if lengths != saved.archives.len() as u64 {
        return Err(SnapshotError::Decode(format!(
            "stored rows of {lengths} bytes in {} bytes of archives",
            saved.archives.len()
        )));
    }
    if saved.issued.contains(&RowHandle::MAX) {
        return Err(SnapshotError::Decode("stored row handle out of range".into()));
    }
    // Sorted rather than hashed: a restart checks hundreds of thousands of handles. The
    // greatest comes last, so one look tells whether any is out of range.
    let mut handles: Vec<RowHandle> = saved.rows.iter().map(|r| r.handle).collect();
    handles.sort_unstable();
    if handles.last() == Some(&RowHandle::MAX) {
        return Err(SnapshotError::Decode("stored row handle out of range".into()));
    }
    if let Some(pair) = handles.windows(2).find(|pair| pair[0] == pair[1]) {
        return Err(SnapshotError::Decode(format!("two stored rows with handle {:#x}", pair[0])));
    }
    Ok(())
}

/// Imports what [`check_store`] accepted; an archive that is not a row is an error, and the
/// store, half filled, is then to be dropped with the instance it belongs to.
pub fn load_store(store: &mut dyn KeyedStore, saved: &SavedStore) -> Result<(), SnapshotError> {
    store.import(saved)
}

/// Copies `archive` (any alignment) into `scratch` and reads it as a row, checked.
pub fn access_row<'a>(
    scratch: &'a mut AlignedVec<16>,
    archive: &[u8],
) -> Result<&'a crate::record::ArchivedRow, SnapshotError> {
    scratch.clear();
    scratch.extend_from_slice(archive);
    crate::record::frame::access(scratch).map_err(|e| SnapshotError::Decode(format!("a stored row: {e}")))
}

/// [`SnapshotError::Mismatch`] unless `found == expected` (a count: inputs, slots, aggregates).
pub fn expect_len(what: &str, expected: usize, found: usize) -> Result<(), SnapshotError> {
    if expected == found {
        return Ok(());
    }
    Err(SnapshotError::Mismatch { expected: format!("{expected} {what}"), found: format!("{found} {what}") })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
    struct Sample {
        a: u64,
        b: Vec<(i128, bool)>,
    }

    #[test]
    fn the_archive_in_a_vec_is_the_aligned_one_byte_for_byte() {
        // i128 fields need 16-byte alignment: padding is where the two could differ.
        let sample = Sample { a: 7, b: (0..100).map(|i| (i128::from(i) << 70, i % 3 == 0)).collect() };
        let aligned = encode_after(&sample, AlignedVec::new()).unwrap();
        let in_vec = encode_sized(&sample, 0).unwrap();
        assert_eq!(in_vec, aligned.as_slice());
        assert_eq!(decode::<Sample>(&in_vec).unwrap(), sample);
        // Read from a misaligned copy too.
        let mut shifted = vec![0u8; 1];
        shifted.extend_from_slice(&in_vec);
        assert_eq!(decode::<Sample>(&shifted[1..]).unwrap(), sample);
    }

    #[test]
    fn round_trip_and_damage_is_an_error() {
        let sample = Sample { a: 7, b: vec![(-3, true), (i128::MAX, false)] };
        let bytes = encode(&sample).unwrap();
        assert_eq!(decode::<Sample>(&bytes).unwrap(), sample);
        for shift in 1..16 {
            let mut shifted = vec![0u8; shift];
            shifted.extend_from_slice(&bytes);
            assert_eq!(decode::<Sample>(&shifted[shift..]).unwrap(), sample, "read at an offset of {shift}");
        }
        for len in 0..bytes.len() {
            assert!(decode::<Sample>(&bytes[..len]).is_err(), "truncated to {len}");
        }
        for at in 0..bytes.len() {
            for bit in [0x01, 0x80] {
                let mut damaged = bytes.clone();
                damaged[at] ^= bit;
                assert!(decode::<Sample>(&damaged).is_err(), "bit {bit:#x} of byte {at} flipped");
            }
        }
    }

    fn row(key: &str, ts: i64) -> crate::record::Row {
        let key = crate::record::Key::Str(key.into());
        let key_hash = crate::record::id::key_hash(&key);
        crate::record::Row { ts, key, key_hash, id: ts as u64, values: Box::new([crate::record::Value::Int(ts)]) }
    }

    /// Rows come back under their handles, in each key's order, matched flags kept; the store
    /// hands out greater handles afterwards, past those of rows removed before the snapshot too;
    /// a used store or repeated handles are refused.
    #[test]
    fn stored_rows_round_trip_through_both_stores() {
        use crate::record::frame::to_row;
        use crate::state::MemoryStore;
        use crate::state::arena::ArenaStore;
        let dir = tempfile::tempdir().unwrap();
        let mut memory_source = MemoryStore::default();
        let mut arena_source = ArenaStore::open(&dir.path().join("source")).unwrap();
        let sources: [&mut dyn KeyedStore; 2] = [&mut memory_source, &mut arena_source];
        for (s, source) in sources.into_iter().enumerate() {
            let handles: Vec<RowHandle> =
                (0..7).map(|i| source.insert(row(["a", "b"][i % 2], i as i64), i == 2)).collect();
            source.discard(row("a", 0).key_hash, handles[0]);
            source.discard(row("a", 0).key_hash, handles[6]);
            let saved = save_store(source).unwrap();
            assert_eq!(saved.rows.len(), 5);
            let by_key = |saved: &SavedStore, key: &str| -> Vec<(RowHandle, bool, i64)> {
                let mut scratch = AlignedVec::new();
                saved
                    .iter()
                    .map(|(handle, matched, archive)| {
                        (handle, matched, to_row(access_row(&mut scratch, archive).unwrap()))
                    })
                    .filter(|(_, _, r)| r.key == row(key, 0).key)
                    .map(|(handle, matched, r)| (handle, matched, r.ts))
                    .collect()
            };
            let a = by_key(&saved, "a");
            assert_eq!(a, [(handles[2], true, 2), (handles[4], false, 4)]);

            let mut memory = MemoryStore::default();
            let mut arena = ArenaStore::open(&dir.path().join(format!("restored{s}"))).unwrap();
            let stores: [&mut dyn KeyedStore; 2] = [&mut memory, &mut arena];
            for store in stores {
                check_store(store, &saved).unwrap();
                load_store(store, &saved).unwrap();
                let again = save_store(store).unwrap();
                assert_eq!((by_key(&again, "a"), by_key(&again, "b")), (a.clone(), by_key(&saved, "b")));
                let next = store.insert(row("a", 9), false);
                assert!(handles.iter().all(|&h| next > h), "{next:#x} after {handles:x?}");
                assert!(store.remove(row("a", 0).key_hash, handles[4]).is_some_and(|r| r.row.ts == 4));
                assert!(matches!(check_store(store, &saved), Err(SnapshotError::Mismatch { .. })));
            }
            let mut twice = saved.clone();
            twice.rows.push(saved.rows[0]);
            twice.archives.extend_from_slice(&saved.archives[..saved.rows[0].len as usize]);
            assert!(matches!(check_store(&MemoryStore::default(), &twice), Err(SnapshotError::Decode(_))));
            let mut short = saved.clone();
            short.archives.pop();
            assert!(matches!(check_store(&MemoryStore::default(), &short), Err(SnapshotError::Decode(_))));
            let mut damaged = saved.clone();
            damaged.archives[..saved.rows[0].len as usize].fill(0xFF);
            let mut memory = MemoryStore::default();
            check_store(&memory, &damaged).unwrap();
            assert!(matches!(load_store(&mut memory, &damaged), Err(SnapshotError::Decode(_))), "not a row");
        }
    }
}
