//! The segment log: crc'd records appended to fixed-size segment files, walked on open. Both the
//! spool (the journal of `braid run`, each MQTT sink's store-and-forward buffer) and the state
//! arenas keep their records here; what a record means (a sequence number, a row with flags) is
//! theirs, how it is laid out, found and recovered is this module's alone.
//!
//! # Layout
//!
//! ```text
//! file:     [file header 64 B (mapped_file.rs)][segment header][record][record]…[0 × 16: end mark]
//! segment header (little endian): id u64 | zero | crc32c of everything before it u32 (last 4 B)
//! record:   [record header][payload, `len` bytes][zero padding to a multiple of `align`]
//! record header (little endian):
//!   0   len    u32   payload length
//!   4   crc    u32   crc32c(salt ‖ bytes 0..4 ‖ bytes 16.. ‖ payload)
//!   8   either seq u64 — the record's sequence number, = the segment id + its position
//!                        ("numbered" logs; the salt is that seq, u64)
//!       or     flags [u8; f] then zero to 16 — bytes written in place after the append, outside
//!                        the crc, each 0 or 1 (the salt is the segment id as u32)
//!   16  meta   the rest of the header, covered by the crc
//! ```
//!
//! Two [`Format`]s use it, differing only in widths fixed by their files on disk:
//!
//! | format            | magic      | segment header | record header | align | records          |
//! |-------------------|------------|----------------|---------------|-------|------------------|
//! | spool (journal, sink buffers) | `braidspl` v1 | 32 B | 16 B (seq) | 8 | numbered   |
//! | arena (operator state)        | `braidarn` v1 | 64 B | 32 B (flags matched, dead; key hash, ts) | 16 | flags |
//!
//! The spool's widths are today's journal and sink-buffer files, byte for byte: a gateway upgraded
//! with results in its store-and-forward buffer reads them as before (`tests.rs`, "today's spool
//! segment"). The arena needs 16-byte payloads (rkyv) and its flags, so its widths stay its own;
//! its files are rebuilt at every start of `braid run` (the service deletes `STATE_DIR/run`).
//!
//! - **Salt.** The crc covers the record's seq (numbered) or the segment's id, so a record left
//!   over from a recycled file's earlier life never passes as one of its current life.
//! - **Append** writes the payload, then zeroes the 16 bytes after the record where they fit (the
//!   new **end mark**), then the header (crc last). Until the header lands, the old end mark at the
//!   record's place ends the log: a crash or a failed write in the middle leaves no record, and a
//!   torn header fails its crc. The log's state moves only once the header is written.
//! - **Reset** (recycling a segment) writes the end mark at the first record first, then the new
//!   segment header: a crash in between leaves the old id with no records or the new one with none.
//! - **Sync** is `msync(MS_SYNC)` of a range ([`Segment::flush`], [`Segment::flush_all`]).
//!
//! # Recovery: the one rule
//!
//! [`Segment::walk`] reads the records from the first one. A record is *intact* when its length
//! fits the segment, its crc (with the expected salt) matches, its seq is the expected one
//! (numbered) or its flags are 0/1 and its reserved bytes zero (flags), and the owner accepts it
//! (the arena: rkyv's check and the key hash). The walk stops at the end mark (16 zero bytes where a
//! header would start), at the end of the segment, or at a length that runs past it. Then:
//!
//! - a record that is not intact **but is followed by an intact one** is damage in the middle: it
//!   is **skipped and reported** ([`Walk::skipped`]; the owner counts it and logs a warning) —
//!   never read as the end of the log, so the records after it stay;
//! - the records after the last intact one are the **torn tail** (a crash in the middle of an
//!   append, or damage no later record vouches for): they are **cut** ([`Walk::torn`]), the end mark
//!   is written after the last intact record and the next append takes their place.
//!
//! A damaged length that still fits the segment makes the walk read the next header at a wrong
//! place; that header fails its crc, so the worst case is a longer torn tail, never an invented
//! record (a false match needs a 32-bit crc collision).

use std::path::Path;

use super::{MappedFileError, Storage, StoredFile};

/// Zero bytes after the last record; 16 zero bytes where a record header would start end a walk.
pub const END_MARK: usize = 16;

