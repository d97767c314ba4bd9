//! The spool: a durable FIFO of byte records in memory-mapped segment files.
//!
//! Used as the service's ingest journal (every accepted MQTT message is appended before its
//! PUBACK and replayed after a crash) and as each MQTT sink's store-and-forward buffer (a result
//! is released only after the upstream PUBACK). Records get sequence numbers `0, 1, 2, …`:
//! monotonic, never reused, kept across restarts. The unreleased records are `first()..end()`.
//!
//! # Files
//!
//! A spool is a directory: `head` (where the unreleased records start) and segment files
//! `NNNNNNNNNN.spool` (1 MiB by default, [`SpoolOptions::segment_bytes`]; a record larger than
//! that gets a segment of its own size), each a numbered
//! [segment log](crate::storage::log) in a [`MappedFile`](crate::storage::MappedFile) — locked,
//! preallocated, header-checked; storage/mapped_file.rs has the soundness argument, storage/log.rs
//! the record layout, the walk and the recovery rule. The number in a file name only tells files
//! apart; a segment's place in the FIFO is the base sequence number in its header.
//!
//! ```text
//! segment:  [MappedFile header 64 B][segment header 32 B][record][record]…[0 × 16: end mark]
//! segment header (little endian): base seq u64 | zero [u8; 20] | crc32c of 0..28 u32
//! record:   [header 16 B][payload, `len` bytes][zero padding to a multiple of 8]
//! record header: len u32 | crc32c(seq ‖ len ‖ payload) u32 | seq u64
//! head:     [MappedFile header 64 B][slot 32 B][slot 32 B]   (head.rs)
//! ```
//!
//! - **Append** writes payload, end mark and header (crc last). A segment's records carry `base,
//!   base + 1, …` and each crc is salted with its seq, so records left over from a recycled
//!   file's earlier life (smaller seqs) never come back. On open, the segment log's one rule
//!   applies (storage/log.rs, "Recovery"): damaged records followed by an intact one are skipped
//!   — their seqs stay taken, [`Spool::get`] returns `None` for them, they are counted by
//!   [`Spool::damaged`] — and the records after them stay; a torn last record is cut and its seq
//!   is taken by the next append. Damage is logged with the seqs and byte ranges lost and the
//!   file copied as found into `STATE_DIR/quarantine/` (storage/quarantine.rs).
//! - **Release** advances `first` and writes it to the head file (two crc'd slots written in
//!   turn: a torn write leaves the other). A segment whose records are all released, other than
//!   the one being appended to, is recycled: kept as a spare (reset when a new segment is
//!   needed) or deleted. So the files hold at most `max_bytes` plus about two segments (and a
//!   page for each emptied spare, below).
//! - **Flash.** With [`SpoolOptions::roll_after`] (the journal's and the sinks' setting) a new
//!   segment is started once the active one is that old. The kernel writes a file's dirty pages
//!   back about `vm.dirty_expire_centisecs` (30 s) after the file was first dirtied, and pages
//!   dropped before then are never written: records released within seconds — the journal at
//!   every checkpoint, a sink buffer at every upstream acknowledgement — then cost the disk
//!   nothing under `durability = "process"`. So a released segment is deleted, or kept as one
//!   of up to 32 spares only once emptied (the end mark after its header) and with every page but
//!   its first given back (a punched hole: dirty pages dropped unwritten, blocks freed),
//!   allocated again when it is taken into use. Reusing it spares the appending thread a file's
//!   making — a header synced to the disk, 0.5–3.6 ms a segment on the test guest's disk — and
//!   its deletion.
//! - **Limits.** A record holds at most [`Spool::max_record`] bytes (its record size at most
//!   `max_bytes`, and a segment at most 1 GiB). [`Spool::queued_bytes`] counts the
//!   unreleased records with their headers and padding; an append that would take it past
//!   `max_bytes` fails with [`SpoolError::Full`] (`Overflow::Block`) or first drops the oldest
//!   records (`Overflow::DropOldest`, counted by [`Spool::dropped`] and kept in the head file).
//! - **Memory.** Per segment a sparse index of one `u32` per 32 records; [`Spool::get`] reads at
//!   most 31 record headers to find a record and hands out the payload in place.
//!
//! # Guarantees
//!
//! After a process crash or `kill -9` (anything that leaves the page cache alone): every record
//! whose `append` returned is there with its seq, every `release_through` that returned stays
//! released, and nothing comes back that was never appended. After a power loss, only what
//! [`Spool::sync`] (msync) covered. A segment whose file header or segment header is damaged, or
//! that holds an unreadable block, is moved to the quarantine and its records are lost, logged
//! and counted; a gap in the seqs is then possible and [`Spool::get`] returns `None` for the
//! missing ones, as for a record skipped as damaged. A damaged head file (both slots failing
//! their crc, or its file header) is quarantined and made anew: the spool then starts at its
//! oldest segment, so released records may come again (a duplicate with the same `_id`, never a
//! loss) — never an error at every start.
//!
//! Faults: every write and sync goes through the [`Storage`] trait, and a failed one is an error
//! of [`Spool::append`] or [`Spool::sync`] with the spool unchanged (storage/faulty.rs tests).

