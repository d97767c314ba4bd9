//! One segment file of an arena: its header, its records, and the walk that recovers them.
//!
//! Byte layouts, invariants and the reasons for them are in the parent module's doc. This file
//! is the only one in the arena that touches the mapping: `bytes` and `bytes_mut` turn it into
//! slices, once each; `row` (an `unsafe fn`, called from one place in the parent) reads a row in
//! place without validation.

use std::path::Path;

use crate::mapped_file::{MappedFile, MappedFileError};
use crate::record::frame::{self, ArchivedRow, PAYLOAD_ALIGN};

/// `MappedFile` magic and version of a segment file. Bump the version when the segment header,
/// the record header or the row format (`Row`, `Key`, `Value`) changes: an older file is then
/// refused at open instead of misread.
pub(super) const MAGIC: [u8; 8] = *b"braidarn";
pub(super) const VERSION: u32 = 1;

/// The segment header at the start of the data area: sequence number u64 | reserved | crc32c.
pub(super) const SEGMENT_HEADER: usize = 64;
const SEGMENT_CRC_AT: usize = 60;

/// The record header: payload length u32 | crc32c u32 | matched u8 | dead u8 | 6 zero bytes |
/// key hash u64 | ts i64.
pub(super) const RECORD_HEADER: usize = 32;
const CRC_AT: usize = 4;
const MATCHED_AT: usize = 8;
const DEAD_AT: usize = 9;
const KEY_HASH_AT: usize = 16;
const TS_AT: usize = 24;
/// Bytes zeroed after the last record (its length and crc): the end marker.
const END_MARK: usize = 16;

/// Records start at multiples of this, so payloads do too (the data area is 16-aligned).
pub(super) const RECORD_ALIGN: usize = PAYLOAD_ALIGN;

/// Bytes a record with a `payload_len`-byte payload takes in a segment.
pub(super) fn record_size(payload_len: usize) -> usize {
    RECORD_HEADER + payload_len.next_multiple_of(RECORD_ALIGN)
}

/// A mapped segment file and where its next record goes.
pub(super) struct Segment {
    file: MappedFile,
    /// Its place in the store's append order (segment header); part of every record's crc and
    /// the upper half of its rows' handles.
    pub(super) seq: u32,
    /// Data offset where the next record goes; every record lies before it.
    pub(super) end: usize,
    /// Records not marked dead.
    pub(super) live: usize,
}

/// What [`Segment::walk`] found.
#[derive(Default)]
pub(super) struct Walk {
    /// Records dropped: crc mismatch, bad flags, or a payload `frame::access` refused.
    pub(super) damaged: usize,
}

impl Segment {
    /// Creates (or replaces) the segment file `path`, `data_len` bytes after the file header.
    pub(super) fn create(path: &Path, seq: u32, data_len: usize) -> Result<Segment, MappedFileError> {
        let file = MappedFile::create(path, MAGIC, VERSION, data_len)?;
        let mut segment = Segment { file, seq, end: SEGMENT_HEADER, live: 0 };
        segment.write_header(seq);
        Ok(segment)
    }

    /// Opens an existing segment file. The sequence number is `None` when the segment header is
    /// damaged (torn while the file was being reused, or damaged on disk): its records cannot be
    /// trusted and it holds no live rows.
    pub(super) fn open(path: &Path) -> Result<(Segment, Option<u32>), OpenError> {
        let file = MappedFile::open(path, MAGIC, VERSION)?;
        let data_len = file.data_len();
        if !data_len.is_multiple_of(RECORD_ALIGN)
            || data_len < SEGMENT_HEADER + RECORD_HEADER + RECORD_ALIGN
            || u32::try_from(data_len).is_err()
        {
            return Err(OpenError::BadLength(data_len));
        }
        let segment = Segment { file, seq: 0, end: SEGMENT_HEADER, live: 0 };
        let header = &segment.bytes()[..SEGMENT_HEADER];
        let crc = u32::from_le_bytes(word(header, SEGMENT_CRC_AT));
        let seq = u64::from_le_bytes(dword(header, 0));
        let seq = (crc32c::crc32c(&header[..SEGMENT_CRC_AT]) == crc)
            .then(|| u32::try_from(seq).ok())
            .flatten()
            .filter(|&s| s != 0 && s <= super::MAX_SEQ);
        Ok((Segment { seq: seq.unwrap_or(0), ..segment }, seq))
    }

