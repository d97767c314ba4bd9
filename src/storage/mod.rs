//! Byte-level storage: the files under the spools (journal, sink buffers) and the state arenas.
//!
//! Three layers, bottom up:
//!
//! - [`mapped_file`]: a locked, preallocated, header-checked file mapped into memory — the only
//!   `memmap2` call site, and the one place where the mmap soundness argument is written.
//! - [`Storage`] / [`StoredFile`]: the small trait the segment log is written against (STYLE.md
//!   11): `create`, `open`, `read`, `write`, `sync`, `remove`. [`Mmap`] is the product's backend
//!   (a [`MappedFile`] behind it); `faulty` (tests only) wraps any backend and fails a chosen
//!   call with ENOSPC, EIO, a torn write or a flipped bit, so tests can show that every fault is an
//!   error or a reported skip, never a panic or a silent loss.
//! - [`prefetch`]: a hint that brings a record's cache line in ahead of its read.
//! - [`quarantine`]: where a damaged state file goes (`STATE_DIR/quarantine/`), with what was lost
//!   logged and counted.
//! - [`log`]: one segment log — one record layout, one walk, one recovery rule — that the spool
//!   and the arena both store their records in. Its module doc has the byte layout.
//!
//! Why the trait has no `truncate`: a mapped file is never shrunk while mapped (mapped_file.rs,
//! point 3). "Truncating" a segment log is writing its end mark earlier ([`log::Segment::reset`]
//! and the torn-tail cut on open); a file that is no longer needed is [`StoredFile::remove`]d.
//! Why files have a fixed length: a segment is created at its full size, so an append never
//! allocates and a full disk shows up as an error at `create`, never as SIGBUS at a write.

#[cfg(test)]
pub mod faulty;
pub mod log;
pub mod mapped_file;
mod prefetch;
pub mod quarantine;
#[cfg(test)]
mod tests;
pub mod write_faults;

use std::path::Path;
use std::sync::Arc;

pub use self::mapped_file::{HEADER_LEN, MappedFile, MappedFileError, scratch_base};
pub use self::prefetch::prefetch;

/// Makes and opens [`StoredFile`]s: a directory's worth of segment files.
pub trait Storage: Send + Sync {
    /// Creates (or replaces) `path` with `data_len` zeroed bytes after a checked header with
    /// `magic` and `version`.
    fn create(
        &self,
        path: &Path,
        magic: [u8; 8],
        version: u32,
        data_len: usize,
    ) -> Result<Box<dyn StoredFile>, MappedFileError>;

    /// Opens an existing file, checking its header (length, magic, version, crc).
    fn open(&self, path: &Path, magic: [u8; 8], version: u32) -> Result<Box<dyn StoredFile>, MappedFileError>;
}

/// One fixed-length file's data area (what follows its header).
pub trait StoredFile: Send + Sync {
    fn path(&self) -> &Path;

    /// The whole data area, in place (through the mapping: only for bytes already read once with
    /// [`read_at`](Self::read_at), mapped_file.rs point 7).
    fn read(&self) -> &[u8];

    /// Reads data bytes `at..at + buf.len()` with `pread`: how recovery reads, so an unreadable
    /// block is an error (EIO), not SIGBUS.
    fn read_at(&self, at: usize, buf: &mut [u8]) -> Result<(), MappedFileError>;

    /// Writes `bytes` at data offset `at`. The caller keeps `at + bytes.len()` within
    /// [`read`](Self::read)`().len()`; a write outside it is an error, never a panic.
    fn write(&mut self, at: usize, bytes: &[u8]) -> Result<(), MappedFileError>;

    /// Writes one log record at data offset `at` in the order an append needs (storage/log.rs,
    /// "Append"): `parts` back to back from `at + header.len()`, then `tail` (padding and end
    /// mark) after them, then `header` at `at` — last, so a failure before it leaves no record.
    /// Stops at the first failed write. One call per record instead of one per piece; the
    /// default makes each piece a [`write`](Self::write), so a fault injected into any one of
    /// them is seen as before, and a backend may check the whole range once instead.
    fn write_record(&mut self, at: usize, header: &[u8], parts: &[&[u8]], tail: &[u8]) -> Result<(), MappedFileError> {
        let mut next = at + header.len();
        for part in parts {
            self.write(next, part)?;
            next += part.len();
        }
        self.write(next, tail)?;
        self.write(at, header)
    }

    /// The whole data area, exclusively, when a write is nothing more than a copy into it (the
    /// mmap backend): a log without crcs then writes a record in place (storage/log.rs,
    /// [`append_one`](log::Segment::append_one)). `None`, the default, for a
    /// backend whose every write must go through [`write`](Self::write) (one that injects faults).
    fn memory_mut(&mut self) -> Option<&mut [u8]> {
        None
    }

    /// Makes data bytes `at..at + len` durable (`msync(MS_SYNC)` for the mmap backend).
    fn sync(&self, at: usize, len: usize) -> Result<(), MappedFileError>;

    /// Lets the process's resident set go of the file's pages, for a file written no more and
    /// seldom read (a full spool segment): they stay in the page cache and come back as they are
    /// read ([`MappedFile::forget_pages`]). Nothing for a backend without a mapping.
    fn forget_pages(&self) {}