mod head;
mod segment;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use thiserror::Error;

use self::head::{Head, HeadState};
use self::segment::{END_MARK, RECORD_HEADER, SEGMENT_HEADER, Segment, record_size};
use crate::config::Overflow;
use crate::storage::log::Walk;
use crate::storage::mapped_file::{HEADER_LEN, MappedFileError};
use crate::storage::quarantine::{Action, Lost, quarantine};
use crate::storage::{Mmap, Storage};

/// How big a spool may grow and what happens when it is full.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpoolOptions {
    /// Bound on [`Spool::queued_bytes`].
    pub max_bytes: u64,
    /// Size of each new segment file: a multiple of 4096 from 8 KiB to 1 GiB. A record that
    /// does not fit one gets a segment of its own size.
    pub segment_bytes: usize,
    pub overflow: Overflow,
    /// Start a new segment once the active one is this old, and keep a spare only emptied and
    /// without its pages (module doc, "Flash"); `None`: a new segment only when one is full.
    pub roll_after: Option<Duration>,
}

impl Default for SpoolOptions {
    fn default() -> Self {
        SpoolOptions {
            max_bytes: 256 << 20,
            // The segment being written stays mapped, its written pages resident until it is
            // full or rolls: at 5 000 messages a second a 4 MiB segment held up to 4 MiB of the
            // service's resident set, journal and sink buffer each (BENCHMARKS.md "Memory at
            // 10 k devices").
            segment_bytes: 1 << 20,
            overflow: Overflow::Block,
            roll_after: Some(before_writeback()),
        }
    }
}

/// A third of the kernel's `vm.dirty_expire_centisecs` (10 s of the usual 30 s, within 1..=60 s):
/// a segment rolled this often and released within about as long again is deleted before the
/// kernel writes its pages back.
fn before_writeback() -> Duration {
    static DELAY: OnceLock<Duration> = OnceLock::new();
    *DELAY.get_or_init(|| {
        let expire = std::fs::read_to_string("/proc/sys/vm/dirty_expire_centisecs").ok();
        let centis = expire.and_then(|text| text.trim().parse::<u64>().ok()).unwrap_or(3000);
        Duration::from_millis(centis * 10 / 3).clamp(Duration::from_secs(1), Duration::from_secs(60))
    })
}