/// The widths and kind of one log's records (module doc, "Layout").
#[derive(Debug)]
pub struct Format {
    /// File header magic and version; bump the version when anything here changes.
    pub magic: [u8; 8],
    pub version: u32,
    /// Bytes of the segment header (its crc in the last 4).
    pub segment_header: usize,
    /// Bytes of each record header (at least 16).
    pub record_header: usize,
    /// Records start at multiples of this.
    pub align: usize,
    /// Records carry their seq at 8..16 (segment id + position); else flag bytes.
    pub numbered: bool,
    /// Flag bytes at 8.. (not numbered): written in place, outside the crc, each 0 or 1.
    pub flags: usize,
    /// Appends keep room for the end mark after the record (else it is written where it fits).
    pub end_room: bool,
}

impl Format {
    /// Bytes a record with a `len`-byte payload takes.
    pub const fn record_size(&self, len: usize) -> usize {
        self.record_header + len.next_multiple_of(self.align)
    }

    /// Where the covered header bytes start: after the seq or the flags.
    const META_AT: usize = 16;
}

/// What a walk found besides the intact records it handed to the owner.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Walk {
    /// Positions (0 = the segment's first record) of damaged records that were skipped.
    pub skipped: Vec<u64>,
    /// Records cut as the torn tail.
    pub torn: usize,
}

/// One record as the walk sees it.
pub struct Record<'a> {
    /// Data offset of its header.
    pub off: usize,
    /// Bytes it takes, header and padding included.
    pub size: usize,
    /// Its place among the segment's records, damaged ones included.
    pub position: u64,
    pub header: &'a [u8],
    pub payload: &'a [u8],
}

/// One segment file of a log.
pub struct Segment {
    file: Box<dyn StoredFile>,
    format: &'static Format,
    /// The segment header's number: a spool's base seq, an arena's sequence number.
    id: u64,
    /// Data offset where the next record goes.
    end: usize,
    /// Records before `end` (intact or skipped): the next record's position.
    records: u64,
    /// Data offset up to which `flush` has run.
    synced: usize,
}

impl Segment {
    /// Creates (or replaces) `path` with `data_len` data bytes and an empty log numbered `id`.
    pub fn create(
        storage: &dyn Storage,
        path: &Path,
        format: &'static Format,
        id: u64,
        data_len: usize,
    ) -> Result<Segment, MappedFileError> {
        let file = storage.create(path, format.magic, format.version, data_len)?;
        let mut segment = Segment { file, format, id, end: format.segment_header, records: 0, synced: 0 };
        if let Err(error) = segment.write_header(id) {
            // A failed creation leaves nothing behind (the file holds no segment yet).
            let _ = segment.file.remove();
            return Err(error);
        }
        Ok(segment)
    }

    /// Opens `path`; the id is `None` when the segment header is damaged or the file too short to
    /// hold one (then the segment holds no records). Call [`walk`](Self::walk) next.
    pub fn open(
        storage: &dyn Storage,
        path: &Path,
        format: &'static Format,
    ) -> Result<(Segment, Option<u64>), MappedFileError> {
        let file = storage.open(path, format.magic, format.version)?;
        let mut segment = Segment { file, format, id: 0, end: format.segment_header, records: 0, synced: 0 };
        let crc_at = format.segment_header - 4;
        let id = segment.file.read().get(..format.segment_header).and_then(|header| {
            let crc = u32::from_le_bytes(word(header, crc_at));
            (crc32c::crc32c(&header[..crc_at]) == crc).then(|| u64::from_le_bytes(dword(header, 0)))
        });
        if segment.data_len() < format.segment_header + END_MARK {
            return Ok((segment, None));
        }
        segment.id = id.unwrap_or(0);
        Ok((segment, id))
    }

