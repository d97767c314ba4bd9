//! The mmap arena: a [`KeyedStore`] whose rows live in segment files (DESIGN.md "State").
//!
//! One [`ArenaStore`] per shard and per operator state (the caller picks the directory, e.g.
//! `state_dir/shard-0/interval-join-effect-left/`). Rows are appended, as rkyv archives, to
//! small fixed-size segment files; an in-memory index maps each key hash to its rows in insertion
//! order; the matched flag of outer joins and the dead flag of removed rows are bytes in the
//! record, written in place, so a restart finds the state as it was: recovery is a scan of the
//! segments, not a replay.
//!
//! # Files
//!
//! A store is a directory of segment files `seg-NNNNNN.arena` (256 KiB by default,
//! [`ArenaConfig::segment_bytes`]), each a [segment log](crate::storage::log) with the arena's
//! format in a [`MappedFile`](crate::storage::MappedFile) (magic `braidarn`, version 1: locked,
//! preallocated, header-checked; storage/mapped_file.rs has the soundness argument, storage/log.rs
//! the walk and the recovery rule shared with the spool).
//! Other files in the directory are ignored. The number in a name only tells the files apart; the
//! order of the segments is the sequence number in their header (a recycled file keeps its name and
//! gets a new number).
//!
//! ```text
//! file:     [MappedFile header 64 B][segment header 64 B][record][record]…[0 × 16: end mark]
//! segment header (64 B, little endian): seq u64 | reserved [u8; 52] (zero) | crc32c of 0..60 u32
//! record:   [header 32 B][payload: the row's rkyv archive, `len` bytes][zero padding to 16]
//! record header (32 B, little endian):
//!   0  len      u32   payload length (the record takes 32 + len rounded up to 16 bytes)
//!   4  crc      u32   crc32c of seq (u32, the segment's) ‖ bytes 0..4 ‖ bytes 16..32 ‖ payload
//!   8  matched  u8    0 or 1, written in place by `scan`
//!   9  dead     u8    0 or 1, written in place by `remove`
//!   10 zero     [u8; 6]
//!   16 key hash u64   the row's key hash (also inside the archive; recovery checks they agree)
//!   24 ts       i64   the row's event time: segment-level TTL can read it without the archive
//! ```
//!
//! - **Alignment.** The data area is 16-aligned (`MappedFile::data_ptr`), the segment header is
//!   64 bytes and every record a multiple of 16, so every payload starts 16-byte aligned, which
//!   is what [`frame::access`] checks and rkyv needs.
//! - **The crc does not cover the flags.** Marking a row matched or dead is one byte written in
//!   place, with no crc to recompute: a flag is either written or not, never torn. The price: a
//!   flag damaged into another 0/1 value goes unnoticed (one damaged into anything else drops the
//!   record). The crc covers the segment's sequence number, so a record left over from a
//!   recycled file's earlier life never passes as a record of its current one.
//! - **End mark.** Each append zeroes the 16 bytes after its record (when there is room); a zero
//!   length ends a segment. Fresh files are zeroed; a reused one gets its first end mark when it
//!   is reset. So a walk never reads past the last record written, except around damage.
//! - **Numbers.** The gateway `command` row (frame.rs) is a 184-byte payload: a 224-byte record,
//!   1.22× its payload (DESIGN.md's memory target allows 1.5×), 1 169 of them in a 256 KiB
//!   segment. A row of more than `segment_bytes − 176` bytes of payload gets a segment of its own
//!   (below).
//!
//! # Index, handles, counts
//!
//! In memory: key hash → the rows with that hash in insertion order, each an entry of 24 bytes
//! (handle, where the record is and its payload's length, matched flag: a snapshot lists the rows
//! from the index alone, [`KeyedStore::export_lens`]); a key's first two entries lie in its hash-map slot
//! ([`key_rows`]), the rest in a deque. A row's [`RowHandle`] is `seq << 32 | offset`:
//! unique for the store's life and the same after a restart. A row restored from a snapshot
//! ([`KeyedStore::import`], into an empty store) is written to a new place but keeps the handle
//! the snapshot names it by, which the index holds apart from the place; the store first moves
//! its next segment number past every restored handle's, so no handle it makes later can equal
//! one of them (nor be smaller: handles keep arrival order).
//! Scans compare key values ([`Key`] equality against the archived key), never only hashes, so
//! two keys with the same hash never see each other's rows. [`rows`](KeyedStore::rows) counts
//! live rows and [`bytes`](KeyedStore::bytes) the bytes their records take in the arena (header
//! and padding included; a row kept in memory, below, counts its [`Row::size_bytes`]).
//!
//! `scan` hands `visit` a [`RowView`] row read in place: its event time and id cost nothing, and
//! a visitor copies the whole row out ([`frame::to_row`]) only when it needs it (the interval
//! join: for a pair). `scan_handles` and `remove` still copy the row out. Rows are read in place
//! without validation ([`frame::access_unchecked`], STYLE.md 8): this process wrote them, or
//! `open` validated them (crc and [`frame::access`]).
//!
//! # Appending, removing, recycling
//!
//! Rows go to the end of the active segment (the one with the highest sequence number); a row
//! that does not fit starts the next segment. A row larger than a segment of the configured size
//! gets a segment file of its own size (rounded up to a page, up to 1 GiB), which is never kept
//! as a spare: so the configured size can stay small — a store's mapped bytes beyond its live
//! rows are its active, its spare and its front segments, each of that size — and still take
//! the largest row a ring carries. `remove` sets the record's dead flag and drops its
//! index entry. A segment whose records are all dead, other than the active one, is recycled: it
//! is kept mapped as a spare ([`ArenaConfig::spare_segments`], 1 by default) and reset when a new
//! segment is needed, or else its file is deleted (unlinked while still mapped, then unmapped:
//! never truncated while mapped). With the usual time-ordered expiry, one spare means a
//! steady-state store creates no files and its pages stay in the page cache.
//!
//! # Scratch stores
//!
//! The shards' stores ([`ArenaConfig::scratch`]) are never recovered: `braid run` rebuilds its
//! state from the last checkpoint and the journal at every start (service/scratch.rs), and a
//! replay starts empty. For them the crc of each record would be work for a walk that never
//! comes (a sixth of the interval join's time over ring frames, `benches/interval_join_ring`).
//! So a scratch store's records carry no crc, its files have a magic of their own (`braidars`)
//! that nothing opens, and opening one deletes the segment files its directory holds instead of
//! reading them. Nor is a row's matched flag written into its record: the index entry holds it,
//! and that is what scans, snapshots and compaction read. Layout, the dead flag, recycling and
//! compaction are the same.
//!
//! # Compaction
//!
//! A segment is freed only when all its records are dead, so a few long-lived rows (a key that
//! stays while a flood of new keys comes and goes) could pin any number of mostly-dead segments.
//! A segment other than the active one whose live records take less than a quarter of its data
//! bytes is *sparse*. Once more than two segments are sparse, the oldest one's live records are
//! moved to the end of the active segment (copied as bytes, with their matched flags) and marked
//! dead where they were, so the segment empties and is recycled. Two are left as they are because
//! rows usually leave in time order: the segment at the front of the expiry is sparse for a
//! while on its way to empty, and moving its last rows would copy up to a quarter of every row for
//! nothing. So at most two mostly-dead segments stay pinned.
//!
//! A moved row keeps its [`RowHandle`] and its place in its key's scan order: its index entry
//! stays where it is and only points at the new place, as for a restored row (below). Each byte is moved only when its segment has fallen under a quarter live, so a
//! compaction pass moves at most a quarter segment and frees a whole one.
//!
//! What a checkpoint names is not affected: a snapshot ([`KeyedStore::export`]) copies each
//! row's archive bytes with the handle from its index entry (state/snapshot.rs `SavedStore`),
//! never a segment or an offset, and restoring writes them anew into an empty store. What
//! compaction does change is the files: a store **reopened from its files** (recovery, below)
//! names a moved row by its new place and scans it after the rows appended before the move, and
//! a crash between the copy and the dead mark finds the row twice. `braid run` never reopens
//! arena files (its scratch is rebuilt from the checkpoint and the journal at every start), so
//! stores are opened compacting; [`ArenaStore::set_compaction`] turns it off for a store whose
//! files must give every row back exactly (the crash guarantee below then holds as written).
//!
//! A row larger than the largest segment, or a new segment that cannot be created (a full disk), is an
//! error of [`ArenaStore::try_insert`]. [`KeyedStore::insert`] has no error to return, and must
//! not drop the row (no silent loss) nor panic: it keeps such a row in memory instead, logs it
//! (a warning at the 1st, 2nd, 4th, 8th… such row) and counts it ([`ArenaStore::unsaved_rows`]);
//! it behaves like any other row but does not survive a restart, and its handle (top bit set)
//! is unique only until the store is reopened. A full disk is also reported as a failing write
//! site (storage/write_faults.rs: `/healthz`, metrics) until a segment can be created again.
//!
//! Why memory and not backpressure on the shard under a full disk: an arena's space comes back
//! only when its rows expire, and rows expire only as the watermark moves — holding the shard's
//! input would stop the very progress that frees the space (a deadlock for as long as the disk
//! stays full, with every other operator of the shard held too). In the service the arena is
//! scratch (rebuilt at every start from the last checkpoint and the journal), and a checkpoint
//! saves the rows kept in memory with the others, so they are not lost at a restart there;
//! what bounds their memory is the state budget, which counts them.
//!
//! # Recovery
//!
//! [`ArenaStore::open`] maps every segment file of the directory and walks them in sequence
//! order. A record is kept when its crc matches, its flags are 0 or 1, [`frame::access`] accepts
//! its payload and the payload's key hash equals the header's; dead records are skipped. The rest
//! is the segment log's one rule (storage/log.rs, "Recovery", shared with the spool): a damaged
//! record followed by an intact one is skipped and reported (counted in
//! [`Recovery::damaged_records`], logged), and the walk goes on after it; a torn last record — a
//! crash in the middle of an append — is cut (counted too), and the next append overwrites it. The index is
//! rebuilt with the matched flags as stored and the same handles; the active segment is the one
//! with the highest sequence number; all-dead segments are recycled. The walk reads with `pread`:
//! an unreadable block is an error of `open` (EIO), never SIGBUS — `braid run` rebuilds its arenas
//! at every start, so nothing here is quarantined (storage/quarantine.rs is for the state a
//! restart reads).
//!
//! Guaranteed (with compaction off; above): after a process crash or `kill -9` — anything that leaves the page cache alone —
//! every row whose `insert` returned is back with its key, handle and matched flag, every
//! `remove` that returned stays removed, and no row comes back that was never inserted. A
//! half-done insert, mark or remove at the moment of the crash is either done or not.
//!
//! Not guaranteed: a power loss or kernel crash loses what the kernel had not written back — rows,
//! marks and removes alike, so a removed row can come back ([`ArenaStore::sync`] is
//! `msync(MS_SYNC)` of every segment, for `durability = "power"` at a checkpoint); rows kept in
//! memory (above) are gone; a segment whose header is damaged is treated as holding nothing
//! (logged); truncating the store back to a checkpoint is the checkpoint's work (it can use
//! [`ArenaStore::high_water`]), and until it exists a restart resumes from the state at the crash,
//! not from a checkpoint.

