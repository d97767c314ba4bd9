//! One segment file of an arena: a [segment log](crate::storage::log) with two flags per record
//! (matched, dead) and the row's key hash and event time in its header.
//!
//! Layout, walk and recovery rule: storage/log.rs; what they mean for the arena: the parent's
//! doc. `row` (an `unsafe fn`, called from one place in the parent) reads a row in place without
//! validation.

use std::path::Path;

use crate::record::frame::{self, ArchivedRow, PAYLOAD_ALIGN};
use crate::storage::log::{self, Format, dword};
use crate::storage::{MappedFileError, Storage};

/// The arena's record format. Bump the version when the segment header, the record header or the
/// row format (`Row`, `Key`, `Value`) changes: an older file is then refused at open instead of
/// misread.
pub(super) static FORMAT: Format = Format {
    magic: *b"braidarn",
    version: 1,
    segment_header: 64,
    record_header: 32,
    align: PAYLOAD_ALIGN,
    numbered: false,
    flags: 2,
    end_room: false,
    crc: true,
};

/// A scratch arena's format ([`ArenaConfig::recoverable`](super::ArenaConfig) false): the same
/// layout with no crc computed, under a magic of its own that no open is given, so its files are
/// never taken for recoverable ones.
static SCRATCH_FORMAT: Format = Format { magic: *b"braidars", crc: false, ..FORMAT };

/// The segment header at the start of the data area: sequence number u64 | reserved | crc32c.
pub(super) const SEGMENT_HEADER: usize = FORMAT.segment_header;

/// The record header: payload length u32 | crc32c u32 | matched u8 | dead u8 | 6 zero bytes |
/// key hash u64 | ts i64.
pub(super) const RECORD_HEADER: usize = FORMAT.record_header;
const MATCHED: usize = 0;
const DEAD: usize = 1;
const MATCHED_AT: usize = 8;
const DEAD_AT: usize = 9;
const KEY_HASH_AT: usize = 16;

/// Records start at multiples of this, so payloads do too (the data area is 16-aligned).
pub(super) const RECORD_ALIGN: usize = PAYLOAD_ALIGN;

/// Bytes a record with a `payload_len`-byte payload takes in a segment.
pub(super) fn record_size(payload_len: usize) -> usize {
    FORMAT.record_size(payload_len)
}

/// A mapped segment file and where its next record goes.
pub(super) struct Segment {
    log: log::Segment,
    /// Its place in the store's append order (segment header); part of every record's crc and
    /// the upper half of its rows' handles.
    pub(super) seq: u32,
    /// Data offset where the next record goes; every record lies before it.
    pub(super) end: usize,
    /// Records not marked dead.
    pub(super) live: usize,
    /// Bytes those records take (headers and padding included): compaction's measure.
    pub(super) live_bytes: usize,
}

/// What [`Segment::walk`] found.
#[derive(Default)]
pub(super) struct Walk {
    /// Records dropped: skipped in the middle or cut as the torn tail (storage/log.rs).
    pub(super) damaged: usize,
}

impl Segment {
    /// Creates (or replaces) the segment file `path`, `data_len` bytes after the file header; a
    /// scratch segment's records carry no crc (it is never opened again).
    pub(super) fn create(
        storage: &dyn Storage,
        path: &Path,
        seq: u32,
        data_len: usize,
        recoverable: bool,
    ) -> Result<Segment, MappedFileError> {
        let format = if recoverable { &FORMAT } else { &SCRATCH_FORMAT };
        let log = log::Segment::create(storage, path, format, u64::from(seq), data_len)?;
        // Rows fill a segment from its start to its end, one page fault per page otherwise.
        log.populate_pages();
        Ok(Segment { log, seq, end: SEGMENT_HEADER, live: 0, live_bytes: 0 })
    }

