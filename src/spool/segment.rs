//! One segment file of a spool: its header, its records, the walk that recovers them and the
//! sparse index that finds a record by sequence number. Layouts and reasons: the parent's doc.
//! This file is the only one in the spool that touches a segment's mapping (`bytes`, `bytes_mut`).

use std::path::Path;

use crate::mapped_file::{MappedFile, MappedFileError};

/// `MappedFile` magic and version of a segment file; bump the version when a layout changes.
pub(super) const MAGIC: [u8; 8] = *b"braidspl";
pub(super) const VERSION: u32 = 1;

/// Segment header at the start of the data area: base seq u64 | zero | crc32c of 0..28 u32.
pub(super) const SEGMENT_HEADER: usize = 32;
const SEGMENT_CRC_AT: usize = 28;

/// Record header: payload length u32 | crc32c u32 | seq u64.
pub(super) const RECORD_HEADER: usize = 16;
/// Records start at multiples of this.
const RECORD_ALIGN: usize = 8;
/// Bytes zeroed after the last record: a zeroed header fails its crc, so the walk stops there.
pub(super) const END_MARK: usize = RECORD_HEADER;
/// One sparse-index entry (a record's offset) per this many records.
const STRIDE: u64 = 32;

/// Bytes a record with a `payload_len`-byte payload takes in a segment.
pub(super) fn record_size(payload_len: usize) -> usize {
    RECORD_HEADER + payload_len.next_multiple_of(RECORD_ALIGN)
}

/// A mapped segment file holding the records `base..base + count`.
pub(super) struct Segment {
    file: MappedFile,
    /// Sequence number of its first record (segment header).
    pub(super) base: u64,
    /// Records in it; they are `base..base + count`, consecutive.
    pub(super) count: u64,
    /// Data offset where the next record goes.
    pub(super) end: usize,
    /// Data offset up to which `msync` has run.
    pub(super) synced: usize,
    /// Offset of record `base + i * STRIDE` at `i`: `get` hops at most STRIDE − 1 records.
    index: Vec<u32>,
}

impl Segment {
    /// Creates (or replaces) the segment file `path`, `data_len` bytes after the file header.
    pub(super) fn create(path: &Path, base: u64, data_len: usize) -> Result<Segment, MappedFileError> {
        let file = MappedFile::create(path, MAGIC, VERSION, data_len)?;
        let mut segment = Segment { file, base, count: 0, end: SEGMENT_HEADER, synced: 0, index: Vec::new() };
        segment.write_header(base);
        Ok(segment)
    }

    /// Opens an existing segment file and walks its records. `None` as the base: the segment
    /// header is damaged (a reset torn by a crash, or damage on disk), so it holds no records.
    pub(super) fn open(path: &Path) -> Result<(Segment, Option<u64>), MappedFileError> {
        let file = MappedFile::open(path, MAGIC, VERSION)?;
        let mut segment = Segment { file, base: 0, count: 0, end: SEGMENT_HEADER, synced: 0, index: Vec::new() };
        if segment.data_len() < SEGMENT_HEADER + END_MARK {
            return Ok((segment, None));
        }
        let header = &segment.bytes()[..SEGMENT_HEADER];
        let crc = u32::from_le_bytes(word(header, SEGMENT_CRC_AT));
        if crc32c::crc32c(&header[..SEGMENT_CRC_AT]) != crc {
            return Ok((segment, None));
        }
        segment.base = u64::from_le_bytes(dword(header, 0));
        segment.walk();
        segment.synced = segment.end;
        let base = segment.base;
        Ok((segment, Some(base)))
    }

    /// Starts the segment over at `base`: the end mark goes first, then the header, so a crash in
    /// between leaves either the old base with no records or the new one with none. Records of
    /// its earlier life can never pass as new ones: the walk wants seq `base`, `base + 1`, ….
    pub(super) fn reset(&mut self, base: u64) {
        self.bytes_mut()[SEGMENT_HEADER..SEGMENT_HEADER + END_MARK].fill(0);
        self.write_header(base);
        self.base = base;
        self.count = 0;
        self.end = SEGMENT_HEADER;
        self.synced = 0;
        self.index.clear();
    }

    fn write_header(&mut self, base: u64) {
        let mut header = [0u8; SEGMENT_HEADER];
        header[..8].copy_from_slice(&base.to_le_bytes());
        let crc = crc32c::crc32c(&header[..SEGMENT_CRC_AT]);
        header[SEGMENT_CRC_AT..].copy_from_slice(&crc.to_le_bytes());
        self.bytes_mut()[..SEGMENT_HEADER].copy_from_slice(&header);
    }

    /// Walks the records from the start; the first one that is cut short, fails its crc or has
    /// the wrong seq ends the segment (a torn append, or damage: nothing after it is trusted).
    fn walk(&mut self) {
        let mut off = SEGMENT_HEADER;
        while let Some(size) = self.valid_at(off, self.base + self.count) {
            self.push_index(off);
            self.count += 1;
            off += size;
        }
        self.end = off;
        self.zero_end_mark();
    }

    /// The size of the record at `off` if it is intact and has sequence number `seq`.
    fn valid_at(&self, off: usize, seq: u64) -> Option<usize> {
        let bytes = self.bytes();
        let header = bytes.get(off..off + RECORD_HEADER)?;
        let len = u32::from_le_bytes(word(header, 0)) as usize;
        let payload = bytes.get(off + RECORD_HEADER..off + RECORD_HEADER + len)?;
        let size = record_size(len);
        let intact = off + size <= bytes.len()
            && u64::from_le_bytes(dword(header, 8)) == seq
            && u32::from_le_bytes(word(header, 4)) == record_crc(seq, len as u32, payload);
        intact.then_some(size)
    }