mod key_rows;
mod segment;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use thiserror::Error;

use self::key_rows::KeyRows;
use self::segment::{OpenError, RECORD_HEADER, SEGMENT_HEADER, Segment, record_size};
use super::snapshot::{self, SavedStore, SnapshotError};
use super::{KeyedStore, Removed, RowHandle};
use crate::record::frame::{self, FrameError, RowEncoder};
use crate::record::view::{KeyRef, RowView};
use crate::record::{ArchivedRow, Key, Row};
use crate::storage::log::END_MARK;
use crate::storage::mapped_file::{HEADER_LEN, MappedFileError};
use crate::storage::write_faults;
use crate::storage::{Mmap, Storage};

/// How an arena's failed segment creations are reported (storage/write_faults.rs). Why rows
/// then wait in memory rather than hold the shard: module doc, "Appending".
const ARENA_SITE: &str = "arena";
const ARENA_MEANWHILE: &str =
    "new rows are kept in memory (in the next checkpoint like the others) until a segment can be made";

/// Sequence numbers run from 1 to this; handles of rows kept in memory have the top bit set.
const MAX_SEQ: u32 = (1 << 31) - 1;
const MEMORY_HANDLE: RowHandle = 1 << 63;
/// A segment whose live records take less than this fraction (numerator, denominator) of its
/// data bytes is compacted (module doc, "Compaction").
const COMPACT_BELOW: (usize, usize) = (1, 4);

/// Sparse segments left as they are before the oldest is compacted (module doc, "Compaction").
const SPARSE_KEPT: usize = 2;
/// `Segments::active` when no segment takes rows: the next append starts one.
const NO_SEGMENT: u32 = u32::MAX;
/// The largest segment file, headers included: the configured size's bound, and an oversized
/// segment's (module doc, "Appending, removing, recycling").
const MAX_SEGMENT_BYTES: usize = 1 << 30;

#[derive(Clone, Debug)]
pub struct ArenaConfig {
    /// Size of each new segment file, headers included: a multiple of 4096 from 4 KiB to 1 GiB.
    pub segment_bytes: usize,
    /// All-dead segments kept for reuse instead of deleted.
    pub spare_segments: usize,
    /// A restart can find the rows in the files (module doc, "Recovery"); false for a scratch
    /// store (module doc, "Scratch stores").
    pub recoverable: bool,
}

impl Default for ArenaConfig {
    fn default() -> Self {
        ArenaConfig { segment_bytes: 256 << 10, spare_segments: 1, recoverable: true }
    }
}

impl ArenaConfig {
    /// The default sizes for a scratch store.
    pub fn scratch() -> ArenaConfig {
        ArenaConfig { recoverable: false, ..ArenaConfig::default() }
    }