    /// Opens an existing segment file. The sequence number is `None` when the segment header is
    /// damaged (torn while the file was being reused, or damaged on disk): its records cannot be
    /// trusted and it holds no live rows.
    pub(super) fn open(storage: &dyn Storage, path: &Path) -> Result<(Segment, Option<u32>), OpenError> {
        let (log, id) = log::Segment::open(storage, path, &FORMAT)?;
        let data_len = log.data_len();
        if !data_len.is_multiple_of(RECORD_ALIGN)
            || data_len < SEGMENT_HEADER + RECORD_HEADER + RECORD_ALIGN
            || u32::try_from(data_len).is_err()
        {
            return Err(OpenError::BadLength(data_len));
        }
        let seq = id.and_then(|id| u32::try_from(id).ok()).filter(|&s| s != 0 && s <= super::MAX_SEQ);
        Ok((Segment { log, seq: seq.unwrap_or(0), end: SEGMENT_HEADER, live: 0, live_bytes: 0 }, seq))
    }

    /// Starts the segment over under a new sequence number. Only for a segment without live
    /// records: its old records become unreachable (storage/log.rs, "reset").
    pub(super) fn reset(&mut self, seq: u32) -> Result<(), MappedFileError> {
        debug_assert_eq!(self.live, 0);
        self.log.reset(u64::from(seq))?;
        self.seq = seq;
        self.end = SEGMENT_HEADER;
        self.live_bytes = 0;
        Ok(())
    }

    /// Writes the records to disk (`msync(MS_SYNC)`), flags written in place included.
    pub(super) fn flush(&self) -> Result<(), MappedFileError> {
        self.log.flush_all()
    }

    pub(super) fn path(&self) -> &Path {
        self.log.path()
    }

    pub(super) fn data_len(&self) -> usize {
        self.log.data_len()
    }

    /// Deletes the file (unlinked while still mapped and locked, then unmapped).
    pub(super) fn remove(self) -> Result<(), MappedFileError> {
        self.log.remove()
    }

    /// Whether a record of `size` bytes fits after the last one.
    pub(super) fn fits(&self, size: usize) -> bool {
        self.log.fits(size)
    }

    /// Writes `payload` (a row as [`frame::RowEncoder`] archived it) as a new record at the end;
    /// its data offset. The caller checked [`fits`](Self::fits). Inlined, as the log's
    /// `append_one` is into it: once per row stored, where the call's frame cost a fifth of it.
    #[inline(always)]
    pub(super) fn append(
        &mut self,
        payload: &[u8],
        key_hash: u64,
        ts: i64,
        matched: bool,
    ) -> Result<usize, MappedFileError> {
        let mut meta = [0u8; RECORD_HEADER - 8];
        meta[MATCHED] = u8::from(matched);
        meta[KEY_HASH_AT - 8..KEY_HASH_AT].copy_from_slice(&key_hash.to_le_bytes());
        meta[KEY_HASH_AT..].copy_from_slice(&ts.to_le_bytes());
        let off = self.log.append_one(&meta, payload)?;
        self.end = self.log.end();
        self.live += 1;
        self.live_bytes += self.end - off;
        Ok(off)
    }

    /// Bytes taken by the record at `off`.
    pub(super) fn size_at(&self, off: usize) -> usize {
        self.log.size_at(off)
    }

    /// Marks the record at `off` matched, in place (the crc does not cover the flags).
    pub(super) fn set_matched(&mut self, off: usize) {
        self.set_flag(off, MATCHED);
    }

    /// Marks the record at `off` dead, in place; the caller updates `live` (and `live_bytes`).
    pub(super) fn set_dead(&mut self, off: usize) {
        self.set_flag(off, DEAD);
    }

    /// The data offsets and key hashes of the records not marked dead, in append order (for
    /// compaction: a walk over headers only, no crc, no archive checks — this process wrote or
    /// validated every record before `end`). A scratch store marks none dead.
    pub(super) fn live_records(&self) -> Vec<(usize, u64)> {
        let mut found = Vec::with_capacity(self.live);
        let mut off = SEGMENT_HEADER;
        while off < self.end {
            let header = self.log.header(off);
            if header[DEAD_AT] != 1 {
                found.push((off, u64::from_le_bytes(dword(header, KEY_HASH_AT))));
            }
            let size = self.log.size_at(off);
            if size < RECORD_HEADER || off + size > self.end {
                break; // damage recovery skipped over (never so for records this process wrote)
            }
            off += size;
        }
        found
    }

