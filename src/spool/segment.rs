//! One segment file of a spool: a numbered [segment log](crate::storage::log) whose segment id is
//! the seq of its first record, plus the sparse index that finds a record by sequence number.
//! Layout, walk and recovery rule: storage/log.rs; what they mean for the spool: the parent's doc.

use std::path::Path;
use std::time::Instant;

use crate::storage::log::{self, Format, Walk};
use crate::storage::{MappedFileError, Storage, write_faults};

/// The spool's record format: today's (and every earlier braid's) journal and sink-buffer files.
pub(super) static FORMAT: Format = Format {
    magic: *b"braidspl",
    version: 1,
    segment_header: 32,
    record_header: 16,
    align: 8,
    numbered: true,
    flags: 0,
    end_room: true,
    crc: true,
};

/// Segment header at the start of the data area: base seq u64 | zero | crc32c of 0..28 u32.
pub(super) const SEGMENT_HEADER: usize = FORMAT.segment_header;
/// Record header: payload length u32 | crc32c u32 | seq u64.
pub(super) const RECORD_HEADER: usize = FORMAT.record_header;
pub(super) use crate::storage::log::END_MARK;
/// One sparse-index entry (a record's offset) per this many records.
const STRIDE: u64 = 32;

/// Bytes a record with a `payload_len`-byte payload takes in a segment.
pub(super) fn record_size(payload_len: usize) -> usize {
    FORMAT.record_size(payload_len)
}

/// A mapped segment file holding the records `base..base + count`.
pub(super) struct Segment {
    log: log::Segment,
    /// Sequence number of its first record (segment header).
    pub(super) base: u64,
    /// Records in it; they are `base..base + count`, consecutive (skipped ones included).
    pub(super) count: u64,
    /// Sparse index, by position: an intact record every STRIDE positions, and one at each end
    /// of a stretch skipped as damaged — `get` hops at most STRIDE − 1 records and never across
    /// damage.
    index: Vec<Mark>,
    /// Seqs of records the walk skipped as damaged: `get` returns `None` for them.
    skipped: Vec<u64>,
    /// When this file was created, reset or opened: how long its pages may have been dirty.
    pub(super) started: Instant,
}

impl Segment {
    /// Creates (or replaces) the segment file `path`, `data_len` bytes after the file header.
    pub(super) fn create(
        storage: &dyn Storage,
        path: &Path,
        base: u64,
        data_len: usize,
    ) -> Result<Segment, MappedFileError> {
        let log = log::Segment::create(storage, path, &FORMAT, base, data_len)?;
        Ok(Segment { log, base, count: 0, index: Vec::new(), skipped: Vec::new(), started: write_faults::now() })
    }

    /// Opens an existing segment file and walks its records (nothing written yet: the caller
    /// reports damage, then calls [`cut_tail`](Self::cut_tail)). `None` as the base: the segment
    /// header is damaged (a reset torn by a crash, or damage on disk), so it holds no records.
    pub(super) fn open(storage: &dyn Storage, path: &Path) -> Result<(Segment, Option<u64>, Walk), MappedFileError> {
        let (log, base) = log::Segment::open(storage, path, &FORMAT)?;
        let mut segment =
            Segment { log, base: 0, count: 0, index: Vec::new(), skipped: Vec::new(), started: write_faults::now() };
        let Some(base) = base else { return Ok((segment, None, Walk::default())) };
        segment.base = base;
        let mut index = Vec::new();
        let mut expected = 0;
        let walk = segment.log.walk(|record| {
            if record.position != expected {
                index.push(Mark { position: expected, off: 0, damaged: true });
            }
            if record.position.is_multiple_of(STRIDE) || record.position != expected {
                index.push(Mark { position: record.position, off: record.off as u32, damaged: false });
            }
            expected = record.position + 1;
            true
        })?;
        // A damaged stretch starts where the intact record before it ends; the mark before a
        // damaged one is an intact one.
        for i in 0..index.len() {
            if index[i].damaged {
                index[i].off = match i.checked_sub(1) {
                    None => SEGMENT_HEADER as u32,
                    Some(before) => {
                        let last = segment.hop(index[before], index[i].position - 1);
                        (last + record_size(segment.log.len_at(last))) as u32
                    }
                };
            }
        }
        segment.index = index;
        segment.count = segment.log.records();
        segment.skipped = walk.skipped.iter().map(|&p| base + p).collect();
        Ok((segment, Some(base), walk))
    }

    /// Writes the end mark after the last intact record (storage/log.rs, "Recovery").
    pub(super) fn cut_tail(&mut self) -> Result<(), MappedFileError> {
        self.log.cut_tail()
    }