    fn data_len(&self) -> usize {
        self.segment_bytes - HEADER_LEN
    }

    /// The largest record a new segment of the configured size holds.
    fn max_record(&self) -> usize {
        self.data_len() - SEGMENT_HEADER
    }

    /// The data bytes of a new segment for a record of `size` bytes: the configured size, or for
    /// a record that does not fit it, a segment of its own, rounded up to a page.
    fn data_len_for(&self, size: usize) -> Result<usize, ArenaError> {
        if size + END_MARK <= self.max_record() {
            return Ok(self.data_len());
        }
        let file_bytes = (HEADER_LEN + SEGMENT_HEADER + size + END_MARK).next_multiple_of(4096);
        if file_bytes > MAX_SEGMENT_BYTES {
            let max = MAX_SEGMENT_BYTES - HEADER_LEN - SEGMENT_HEADER - END_MARK;
            return Err(ArenaError::RowTooLarge { bytes: size, max });
        }
        Ok(file_bytes - HEADER_LEN)
    }
}

#[derive(Debug, Error)]
pub enum ArenaError {
    #[error(transparent)]
    File(#[from] MappedFileError),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("arena segment size {0} must be a multiple of 4096 from 4 KiB to 1 GiB")]
    BadConfig(usize),
    /// This row can never be stored in an arena: larger than the largest segment file.
    #[error("row of {bytes} bytes (as a record) is larger than an arena segment holds ({max} bytes)")]
    RowTooLarge { bytes: usize, max: usize },
    #[error(transparent)]
    Encode(#[from] FrameError),
    /// The directory holds files this arena cannot have written; it refuses to guess.
    #[error("arena {path}: {reason}")]
    Damaged { path: PathBuf, reason: String },
    #[error("arena {0}: segment sequence numbers exhausted")]
    Exhausted(PathBuf),
}

/// What [`ArenaStore::open`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recovery {
    pub segments: usize,
    pub rows: usize,
    /// Records dropped because they failed their checks (torn or damaged).
    pub damaged_records: usize,
    /// Segment files whose segment header was damaged (their records were not read).
    pub damaged_segments: usize,
}

/// Where the next record goes: segment sequence number and data offset. Everything appended so
/// far lies before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct HighWater {
    pub seq: u32,
    pub offset: u32,
}

/// Where a row lies, and its matched flag: the flag sits in each variant, in the byte after the
/// tag, so a place is 16 bytes and an entry 24 (as a field of the entry it made entries 32 and
/// a key's map slot 104 bytes, not 88: the indexes are the largest part of `braid run`'s private
/// memory at 10 k devices, BENCHMARKS.md "State in less memory").
enum Place {
    /// `len`: the row's archive's bytes (its record's are [`record_size`] of it), so neither a
    /// row leaving nor a snapshot listing the rows needs to read the record's header.
    Arena {
        slot: u32,
        off: u32,
        len: u32,
        matched: bool,
    },
    Memory {
        row: Box<Row>,
        matched: bool,
    },
}

struct Entry {
    handle: RowHandle,
    place: Place,
}

impl Entry {
    fn in_arena(handle: RowHandle, matched: bool, slot: u32, off: usize, len: usize) -> Entry {
        Entry { handle, place: Place::Arena { slot, off: off as u32, len: len as u32, matched } }
    }

    fn matched(&self) -> bool {
        match self.place {
            Place::Arena { matched, .. } | Place::Memory { matched, .. } => matched,
        }
    }

    fn set_matched(&mut self, to: bool) {
        match &mut self.place {
            Place::Arena { matched, .. } | Place::Memory { matched, .. } => *matched = to,
        }
    }
}

/// Rows whose records [`ArenaStore::export`] looks up before it hands the first of them over.
const EXPORT_BATCH: usize = 16;

/// An index entry's bytes on 64-bit targets, as `key_rows::index_bytes` counts it; in a key's
/// map slot (`Option<Entry>`, the tag's niche) as in its deque.
pub(super) const ENTRY_BYTES: usize = 24;
const _: () = assert!(std::mem::size_of::<Entry>() == ENTRY_BYTES);
const _: () = assert!(std::mem::size_of::<Option<Entry>>() == ENTRY_BYTES);

/// The segment files of a store.
struct Segments {
    dir: PathBuf,
    storage: Arc<dyn Storage>,
    config: ArenaConfig,
    /// Index entries name segments by slot; a recycled segment leaves its slot empty.
    slots: Vec<Option<Segment>>,
    free_slots: Vec<u32>,
    active: u32,
    spares: Vec<Segment>,
    /// The segment that was active until the last append started a new one: it may already be
    /// mostly dead (rows removed while it took rows), and no later remove may come to look.
    left_active: Option<u32>,
    next_seq: u32,
    next_number: u32,
}

/// Keys whose rows all left keep their slot (their deque already gone: `KeyRows::remove`) while
/// the emptied keys number at most the keys with rows plus this many: then they are dropped in one
/// pass, so the index holds at most twice the live keys plus this.
const EMPTY_KEYS_KEPT: usize = 1024;

/// A keyed store in mmap segment files (module doc).
pub struct ArenaStore {
    segments: Segments,
    index: super::ByKeyHash<KeyRows>,
    /// Keys of `index` without entries. A key whose rows come and go (one row in the window at a
    /// time) keeps its slot, where taking it out and putting it back would cost a map removal and
    /// an insertion per row ([`EMPTY_KEYS_KEPT`]).
    empty_keys: usize,
    encoder: RowEncoder,
    rows: usize,
    bytes: usize,
    next_memory_handle: RowHandle,
    unsaved_rows: usize,
    /// Bytes of the rows kept in memory ([`Row::size_bytes`]): part of `bytes`, on the heap.
    memory_bytes: usize,
    /// A moved record's payload on its way (compaction copies out of the map it appends to).
    moving: Vec<u8>,
    /// Mostly-dead segments are compacted (on unless [`set_compaction`](Self::set_compaction)).
    compact: bool,
    /// Slots of segments found sparse and not compacted yet (at most [`SPARSE_KEPT`] after a call).
    sparse: Vec<u32>,
    compactions: usize,
    moved_rows: usize,
    recovery: Recovery,
    changes: super::StoreChanges,
}

impl ArenaStore {
    /// Opens the store in `dir` with the default configuration, creating it if needed.
    pub fn open(dir: &Path) -> Result<ArenaStore, ArenaError> {
        ArenaStore::open_with(dir, ArenaConfig::default())
    }

    /// Opens (or creates) the store in `dir`, recovering its rows (module doc, "Recovery").
    pub fn open_with(dir: &Path, config: ArenaConfig) -> Result<ArenaStore, ArenaError> {
        ArenaStore::open_on(Mmap::shared(), dir, config)
    }