    /// Zeroes the bytes after the last record (where they fit): a walk after a crash stops there.
    fn zero_end_mark(&mut self) {
        let (end, len) = (self.end, self.data_len());
        self.bytes_mut()[end..(end + END_MARK).min(len)].fill(0);
    }

    pub(super) fn flush(&mut self) -> Result<(), MappedFileError> {
        if self.synced < self.end {
            self.file.flush_data(self.synced, self.end - self.synced)?;
            self.synced = self.end;
        }
        Ok(())
    }

    pub(super) fn path(&self) -> &Path {
        self.file.path()
    }

    pub(super) fn data_len(&self) -> usize {
        self.file.data_len()
    }

    /// The sequence number the next record appended here gets.
    pub(super) fn next_seq(&self) -> u64 {
        self.base + self.count
    }

    /// Whether a record of `size` bytes (and the end mark after it) fits after the last one.
    pub(super) fn fits(&self, size: usize) -> bool {
        self.end + size + END_MARK <= self.data_len()
    }

    /// Writes the concatenated `parts` (`len` bytes in all) as record `next_seq()`. The caller
    /// checked [`fits`](Self::fits). Payload first, header (with the crc) last, then the end
    /// mark: a crash in the middle leaves a record whose crc fails, cut on the next open.
    pub(super) fn append(&mut self, parts: &[&[u8]], len: usize) {
        let (off, seq, size) = (self.end, self.next_seq(), record_size(len));
        let record = &mut self.bytes_mut()[off..off + size];
        let (header, rest) = record.split_at_mut(RECORD_HEADER);
        let (mut body, padding) = rest.split_at_mut(len);
        let mut crc = crc32c::crc32c_append(crc32c::crc32c(&seq.to_le_bytes()), &(len as u32).to_le_bytes());
        for part in parts {
            let (this, next) = body.split_at_mut(part.len());
            this.copy_from_slice(part);
            crc = crc32c::crc32c_append(crc, part);
            body = next;
        }
        padding.fill(0);
        header[..4].copy_from_slice(&(len as u32).to_le_bytes());
        header[8..].copy_from_slice(&seq.to_le_bytes());
        header[4..8].copy_from_slice(&crc.to_le_bytes());
        self.push_index(off);
        self.count += 1;
        self.end = off + size;
        self.zero_end_mark();
    }

    fn push_index(&mut self, off: usize) {
        if self.count.is_multiple_of(STRIDE) {
            // A segment is at most u32::MAX bytes (checked at open), so an offset fits.
            self.index.push(off as u32);
        }
    }

    /// Offset of record `seq`, which lies in this segment.
    fn offset_of(&self, seq: u64) -> Option<usize> {
        let i = seq.checked_sub(self.base).filter(|&i| i < self.count)?;
        let mut off = *self.index.get(usize::try_from(i / STRIDE).ok()?)? as usize;
        for _ in 0..i % STRIDE {
            off += record_size(self.len_at(off));
        }
        Some(off)
    }

    fn len_at(&self, off: usize) -> usize {
        u32::from_le_bytes(word(self.bytes(), off)) as usize
    }

    /// The payload of record `seq`, in place.
    pub(super) fn get(&self, seq: u64) -> Option<&[u8]> {
        let off = self.offset_of(seq)?;
        let len = self.len_at(off);
        self.bytes().get(off + RECORD_HEADER..off + RECORD_HEADER + len)
    }

    /// Bytes records `from..to` take (headers and padding included); both within this segment's
    /// range `base..=base + count`.
    pub(super) fn bytes_between(&self, from: u64, to: u64) -> u64 {
        let at = |seq: u64| if seq >= self.next_seq() { Some(self.end) } else { self.offset_of(seq) };
        match (at(from), at(to)) {
            (Some(a), Some(b)) => b.saturating_sub(a) as u64,
            _ => 0,
        }
    }

    /// Bytes taken by the records `from..` of this segment.
    pub(super) fn bytes_from(&self, from: u64) -> u64 {
        self.bytes_between(from.max(self.base), self.next_seq())
    }

    /// The data area, shared.
    fn bytes(&self) -> &[u8] {
        // SAFETY: `data_ptr` is valid for `data_len` bytes while `self.file` lives, and the mapping
        // is initialised (a created file is zeroed, an opened one holds its bytes). This `Segment`
        // owns the only mapping of the file in this process (`MappedFile` is not `Clone`) and the
        // file is flock'ed against other processes (mapped_file.rs, point 1), so while this shared
        // borrow of `self` lives nothing writes the bytes.
        unsafe { std::slice::from_raw_parts(self.file.data_ptr(), self.file.data_len()) }
    }

    /// The data area, exclusive.
    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`; the exclusive borrow of `self` makes this the only slice of the
        // mapping alive.
        unsafe { std::slice::from_raw_parts_mut(self.file.data_ptr(), self.file.data_len()) }
    }
}

/// crc32c of the record's seq, its length and its payload.
fn record_crc(seq: u64, len: u32, payload: &[u8]) -> u32 {
    let crc = crc32c::crc32c(&seq.to_le_bytes());
    let crc = crc32c::crc32c_append(crc, &len.to_le_bytes());
    crc32c::crc32c_append(crc, payload)
}

pub(super) fn word(bytes: &[u8], at: usize) -> [u8; 4] {
    [bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]
}

pub(super) fn dword(bytes: &[u8], at: usize) -> [u8; 8] {
    let mut out = [0u8; 8];
    out.copy_from_slice(&bytes[at..at + 8]);
    out
}