#[derive(Debug, Error)]
pub enum SpoolError {
    #[error(transparent)]
    File(#[from] MappedFileError),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("spool options: {0}")]
    BadOptions(String),
    /// This record can never be stored: larger segments or a larger buffer are needed.
    #[error("record of {len} bytes is larger than the spool holds ({max} bytes)")]
    TooLarge { len: usize, max: usize },
    /// `Overflow::Block` and no room: retry after records are released.
    #[error("spool full")]
    Full,
}

impl SpoolError {
    /// A write that failed in the file system (a full disk, EIO): the spool is unchanged and the
    /// same append may be tried again later. The path and the system's error.
    pub fn write_failure(&self) -> Option<(&Path, &std::io::Error)> {
        match self {
            SpoolError::File(file) => file.io().map(|error| (file.path(), error)),
            SpoolError::Io { path, source } => Some((path, source)),
            SpoolError::BadOptions(_) | SpoolError::TooLarge { .. } | SpoolError::Full => None,
        }
    }

    /// [`write_failure`](Self::write_failure), owned (an `io::Error` is not `Clone`: the same
    /// errno, or kind and text).
    pub fn owned_write_failure(&self) -> Option<(PathBuf, std::io::Error)> {
        self.write_failure().map(|(path, error)| {
            let error = match error.raw_os_error() {
                Some(errno) => std::io::Error::from_raw_os_error(errno),
                None => std::io::Error::new(error.kind(), error.to_string()),
            };
            (path.to_owned(), error)
        })
    }
}

/// A durable FIFO of byte records; see the module doc.
pub struct Spool {
    dir: PathBuf,
    storage: Arc<dyn Storage>,
    options: SpoolOptions,
    head: Head,
    /// By base seq; the last one takes the appends.
    segments: VecDeque<Segment>,
    /// Released segments kept for reuse, at most [`Spool::spares_kept`].
    spares: Vec<Segment>,
    next_file: u64,
    first: u64,
    end: u64,
    queued: u64,
    dropped: u64,
    /// Records skipped as damaged when the segments were opened.
    damaged: u64,
    /// What the next [`sync`](Spool::sync) must write besides the records appended since: the
    /// head file (written by a release) and the directory (a segment file made or deleted).
    unsynced: Unsynced,
}

/// Parts of a spool changed since its last [`Spool::sync`]. A sync per batch of acknowledgements
/// (`durability = "power"`) would otherwise rewrite the head file's page and flush the directory
/// (a device cache flush) each time, although most batches only append.
#[derive(Clone, Copy, Default)]
struct Unsynced {
    head: bool,
    dir: bool,
}

impl Spool {
    /// Opens the spool in `dir`, or creates it (and `dir`) when there is none.
    pub fn open(dir: &Path, options: SpoolOptions) -> Result<Spool, SpoolError> {
        Spool::open_on(Mmap::shared(), dir, options)
    }

    /// [`open`](Self::open) with the segment files on `storage` (tests inject faults with it).
    pub fn open_on(storage: Arc<dyn Storage>, dir: &Path, options: SpoolOptions) -> Result<Spool, SpoolError> {
        check_options(&options)?;
        std::fs::create_dir_all(dir).map_err(|source| SpoolError::Io { path: dir.to_owned(), source })?;
        let (head, state, head_lost) = Head::open(&dir.join("head"))?;
        let (found, next_file, damaged) = open_segments(&*storage, dir)?;
        // A lost head: start at the oldest record still on disk (a duplicate rather than a loss).
        let first = if head_lost {
            found.iter().filter(|s| s.count > 0).map(|s| s.base).min().unwrap_or(0)
        } else {
            state.first
        };
        let mut spool = Spool {
            dir: dir.to_owned(),
            storage,
            options,
            head,
            segments: VecDeque::new(),
            spares: Vec::new(),
            next_file,
            first,
            end: first,
            queued: 0,
            dropped: state.dropped,
            damaged,
            // The first sync writes all: what an earlier run or this opening changed included.
            unsynced: Unsynced { head: true, dir: true },
        };
        spool.adopt(found);
        if head_lost {
            spool.head.write(HeadState { first: spool.first, dropped: spool.dropped });
        }
        Ok(spool)
    }