    /// [`open_with`](Self::open_with) with the segment files on `storage` (tests inject faults
    /// with it).
    pub fn open_on(storage: Arc<dyn Storage>, dir: &Path, config: ArenaConfig) -> Result<ArenaStore, ArenaError> {
        let bytes = config.segment_bytes;
        if !bytes.is_multiple_of(4096) || !(4096..=MAX_SEGMENT_BYTES).contains(&bytes) {
            return Err(ArenaError::BadConfig(bytes));
        }
        let io = |source| ArenaError::Io { path: dir.to_owned(), source };
        std::fs::create_dir_all(dir).map_err(io)?;
        let mut numbers = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(io)? {
            let name = entry.map_err(io)?.file_name();
            if let Some(number) = name.to_str().and_then(parse_name) {
                numbers.push(number);
            }
        }
        if !config.recoverable {
            // A scratch store starts empty: whatever an earlier life left is not read.
            for number in numbers.drain(..) {
                let path = dir.join(file_name(number));
                std::fs::remove_file(&path).map_err(|source| ArenaError::Io { path, source })?;
            }
        }
        numbers.sort_unstable();

        let mut recovery = Recovery::default();
        let mut ordered = Vec::new();
        let mut unreadable = Vec::new();
        for &number in &numbers {
            let path = dir.join(file_name(number));
            match Segment::open(&*storage, &path) {
                Ok((segment, Some(seq))) => ordered.push((seq, segment)),
                Ok((segment, None)) => {
                    tracing::warn!(path = %path.display(), "Arena segment header damaged; its rows are dropped");
                    recovery.damaged_segments += 1;
                    unreadable.push(segment);
                }
                Err(OpenError::File(e)) => return Err(e.into()),
                Err(OpenError::BadLength(len)) => {
                    return Err(ArenaError::Damaged { path, reason: format!("segment data length {len}") });
                }
            }
        }
        ordered.sort_unstable_by_key(|(seq, _)| *seq);
        if let Some(pair) = ordered.windows(2).find(|pair| pair[0].0 == pair[1].0) {
            let reason = format!("two segments with sequence number {}", pair[0].0);
            return Err(ArenaError::Damaged { path: dir.to_owned(), reason });
        }

        let mut store = ArenaStore {
            segments: Segments {
                dir: dir.to_owned(),
                storage,
                config,
                slots: Vec::new(),
                free_slots: Vec::new(),
                active: NO_SEGMENT, // set below, once the segments are in their slots
                spares: Vec::new(),
                left_active: None,
                next_seq: ordered.last().map_or(1, |(seq, _)| seq + 1),
                next_number: numbers.last().map_or(1, |n| n.saturating_add(1)),
            },
            index: Default::default(),
            empty_keys: 0,
            encoder: RowEncoder::new(),
            rows: 0,
            bytes: 0,
            next_memory_handle: MEMORY_HANDLE,
            unsaved_rows: 0,
            memory_bytes: 0,
            moving: Vec::new(),
            compact: true,
            sparse: Vec::new(),
            compactions: 0,
            moved_rows: 0,
            recovery: Recovery::default(),
            changes: super::StoreChanges::default(),
        };
        let last = ordered.len().checked_sub(1);
        for (i, (_, mut segment)) in ordered.into_iter().enumerate() {
            let slot = store.segments.slots.len() as u32;
            let seq = segment.seq;
            let (index, rows, bytes) = (&mut store.index, &mut store.rows, &mut store.bytes);
            let walk = segment.walk(|off, len, matched, row| {
                let handle = u64::from(seq) << 32 | off as u64;
                // A fresh index has no emptied keys: no count to keep.
                index
                    .entry(row.key_hash.to_native())
                    .or_default()
                    .push_back(Entry::in_arena(handle, matched, slot, off, len));
                *rows += 1;
                *bytes += record_size(len);
            })?;
            if walk.damaged > 0 {
                tracing::warn!(path = %segment.path().display(), records = walk.damaged, "Arena records damaged; dropped");
            }
            recovery.damaged_records += walk.damaged;
            recovery.segments += 1;
            store.segments.slots.push(Some(segment));
            if Some(i) == last {
                store.segments.active = slot;
            } else {
                store.segments.recycle_if_dead(slot);
            }
        }
        for segment in unreadable {
            store.segments.retire(segment);
        }
        if last.is_none() {
            let segment = store.segments.next_segment(0)?;
            store.segments.active = store.segments.install(segment);
        }
        recovery.rows = store.rows;
        store.recovery = recovery;
        Ok(store)
    }

    /// Stores `row` in the arena; fails (storing nothing) when it cannot.
    pub fn try_insert(&mut self, row: &Row, matched: bool) -> Result<RowHandle, ArenaError> {
        let payload = self.encoder.encode(row)?;
        let len = payload.len();
        let size = record_size(len);
        let (slot, off, handle) = self.segments.append(payload, size, row.key_hash, row.ts, matched)?;
        Ok(self.indexed(slot, off, len, row.key_hash, matched, handle))
    }

    /// Stores a row archive as it is (`bytes`: exactly what [`RowEncoder`] wrote for a row
    /// with this key hash and event time — a ring frame's row, a snapshot's checked row) under
    /// `handle` when given (a restored row), else under the handle of its place. Inlined into
    /// `insert_archived`, a row's way in from a ring frame.
    #[inline(always)]
    fn append_indexed(
        &mut self,
        bytes: &[u8],
        key_hash: u64,
        ts: i64,
        matched: bool,
        handle: Option<RowHandle>,
    ) -> Result<RowHandle, ArenaError> {
        let size = record_size(bytes.len());
        let (slot, off, place_handle) = self.segments.append(bytes, size, key_hash, ts, matched)?;
        let handle = handle.unwrap_or(place_handle);
        Ok(self.indexed(slot, off, bytes.len(), key_hash, matched, handle))
    }

    /// Indexes a row just appended. Inlined, with [`entries_of`](Self::entries_of), into the
    /// two ways a row is appended, as `append_indexed` is into `insert_archived`: as calls, the
    /// three cost 34 instructions per row stored (benches/interval_join_ring).
    #[inline(always)]
    fn indexed(
        &mut self,
        slot: u32,
        off: usize,
        len: usize,
        key_hash: u64,
        matched: bool,
        handle: RowHandle,
    ) -> RowHandle {
        self.entries_of(key_hash).push_back(Entry::in_arena(handle, matched, slot, off, len));
        self.rows += 1;
        self.bytes += record_size(len);
        if let Some(left) = self.segments.left_active.take() {
            self.note_sparse(left);
        }
        handle
    }

    /// The index entries of `key_hash`, made if the key has none (counted if it was emptied).
    #[inline(always)]
    fn entries_of(&mut self, key_hash: u64) -> &mut KeyRows {
        use std::collections::hash_map::Entry as Slot;
        match self.index.entry(key_hash) {
            Slot::Occupied(slot) => {
                let entries = slot.into_mut();
                self.empty_keys -= usize::from(entries.is_empty());
                entries
            }
            Slot::Vacant(slot) => slot.insert(KeyRows::default()),
        }
    }