    /// Whether a segment whose header is damaged held records (else: an interrupted reset).
    pub(super) fn first_record_written(&self) -> Result<bool, MappedFileError> {
        self.log.first_record_written()
    }

    /// Starts the segment over at `base` (storage/log.rs, "reset"). Records of its earlier life
    /// can never pass as new ones: the crc of record `base + i` is salted with that seq.
    pub(super) fn reset(&mut self, base: u64) -> Result<(), MappedFileError> {
        self.log.reset(base)?;
        self.base = base;
        self.count = 0;
        self.index.clear();
        self.skipped.clear();
        self.started = write_faults::now();
        Ok(())
    }

    pub(super) fn flush(&mut self) -> Result<(), MappedFileError> {
        self.log.flush()
    }

    /// Written no more: its pages leave the resident set (they stay in the page cache).
    pub(super) fn forget_pages(&self) {
        self.log.forget_pages();
    }

    pub(super) fn path(&self) -> &Path {
        self.log.path()
    }

    /// Released, kept as the spare of a spool that rolls by age: emptied, and its pages go,
    /// dirty ones unwritten (the parent's doc, "Flash").
    pub(super) fn give_back_pages(&mut self) -> Result<(), MappedFileError> {
        self.log.give_back_pages()?;
        self.count = 0;
        self.index.clear();
        self.skipped.clear();
        Ok(())
    }

    /// The spare is taken into use: the pages [`give_back_pages`](Self::give_back_pages) freed are
    /// allocated again (a full disk fails here); nothing to do for one that kept them.
    pub(super) fn take_back_pages(&self) -> Result<(), MappedFileError> {
        self.log.take_back_pages()
    }

    pub(super) fn remove(self) -> Result<(), MappedFileError> {
        self.log.remove()
    }

    /// The sequence number the next record appended here gets.
    pub(super) fn next_seq(&self) -> u64 {
        self.base + self.count
    }

    /// Whether a record of `size` bytes (and the end mark after it) fits after the last one.
    pub(super) fn fits(&self, size: usize) -> bool {
        self.log.fits(size)
    }

    /// Writes the concatenated `parts` (`len` bytes in all) as record `next_seq()`. The caller
    /// checked [`fits`](Self::fits).
    pub(super) fn append(&mut self, parts: &[&[u8]], len: usize) -> Result<(), MappedFileError> {
        let off = self.log.append(&[], parts, len)?;
        self.push_index(self.count, off);
        self.count += 1;
        Ok(())
    }

    fn push_index(&mut self, position: u64, off: usize) {
        if position.is_multiple_of(STRIDE) {
            // A segment is at most 1 GiB (SpoolOptions), so an offset fits.
            self.index.push(Mark { position, off: off as u32, damaged: false });
        }
    }

    /// Offset of record `seq`, which lies in this segment (of a skipped one: where its damaged
    /// stretch starts).
    fn offset_of(&self, seq: u64) -> Option<usize> {
        let i = seq.checked_sub(self.base).filter(|&i| i < self.count)?;
        let at = self.index.partition_point(|m| m.position <= i).checked_sub(1)?;
        let mark = self.index[at];
        Some(if mark.damaged { mark.off as usize } else { self.hop(mark, i) })
    }

    /// Offset of the record at `position`, hopping from `mark` (intact records only between).
    fn hop(&self, mark: Mark, position: u64) -> usize {
        let mut off = mark.off as usize;
        for _ in mark.position..position {
            off += record_size(self.log.len_at(off));
        }
        off
    }

    /// The payload of record `seq`, in place; `None` for a record skipped as damaged.
    pub(super) fn get(&self, seq: u64) -> Option<&[u8]> {
        if self.skipped.contains(&seq) {
            return None;
        }
        Some(self.log.payload(self.offset_of(seq)?))
    }

    /// Bytes records `from..to` take (headers and padding included); both within this segment's
    /// range `base..=base + count`.
    pub(super) fn bytes_between(&self, from: u64, to: u64) -> u64 {
        let at = |seq: u64| if seq >= self.next_seq() { Some(self.log.end()) } else { self.offset_of(seq) };
        match (at(from), at(to)) {
            (Some(a), Some(b)) => b.saturating_sub(a) as u64,
            _ => 0,
        }
    }

    /// Data offset after the last intact record.
    pub(super) fn end_offset(&self) -> usize {
        self.log.end()
    }

    /// Bytes taken by the records `from..` of this segment.
    pub(super) fn bytes_from(&self, from: u64) -> u64 {
        self.bytes_between(from.max(self.base), self.next_seq())
    }
}

/// One sparse-index entry: where the record at `position` starts, or where a damaged stretch
/// starting at `position` does.
#[derive(Clone, Copy, Debug)]
struct Mark {
    position: u64,
    off: u32,
    damaged: bool,
}