    /// Maps the file's pages into the process in one call, for a file about to be written from
    /// end to end (a new arena segment), instead of one page fault each as writes reach them
    /// ([`MappedFile::populate_pages`]). Nothing for a backend without a mapping.
    fn populate_pages(&self) {}

    /// Frees the whole pages of data bytes `[offset, offset + len)`: the blocks go back to the
    /// file system and dirty pages are dropped unwritten; they read as zeros and nothing may be
    /// written there before [`take_back`](Self::take_back) ([`MappedFile::give_back`]). Nothing
    /// for a backend without a mapping (its bytes stay as they are).
    fn give_back(&self, _offset: usize, _len: usize) -> std::io::Result<()> {
        Ok(())
    }

    /// Allocates again what [`give_back`](Self::give_back) freed, so it can be written: a full
    /// disk is an error here, not a fault at the write ([`MappedFile::take_back`]).
    fn take_back(&self, _offset: usize, _len: usize) -> std::io::Result<()> {
        Ok(())
    }

    /// Deletes the file: unlinked while still mapped and locked, then unmapped — never truncated
    /// under a mapping.
    fn remove(self: Box<Self>) -> Result<(), MappedFileError>;
}

/// The product's backend: every file a [`MappedFile`].
#[derive(Clone, Copy, Debug, Default)]
pub struct Mmap;

impl Mmap {
    /// The shared handle the spool and the arena take by default.
    pub fn shared() -> Arc<dyn Storage> {
        Arc::new(Mmap)
    }
}

impl Storage for Mmap {
    fn create(
        &self,
        path: &Path,
        magic: [u8; 8],
        version: u32,
        data_len: usize,
    ) -> Result<Box<dyn StoredFile>, MappedFileError> {
        Ok(Box::new(MappedFile::create(path, magic, version, data_len)?))
    }

    fn open(&self, path: &Path, magic: [u8; 8], version: u32) -> Result<Box<dyn StoredFile>, MappedFileError> {
        Ok(Box::new(MappedFile::open(path, magic, version)?))
    }
}

impl StoredFile for MappedFile {
    fn path(&self) -> &Path {
        MappedFile::path(self)
    }

    fn read(&self) -> &[u8] {
        self.data()
    }

    fn read_at(&self, at: usize, buf: &mut [u8]) -> Result<(), MappedFileError> {
        self.read_data_at(at, buf)
    }

    fn write(&mut self, at: usize, bytes: &[u8]) -> Result<(), MappedFileError> {
        let target = at.checked_add(bytes.len()).and_then(|end| self.data_mut().get_mut(at..end));
        let Some(target) = target else {
            return Err(outside(self.path(), at, Some(bytes.len())));
        };
        target.copy_from_slice(bytes);
        Ok(())
    }

    fn write_record(&mut self, at: usize, header: &[u8], parts: &[&[u8]], tail: &[u8]) -> Result<(), MappedFileError> {
        let len = parts.iter().try_fold(header.len() + tail.len(), |len, part| len.checked_add(part.len()));
        let target = len.and_then(|len| self.data_mut().get_mut(at..at.checked_add(len)?));
        let Some(record) = target else {
            return Err(outside(self.path(), at, len));
        };
        // The pieces fill `record` exactly (its length is theirs summed), in the trait's order.
        let (head, mut rest) = record.split_at_mut(header.len());
        for part in parts {
            let (target, after) = rest.split_at_mut(part.len());
            target.copy_from_slice(part);
            rest = after;
        }
        if !tail.is_empty() {
            rest.copy_from_slice(tail);
        }
        head.copy_from_slice(header);
        Ok(())
    }

    fn memory_mut(&mut self) -> Option<&mut [u8]> {
        Some(self.data_mut())
    }

    fn forget_pages(&self) {
        MappedFile::forget_pages(self);
    }

    fn populate_pages(&self) {
        MappedFile::populate_pages(self);
    }

    fn give_back(&self, offset: usize, len: usize) -> std::io::Result<()> {
        MappedFile::give_back(self, offset, len)
    }

    fn take_back(&self, offset: usize, len: usize) -> std::io::Result<()> {
        MappedFile::take_back(self, offset, len)
    }

    fn sync(&self, at: usize, len: usize) -> Result<(), MappedFileError> {
        self.flush_data(at, len)
    }

    fn remove(self: Box<Self>) -> Result<(), MappedFileError> {
        // Unlinked while still mapped and locked; the mapping goes when `self` drops.
        std::fs::remove_file(self.path()).map_err(|source| MappedFileError::Io { path: self.path().to_owned(), source })
    }
}

/// A write of `len` bytes (`None`: more than a `usize` holds) at data offset `at` that does not
/// fit the file: the caller's bug, reported as an error rather than a panic.
fn outside(path: &Path, at: usize, len: Option<usize>) -> MappedFileError {
    let len = len.map_or_else(|| "too many".to_owned(), |len| len.to_string());
    let source = std::io::Error::other(format!("write of {len} bytes at {at} outside the file"));
    MappedFileError::Io { path: path.to_owned(), source }
}