    /// Starts the segment over under a new sequence number. Only for a segment without live
    /// records: its old records become unreachable (the end mark goes first; then the new
    /// sequence number, which also fails every old record's crc should the end mark be damaged).
    pub(super) fn reset(&mut self, seq: u32) {
        debug_assert_eq!(self.live, 0);
        self.bytes_mut()[SEGMENT_HEADER..SEGMENT_HEADER + END_MARK].fill(0);
        self.write_header(seq);
        self.seq = seq;
        self.end = SEGMENT_HEADER;
    }

    fn write_header(&mut self, seq: u32) {
        let mut header = [0u8; SEGMENT_HEADER];
        header[..8].copy_from_slice(&u64::from(seq).to_le_bytes());
        let crc = crc32c::crc32c(&header[..SEGMENT_CRC_AT]);
        header[SEGMENT_CRC_AT..].copy_from_slice(&crc.to_le_bytes());
        self.bytes_mut()[..SEGMENT_HEADER].copy_from_slice(&header);
    }

    /// Writes the records to disk (`msync(MS_SYNC)`).
    pub(super) fn flush(&self) -> Result<(), MappedFileError> {
        self.file.flush_data(0, self.end)
    }

    pub(super) fn path(&self) -> &Path {
        self.file.path()
    }

    pub(super) fn data_len(&self) -> usize {
        self.file.data_len()
    }

    /// Whether a record of `size` bytes fits after the last one.
    pub(super) fn fits(&self, size: usize) -> bool {
        size <= self.data_len() - self.end
    }

    /// Writes `payload` (a row as [`frame::RowEncoder`] archived it) as a new record at the end;
    /// its data offset. The caller checked [`fits`](Self::fits).
    pub(super) fn append(&mut self, payload: &[u8], key_hash: u64, ts: i64, matched: bool) -> usize {
        let size = record_size(payload.len());
        debug_assert!(self.fits(size));
        let (off, seq) = (self.end, self.seq);
        let record = &mut self.bytes_mut()[off..off + size];
        let (header, rest) = record.split_at_mut(RECORD_HEADER);
        let (body, padding) = rest.split_at_mut(payload.len());
        body.copy_from_slice(payload);
        padding.fill(0);
        header[..4].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        header[MATCHED_AT..KEY_HASH_AT].fill(0);
        header[MATCHED_AT] = u8::from(matched);
        header[KEY_HASH_AT..TS_AT].copy_from_slice(&key_hash.to_le_bytes());
        header[TS_AT..].copy_from_slice(&ts.to_le_bytes());
        let crc = record_crc(seq, header, payload);
        header[CRC_AT..MATCHED_AT].copy_from_slice(&crc.to_le_bytes());
        let next = off + size;
        if next + END_MARK <= self.data_len() {
            self.bytes_mut()[next..next + END_MARK].fill(0);
        }
        self.end = next;
        self.live += 1;
        off
    }

    /// Bytes taken by the record at `off`.
    pub(super) fn size_at(&self, off: usize) -> usize {
        record_size(u32::from_le_bytes(word(self.bytes(), off)) as usize)
    }

    /// Marks the record at `off` matched, in place (the crc does not cover the flags).
    pub(super) fn set_matched(&mut self, off: usize) {
        self.bytes_mut()[off + MATCHED_AT] = 1;
    }

    /// Marks the record at `off` dead, in place; the caller updates `live`.
    pub(super) fn set_dead(&mut self, off: usize) {
        self.bytes_mut()[off + DEAD_AT] = 1;
    }