    /// Takes a row's index entry out (the row is then no longer counted).
    fn unindex(&mut self, key_hash: u64, handle: RowHandle) -> Option<Entry> {
        let entries = self.index.get_mut(&key_hash)?;
        let at = entries.position(handle)?;
        // Rows usually leave in arrival order (time-ordered expiry): the first of the key, which
        // `KeyRows` removes in O(1), so evicting a hot key's n rows is O(n), not O(n²).
        let entry = entries.remove(at)?;
        if entries.is_empty() {
            self.empty_keys += 1;
            let live_keys = self.index.len() - self.empty_keys;
            if self.empty_keys > live_keys + EMPTY_KEYS_KEPT {
                self.drop_empty_keys();
            }
        }
        self.rows -= 1;
        self.changes.removed(handle);
        Some(entry)
    }

    /// Drops the emptied keys in one pass, once they outnumber the keys with rows by more than
    /// [`EMPTY_KEYS_KEPT`] (amortised O(1) per emptied key). Cold: out of line, it does not make
    /// every row leaving pay for its stack frame.
    #[cold]
    fn drop_empty_keys(&mut self) {
        self.index.retain(|_, entries| !entries.is_empty());
        self.empty_keys = 0;
    }

    /// A row kept in memory left the store.
    fn forget_memory_row(&mut self, row: &Row) {
        self.unsaved_rows -= 1;
        self.bytes -= row.size_bytes();
        self.memory_bytes -= row.size_bytes();
    }

    /// An arena row left the store (its index entry is gone): its record is marked dead, and
    /// its segment recycled when that was its last live record, or compacted when it has become
    /// mostly dead (module doc, "Compaction"). Inlined into the three ways a row leaves.
    #[inline(always)]
    fn release(&mut self, slot: u32, off: u32, len: u32) {
        let size = record_size(len as usize);
        let Some(sparse) = self.segments.release(slot, off as usize, size) else { return };
        self.bytes -= size;
        if sparse {
            self.found_sparse(slot);
        }
    }

    /// Notes `slot` if it has become sparse; compacts the oldest sparse segments while more than
    /// [`SPARSE_KEPT`] are (module doc, "Compaction").
    fn note_sparse(&mut self, slot: u32) {
        if self.segments.is_sparse(slot) {
            self.found_sparse(slot);
        }
    }

    /// [`note_sparse`](Self::note_sparse) for a segment known to be sparse.
    #[inline]
    fn found_sparse(&mut self, slot: u32) {
        if self.compact && !self.sparse.contains(&slot) {
            self.add_sparse(slot);
        }
    }

    /// Notes `slot` as sparse ([`found_sparse`](Self::found_sparse)) and compacts. Cold (once per
    /// segment), so that inlined into `found_sparse` it does not make every call pay for its
    /// stack frame.
    #[cold]
    fn add_sparse(&mut self, slot: u32) {
        self.sparse.push(slot);
        // Emptied (recycled) since they were noted, or refilled as a new segment: not sparse now.
        let segments = &self.segments;
        self.sparse.retain(|&s| segments.is_sparse(s));
        while self.sparse.len() > SPARSE_KEPT {
            let oldest = (0..self.sparse.len()).min_by_key(|&i| self.segments.get(self.sparse[i]).map(|s| s.seq));
            let Some(oldest) = oldest else { break };
            let slot = self.sparse.swap_remove(oldest);
            self.compact(slot);
        }
    }

    /// Moves the live records of segment `slot` to the end of the active one, each keeping its
    /// handle and matched flag (its index entry is pointed at the new place), so that the
    /// segment empties and is recycled. Stops, leaving the rest where it is, if an append fails
    /// (a full disk): nothing is lost, the segment is only not freed yet.
    fn compact(&mut self, slot: u32) {
        let Some(segment) = self.segments.get(slot) else { return };
        // In a scratch store every record, dead ones too (`release`): the index names the live.
        let records = segment.live_records();
        self.compactions += 1;
        for (off, key_hash) in records {
            let Some(at) = self.index.get(&key_hash).and_then(|entries| {
                entries.iter().position(
                    |e| matches!(e.place, Place::Arena { slot: s, off: o, .. } if s == slot && o as usize == off),
                )
            }) else {
                continue; // a record the index does not name (damaged on open): left to die with the segment
            };
            let Some(row) = self.segments.row(slot, off as u32) else { return };
            let ts = row.ts.to_native();
            let Some(payload) = self.segments.payload(slot, off as u32) else { return };
            self.moving.clear();
            self.moving.extend_from_slice(payload);
            let matched = self.index.get(&key_hash).and_then(|entries| entries.get(at)).is_some_and(Entry::matched);
            let size = record_size(self.moving.len());
            let moved = self.segments.append(&self.moving, size, key_hash, ts, matched);
            let Ok((new_slot, new_off, _)) = moved else { return };
            if let Some(entry) = self.index.get_mut(&key_hash).and_then(|entries| entries.get_mut(at)) {
                entry.place =
                    Place::Arena { slot: new_slot, off: new_off as u32, len: self.moving.len() as u32, matched };
            }
            self.bytes += size;
            if self.segments.release(slot, off, size).is_some() {
                self.bytes -= size;
            }
            self.moved_rows += 1;
        }
    }

    /// Turns compaction on or off (module doc, "Compaction": off for a store whose files must
    /// give every row back under its handle and in its order when reopened).
    pub fn set_compaction(&mut self, on: bool) {
        self.compact = on;
    }

    /// Segments compacted and rows moved by compaction since the store was opened.
    pub fn compaction_counts(&self) -> (usize, usize) {
        (self.compactions, self.moved_rows)
    }

    /// Rows kept in memory because the arena could not take them (module doc): lost on restart.
    pub fn unsaved_rows(&self) -> usize {
        self.unsaved_rows
    }

    /// What `open` found.
    pub fn recovery(&self) -> &Recovery {
        &self.recovery
    }

    /// Where the next record goes (for checkpoints).
    pub fn high_water(&self) -> HighWater {
        match self.segments.get(self.segments.active) {
            Some(s) => HighWater { seq: s.seq, offset: s.end as u32 },
            None => HighWater { seq: 0, offset: 0 },
        }
    }

    /// Writes every segment's records to disk (`msync(MS_SYNC)`); not needed to survive a
    /// process crash, only a power loss.
    pub fn sync(&self) -> Result<(), ArenaError> {
        for segment in self.segments.slots.iter().flatten() {
            segment.flush()?;
        }
        Ok(())
    }

