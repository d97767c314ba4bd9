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
//! A third, the scratch arena, is the arena's layout under magic `braidars` with no crc (the
//! field stays 0) and no zeros written after a record (its padding and the end mark hold
//! whatever the file held there): the shards' stores, rebuilt at every start and never walked
//! (state/arena/mod.rs, "Scratch stores").
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
//! [`Segment::walk`] reads the file with `pread` (never through the mapping: an unreadable block
//! is then an EIO error, not SIGBUS — mapped_file.rs point 7) and looks at the records from the
//! first one. A record is *intact* when its length fits the segment, its crc (with the expected
//! salt) matches, its seq is the expected one (numbered) or its flags are 0/1 and its reserved
//! bytes zero (flags), and the owner accepts it (the arena: rkyv's check and the key hash). The
//! walk ends at the end mark (16 zero bytes where a header would start) or at the end of the
//! segment. At a record that is not intact the walk **resyncs**: it tries every aligned offset
//! after it for an intact record (numbered: one whose seq lies after the bad one's, which then
//! says exactly how many records were lost; a false find needs a 32-bit crc collision, and salted
//! crcs keep records of a recycled file's earlier life out). Then, what the layout lets us tell
//! apart:
//!
//! - **damage in the middle**: an intact record follows. The stretch is skipped
//!   ([`Walk::skipped`], [`Walk::damaged`]): never read as the end of the log, so the records
//!   after it stay;
//! - **a torn append**: nothing intact follows, and the bad record's length fits and the 16 bytes
//!   after it are zero. An append writes the end mark after the record *before* its header, so
//!   this is what an interrupted append leaves (only a power loss can leave it: after `kill -9`
//!   the page cache holds every write, and the header, written last, is either there whole or
//!   not). Cut ([`Walk::torn`]), as a crash's tail always was;
//! - **damage at the tail**: nothing intact follows, and the bad record's length does not fit or
//!   non-zero bytes follow it where its end mark must be. Cut too (nothing after it can be
//!   trusted), but reported as damage ([`Walk::damaged`]);
//! - **an unreadable block**: the walk stops and writes nothing ([`Walk::unreadable`]); the
//!   owner must not use the file.
//!
//! The owner logs damage with what was lost and quarantines the file (storage/quarantine.rs),
//! then calls [`Segment::cut_tail`], which writes the end mark after the last intact record: the
//! next append takes the place of whatever followed it. What the walk cannot see: a header zeroed
//! whole reads as the end mark, so the records after it are cut unreported — a spool notices the
//! gap in seqs before the next segment (spool/mod.rs); bit flips never zero 16 bytes.

use std::ops::Range;
use std::path::Path;

use super::{MappedFileError, Storage, StoredFile};

/// Zero bytes after the last record; 16 zero bytes where a record header would start end a walk.
pub const END_MARK: usize = 16;
/// The widest record alignment: a record's padding and the end mark after it are written from
/// [`ZEROS`] in one piece.
const MAX_ALIGN: usize = 16;
const ZEROS: [u8; MAX_ALIGN + END_MARK] = [0; MAX_ALIGN + END_MARK];

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
    /// Records carry their crc. Only a log that is never walked goes without (a scratch arena,
    /// state/arena/mod.rs): its crc field stays 0, and its magic is one no walk is given.
    pub crc: bool,
}

impl Format {
    /// Bytes a record with a `len`-byte payload takes. `align` is a power of two
    /// ([`supported`]): rounded up with a mask, where `next_multiple_of` divided by it.
    pub const fn record_size(&self, len: usize) -> usize {
        self.record_header + ((len + self.align - 1) & !(self.align - 1))
    }

    /// Where the covered header bytes start: after the seq or the flags.
    const META_AT: usize = 16;
}

/// What a walk found besides the intact records it handed to the owner.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Walk {
    /// Positions (0 = the segment's first record) of damaged records skipped in the middle. In a
    /// numbered log they are exact (the next intact record's seq says how many were lost); in a
    /// flags log a damaged stretch counts as one.
    pub skipped: Vec<u64>,
    /// Records cut at the tail (a torn append, or damage no later record vouches for): 0 or 1.
    pub torn: usize,
    /// Data byte ranges that held damage (module doc, "Recovery"): each skipped stretch, and a
    /// tail that is not a torn append. Empty when nothing needs a report or a quarantine.
    pub damaged: Vec<Range<usize>>,
    /// An unreadable block (EIO at `pread`): the walk stopped there and wrote nothing; the owner
    /// must not use the file (quarantine.rs).
    pub unreadable: Option<Range<usize>>,
}