    /// A flag that cannot be written is lost on restart only (the index has it): logged.
    fn set_flag(&mut self, off: usize, flag: usize) {
        if let Err(error) = self.log.set_flag(off, flag) {
            tracing::warn!(path = %self.path().display(), off, flag, %error, "Arena flag not written; lost on restart");
        }
    }

    /// The row of the live record at `off`, read in place without validation.
    ///
    /// # Safety
    ///
    /// `off` is the offset of a record of this segment that [`append`](Self::append) wrote in
    /// this process, or that [`walk`](Self::walk) accepted (crc and `frame::access`) since the
    /// segment was opened, and the segment has not been [`reset`](Self::reset) since.
    pub(super) unsafe fn row(&self, off: usize) -> &ArchivedRow {
        // SAFETY: by the contract, the payload is exactly what `RowEncoder::encode` returned (this
        // build's format) or bytes `frame::access` accepted; nothing writes a payload after its
        // record is appended (flags live in the header, `reset` needs no live records). It starts
        // 16-byte aligned: the data area is (MappedFile::data), records start at multiples of 16
        // and the header is 32 bytes.
        unsafe { frame::access_unchecked(self.log.payload(off)) }
    }

    /// The record at `off`, header and payload (`len` bytes, an index entry's), found without
    /// reading it.
    pub(super) fn record(&self, off: usize, len: usize) -> &[u8] {
        self.log.record_bytes(off, len)
    }

    /// Asks the CPU to fetch the first and the last cache line of the record at `off` (payload
    /// `len` bytes: the row's root lies at its end) while other work goes on.
    pub(super) fn prefetch(&self, off: usize, len: usize) {
        let bytes = self.record(off, len);
        if let (Some(first), Some(last)) = (bytes.first(), bytes.last()) {
            crate::storage::prefetch(first);
            crate::storage::prefetch(last);
        }
    }

    /// The payload of the record at `off` (a row's archive) as bytes, for a snapshot: `off` is an
    /// index entry's, as for [`row`](Self::row), but reading bytes needs no promise about them.
    pub(super) fn payload(&self, off: usize) -> &[u8] {
        self.log.payload(off)
    }

    /// Walks the records (storage/log.rs, "Recovery"): `live` gets every intact live record
    /// (offset, payload length, matched flag, row). A record is intact when the log's checks pass,
    /// [`frame::access`] accepts its payload and the payload's key hash is the header's; dead
    /// records are intact but not handed out. Sets `end` after the last intact record and `live`
    /// to the live records visited.
    pub(super) fn walk(
        &mut self,
        mut live: impl FnMut(usize, usize, bool, &ArchivedRow),
    ) -> Result<Walk, MappedFileError> {
        let (mut visited, mut visited_bytes) = (0, 0);
        let walk = self.log.walk(|record| {
            if record.header[DEAD_AT] == 1 {
                return true;
            }
            let key_hash = u64::from_le_bytes(dword(record.header, KEY_HASH_AT));
            match frame::access(record.payload) {
                Ok(row) if row.key_hash.to_native() == key_hash => {
                    live(record.off, record.payload.len(), record.header[MATCHED_AT] == 1, row);
                    visited += 1;
                    visited_bytes += record.size;
                    true
                }
                _ => false,
            }
        })?;
        if let Some(range) = walk.unreadable {
            let source = std::io::Error::from_raw_os_error(libc::EIO);
            let source = std::io::Error::new(source.kind(), format!("bytes {range:?} unreadable: {source}"));
            return Err(MappedFileError::Io { path: self.log.path().to_owned(), source });
        }
        self.log.cut_tail()?;
        self.end = self.log.end();
        self.live = visited;
        self.live_bytes = visited_bytes;
        Ok(Walk { damaged: walk.skipped.len() + walk.torn })
    }
}

/// Why a segment file could not be opened.
#[derive(Debug)]
pub(super) enum OpenError {
    File(MappedFileError),
    BadLength(usize),
}

impl From<MappedFileError> for OpenError {
    fn from(e: MappedFileError) -> OpenError {
        OpenError::File(e)
    }
}