    /// Makes sure no handle handed out from now on equals one of `handles` (restored rows' and
    /// the bounds of the snapshotted store's):
    /// memory handles count on past the greatest restored one, and arena rows go to segments
    /// whose sequence number is past every restored arena handle's. If the active segment's is
    /// not, it takes no more rows (recycled if empty, like a fresh store's); the next row starts
    /// a segment with a greater number. Handles then also stay in arrival order (module doc).
    fn reserve_handles(&mut self, handles: impl Iterator<Item = RowHandle>) {
        let mut max_seq = None;
        for handle in handles {
            if handle & MEMORY_HANDLE != 0 {
                self.next_memory_handle = self.next_memory_handle.max(handle.saturating_add(1));
            } else {
                // Below the top bit: `handle >> 32` < 2^31.
                max_seq = max_seq.max(Some((handle >> 32) as u32));
            }
        }
        let Some(max_seq) = max_seq else { return };
        self.segments.next_seq = self.segments.next_seq.max(max_seq + 1);
        let active = self.segments.active;
        if self.segments.get(active).is_some_and(|s| s.seq <= max_seq) {
            self.segments.active = NO_SEGMENT;
            self.segments.recycle_if_dead(active);
        }
    }

    /// Cold, as is [`keep_in_memory_as`](Self::keep_in_memory_as): the arena takes nearly every
    /// row, and the way out of line keeps the appends' frames small.
    #[cold]
    fn keep_in_memory(&mut self, row: Row, matched: bool, error: &ArenaError) -> RowHandle {
        let handle = self.next_memory_handle;
        self.next_memory_handle += 1;
        self.keep_in_memory_as(row, matched, error, handle)
    }

    #[cold]
    fn keep_in_memory_as(&mut self, row: Row, matched: bool, error: &ArenaError, handle: RowHandle) -> RowHandle {
        self.unsaved_rows += 1;
        let failed = match error {
            ArenaError::File(file) => file.io().map(|io| (file.path(), io)),
            ArenaError::Io { path, source } => Some((path.as_path(), source)),
            _ => None,
        };
        if let Some((path, io)) = failed {
            write_faults::failed(ARENA_SITE, path, io, ARENA_MEANWHILE);
        }
        if self.unsaved_rows.is_power_of_two() {
            tracing::warn!(
                dir = %self.segments.dir.display(),
                unsaved_rows = self.unsaved_rows,
                %error,
                "Arena cannot store a row; kept in memory, lost on restart"
            );
        }
        self.rows += 1;
        self.bytes += row.size_bytes();
        self.memory_bytes += row.size_bytes();
        let key_hash = row.key_hash;
        self.entries_of(key_hash).push_back(Entry { handle, place: Place::Memory { row: Box::new(row), matched } });
        handle
    }
}

impl KeyedStore for ArenaStore {
    fn insert(&mut self, row: Row, matched: bool) -> RowHandle {
        match self.try_insert(&row, matched) {
            Ok(handle) => handle,
            Err(error) => self.keep_in_memory(row, matched, &error),
        }
    }

    fn insert_archived(&mut self, row: &ArchivedRow, bytes: &[u8], matched: bool) -> RowHandle {
        match self.append_indexed(bytes, row.key_hash.to_native(), row.ts.to_native(), matched, None) {
            Ok(handle) => handle,
            Err(error) => self.keep_in_memory(frame::to_row(row), matched, &error),
        }
    }