impl Walk {
    /// Whether the file holds damage: its owner logs what was lost and quarantines it.
    pub fn is_damaged(&self) -> bool {
        !self.damaged.is_empty() || self.unreadable.is_some()
    }
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
    /// The file's data bytes (a mapping never changes size): read on every append.
    data_len: usize,
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
        supported(format, path)?;
        let file = storage.create(path, format.magic, format.version, data_len)?;
        let data_len = file.read().len();
        let mut segment = Segment { file, format, id, end: format.segment_header, records: 0, synced: 0, data_len };
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
        debug_assert!(format.crc, "a log without crcs is never opened: nothing could tell its records intact");
        supported(format, path)?;
        let file = storage.open(path, format.magic, format.version)?;
        let data_len = file.read().len();
        let mut segment = Segment { file, format, id: 0, end: format.segment_header, records: 0, synced: 0, data_len };
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

    /// Recovers the records (module doc, "Recovery"): reads the file with `pread`, hands every
    /// intact record to `accept`, which may still refuse it (then it counts as damaged), skips
    /// damaged stretches followed by an intact record and sets the end after the last intact
    /// record. Writes nothing: [`cut_tail`](Self::cut_tail) writes the end mark there next, unless
    /// a block is unreadable ([`Walk::unreadable`]; then the file must not be used).
    pub fn walk(&mut self, mut accept: impl FnMut(&Record<'_>) -> bool) -> Result<Walk, MappedFileError> {
        let format = self.format;
        let data_len = self.data_len();
        let mut reader = Reader::new(&*self.file);
        let mut walk = Walk::default();
        let (mut off, mut position) = (format.segment_header, 0u64);
        let (mut end, mut records) = (off, 0);
        let stopped = loop {
            match self.step(&mut reader, off, position, false, &mut accept) {
                Ok(Step::End) => break Ok(()),
                Ok(Step::Intact(size)) => {
                    off += size;
                    position += 1;
                    (end, records) = (off, position);
                }
                Ok(Step::Bad(size)) => match self.resync(&mut reader, off, position, &mut accept) {
                    Ok(Some((next, next_position, size_next))) => {
                        walk.skipped.extend(position..next_position.max(position + 1));
                        walk.damaged.push(off..next);
                        off = next + size_next;
                        position = next_position.max(position + 1) + 1;
                        (end, records) = (off, position);
                    }
                    Ok(None) => {
                        walk.torn = 1;
                        if !torn_append(&mut reader, off, size, data_len) {
                            walk.damaged.push(off..size.map_or(off + format.record_header, |size| off + size));
                        }
                        break Ok(());
                    }
                    Err(range) => break Err(range),
                },
                Err(range) => break Err(range),
            }
        };
        if let Err(range) = stopped {
            walk.unreadable = Some(range);
            return Ok(walk);
        }
        self.end = end;
        self.records = records;
        self.synced = end;
        Ok(walk)
    }

    /// Cuts what follows the last intact record the walk found: writes the end mark there. Called
    /// after the walk, once a damaged file's owner has copied it as found (quarantine.rs).
    pub fn cut_tail(&mut self) -> Result<(), MappedFileError> {
        self.write_end_mark()
    }

    /// Whether the first record's place holds anything (read with `pread`): a segment whose
    /// header fails its crc but holds nothing is a reset a crash interrupted (module doc,
    /// "Reset"), not damage.
    pub fn first_record_written(&self) -> Result<bool, MappedFileError> {
        let mut first = [0u8; END_MARK];
        if self.format.segment_header + END_MARK > self.data_len() {
            return Ok(false);
        }
        self.file.read_at(self.format.segment_header, &mut first)?;
        Ok(first.iter().any(|&b| b != 0))
    }

    /// Looks at the record at `off` (expected at `position`; `resync`: any later position of a
    /// numbered log is fine too). `Err`: an unreadable block.
    fn step(
        &self,
        reader: &mut Reader<'_>,
        off: usize,
        position: u64,
        resync: bool,
        accept: &mut impl FnMut(&Record<'_>) -> bool,
    ) -> Result<Step, Range<usize>> {
        let format = self.format;
        let data_len = self.data_len();
        if off + format.record_header > data_len {
            return Ok(Step::End);
        }
        let header = reader.get(off, format.record_header)?;
        if header[..END_MARK].iter().all(|&b| b == 0) {
            return Ok(if resync { Step::Bad(None) } else { Step::End });
        }
        let size = format.record_size(u32::from_le_bytes(word(header, 0)) as usize);
        if size > data_len - off {
            return Ok(Step::Bad(None));
        }
        let position = match (resync, format.numbered) {
            // A later record of a numbered log says where it stands: its seq.
            (true, true) => {
                let seq = u64::from_le_bytes(dword(header, 8));
                match seq.checked_sub(self.id) {
                    Some(p) if p > position && p - position <= (data_len / format.record_header) as u64 => p,
                    _ => return Ok(Step::Bad(Some(size))),
                }
            }
            _ => position,
        };
        // The cheap checks before the crc reads the payload (resync tries every offset).
        if !self.header_ok(header, position) {
            return Ok(Step::Bad(Some(size)));
        }
        let bytes = reader.get(off, size)?;
        let (header, rest) = bytes.split_at(format.record_header);
        let payload = &rest[..u32::from_le_bytes(word(header, 0)) as usize];
        let intact = crc(self.salt(position), header, payload) == u32::from_le_bytes(word(header, 4))
            && accept(&Record { off, size, position, header, payload });
        Ok(if intact { Step::Intact(size) } else { Step::Bad(Some(size)) })
    }

    /// The next intact record after the bad one at `off`: its offset, position and size. Every
    /// aligned offset is a candidate; a false find needs a 32-bit crc collision (and, numbered, a
    /// seq in range).
    #[allow(clippy::type_complexity)]
    fn resync(
        &self,
        reader: &mut Reader<'_>,
        off: usize,
        position: u64,
        accept: &mut impl FnMut(&Record<'_>) -> bool,
    ) -> Result<Option<(usize, u64, usize)>, Range<usize>> {
        let format = self.format;
        let mut at = off + format.align;
        while at + format.record_header <= self.data_len() {
            let mut found = None;
            let mut accept_here = |record: &Record<'_>| {
                let ok = accept(record);
                if ok {
                    found = Some(record.position);
                }
                ok
            };
            if let Step::Intact(size) = self.step(reader, at, position, true, &mut accept_here)? {
                let next_position = found.unwrap_or(position + 1);
                return Ok(Some((at, next_position, size)));
            }
            at += format.align;
        }
        Ok(None)
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
        if parts.iter().map(|part| part.len()).sum::<usize>() != len {
            return Err(bad("record parts of the wrong length"));
        }
        header[meta_at..].copy_from_slice(meta);
        let crc = format.crc.then(|| {
            let (salt, salt_len) = self.salt(position);
            record_crc(&[&salt[..salt_len], &header[..4], &header[Format::META_AT..]], parts)
        });
        header[4..8].copy_from_slice(&crc.unwrap_or(0).to_le_bytes());
        // The parts, the padding and the end mark after the record (one run of zeros), then the
        // header: until the header lands, the old end mark at `off` still ends the log, so a
        // failed or torn append leaves no record. A log without crcs is never walked, so nothing
        // reads its padding or end marks: they are not written.
        let after = off + size;
        let zeros = if format.crc {
            after - (off + format.record_header + len) + END_MARK.min(self.data_len() - after)
        } else {
            0
        };
        // At most MAX_ALIGN − 1 + END_MARK: the format passed `supported` when the segment was made.
        self.file.write_record(off, header, parts, &ZEROS[..zeros])?;
        self.end = after;
        self.records += 1;
        Ok(off)
    }

    /// [`append`](Self::append) of one payload, `meta` being its header from byte 8 on. In a log
    /// without crcs (a scratch arena's: one append per row a shard stores) on a file written in
    /// place ([`StoredFile::memory_mut`]), the header and the payload are copied straight into
    /// the mapping, with no padding or end mark (module doc: nothing walks such a log); the
    /// general path assembled, checked and handed its pieces to a call through the file's
    /// vtable, which cost as much as the rest of the row's store. Any other log or file, or a
    /// record that does not fit, takes the general path.
    #[inline]
    pub fn append_one<const M: usize>(&mut self, meta: &[u8; M], payload: &[u8]) -> Result<usize, MappedFileError> {
        let format = self.format;
        let (off, size, header_len) = (self.end, format.record_size(payload.len()), 8 + M);
        let plain = !format.crc && !format.numbered && header_len == format.record_header;
        if !plain || u32::try_from(payload.len()).is_err() || !self.fits(size) {
            return self.append_general(meta, payload);
        }
        let in_place = self.file.memory_mut().and_then(|data| data.get_mut(off..off + header_len + payload.len()));
        let Some(record) = in_place else {
            return self.append_general(meta, payload);
        };
        let (header, body) = record.split_at_mut(header_len);
        header[..4].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        header[4..8].fill(0); // the crc field, as `append` leaves it in a log without crcs
        header[8..].copy_from_slice(meta);
        body.copy_from_slice(payload);
        self.end = off + size;
        self.records += 1;
        Ok(off)
    }

    /// [`append_one`](Self::append_one) by the general path. Out of line, so that `append_one`
    /// stays small enough to be inlined into its caller with the general path's frame kept out.
    #[inline(never)]
    fn append_general(&mut self, meta: &[u8], payload: &[u8]) -> Result<usize, MappedFileError> {
        self.append(meta, &[payload], payload.len())
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

    /// The payload of the record at `off`, in place. Inlined: the arena reads a stored row
    /// through it at every visit of a key's rows.
    #[inline]
    pub fn payload(&self, off: usize) -> &[u8] {
        let data = self.file.read();
        let at = off + self.format.record_header;
        &data[at..at + payload_len(data, off)]
    }

    /// The bytes of the record at `off` whose payload is `len` bytes long, header included, as
    /// an index entry knows them: found without reading the record (for a prefetch, before every
    /// visit of a key's rows, so inlined; clipped to the data area, as a hint must never panic).
    #[inline]
    pub fn record_bytes(&self, off: usize, len: usize) -> &[u8] {
        let data = self.file.read();
        let end = (off + self.format.record_header + len).min(data.len());
        &data[off.min(end)..end]
    }

    /// Payload length of the record at `off`.
    pub fn len_at(&self, off: usize) -> usize {
        payload_len(self.file.read(), off)
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

    /// Maps the file's pages in one call (a new segment that will be filled: [`StoredFile::populate_pages`]).
    pub fn populate_pages(&self) {
        self.file.populate_pages();
    }

    /// Lets the resident set go of the file's pages (a full segment: [`StoredFile::forget_pages`]).
    pub fn forget_pages(&self) {
        self.file.forget_pages();
    }

    /// Empties a segment kept for reuse: the end mark goes right after its header, so it reads
    /// as holding no records (a start after a crash finds nothing torn in it), then every whole
    /// page of the data area past the first, which holds the headers, is freed
    /// ([`StoredFile::give_back`]). The header stays until [`reset`](Self::reset).
    pub fn give_back_pages(&mut self) -> Result<(), MappedFileError> {
        let at = self.format.segment_header;
        self.file.write(at, &[0; END_MARK])?;
        (self.end, self.records, self.synced) = (at, 0, 0);
        self.file
            .give_back(0, self.data_len())
            .map_err(|source| MappedFileError::Io { path: self.path().to_owned(), source })
    }

    /// Allocates again what [`give_back_pages`](Self::give_back_pages) freed, before the segment
    /// is written again ([`StoredFile::take_back`]).
    pub fn take_back_pages(&self) -> Result<(), MappedFileError> {
        self.file
            .take_back(0, self.data_len())
            .map_err(|source| MappedFileError::Io { path: self.path().to_owned(), source })
    }

    pub fn path(&self) -> &Path {
        self.file.path()
    }

    pub fn data_len(&self) -> usize {
        self.data_len
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

/// Refuses a format whose records this module cannot pad: their padding and end mark are written
/// from [`ZEROS`], and [`Format::record_size`] rounds with a mask (checked once per segment, so an
/// append can rely on it).
fn supported(format: &Format, path: &Path) -> Result<(), MappedFileError> {
    if format.align > MAX_ALIGN || !format.align.is_power_of_two() {
        let source = std::io::Error::other(format!(
            "records aligned to {} bytes: not a power of two up to {MAX_ALIGN}",
            format.align
        ));
        return Err(MappedFileError::Io { path: path.to_owned(), source });
    }
    Ok(())
}

/// crc32c of the salt, the length (header bytes 0..4), the covered header bytes (16..) and the
/// payload.
fn crc((salt, salt_len): ([u8; 8], usize), header: &[u8], payload: &[u8]) -> u32 {
    record_crc(&[&salt[..salt_len], &header[..4], &header[Format::META_AT..]], &[payload])
}

/// Bytes a record's covered pieces may take to be gathered for one crc call.
const GATHER: usize = 512;

/// crc32c of `head`'s pieces, then `parts`', as if they were one run of bytes. A record small
/// enough is gathered on the stack and summed in one call: each call of the crc has a fixed cost
/// (two block passes, the bytes before and after the aligned middle) that a journal entry of a
/// hundred bytes in six pieces paid six times (7 % of the intake thread's samples, BENCHMARKS.md
/// "One thread for a source's messages"). A larger one is summed piece by piece, to the same value.
fn record_crc(head: &[&[u8]], parts: &[&[u8]]) -> u32 {
    let pieces = || head.iter().chain(parts);
    let len: usize = pieces().map(|piece| piece.len()).sum();
    if len > GATHER {
        return pieces().fold(0, |crc, piece| crc32c::crc32c_append(crc, piece));
    }
    let mut gathered = [0u8; GATHER];
    let mut at = 0;
    for piece in pieces() {
        gathered[at..at + piece.len()].copy_from_slice(piece);
        at += piece.len();
    }
    crc32c::crc32c(&gathered[..at])
}

/// The payload length in the header of the record at `off` of `data` (one read of the mapping
/// for both the length and the payload).
fn payload_len(data: &[u8], off: usize) -> usize {
    u32::from_le_bytes(word(data, off)) as usize
}

/// Four bytes at `at` (the caller checked the bounds). One range check, not four: a stored
/// row's every read goes through it (`payload`).
pub fn word(bytes: &[u8], at: usize) -> [u8; 4] {
    let mut out = [0u8; 4];
    out.copy_from_slice(&bytes[at..at + 4]);
    out
}

/// Eight bytes at `at` (the caller checked the bounds).
pub fn dword(bytes: &[u8], at: usize) -> [u8; 8] {
    let mut out = [0u8; 8];
    out.copy_from_slice(&bytes[at..at + 8]);
    out
}

/// Whether the bad record at `off` (its size, when its length fits) is a torn append: the end
/// mark an append writes before its header is there after it (module doc, "Recovery").
fn torn_append(reader: &mut Reader<'_>, off: usize, size: Option<usize>, data_len: usize) -> bool {
    let Some(size) = size else { return false };
    let after = off + size;
    let n = END_MARK.min(data_len - after);
    reader.get(after, n).is_ok_and(|bytes| bytes.iter().all(|&b| b == 0))
}

/// What [`Segment::step`] found at an offset.
enum Step {
    /// No record starts here: the end mark or the end of the segment.
    End,
    /// An intact record of this many bytes.
    Intact(usize),
    /// Not an intact record; its size when its length fits the segment.
    Bad(Option<usize>),
}

/// Reads a file's data area with `pread` through a window, for the walk (mapped_file.rs point 7).
struct Reader<'a> {
    file: &'a dyn StoredFile,
    buf: Vec<u8>,
    /// Data offset of `buf[0]`.
    start: usize,
}

/// Bytes read at a time.
const WINDOW: usize = 256 << 10;
/// Unreadable ranges are reported to this granularity.
const BLOCK: usize = 4096;

impl<'a> Reader<'a> {
    fn new(file: &'a dyn StoredFile) -> Reader<'a> {
        Reader { file, buf: Vec::new(), start: 0 }
    }

    /// Data bytes `at..at + n` (within the file); `Err`: the first unreadable block among them.
    fn get(&mut self, at: usize, n: usize) -> Result<&[u8], Range<usize>> {
        if at < self.start || at + n > self.start + self.buf.len() {
            let len = n.max(WINDOW).min(self.file.read().len() - at);
            self.buf.resize(len, 0);
            self.start = at;
            if self.file.read_at(at, &mut self.buf).is_err() {
                self.buf.clear();
                return Err(self.first_unreadable(at, len));
            }
        }
        Ok(&self.buf[at - self.start..at - self.start + n])
    }

    /// The first block of `at..at + len` that `pread` cannot read (all of it if each reads now).
    fn first_unreadable(&self, at: usize, len: usize) -> Range<usize> {
        let mut block = [0u8; BLOCK];
        let mut from = at;
        while from < at + len {
            let to = (from / BLOCK + 1) * BLOCK;
            let to = to.min(at + len);
            if self.file.read_at(from, &mut block[..to - from]).is_err() {
                return from..to;
            }
            from = to;
        }
        at..at + len
    }
}

#[cfg(test)]
mod crc_tests {
    use super::{GATHER, record_crc};

    /// Gathered or summed piece by piece, a record's crc is the crc of its bytes in one run, at
    /// every size around the gathering bound.
    #[test]
    fn a_record_crc_is_the_crc_of_its_pieces_in_one_run() {
        let bytes: Vec<u8> = (0..2 * GATHER as u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        for len in [0, 1, 7, 100, GATHER - 13, GATHER - 12, GATHER - 11, GATHER + 1, 2 * GATHER - 12] {
            let (salt, rest) = bytes.split_at(8);
            let (length, rest) = rest.split_at(4);
            let payload = &rest[..len];
            let (first, second) = payload.split_at(len / 3);
            let whole: Vec<u8> = [salt, length, first, second].concat();
            assert_eq!(record_crc(&[salt, length], &[first, second]), crc32c::crc32c(&whole), "{len} bytes of parts");
        }
    }
}