    fn payload(&self, off: usize) -> &[u8] {
        let len = u32::from_le_bytes(word(self.bytes(), off)) as usize;
        &self.bytes()[off + RECORD_HEADER..off + RECORD_HEADER + len]
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
        // 16-byte aligned: the data area is (MappedFile::data_ptr), records start at multiples of
        // 16 and the header is 32 bytes.
        unsafe { frame::access_unchecked(self.payload(off)) }
    }

    /// Walks the records from the start, checking each one: `live` gets every intact live record
    /// (offset, size, matched flag, row). Damaged records are skipped when their length is
    /// plausible (the next record has its own crc) and end the walk when it is not; a zero length
    /// is the end mark. Sets `end` after the last intact record and `live` to the records visited.
    pub(super) fn walk(&mut self, mut live: impl FnMut(usize, usize, bool, &ArchivedRow)) -> Walk {
        let mut walk = Walk::default();
        let (bytes, data_len, seq) = (self.bytes(), self.data_len(), self.seq);
        let (mut off, mut end, mut visited) = (SEGMENT_HEADER, SEGMENT_HEADER, 0);
        while off + RECORD_HEADER <= data_len {
            let header = &bytes[off..off + RECORD_HEADER];
            let len = u32::from_le_bytes(word(header, 0)) as usize;
            if len == 0 {
                break;
            }
            let size = record_size(len);
            if size > data_len - off {
                walk.damaged += 1;
                break;
            }
            let payload = &bytes[off + RECORD_HEADER..off + RECORD_HEADER + len];
            let (matched, dead) = (header[MATCHED_AT], header[DEAD_AT]);
            let intact = record_crc(seq, header, payload) == u32::from_le_bytes(word(header, CRC_AT))
                && matched <= 1
                && dead <= 1
                && header[DEAD_AT + 1..KEY_HASH_AT].iter().all(|&b| b == 0);
            let row = if intact && dead == 0 { frame::access(payload).ok() } else { None };
            let key_hash = u64::from_le_bytes(dword(header, KEY_HASH_AT));
            match row {
                Some(row) if row.key_hash.to_native() == key_hash => {
                    live(off, size, matched == 1, row);
                    visited += 1;
                    end = off + size;
                }
                _ if intact && dead == 1 => end = off + size,
                _ => walk.damaged += 1,
            }
            off += size;
        }
        self.end = end;
        self.live = visited;
        walk
    }

    /// The data area, shared.
    fn bytes(&self) -> &[u8] {
        // SAFETY: `data_ptr` is valid for `data_len` bytes while `self.file` lives, and the
        // mapping is initialised (a created file is zeroed, an opened one holds its bytes). This
        // `Segment` owns the only mapping of the file in this process (`MappedFile` is not
        // `Clone`) and the file is flock'ed against other braids (mapped_file.rs, point 1), so
        // while this shared borrow of `self` lives nothing writes the bytes.
        unsafe { std::slice::from_raw_parts(self.file.data_ptr(), self.file.data_len()) }
    }

    /// The data area, exclusive.
    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`; the exclusive borrow of `self` makes this the only slice of the
        // mapping alive.
        unsafe { std::slice::from_raw_parts_mut(self.file.data_ptr(), self.file.data_len()) }
    }
}

/// crc32c of the segment's sequence number, the payload length, the key hash and ts (header
/// bytes 16..32) and the payload — everything but the crc itself and the flag bytes 8..16, which
/// are written in place after the record.
fn record_crc(seq: u32, header: &[u8], payload: &[u8]) -> u32 {
    let crc = crc32c::crc32c(&seq.to_le_bytes());
    let crc = crc32c::crc32c_append(crc, &header[..CRC_AT]);
    let crc = crc32c::crc32c_append(crc, &header[KEY_HASH_AT..RECORD_HEADER]);
    crc32c::crc32c_append(crc, payload)
}

fn word(bytes: &[u8], at: usize) -> [u8; 4] {
    [bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]
}

fn dword(bytes: &[u8], at: usize) -> [u8; 8] {
    let mut out = [0u8; 8];
    out.copy_from_slice(&bytes[at..at + 8]);
    out
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