    /// Takes the segments found on disk: live ones in base order, the rest recycled.
    fn adopt(&mut self, mut found: Vec<Segment>) {
        found.sort_by_key(|s| s.base);
        for segment in found {
            let overlaps = self.segments.back().is_some_and(|last| segment.base < last.next_seq());
            if segment.count == 0 || segment.next_seq() <= self.first || overlaps {
                if overlaps {
                    tracing::warn!(path = %segment.path().display(), "Spool segment overlaps the one before; set aside");
                }
                self.recycle(segment);
            } else {
                if let Some(last) = self.segments.back()
                    && segment.base > last.next_seq()
                    && segment.base > self.first
                {
                    // Records at the end of the segment before are gone (a zeroed block reads as
                    // its end mark): counted as damage, their seqs stay taken.
                    let (from, to) = (last.next_seq().max(self.first), segment.base);
                    tracing::warn!(dir = %self.dir.display(), from, to, "Spool records missing between segments");
                    self.damaged += to - from;
                    crate::storage::quarantine::note_lost(to - from);
                }
                self.segments.push_back(segment);
            }
        }
        if let Some(front) = self.segments.front()
            && front.base > self.first
        {
            tracing::warn!(dir = %self.dir.display(), from = self.first, to = front.base, "Spool records missing");
            self.first = front.base;
        }
        self.end = self.segments.back().map_or(self.first, |s| s.next_seq().max(self.first));
        self.queued = self.segments.iter().map(|s| s.bytes_from(self.first)).sum();
    }

    /// The largest record [`append`](Self::append) takes.
    pub fn max_record(&self) -> usize {
        let by_segment = MAX_SEGMENT_BYTES - HEADER_LEN - SEGMENT_HEADER - RECORD_HEADER - END_MARK;
        // Record sizes are multiples of 8: a payload up to this rounds up to at most `max_bytes`.
        let by_buffer =
            usize::try_from(self.options.max_bytes & !7).unwrap_or(usize::MAX).saturating_sub(RECORD_HEADER);
        by_segment.min(by_buffer)
    }

    /// Appends one record; its sequence number. See the module doc for `Full` and dropping.
    pub fn append(&mut self, record: &[u8]) -> Result<u64, SpoolError> {
        self.append_parts(&[record])
    }

    /// Appends the concatenation of `parts` as one record, without a buffer to join them in.
    pub fn append_parts(&mut self, parts: &[&[u8]]) -> Result<u64, SpoolError> {
        let (len, max) = (parts.iter().map(|p| p.len()).sum::<usize>(), self.max_record());
        if len > max {
            return Err(SpoolError::TooLarge { len, max });
        }
        let size = record_size(len);
        if self.queued + size as u64 > self.options.max_bytes {
            match self.options.overflow {
                Overflow::Block => return Err(SpoolError::Full),
                Overflow::DropOldest => self.drop_for(size as u64),
            }
        }
        let seq = self.end;
        self.active_for(size)?.append(parts, len)?;
        self.end += 1;
        self.queued += size as u64;
        Ok(seq)
    }

    /// Makes sure a record of `len` bytes can be appended without a new file: starts the next
    /// segment now if the one being appended to cannot take it. An error (a full disk) changes
    /// nothing; the journal uses it to try a held record before anything else is appended.
    pub fn make_room(&mut self, len: usize) -> Result<(), SpoolError> {
        if len > self.max_record() {
            return Err(SpoolError::TooLarge { len, max: self.max_record() });
        }
        self.active_for(record_size(len)).map(drop)
    }

    /// Drops the oldest records until `size` more bytes fit.
    fn drop_for(&mut self, size: u64) {
        let mut to = self.first;
        let mut freed = 0;
        while self.queued - freed + size > self.options.max_bytes && to < self.end {
            freed += self.bytes_in(to, to + 1);
            to += 1;
        }
        self.dropped += to - self.first;
        self.release_to(to);
    }

