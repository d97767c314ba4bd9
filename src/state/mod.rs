//! Keyed operator state.
//!
//! Operators keep rows through the [`KeyedStore`] trait: insert a row under its key, scan a key,
//! mark rows matched (the matched flag of outer joins lives in the store so that recovery will
//! restore it), remove a row, count rows and bytes. Two backends implement it: the mmap arenas of
//! [`arena`] (DESIGN.md "State"), which survive a crash (`tests/it/crash_kill_9.rs`) and which every
//! shard of the runtime gives its interval joins, temporal joins and connects
//! ([`OperatorSpec::build_in`](crate::operator::OperatorSpec::build_in)), and [`MemoryStore`], for
//! `braid bench --memory-state`, the test oracle and unit tests. Scans hand out rows read in place
//! ([`RowView`]).
//!
//! Rows are grouped by the key's stable hash and compared by key value on every scan, so two keys
//! with the same hash never see each other's rows.

pub mod arena;
pub mod budget;
pub mod snapshot;
pub mod ttl;

use std::collections::{HashMap, VecDeque};

use rkyv::util::AlignedVec;

use self::snapshot::{SavedStore, SnapshotError};
use crate::record::frame::{FrameError, RowEncoder, to_row};
use crate::record::view::{KeyRef, RowView};
use crate::record::{ArchivedRow, Key, Row};

/// A map keyed by a key's stable hash ([`crate::record::id::key_hash`], xxh3): the hash is
/// already well mixed, so the map uses it as it is instead of hashing it again with SipHash.
/// Containers keep the capacity they grew to: after a burst or a lagging watermark held more
/// state than usual, the memory would stay at that high-water mark for the rest of the run. The
/// operators' timer queues and the arenas' indexes give it back once they hold less than a quarter
/// of it — all but room for twice what they hold, never below [`KEPT_CAPACITY`] entries — so a
/// container that grows again soon copies little (growth doubles, this halves at most once per
/// quartering). Large buffers are mappings of their own (ops/malloc.rs), so what is given back
/// leaves the process.
pub fn spare_capacity_released(capacity: usize, len: usize) -> Option<usize> {
    (capacity > KEPT_CAPACITY && capacity / 4 > len).then(|| (2 * len).max(KEPT_CAPACITY))
}

/// Entries a container keeps room for whatever it holds ([`spare_capacity_released`]).
pub const KEPT_CAPACITY: usize = 4096;

pub type ByKeyHash<V> = HashMap<u64, V, std::hash::BuildHasherDefault<KeyHashHasher>>;

/// The identity hasher of [`ByKeyHash`]: takes the one `u64` written to it.
#[derive(Default)]
pub struct KeyHashHasher(u64);

impl std::hash::Hasher for KeyHashHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `u64` keys are hashed with it; fold anything else in case.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

/// Names one stored row: unique within its store for the store's lifetime.
pub type RowHandle = u64;

/// A row removed from a store, with its matched flag.
#[derive(Debug)]
pub struct Removed {
    pub row: Row,
    pub matched: bool,
}