    /// Recovers the records (module doc, "Recovery"): hands every intact one to `accept`, which
    /// may still refuse it (then it counts as damaged), skips damaged ones in the middle, cuts the
    /// torn tail and writes the end mark after the last intact record.
    pub fn walk(&mut self, mut accept: impl FnMut(&Record<'_>) -> bool) -> Result<Walk, MappedFileError> {
        let format = self.format;
        let bytes = self.file.read();
        let data_len = bytes.len();
        let mut walk = Walk::default();
        let mut pending = Vec::new();
        let (mut off, mut position) = (format.segment_header, 0u64);
        let (mut end, mut records) = (off, 0);
        while off + format.record_header <= data_len {
            let header = &bytes[off..off + format.record_header];
            if header[..END_MARK].iter().all(|&b| b == 0) {
                break;
            }
            let len = u32::from_le_bytes(word(header, 0)) as usize;
            let size = format.record_size(len);
            if size > data_len - off {
                pending.push(position);
                break;
            }
            let payload = &bytes[off + format.record_header..off + format.record_header + len];
            let intact = self.header_ok(header, position)
                && crc(self.salt(position), header, payload) == u32::from_le_bytes(word(header, 4))
                && accept(&Record { off, size, position, header, payload });
            if intact {
                walk.skipped.append(&mut pending);
                end = off + size;
                records = position + 1;
            } else {
                pending.push(position);
            }
            off += size;
            position += 1;
        }
        walk.torn = pending.len();
        self.end = end;
        self.records = records;
        self.synced = end;
        self.write_end_mark()?;
        Ok(walk)
    }

    /// The checks of the header bytes 8..16 (module doc, "Layout").
    fn header_ok(&self, header: &[u8], position: u64) -> bool {
        if self.format.numbered {
            return u64::from_le_bytes(dword(header, 8)) == self.id.wrapping_add(position);
        }
        let flags = 8 + self.format.flags;
        header[8..flags].iter().all(|&b| b <= 1) && header[flags..Format::META_AT].iter().all(|&b| b == 0)
    }

    /// What the crc of the record at `position` starts with: 8 bytes (numbered) or 4.
    fn salt(&self, position: u64) -> ([u8; 8], usize) {
        if self.format.numbered {
            (self.id.wrapping_add(position).to_le_bytes(), 8)
        } else {
            (u64::from(self.id as u32).to_le_bytes(), 4)
        }
    }

    /// Starts the segment over as `id`, holding no records: the end mark goes first, then the
    /// header (module doc). Records of its earlier life can never pass as new ones (the salt).
    pub fn reset(&mut self, id: u64) -> Result<(), MappedFileError> {
        let at = self.format.segment_header;
        self.file.write(at, &[0; END_MARK])?;
        self.write_header(id)?;
        self.id = id;
        self.end = at;
        self.records = 0;
        self.synced = 0;
        Ok(())
    }

    fn write_header(&mut self, id: u64) -> Result<(), MappedFileError> {
        let len = self.format.segment_header;
        let mut header = [0u8; 64];
        header[..8].copy_from_slice(&id.to_le_bytes());
        let crc = crc32c::crc32c(&header[..len - 4]);
        header[len - 4..len].copy_from_slice(&crc.to_le_bytes());
        self.file.write(0, &header[..len])
    }

    /// Whether a record of `size` bytes fits after the last one (with the end mark after it, for
    /// formats that keep room for it).
    pub fn fits(&self, size: usize) -> bool {
        let room = if self.format.end_room { END_MARK } else { 0 };
        self.end + size + room <= self.data_len()
    }

    /// Appends the concatenated `parts` (`len` bytes) as a record; `meta` is its header from byte
    /// 8 (flags) or 16 (numbered) on. The caller checked [`fits`](Self::fits). Its data offset.
    pub fn append(&mut self, meta: &[u8], parts: &[&[u8]], len: usize) -> Result<usize, MappedFileError> {
        let format = self.format;
        let (off, position, size) = (self.end, self.records, format.record_size(len));
        let bad = |reason: &str| MappedFileError::Io {
            path: self.file.path().to_owned(),
            source: std::io::Error::other(reason.to_owned()),
        };
        if u32::try_from(len).is_err() || !self.fits(size) {
            return Err(bad("record does not fit the segment"));
        }
        let mut header = [0u8; 64];
        let header = &mut header[..format.record_header];
        header[..4].copy_from_slice(&(len as u32).to_le_bytes());
        let meta_at = if format.numbered {
            header[8..16].copy_from_slice(&self.id.wrapping_add(position).to_le_bytes());
            Format::META_AT
        } else {
            8
        };
        if meta.len() != format.record_header - meta_at {
            return Err(bad("record header of the wrong length"));
        }
        header[meta_at..].copy_from_slice(meta);
        let (salt, salt_len) = self.salt(position);
        let mut crc = crc32c::crc32c(&salt[..salt_len]);
        crc = crc32c::crc32c_append(crc, &header[..4]);
        crc = crc32c::crc32c_append(crc, &header[Format::META_AT..]);
        let mut at = off + format.record_header;
        for part in parts {
            self.file.write(at, part)?;
            crc = crc32c::crc32c_append(crc, part);
            at += part.len();
        }
        let padding = size - format.record_header - len;
        self.file.write(at, &[0; 16][..padding])?;
        // The end mark after the record, then the header: until the header lands, the old end
        // mark at `off` still ends the log, so a failed or torn append leaves no record.
        let after = off + size;
        self.file.write(after, &[0; END_MARK][..END_MARK.min(self.data_len() - after)])?;
        header[4..8].copy_from_slice(&crc.to_le_bytes());
        self.file.write(off, header)?;
        self.end = after;
        self.records += 1;
        Ok(off)
    }

    /// Zeroes the bytes after the last record, where they fit: a walk after a crash stops there.
    fn write_end_mark(&mut self) -> Result<(), MappedFileError> {
        let (end, len) = (self.end, self.data_len());
        let n = END_MARK.min(len.saturating_sub(end));
        self.file.write(end, &[0; END_MARK][..n])
    }

    /// Writes flag `flag` (0-based, of [`Format::flags`]) of the record at `off` in place: one
    /// byte, so a crash leaves it written or not.
    pub fn set_flag(&mut self, off: usize, flag: usize) -> Result<(), MappedFileError> {
        debug_assert!(!self.format.numbered && flag < self.format.flags);
        self.file.write(off + 8 + flag, &[1])
    }

    /// The header of the record at `off`.
    pub fn header(&self, off: usize) -> &[u8] {
        &self.file.read()[off..off + self.format.record_header]
    }

    /// The payload of the record at `off`, in place.
    pub fn payload(&self, off: usize) -> &[u8] {
        let at = off + self.format.record_header;
        &self.file.read()[at..at + self.len_at(off)]
    }

    /// Payload length of the record at `off`.
    pub fn len_at(&self, off: usize) -> usize {
        u32::from_le_bytes(word(self.file.read(), off)) as usize
    }

    /// Bytes taken by the record at `off`.
    pub fn size_at(&self, off: usize) -> usize {
        self.format.record_size(self.len_at(off))
    }

    /// Makes the records appended since the last call durable.
    pub fn flush(&mut self) -> Result<(), MappedFileError> {
        if self.synced < self.end {
            self.file.sync(self.synced, self.end - self.synced)?;
            self.synced = self.end;
        }
        Ok(())
    }

    /// Makes every record durable, flags written in place included.
    pub fn flush_all(&self) -> Result<(), MappedFileError> {
        self.file.sync(0, self.end)
    }

    /// Deletes the file (unlinked while mapped, then unmapped).
    pub fn remove(self) -> Result<(), MappedFileError> {
        self.file.remove()
    }

    pub fn path(&self) -> &Path {
        self.file.path()
    }

    pub fn data_len(&self) -> usize {
        self.file.read().len()
    }

    /// The segment header's number.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Data offset where the next record goes; every record lies before it.
    pub fn end(&self) -> usize {
        self.end
    }

    /// Records before [`end`](Self::end), skipped ones included.
    pub fn records(&self) -> u64 {
        self.records
    }
}

/// crc32c of the salt, the length (header bytes 0..4), the covered header bytes (16..) and the
/// payload.
fn crc((salt, salt_len): ([u8; 8], usize), header: &[u8], payload: &[u8]) -> u32 {
    let crc = crc32c::crc32c(&salt[..salt_len]);
    let crc = crc32c::crc32c_append(crc, &header[..4]);
    let crc = crc32c::crc32c_append(crc, &header[Format::META_AT..]);
    crc32c::crc32c_append(crc, payload)
}

/// Four bytes at `at` (the caller checked the bounds).
pub fn word(bytes: &[u8], at: usize) -> [u8; 4] {
    [bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]
}

/// Eight bytes at `at` (the caller checked the bounds).
pub fn dword(bytes: &[u8], at: usize) -> [u8; 8] {
    let mut out = [0u8; 8];
    out.copy_from_slice(&bytes[at..at + 8]);
    out
}