    /// The segment to append a record of `size` bytes to, starting a new one when needed.
    fn active_for(&mut self, size: usize) -> Result<&mut Segment, SpoolError> {
        let rolls = |s: &Segment| self.options.roll_after.is_some_and(|age| s.count > 0 && s.started.elapsed() >= age);
        let usable = self.segments.back().is_some_and(|s| s.fits(size) && s.next_seq() == self.end && !rolls(s));
        if !usable {
            let segment = match self.spares.pop() {
                Some(mut spare) if spare.fits(size) => {
                    let reused = spare.take_back_pages().and_then(|()| spare.reset(self.end));
                    if let Err(error) = reused {
                        self.delete(spare);
                        return Err(error.into());
                    }
                    spare
                }
                other => {
                    if let Some(small) = other {
                        self.delete(small);
                    }
                    // Numbered once it exists: a creation that fails (a full disk) leaves no file
                    // and takes no number, however often it is tried again.
                    let path = self.dir.join(format!("{:010}.spool", self.next_file));
                    let data_len = (self.options.segment_bytes - HEADER_LEN).max(data_len_for(size));
                    let created = Segment::create(&*self.storage, &path, self.end, data_len)?;
                    self.next_file += 1;
                    self.unsynced.dir = true;
                    created
                }
            };
            // The one before is full or rolled: its pages go from the resident set until the
            // start that may read them (a journal kept for a fallback checkpoint holds seconds).
            if let Some(full) = self.segments.back() {
                full.forget_pages();
            }
            self.segments.push_back(segment);
            self.recycle_released();
        }
        // Just ensured: there is a last segment.
        self.segments.back_mut().ok_or(SpoolError::Full)
    }

    /// The spool's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The oldest unreleased sequence number.
    pub fn first(&self) -> u64 {
        self.first
    }

    /// The sequence number the next append gets.
    pub fn end(&self) -> u64 {
        self.end
    }

    /// Record `seq`, in place; `None` outside `first()..end()` (or for a record lost to damage).
    pub fn get(&self, seq: u64) -> Option<&[u8]> {
        if seq < self.first || seq >= self.end {
            return None;
        }
        let at = self.segments.partition_point(|s| s.base <= seq);
        self.segments.get(at.checked_sub(1)?)?.get(seq)
    }

    /// Releases every record up to and including `seq` (kept across a crash); segments left with
    /// released records only are recycled.
    pub fn release_through(&mut self, seq: u64) {
        self.release_to(seq.saturating_add(1));
    }

    fn release_to(&mut self, to: u64) {
        let to = to.min(self.end);
        if to <= self.first {
            return;
        }
        self.queued -= self.bytes_in(self.first, to);
        self.first = to;
        self.head.write(HeadState { first: self.first, dropped: self.dropped });
        self.unsynced.head = true;
        self.recycle_released();
    }

    /// Bytes taken by records `from..to`.
    fn bytes_in(&self, from: u64, to: u64) -> u64 {
        let segments = self.segments.iter().filter(|s| s.base < to && from < s.next_seq());
        segments.map(|s| s.bytes_between(from.max(s.base), to.min(s.next_seq()))).sum()
    }

    fn recycle_released(&mut self) {
        while self.segments.len() > 1 && self.segments.front().is_some_and(|s| s.next_seq() <= self.first) {
            if let Some(segment) = self.segments.pop_front() {
                self.recycle(segment);
            }
        }
    }

    /// Keeps `segment` as a spare, or deletes it when enough are kept. A spool that rolls by age
    /// first empties it and gives its pages back (module doc, "Flash"); where that fails it is
    /// deleted.
    fn recycle(&mut self, mut segment: Segment) {
        let keep = self.spares.len() < self.spares_kept()
            && (self.options.roll_after.is_none() || segment.give_back_pages().is_ok());
        if keep {
            self.spares.push(segment);
        } else {
            self.delete(segment);
        }
    }

    /// One spare, holding its old records until reused; a spool that rolls by age releases
    /// several segments at a time (the journal at a checkpoint) and keeps up to
    /// [`SPARES_ROLLING`] emptied ones, a page of disk each.
    fn spares_kept(&self) -> usize {
        if self.options.roll_after.is_some() { SPARES_ROLLING } else { 1 }
    }