pub trait KeyedStore: Send {
    fn insert(&mut self, row: Row, matched: bool) -> RowHandle;
    /// Stores an archived row whose archive is `bytes` (a ring frame's row): an arena copies the
    /// bytes as they are; the in-memory store copies the row out.
    fn insert_archived(&mut self, row: &ArchivedRow, _bytes: &[u8], matched: bool) -> RowHandle {
        self.insert(to_row(row), matched)
    }
    /// Visits the rows stored under `key` in insertion order; a visit that returns true marks
    /// that row matched.
    fn scan_key(&mut self, key: KeyRef<'_>, key_hash: u64, visit: &mut dyn FnMut(RowView<'_>) -> bool);
    /// [`scan_key`](Self::scan_key) with an owned key.
    fn scan(&mut self, key: &Key, key_hash: u64, visit: &mut dyn FnMut(RowView<'_>) -> bool) {
        self.scan_key(key.key_ref(), key_hash, visit);
    }
    fn remove(&mut self, key_hash: u64, handle: RowHandle) -> Option<Removed>;
    /// Removes a row nobody needs any more; its matched flag, if it was there. An arena does not
    /// copy the row out for it.
    fn discard(&mut self, key_hash: u64, handle: RowHandle) -> Option<bool> {
        self.remove(key_hash, handle).map(|removed| removed.matched)
    }
    /// Removes a row, shown first to `visit` with its matched flag where it lies (an arena does
    /// not copy it out); false when it was not there.
    fn take(&mut self, key_hash: u64, handle: RowHandle, visit: &mut dyn FnMut(RowView<'_>, bool)) -> bool {
        let Some(removed) = self.remove(key_hash, handle) else { return false };
        visit(RowView::Heap(&removed.row), removed.matched);
        true
    }
    /// Visits the rows stored under `key` in insertion order with their handles, until `visit`
    /// returns false; for callers that pick one row to remove (connect's keyed state).
    fn scan_handles(&self, key: &Key, key_hash: u64, visit: &mut dyn FnMut(RowHandle, &Row) -> bool);
    /// Visits every live row with its handle, matched flag and archive (for a snapshot: the bytes
    /// [`RowEncoder`] writes, which an arena record holds as they are): the rows of one key hash
    /// in insertion order, so [`import`](Self::import) in the same order gives every key back its
    /// scan order; key hashes in no particular order. Fails only if a row kept on the heap does
    /// not encode.
    fn export(&self, visit: &mut dyn FnMut(RowHandle, bool, &[u8])) -> Result<(), FrameError>;
    /// [`export`](Self::export)'s rows in its order, with their archives' lengths instead of the
    /// archives: what a snapshot lists before it copies the archives (state/snapshot.rs
    /// `StoreView`). A store that knows the lengths without reading its rows says so here.
    fn export_lens(&self, visit: &mut dyn FnMut(RowHandle, bool, usize)) -> Result<(), FrameError> {
        self.export(&mut |handle, matched, archive| visit(handle, matched, archive.len()))
    }
    /// Bounds on every handle this store has handed out (for a snapshot): for each kind of
    /// handle it makes, the greatest it may have handed out so far.
    fn handles_issued(&self) -> Vec<RowHandle>;
    /// Gives back memory its index grew to and no longer needs ([`spare_capacity_released`]).
    fn release_spare_capacity(&mut self) {}
    /// Stores a snapshot's rows under the handles they carry (as [`export`](Self::export) visited
    /// them), each key hash's rows after those it has, in the order given; an archive that is not
    /// a row is an error (the store is then half filled, to be dropped). Handles the
    /// store hands out later equal none of these nor of `issued` (the snapshotted store's
    /// [`handles_issued`](Self::handles_issued): a handle an operator still holds for a row
    /// removed before the snapshot never names a later row) and compare greater, as if the
    /// restored rows had been inserted first (the temporal join takes handles for arrival order;
    /// an arena's rows kept in memory aside). The caller makes sure the handles are distinct and
    /// not in use ([`snapshot::check_store`]: into an empty store).
    fn import(&mut self, saved: &SavedStore) -> Result<(), SnapshotError>;
    fn rows(&self) -> usize;
    fn bytes(&self) -> usize;
    /// What the store costs the shard's state budget (state/budget.rs): its rows' bytes plus
    /// its index ([`index_bytes`]); an arena counts the segment files it maps instead of its
    /// records. O(1): read after every round.
    fn footprint(&self) -> usize;
    /// Visits every live row's (ts, id, key hash, handle), in no order (for `evict_oldest`).
    fn visit_ages(&self, visit: &mut dyn FnMut(i64, u64, u64, RowHandle));
    /// Whether the row `handle` is still stored.
    fn contains(&self, key_hash: u64, handle: RowHandle) -> bool;
    /// Hands `visit` row `handle`'s matched flag and archive (as [`export`](Self::export) does);
    /// false when it is not stored. For a delta snapshot's rows stored since the last one.
    fn export_row(
        &self,
        key_hash: u64,
        handle: RowHandle,
        visit: &mut dyn FnMut(bool, &[u8]),
    ) -> Result<bool, FrameError>;
    /// Row `handle`'s matched flag and the length of its archive, if it is stored (a delta lists
    /// its rows before it copies them). An arena answers from its index.
    fn stored_len(&self, key_hash: u64, handle: RowHandle) -> Option<(bool, usize)> {
        let mut found = None;
        self.export_row(key_hash, handle, &mut |matched, archive| found = Some((matched, archive.len()))).ok()?;
        found
    }
    /// Starts noting, from now on, which rows leave and which become matched
    /// ([`StoreChanges`]): a snapshot of this store was just taken.
    fn note_changes(&mut self);
    /// What [`note_changes`](Self::note_changes) noted since it was called; `None` when it
    /// never was, or the notes outgrew their bound (the next snapshot is then a whole one).
    fn changes(&self) -> Option<&StoreChanges>;
}

/// What a store noted since its last snapshot, for the next one to name only what changed
/// (state/snapshot.rs, "Deltas"): the handles of rows that left and of rows that became
/// matched. (Rows stored since are named by their operator, which knows what it stored.) Notes
/// cost a push per row that leaves; past twice the rows the store held when noting began (at
/// least [`KEPT_CAPACITY`]) they are dropped and noting stops, so a store whose snapshots
/// stopped coming (checkpoints off, a long interval) does not grow them without bound.
#[derive(Debug, Default)]
pub struct StoreChanges {
    noting: bool,
    bound: usize,
    pub removed: Vec<RowHandle>,
    pub matched: Vec<RowHandle>,
}

impl StoreChanges {
    /// Notes afresh, for a store of `rows` rows.
    pub fn restart(&mut self, rows: usize) {
        self.noting = true;
        self.bound = (2 * rows).max(KEPT_CAPACITY);
        self.removed.clear();
        self.matched.clear();
    }

    /// Row `handle` left the store.
    #[inline]
    pub fn removed(&mut self, handle: RowHandle) {
        if self.noting {
            self.removed.push(handle);
            self.check_bound();
        }
    }

    /// Row `handle` became matched.
    #[inline]
    pub fn matched(&mut self, handle: RowHandle) {
        if self.noting {
            self.matched.push(handle);
            self.check_bound();
        }
    }

    fn check_bound(&mut self) {
        if self.removed.len() + self.matched.len() > self.bound {
            *self = StoreChanges::default();
        }
    }

    /// The notes, if they are whole.
    pub fn noted(&self) -> Option<&StoreChanges> {
        self.noting.then_some(self)
    }
}

/// Bytes of a row's index entry in [`MemoryStore`] (the arena's are its own `ENTRY_BYTES`).
pub const INDEX_ENTRY_BYTES: usize = 32;

/// The shape of an index, for [`index_bytes_of`]: each key takes `key_bytes` with room for
/// `entries_per_key` entries in them, and every entry beyond those `entry_bytes`.
pub struct IndexShape {
    pub key_bytes: usize,
    pub entries_per_key: usize,
    pub entry_bytes: usize,
}

/// Heap bytes of an index of `keys` key hashes holding `rows` row entries. An estimate of the
/// allocations, not of the allocator's overhead.
pub fn index_bytes_of(keys: usize, rows: usize, shape: IndexShape) -> usize {
    keys * shape.key_bytes + rows.saturating_sub(keys * shape.entries_per_key) * shape.entry_bytes
}

/// [`index_bytes_of`] for a hash-map slot and a deque per key (its first allocation: 4 entries).
pub fn index_bytes(keys: usize, rows: usize) -> usize {
    const KEY: usize = std::mem::size_of::<(u64, VecDeque<u64>)>() + 1 + 4 * INDEX_ENTRY_BYTES;
    index_bytes_of(keys, rows, IndexShape { key_bytes: KEY, entries_per_key: 4, entry_bytes: INDEX_ENTRY_BYTES })
}

struct Entry {
    handle: RowHandle,
    row: Row,
    matched: bool,
}

/// Rows in memory, grouped by key hash.
#[derive(Default)]
pub struct MemoryStore {
    by_hash: ByKeyHash<VecDeque<Entry>>,
    next_handle: RowHandle,
    rows: usize,
    bytes: usize,
    changes: StoreChanges,
}

impl KeyedStore for MemoryStore {
    fn insert(&mut self, row: Row, matched: bool) -> RowHandle {
        let handle = self.next_handle;
        self.next_handle += 1;
        self.rows += 1;
        self.bytes += row.size_bytes();
        self.by_hash.entry(row.key_hash).or_default().push_back(Entry { handle, row, matched });
        handle
    }

    fn scan_key(&mut self, key: KeyRef<'_>, key_hash: u64, visit: &mut dyn FnMut(RowView<'_>) -> bool) {
        let Some(entries) = self.by_hash.get_mut(&key_hash) else { return };
        for entry in entries.iter_mut().filter(|e| e.row.key.key_ref() == key) {
            if visit(RowView::Heap(&entry.row)) && !entry.matched {
                entry.matched = true;
                self.changes.matched(entry.handle);
            }
        }
    }

    fn remove(&mut self, key_hash: u64, handle: RowHandle) -> Option<Removed> {
        let entries = self.by_hash.get_mut(&key_hash)?;
        let at = entries.iter().position(|e| e.handle == handle)?;
        // Rows usually leave in arrival order: the first of the key, O(1) in a deque.
        let Entry { row, matched, .. } = entries.remove(at)?;
        if entries.is_empty() {
            self.by_hash.remove(&key_hash);
        }
        self.rows -= 1;
        self.bytes -= row.size_bytes();
        self.changes.removed(handle);
        Some(Removed { row, matched })
    }

    fn scan_handles(&self, key: &Key, key_hash: u64, visit: &mut dyn FnMut(RowHandle, &Row) -> bool) {
        let Some(entries) = self.by_hash.get(&key_hash) else { return };
        for entry in entries.iter().filter(|e| e.row.key == *key) {
            if !visit(entry.handle, &entry.row) {
                return;
            }
        }
    }

    fn export(&self, visit: &mut dyn FnMut(RowHandle, bool, &[u8])) -> Result<(), FrameError> {
        let mut encoder = RowEncoder::new();
        for entries in self.by_hash.values() {
            for entry in entries {
                visit(entry.handle, entry.matched, encoder.encode(&entry.row)?);
            }
        }
        Ok(())
    }

    fn handles_issued(&self) -> Vec<RowHandle> {
        self.next_handle.checked_sub(1).into_iter().collect()
    }

    fn import(&mut self, saved: &SavedStore) -> Result<(), SnapshotError> {
        // `check_store` refuses `RowHandle::MAX`: the next handle does not overflow.
        for &handle in saved.issued.iter().chain(saved.rows.iter().map(|r| &r.handle)) {
            self.next_handle = self.next_handle.max(handle.saturating_add(1));
        }
        let mut scratch = AlignedVec::new();
        for (handle, matched, archive) in saved.iter() {
            let row = to_row(snapshot::access_row(&mut scratch, archive)?);
            self.rows += 1;
            self.bytes += row.size_bytes();
            self.by_hash.entry(row.key_hash).or_default().push_back(Entry { handle, row, matched });
        }
        Ok(())
    }

    fn rows(&self) -> usize {
        self.rows
    }

    fn bytes(&self) -> usize {
        self.bytes
    }

    fn footprint(&self) -> usize {
        self.bytes + index_bytes(self.by_hash.len(), self.rows)
    }

    fn visit_ages(&self, visit: &mut dyn FnMut(i64, u64, u64, RowHandle)) {
        for (&key_hash, entries) in &self.by_hash {
            for entry in entries {
                visit(entry.row.ts, entry.row.id, key_hash, entry.handle);
            }
        }
    }

    fn contains(&self, key_hash: u64, handle: RowHandle) -> bool {
        self.by_hash.get(&key_hash).is_some_and(|entries| entries.iter().any(|e| e.handle == handle))
    }

    fn export_row(
        &self,
        key_hash: u64,
        handle: RowHandle,
        visit: &mut dyn FnMut(bool, &[u8]),
    ) -> Result<bool, FrameError> {
        let entry = self.by_hash.get(&key_hash).and_then(|entries| entries.iter().rev().find(|e| e.handle == handle));
        let Some(entry) = entry else { return Ok(false) };
        visit(entry.matched, RowEncoder::new().encode(&entry.row)?);
        Ok(true)
    }

    fn note_changes(&mut self) {
        self.changes.restart(self.rows);
    }

    fn changes(&self) -> Option<&StoreChanges> {
        self.changes.noted()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Value;

    fn row(key: &str, hash: u64, ts: i64) -> Row {
        Row { ts, key: Key::Str(key.into()), key_hash: hash, id: ts as u64, values: Box::new([Value::Int(ts)]) }
    }

    /// Notes begin with a snapshot, name removals and new matches, and stop once they outgrow
    /// their bound (the next snapshot is then whole).
    #[test]
    fn changes_are_noted_from_a_snapshot_and_dropped_past_their_bound() {
        let mut store = MemoryStore::default();
        let handles: Vec<RowHandle> = (0..3).map(|i| store.insert(row("a", 1, i), false)).collect();
        assert!(store.changes().is_none(), "nothing noted before a snapshot");
        store.note_changes();
        store.scan_key(Key::Str("a".into()).key_ref(), 1, &mut |r| r.ts() == 1);
        store.scan_key(Key::Str("a".into()).key_ref(), 1, &mut |r| r.ts() == 1);
        store.remove(1, handles[2]);
        let changes = store.changes().unwrap();
        assert_eq!((&changes.removed[..], &changes.matched[..]), (&[handles[2]][..], &[handles[1]][..]));
        for i in 0..KEPT_CAPACITY as i64 {
            let handle = store.insert(row("b", 2, i), false);
            store.remove(2, handle);
        }
        assert!(store.changes().is_none(), "past {KEPT_CAPACITY} notes");
        store.note_changes();
        assert!(store.changes().is_some_and(|c| c.removed.is_empty()), "noted afresh at the next snapshot");
    }

    #[test]
    fn scan_compares_key_values_not_hashes() {
        let mut store = MemoryStore::default();
        store.insert(row("a", 7, 1), false);
        let b = store.insert(row("b", 7, 2), false);
        let mut seen = Vec::new();
        store.scan(&Key::Str("b".into()), 7, &mut |r| {
            seen.push(r.ts());
            true
        });
        assert_eq!(seen, [2]);
        assert_eq!(store.rows(), 2);
        let removed = store.remove(7, b).unwrap();
        assert!(removed.matched);
        assert_eq!(store.rows(), 1);
        assert!(store.remove(7, b).is_none());
        let a_bytes = row("a", 7, 1).size_bytes();
        assert_eq!(store.bytes(), a_bytes);
    }

    #[test]
    fn scan_handles_names_rows_in_insertion_order_and_stops() {
        let mut store = MemoryStore::default();
        let first = store.insert(row("a", 7, 1), false);
        store.insert(row("b", 7, 2), false);
        let third = store.insert(row("a", 7, 3), false);
        let mut seen = Vec::new();
        store.scan_handles(&Key::Str("a".into()), 7, &mut |handle, r| {
            seen.push((handle, r.ts));
            true
        });
        assert_eq!(seen, [(first, 1), (third, 3)]);
        seen.clear();
        store.scan_handles(&Key::Str("a".into()), 7, &mut |handle, r| {
            seen.push((handle, r.ts));
            false
        });
        assert_eq!(seen, [(first, 1)]);
        assert_eq!(store.remove(7, third).map(|r| r.row.ts), Some(3));
    }
}