    fn scan_key(&mut self, key: KeyRef<'_>, key_hash: u64, visit: &mut dyn FnMut(RowView<'_>) -> bool) {
        let Some(entries) = self.index.get_mut(&key_hash) else { return };
        let (segments, changes) = (&mut self.segments, &mut self.changes);
        // The key's rows lie where each was appended, apart; the visits between them (a match's
        // projection) are too long for the CPU to reach the next row's read by itself, so their
        // cache misses are asked for together first.
        for entry in entries.iter() {
            if let Place::Arena { slot, off, len, .. } = entry.place
                && let Some(segment) = segments.get(slot)
            {
                segment.prefetch(off as usize, len as usize);
            }
        }
        entries.for_each_mut(|entry| {
            let hit = match &entry.place {
                Place::Memory { row, .. } => row.key.key_ref() == key && visit(RowView::Heap(row)),
                &Place::Arena { slot, off, .. } => {
                    let Some(row) = segments.row(slot, off) else { return };
                    KeyRef::archived(&row.key) == key && visit(RowView::Archived(row))
                }
            };
            if hit && !entry.matched() {
                entry.set_matched(true);
                changes.matched(entry.handle);
                // Only a reopened store reads the flag in the record (a scratch one never is).
                if let Place::Arena { slot, off, .. } = entry.place
                    && segments.config.recoverable
                    && let Some(segment) = segments.get_mut(slot)
                {
                    segment.set_matched(off as usize);
                }
            }
        });
    }

    fn remove(&mut self, key_hash: u64, handle: RowHandle) -> Option<Removed> {
        let entry = self.unindex(key_hash, handle)?;
        let matched = entry.matched();
        let row = match entry.place {
            Place::Memory { row, .. } => {
                self.forget_memory_row(&row);
                *row
            }
            Place::Arena { slot, off, len, .. } => {
                let row = self.segments.row(slot, off).map(frame::to_row)?;
                self.release(slot, off, len);
                row
            }
        };
        Some(Removed { row, matched })
    }

    fn take(&mut self, key_hash: u64, handle: RowHandle, visit: &mut dyn FnMut(RowView<'_>, bool)) -> bool {
        let Some(entry) = self.unindex(key_hash, handle) else { return false };
        let matched = entry.matched();
        match entry.place {
            Place::Memory { row, .. } => {
                self.forget_memory_row(&row);
                visit(RowView::Heap(&row), matched);
            }
            Place::Arena { slot, off, len, .. } => {
                if let Some(row) = self.segments.row(slot, off) {
                    visit(RowView::Archived(row), matched);
                }
                self.release(slot, off, len);
            }
        }
        true
    }

    fn discard(&mut self, key_hash: u64, handle: RowHandle) -> Option<bool> {
        let entry = self.unindex(key_hash, handle)?;
        let matched = entry.matched();
        match entry.place {
            Place::Memory { row, .. } => self.forget_memory_row(&row),
            Place::Arena { slot, off, len, .. } => self.release(slot, off, len),
        }
        Some(matched)
    }

    fn scan_handles(&self, key: &Key, key_hash: u64, visit: &mut dyn FnMut(RowHandle, &Row) -> bool) {
        let Some(entries) = self.index.get(&key_hash) else { return };
        for entry in entries.iter() {
            let go_on = match &entry.place {
                Place::Memory { row, .. } => row.key != *key || visit(entry.handle, row),
                &Place::Arena { slot, off, .. } => {
                    let Some(row) = self.segments.row(slot, off) else { continue };
                    KeyRef::archived(&row.key) != key.key_ref() || visit(entry.handle, &frame::to_row(row))
                }
            };
            if !go_on {
                return;
            }
        }
    }

    /// The rows go by in batches of [`EXPORT_BATCH`]: first every record of the batch is found
    /// (its length read from its header), then each is handed over. A record lies wherever its
    /// row arrived, and the index goes by key, so each first read waits for memory; one after
    /// another they wait together, where a read between two rows' copies waited alone
    /// (`benches/store_snapshot.rs`).
    fn export(&self, visit: &mut dyn FnMut(RowHandle, bool, &[u8])) -> Result<(), FrameError> {
        let mut encoder = RowEncoder::new();
        let mut batch = heapless::Vec::<&Entry, EXPORT_BATCH>::new();
        let mut found = heapless::Vec::<Option<&[u8]>, EXPORT_BATCH>::new();
        let mut entries = self.index.values().flat_map(KeyRows::iter).peekable();
        while entries.peek().is_some() {
            batch.clear();
            batch.extend(entries.by_ref().take(EXPORT_BATCH));
            found.clear();
            found.extend(batch.iter().map(|entry| match entry.place {
                Place::Arena { slot, off, .. } => self.segments.payload(slot, off),
                Place::Memory { .. } => None,
            }));
            for (entry, archive) in batch.iter().zip(&found) {
                match (&entry.place, archive) {
                    (Place::Memory { row, .. }, _) => visit(entry.handle, entry.matched(), encoder.encode(&**row)?),
                    (&Place::Arena { len, .. }, Some(archive)) => {
                        debug_assert_eq!(archive.len(), len as usize, "the index's length is the record's");
                        visit(entry.handle, entry.matched(), archive)
                    }
                    (Place::Arena { .. }, None) => {}
                }
            }
        }
        Ok(())
    }

    /// From the index alone, but for a row kept in memory (encoded to be measured).
    fn export_lens(&self, visit: &mut dyn FnMut(RowHandle, bool, usize)) -> Result<(), FrameError> {
        let mut encoder = RowEncoder::new();
        for entry in self.index.values().flat_map(KeyRows::iter) {
            match &entry.place {
                Place::Memory { row, .. } => visit(entry.handle, entry.matched(), encoder.encode(&**row)?.len()),
                // As `export`, which skips a row whose segment is gone (never: `Segments::row`).
                &Place::Arena { slot, len, .. } => {
                    if self.segments.get(slot).is_some() {
                        visit(entry.handle, entry.matched(), len as usize);
                    }
                }
            }
        }
        Ok(())
    }

    /// Restored rows are written anew, each to the next free place, and keep their handles in
    /// the index: a handle names a place only for rows this store wrote itself (so a store
    /// reopened from its files, without the snapshot, names a restored row by its place). A row
    /// the arena cannot take is kept in memory under its handle, as `insert` does.
    fn release_spare_capacity(&mut self) {
        if let Some(capacity) = super::spare_capacity_released(self.index.capacity(), self.index.len()) {
            self.index.shrink_to(capacity);
        }
    }

    fn handles_issued(&self) -> Vec<RowHandle> {
        // Every segment so far had a number below `next_seq`; offsets are below 2^32.
        let arena = (self.segments.next_seq > 1).then(|| u64::from(self.segments.next_seq - 1) << 32 | 0xFFFF_FFFF);
        let memory = (self.next_memory_handle > MEMORY_HANDLE).then(|| self.next_memory_handle - 1);
        arena.into_iter().chain(memory).collect()
    }

    fn import(&mut self, saved: &SavedStore) -> Result<(), SnapshotError> {
        self.reserve_handles(saved.issued.iter().copied().chain(saved.rows.iter().map(|r| r.handle)));
        let mut scratch = rkyv::util::AlignedVec::new();
        for (handle, matched, archive) in saved.iter() {
            let row = snapshot::access_row(&mut scratch, archive)?;
            let (key_hash, ts) = (row.key_hash.to_native(), row.ts.to_native());
            let inserted = self.append_indexed(&scratch, key_hash, ts, matched, Some(handle));
            if let Err(error) = inserted {
                let row = frame::to_row(snapshot::access_row(&mut scratch, archive)?);
                self.keep_in_memory_as(row, matched, &error, handle);
            }
        }
        Ok(())
    }

    fn rows(&self) -> usize {
        self.rows
    }

    fn bytes(&self) -> usize {
        self.bytes
    }

    /// The segment files mapped (in use and spare: each is RAM on a tmpfs scratch, page cache
    /// on a disk) plus the rows kept in memory plus the index ([`key_rows::index_bytes`]).
    fn footprint(&self) -> usize {
        let mapped = self.segments.slots.len() - self.segments.free_slots.len() + self.segments.spares.len();
        mapped * self.segments.config.segment_bytes
            + self.memory_bytes
            + key_rows::index_bytes(self.index.len(), self.rows)
    }

    fn visit_ages(&self, visit: &mut dyn FnMut(i64, u64, u64, RowHandle)) {
        for (&key_hash, entries) in &self.index {
            for entry in entries.iter() {
                let (ts, id) = match &entry.place {
                    Place::Memory { row, .. } => (row.ts, row.id),
                    &Place::Arena { slot, off, .. } => match self.segments.row(slot, off) {
                        Some(row) => (row.ts.to_native(), row.id.to_native()),
                        None => continue,
                    },
                };
                visit(ts, id, key_hash, entry.handle);
            }
        }
    }

    fn contains(&self, key_hash: u64, handle: RowHandle) -> bool {
        self.index.get(&key_hash).is_some_and(|entries| entries.iter().any(|e| e.handle == handle))
    }

    fn export_row(
        &self,
        key_hash: u64,
        handle: RowHandle,
        visit: &mut dyn FnMut(bool, &[u8]),
    ) -> Result<bool, FrameError> {
        let entries = self.index.get(&key_hash);
        let Some(entry) = entries.and_then(|e| e.get(e.position(handle)?)) else { return Ok(false) };
        match &entry.place {
            Place::Memory { row, .. } => visit(entry.matched(), RowEncoder::new().encode(&**row)?),
            &Place::Arena { slot, off, .. } => {
                // As `export`, which skips a row whose segment is gone (never: `Segments::row`).
                let Some(archive) = self.segments.payload(slot, off) else { return Ok(false) };
                visit(entry.matched(), archive);
            }
        }
        Ok(true)
    }

    /// From the index, but for a row kept in memory (encoded to be measured).
    fn stored_len(&self, key_hash: u64, handle: RowHandle) -> Option<(bool, usize)> {
        let entries = self.index.get(&key_hash)?;
        let entry = entries.get(entries.position(handle)?)?;
        match &entry.place {
            Place::Memory { row, .. } => Some((entry.matched(), RowEncoder::new().encode(&**row).ok()?.len())),
            // As `export`, which skips a row whose segment is gone (never: `Segments::row`).
            &Place::Arena { slot, len, .. } => self.segments.get(slot).map(|_| (entry.matched(), len as usize)),
        }
    }

    fn note_changes(&mut self) {
        self.changes.restart(self.rows);
    }

    fn changes(&self) -> Option<&super::StoreChanges> {
        self.changes.noted()
    }
}

impl Segments {
    fn get(&self, slot: u32) -> Option<&Segment> {
        self.slots.get(slot as usize).and_then(Option::as_ref)
    }

    fn get_mut(&mut self, slot: u32) -> Option<&mut Segment> {
        self.slots.get_mut(slot as usize).and_then(Option::as_mut)
    }