    /// Unlinks the file while it is still mapped, then unmaps it (never truncated while mapped).
    fn delete(&mut self, segment: Segment) {
        self.unsynced.dir = true;
        let path = segment.path().to_owned();
        if let Err(error) = segment.remove() {
            tracing::warn!(path = %path.display(), %error, "Spool segment could not be deleted");
        }
    }

    /// Writes everything appended and released so far to disk (`msync(MS_SYNC)`), and the
    /// directory, so segment files created or deleted since are there after a power loss too.
    /// The head file and the directory only when they changed since the last sync.
    pub fn sync(&mut self) -> std::io::Result<()> {
        for segment in &mut self.segments {
            segment.flush().map_err(std::io::Error::other)?;
        }
        if self.unsynced.head {
            self.head.flush().map_err(std::io::Error::other)?;
            self.unsynced.head = false;
        }
        if self.unsynced.dir {
            std::fs::File::open(&self.dir)?.sync_all()?;
            self.unsynced.dir = false;
        }
        Ok(())
    }

    /// Whether the next sync writes the head file and flushes the directory.
    #[cfg(test)]
    fn unsynced(&self) -> (bool, bool) {
        (self.unsynced.head, self.unsynced.dir)
    }

    /// Bytes the unreleased records take (headers and padding included).
    pub fn queued_bytes(&self) -> u64 {
        self.queued
    }

    /// The bound on [`Spool::queued_bytes`] (the sink's `buffer`).
    pub fn max_bytes(&self) -> u64 {
        self.options.max_bytes
    }

    /// Records dropped by `Overflow::DropOldest`, over the spool's whole life.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Records skipped as damaged when this spool was opened (storage/log.rs, "Recovery"): their
    /// seqs stay taken and [`get`](Self::get) returns `None` for them.
    pub fn damaged(&self) -> u64 {
        self.damaged
    }
}

/// Emptied spares a spool that rolls by age keeps ([`Spool::spares_kept`]): the journal releases
/// what a chain of checkpoints covered at once, 14 segments at a time in a saturated braid here
/// (3 MB/s journaled, the release of about 5 s).
const SPARES_ROLLING: usize = 32;

/// The largest segment file, [`SpoolOptions::segment_bytes`] or one made for a large record.
const MAX_SEGMENT_BYTES: usize = 1 << 30;

/// The data bytes of the smallest segment file (a multiple of 4096 bytes) that holds a record of
/// `size` bytes.
fn data_len_for(size: usize) -> usize {
    (HEADER_LEN + SEGMENT_HEADER + size + END_MARK).next_multiple_of(4096) - HEADER_LEN
}

fn check_options(options: &SpoolOptions) -> Result<(), SpoolError> {
    let s = options.segment_bytes;
    if !s.is_multiple_of(4096) || !(8 << 10..=MAX_SEGMENT_BYTES).contains(&s) {
        return Err(SpoolError::BadOptions(format!("segment size {s} must be a multiple of 4096 from 8 KiB to 1 GiB")));
    }
    if options.max_bytes < 64 {
        return Err(SpoolError::BadOptions(format!("max_bytes {} must be at least 64", options.max_bytes)));
    }
    Ok(())
}

/// Opens every segment file in `dir`; also the number for the next new file and the records
/// lost to damage. Damage is logged with what was lost and the file quarantined
/// (storage/quarantine.rs): moved when none of it can be used (file header, segment header, an
/// unreadable block), copied as found when the records around the damage stay in use.
fn open_segments(storage: &dyn Storage, dir: &Path) -> Result<(Vec<Segment>, u64, u64), SpoolError> {
    let io = |source| SpoolError::Io { path: dir.to_owned(), source };
    let (mut found, mut next_file, mut damaged) = (Vec::new(), 0, 0);
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let path = entry.map_err(io)?.path();
        remove_if_temporary(&path);
        let Some(number) = segment_number(&path) else { continue };
        next_file = next_file.max(number + 1);
        let opened = Segment::open(storage, &path);
        match opened {
            Ok((mut segment, Some(base), walk)) => {
                if let Some(range) = &walk.unreadable {
                    drop(segment);
                    let lost = Lost {
                        records: 1,
                        detail: format!("every record from seq {base} on; bytes {range:?} unreadable"),
                    };
                    quarantine(&path, WHAT, "unreadable block (EIO)", &lost, Action::Move);
                    damaged += 1;
                    continue;
                }
                if walk.is_damaged() {
                    let lost = lost_records(&segment, base, &walk);
                    damaged += lost.records;
                    quarantine(&path, WHAT, "crc mismatch in the middle of the segment", &lost, Action::Copy);
                } else if walk.torn > 0 {
                    tracing::warn!(path = %path.display(), seq = segment.next_seq(), "Spool torn tail cut (an append a power loss interrupted)");
                }
                segment.cut_tail()?;
                found.push(segment);
            }
            Ok((segment, None, _)) => {
                if segment.first_record_written().unwrap_or(true) {
                    drop(segment);
                    let lost =
                        Lost { records: 1, detail: "every record of the segment (its base seq is unreadable)".into() };
                    quarantine(&path, WHAT, "segment header crc mismatch", &lost, Action::Move);
                    damaged += 1;
                } else {
                    // A reset a crash interrupted: it holds nothing; recycled.
                    found.push(segment);
                }
            }
            Err(MappedFileError::Invalid { reason, .. }) => {
                let lost = Lost { records: 1, detail: "every record of the segment".into() };
                quarantine(&path, WHAT, &format!("file header: {reason}"), &lost, Action::Move);
                damaged += 1;
            }
            Err(MappedFileError::Io { source, .. }) if source.raw_os_error() == Some(libc::EIO) => {
                let lost = Lost { records: 1, detail: "every record of the segment".into() };
                quarantine(&path, WHAT, "file header unreadable (EIO)", &lost, Action::Move);
                damaged += 1;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok((found, next_file, damaged))
}

/// What a spool segment's file is called in the log and the quarantine.
const WHAT: &str = "spool segment (journal or sink buffer)";

/// The records a walk lost in `segment` (base seq `base`): the skipped seqs and a damaged tail.
fn lost_records(segment: &Segment, base: u64, walk: &Walk) -> Lost {
    let mut detail = Vec::new();
    let mut records = walk.skipped.len() as u64;
    if let (Some(first), Some(last)) = (walk.skipped.first(), walk.skipped.last()) {
        detail.push(format!("{} records between seqs {} and {}", walk.skipped.len(), base + first, base + last));
    }
    let tail_damaged = walk.torn > 0 && walk.damaged.last().is_some_and(|r| r.start >= segment.end_offset());
    if tail_damaged {
        records += 1;
        detail.push(format!("seq {} and any after it in this segment", segment.next_seq()));
    }
    let ranges: Vec<String> =
        walk.damaged.iter().map(|r| format!("{}..{}", r.start + HEADER_LEN, r.end + HEADER_LEN)).collect();
    detail.push(format!("file bytes {}", ranges.join(", ")));
    Lost { records, detail: detail.join("; ") }
}

/// A segment a crash caught before its rename (storage/mapped_file.rs `create`) holds nothing yet.
fn remove_if_temporary(path: &Path) {
    let temporary =
        path.file_name().and_then(|n| n.to_str()).is_some_and(crate::storage::mapped_file::is_temporary_name);
    if temporary && let Err(error) = std::fs::remove_file(path) {
        tracing::warn!(path = %path.display(), %error, "Cannot remove a segment file left half made");
    }
}

fn segment_number(path: &Path) -> Option<u64> {
    let name = path.file_name()?.to_str()?;
    name.strip_suffix(".spool")?.parse().ok()
}