    /// The row of an index entry, read in place. `None` only if the index named a segment that
    /// is gone, which the invariants rule out (a segment is recycled once no entry names it).
    fn row(&self, slot: u32, off: u32) -> Option<&frame::ArchivedRow> {
        let segment = self.get(slot);
        debug_assert!(segment.is_some(), "index entry names recycled slot {slot}");
        // SAFETY: (slot, off) comes from an index entry, and entries are made only by
        // `ArenaStore::try_insert` (from the offset `append` returned) and by `open` (from the
        // offsets `walk` accepted), each for the segment then in that slot. An entry is dropped
        // before its record is marked dead, and a segment leaves its slot (and may be reset)
        // only when all its records are dead, so the segment in the slot is still the one whose
        // record that was and has not been reset since: `Segment::row`'s contract.
        segment.map(|s| unsafe { s.row(off as usize) })
    }

    /// The archive of an index entry's row, as the record holds it (`None` as for [`row`](Self::row)).
    fn payload(&self, slot: u32, off: u32) -> Option<&[u8]> {
        self.get(slot).map(|s| s.payload(off as usize))
    }

    /// Appends a record of `size` bytes, starting a new segment if it does not fit the active
    /// one; (slot, offset, the handle of that place: the segment's sequence number and the
    /// offset, read while the segment is at hand). Inlined into the ways a row is appended, the
    /// new segment out of line: once per row stored, the call and its frame cost as much as the
    /// record's bookkeeping.
    #[inline(always)]
    fn append(
        &mut self,
        payload: &[u8],
        size: usize,
        key_hash: u64,
        ts: i64,
        matched: bool,
    ) -> Result<(u32, usize, RowHandle), ArenaError> {
        let fits = self.get(self.active).is_some_and(|s| s.fits(size));
        if !fits {
            self.start_active(size)?;
        }
        let active = self.active;
        let Some(segment) = self.get_mut(active) else {
            return Err(ArenaError::Damaged { path: self.dir.clone(), reason: "no active segment".into() });
        };
        let off = segment.append(payload, key_hash, ts, matched)?;
        Ok((active, off, u64::from(segment.seq) << 32 | off as u64))
    }

    /// Makes a new segment, for a record of `size` bytes, the active one. Cold: once per segment.
    #[cold]
    fn start_active(&mut self, size: usize) -> Result<(), ArenaError> {
        let segment = self.next_segment(size)?;
        let previous = self.active;
        self.active = self.install(segment);
        self.recycle_if_dead(previous);
        self.left_active = Some(previous);
        Ok(())
    }

    /// Marks the record dead (`size`: its bytes) and recycles its segment when that was its last
    /// live record. Whether the segment is now [sparse](Self::is_sparse), read while it is at
    /// hand (a row leaving looks its segment up once); `None` when no segment is in `slot`.
    fn release(&mut self, slot: u32, off: usize, size: usize) -> Option<bool> {
        let (recoverable, active) = (self.config.recoverable, self.active);
        let segment = self.get_mut(slot)?;
        debug_assert_eq!(segment.size_at(off), size, "the index entry's size is the record's");
        // Only a reopened store reads the flag; compaction asks the index which records live. A
        // scratch store is never reopened, so it leaves the record alone: its line is cold by the
        // time its row leaves.
        if recoverable {
            segment.set_dead(off);
        }
        segment.live -= 1;
        segment.live_bytes -= size;
        if slot == active {
            return Some(false);
        }
        if segment.live == 0 {
            self.recycle(slot);
            return Some(false);
        }
        Some(mostly_dead(segment))
    }

    /// A segment worth compacting: not the active one, still holding live records, but fewer
    /// than [`COMPACT_BELOW`] of its data bytes.
    #[inline]
    fn is_sparse(&self, slot: u32) -> bool {
        slot != self.active && self.get(slot).is_some_and(|s| s.live > 0 && mostly_dead(s))
    }

    /// A segment for the next sequence number and a record of `size` bytes: a spare reset, or a
    /// new file (of the record's own size when it is larger than the configured one).
    fn next_segment(&mut self, size: usize) -> Result<Segment, ArenaError> {
        let seq = self.next_seq;
        if seq > MAX_SEQ {
            return Err(ArenaError::Exhausted(self.dir.clone()));
        }
        let data_len = self.config.data_len_for(size)?;
        let spare = if data_len == self.config.data_len() { self.spares.pop() } else { None };
        let segment = match spare {
            Some(mut spare) => {
                if let Err(error) = spare.reset(seq) {
                    self.delete(spare);
                    return Err(error.into());
                }
                spare
            }
            None => {
                let number = self.next_number;
                let path = self.dir.join(file_name(number));
                let segment = Segment::create(&*self.storage, &path, seq, data_len, self.config.recoverable)?;
                self.next_number += 1;
                write_faults::recovered(ARENA_SITE);
                segment
            }
        };
        self.next_seq += 1;
        Ok(segment)
    }

    fn install(&mut self, segment: Segment) -> u32 {
        match self.free_slots.pop() {
            Some(slot) => {
                self.slots[slot as usize] = Some(segment);
                slot
            }
            None => {
                self.slots.push(Some(segment));
                (self.slots.len() - 1) as u32
            }
        }
    }

    /// Takes the segment in `slot` out when it has no live record and is not the active one.
    /// Inlined: every row leaving asks, and the answer is nearly always no.
    #[inline]
    fn recycle_if_dead(&mut self, slot: u32) {
        if slot == self.active || self.get(slot).is_none_or(|s| s.live > 0) {
            return;
        }
        self.recycle(slot);
    }

    /// Takes the segment in `slot` out ([`recycle_if_dead`](Self::recycle_if_dead) said it may).
    /// Cold: once per segment.
    #[cold]
    fn recycle(&mut self, slot: u32) {
        if let Some(segment) = self.slots.get_mut(slot as usize).and_then(Option::take) {
            self.free_slots.push(slot);
            self.retire(segment);
        }
    }

    /// Keeps an all-dead segment as a spare, or deletes its file.
    fn retire(&mut self, segment: Segment) {
        if self.spares.len() < self.config.spare_segments && segment.data_len() == self.config.data_len() {
            self.spares.push(segment);
            return;
        }
        self.delete(segment);
    }

    /// Unlinked while still mapped and locked, then unmapped: never truncated under a mapping.
    fn delete(&self, segment: Segment) {
        let path = segment.path().to_owned();
        if let Err(error) = segment.remove() {
            tracing::warn!(path = %path.display(), %error, "Cannot delete a dead arena segment");
        }
    }
}

/// Whether a segment's live records take fewer than [`COMPACT_BELOW`] of its data bytes.
fn mostly_dead(segment: &Segment) -> bool {
    segment.live_bytes * COMPACT_BELOW.1 < segment.data_len() * COMPACT_BELOW.0
}

fn file_name(number: u32) -> String {
    format!("seg-{number:06}.arena")
}

fn parse_name(name: &str) -> Option<u32> {
    let digits = name.strip_prefix("seg-")?.strip_suffix(".arena")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

const _: () = assert!(RECORD_HEADER.is_multiple_of(16) && SEGMENT_HEADER.is_multiple_of(16));
