//! Memory-mapped files: the only `memmap2` call site in braid, and the one place where the
//! soundness of braid's mappings is argued. Every other module that reads or writes a mapped file
//! — the segment log of the spools and arenas ([`super::log`]), the spool's head file, the rings —
//! relies on the argument below instead of repeating it.
//!
//! Rings, state arenas, spools and checkpoints live in files mapped into memory. A mapped file is
//! sound to use only if nothing changes its length or contents behind the mapping's back; this
//! module is where that is guaranteed, and the argument is:
//!
//! 1. **One braid per file.** Every file is locked with `flock(LOCK_EX | LOCK_NB)` before it is
//!    mapped and stays locked while mapped (the lock lives in the [`MappedFile`]); a second braid
//!    on the same `state_dir` fails to open it instead of sharing it.
//! 2. **No holes, so no SIGBUS on a full disk.** A file is created at its full length with
//!    `posix_fallocate`; writing into a mapped hole on a full disk raises SIGBUS rather than an
//!    error, and a fully allocated file has no holes. A ring may give back the pages of bytes it
//!    holds no frame in ([`give_back`](MappedFile::give_back), a punched hole) and takes them back
//!    ([`take_back`](MappedFile::take_back), allocated again, a full disk an error) before it
//!    writes there again: no byte is written through the mapping while its block is a hole.
//! 3. **Never shrunk while mapped.** The length is set once, before mapping, and nothing in braid
//!    truncates a mapped file (touching a page past the end of a shrunk file is SIGBUS). A file
//!    that is no longer needed is unlinked while still mapped, then unmapped.
//! 4. **Validated before trusted.** [`MappedFile::open`] checks the length, the magic, the version
//!    and the header's crc32c before any other byte is read; what lies beyond the header (ring
//!    frames, segment records) carries its own crc, checked by its module on recovery.
//! 5. **One mapping, one owner, borrows for access.** A `MappedFile` is the only mapping of its
//!    file in this process (it is not `Clone`, and point 1 keeps other processes out), and the
//!    mapping is initialised (a created file is zeroed, an opened one holds its bytes). So
//!    [`data`](MappedFile::data) hands out a shared slice borrowed from `&self` and
//!    [`data_mut`](MappedFile::data_mut) an exclusive one borrowed from `&mut self`: the borrow
//!    checker then guarantees that nothing writes the bytes while a shared slice lives. These two
//!    are the only `unsafe` blocks that turn the mapping into slices.
//! 6. **Shared memory goes through raw pointers.** The ring is written by one thread and read by
//!    another through the same `&MappedFile`; it uses [`data_ptr`](MappedFile::data_ptr) and
//!    atomics (its own `SAFETY:` arguments) and never calls `data`/`data_mut`, which would alias
//!    its concurrent writes.
//!
//! 7. **Recovery reads with `pread`.** A page of a mapped file that the disk cannot read is
//!    SIGBUS when touched, at every start. So nothing reads a file through its mapping before it
//!    was read once with `pread` ([`read_data_at`](MappedFile::read_data_at)): the header at
//!    [`open`](MappedFile::open), the records by the segment log's walk (storage/log.rs), the
//!    spool's head slots. An unreadable block is then an EIO error, and the file is quarantined
//!    (storage/quarantine.rs) instead of being mapped into use.
//!
//! 8. **Scratch memory that is kept.** [`ScratchBytes`] maps an anonymous memory file
//!    (`memfd_create`, close-on-exec): no path names it, so points 1 and 4 hold by construction.
//!    Point 2 holds as for the rings: a range is allocated (`fallocate`) before the mapping may
//!    reach it, and pages given back are punched holes beyond the length in use, allocated again
//!    before they are written. Point 3: the file only grows while mapped; a longer mapping of
//!    the same file replaces the old one after the file has grown. Point 5: slices are borrowed
//!    from `&self` or `&mut self`, within the length written so far.
//!
//! What this cannot prevent: another program (or a person) truncating or rewriting the file
//! without taking the lock. Like any database, braid owns its `state_dir`.
//!
//! Durability: `flush_range` is `msync(MS_SYNC)`; memmap2's `flush_async` (MS_ASYNC) is a no-op on
//! Linux and is never used for durability.
//!
//! Header layout (64 bytes, little-endian): magic `[u8; 8]` | version u32 | reserved u32 |
//! file length u64 | reserved `[u8; 36]` | crc32c of bytes 0..60 u32.

use std::fs::{File, OpenOptions, TryLockError};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use memmap2::{Advice, MmapOptions, MmapRaw, RemapOptions};
use thiserror::Error;

/// Where throwaway mapped files (a replay's rings and arenas, a benchmark's) go: `/dev/shm` where
/// the machine has it — memory-backed, so no disk writeback for files deleted at exit anyway —
/// else the temporary directory.
pub fn scratch_base() -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() { shm.to_owned() } else { std::env::temp_dir() }
}

/// Removes the private directories `PREFIX PID -…` in `base` whose process is gone (a replay's or
/// a benchmark's, killed before it could remove its own): in `/dev/shm` they would hold memory
/// until the next reboot. Best effort; errors are ignored.
pub fn remove_abandoned(base: &Path, prefix: &str) {
    // Without /proc, a live process cannot be told from a dead one: leave everything.
    if !Path::new("/proc/self").exists() {
        return;
    }
    let Ok(entries) = std::fs::read_dir(base) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_prefix(prefix)).and_then(|rest| rest.split('-').next())
        else {
            continue;
        };
        let gone = pid.parse::<u32>().is_ok_and(|pid| !Path::new(&format!("/proc/{pid}")).exists());
        if gone {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Bytes an unprivileged process may still allocate in the file system holding `path`
/// (statvfs's `f_bavail × f_frsize`): whether preallocated mapped files fit there.
pub fn free_bytes(path: &Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "a NUL byte in the path"))?;
    // SAFETY: an all-zero statvfs is a valid value of this plain C struct (integers only).
    let mut stats: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c_path` is a NUL-terminated string alive for the call; `stats` is a valid,
    // writable statvfs that statvfs(3) fills in.
    if unsafe { libc::statvfs(c_path.as_ptr(), &mut stats) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    #[allow(clippy::useless_conversion)] // the field types differ between targets
    Ok(u64::from(stats.f_bavail).saturating_mul(u64::from(stats.f_frsize)))
}

/// Bytes at the start of every mapped file, before its data.
pub const HEADER_LEN: usize = 64;
const CRC_AT: usize = 60;

#[derive(Debug, Error)]
pub enum MappedFileError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// Another braid holds the file: retrying will not help while it runs.
    #[error("{0}: locked by another process (is another braid using this state_dir?)")]
    Locked(PathBuf),
    #[error("{path}: not a braid {expected} file (or damaged header): {reason}")]
    Invalid { path: PathBuf, expected: String, reason: String },
}

impl MappedFileError {
    /// The system's error, for a failed read, write, allocation or sync (a full disk is one).
    pub fn io(&self) -> Option<&std::io::Error> {
        match self {
            MappedFileError::Io { source, .. } => Some(source),
            MappedFileError::Locked(_) | MappedFileError::Invalid { .. } => None,
        }
    }

    /// The file it is about.
    pub fn path(&self) -> &Path {
        match self {
            MappedFileError::Io { path, .. }
            | MappedFileError::Locked(path)
            | MappedFileError::Invalid { path, .. } => path,
        }
    }
}

/// A locked, fully allocated, mapped file with a checked header.
pub struct MappedFile {
    map: MmapRaw,
    path: PathBuf,
    /// Holds the flock for as long as the mapping lives.
    file: File,
}

impl MappedFile {
    /// Creates (or replaces) `path` with `data_len` bytes of zeroed data after the header.
    ///
    /// Built under a temporary name ([`temporary_name`]) — allocated, header written and synced —
    /// and renamed to `path` only then: a crash or a full disk never leaves a file at `path`
    /// without a valid header, and a failed creation removes what it made (a full disk does not
    /// fill the directory with empty files).
    pub fn create(path: &Path, magic: [u8; 8], version: u32, data_len: usize) -> Result<MappedFile, MappedFileError> {
        let io = |source| MappedFileError::Io { path: path.to_owned(), source };
        refuse_if_locked(path)?;
        let tmp = temporary_name(path);
        let made = MappedFile::create_at(&tmp, magic, version, data_len)
            .and_then(|mapped| std::fs::rename(&tmp, path).map(|()| mapped).map_err(io));
        match made {
            Ok(mut mapped) => {
                mapped.path = path.to_owned();
                Ok(mapped)
            }
            Err(error) => {
                // Nothing may stay behind; a temporary file that was never made is no error.
                let _ = std::fs::remove_file(&tmp);
                // Named by the file it was to be: that is what the operator knows.
                Err(match error {
                    MappedFileError::Io { source, .. } => io(source),
                    other => other,
                })
            }
        }
    }

    /// The file at `tmp`, allocated, with its header written and synced.
    fn create_at(tmp: &Path, magic: [u8; 8], version: u32, data_len: usize) -> Result<MappedFile, MappedFileError> {
        let io = |source| MappedFileError::Io { path: tmp.to_owned(), source };
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(tmp).map_err(io)?;
        lock(&file, tmp)?;
        let len = HEADER_LEN + data_len;
        // Not mapped by anyone (we hold the lock): cutting it to zero first gives zeroed data.
        file.set_len(0).map_err(io)?;
        allocate(&file, len).map_err(io)?;
        let map = MmapRaw::map_raw(&file).map_err(io)?;
        let mut mapped = MappedFile { map, path: tmp.to_owned(), file };
        mapped.write_header(magic, version, len as u64);
        mapped.flush_range(0, HEADER_LEN)?;
        Ok(mapped)
    }

    /// Opens an existing file, checking its length, magic, version and header crc.
    pub fn open(path: &Path, magic: [u8; 8], version: u32) -> Result<MappedFile, MappedFileError> {
        let io = |source| MappedFileError::Io { path: path.to_owned(), source };
        let file = OpenOptions::new().read(true).write(true).open(path).map_err(io)?;
        lock(&file, path)?;
        let invalid = |reason: String| MappedFileError::Invalid {
            path: path.to_owned(),
            expected: String::from_utf8_lossy(&magic).trim_end_matches('\0').to_owned(),
            reason,
        };
        let file_len = file.metadata().map_err(io)?.len();
        if file_len < HEADER_LEN as u64 {
            return Err(invalid(format!("{file_len} bytes, shorter than the header")));
        }
        // Read with pread before mapping: an unreadable header is EIO here, never SIGBUS.
        let mut header = [0u8; HEADER_LEN];
        file.read_exact_at(&mut header, 0).map_err(io)?;
        let map = MmapRaw::map_raw(&file).map_err(io)?;
        let mapped = MappedFile { map, path: path.to_owned(), file };
        let crc = u32::from_le_bytes(header[CRC_AT..].try_into().unwrap_or_default());
        if crc32c::crc32c(&header[..CRC_AT]) != crc {
            return Err(invalid("header checksum mismatch".into()));
        }
        if header[..8] != magic {
            return Err(invalid(format!("magic {:?}", String::from_utf8_lossy(&header[..8]))));
        }
        let found = u32::from_le_bytes(header[8..12].try_into().unwrap_or_default());
        if found != version {
            return Err(invalid(format!("version {found}, this braid reads version {version}")));
        }
        let recorded = u64::from_le_bytes(header[16..24].try_into().unwrap_or_default());
        if recorded != file_len {
            return Err(invalid(format!("length {file_len}, its header says {recorded} (truncated or extended)")));
        }
        Ok(mapped)
    }

    /// Written only here, at creation, while the file is locked and before anyone else sees it.
    fn write_header(&mut self, magic: [u8; 8], version: u32, len: u64) {
        let mut header = [0u8; HEADER_LEN];
        header[..8].copy_from_slice(&magic);
        header[8..12].copy_from_slice(&version.to_le_bytes());
        header[16..24].copy_from_slice(&len.to_le_bytes());
        let crc = crc32c::crc32c(&header[..CRC_AT]);
        header[CRC_AT..].copy_from_slice(&crc.to_le_bytes());
        self.all_mut()[..HEADER_LEN].copy_from_slice(&header);
    }

    /// The whole mapping, header included.
    fn all(&self) -> &[u8] {
        // SAFETY: module doc, point 5: the mapping is valid and initialised for `len` bytes while
        // `self` lives, this `MappedFile` is its only owner, and writers need `&mut self` (or,
        // for the ring, never overlap a slice: point 6), so nothing writes while this borrow lives.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr(), self.map.len()) }
    }

    /// The whole mapping, exclusively.
    fn all_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `all`; the exclusive borrow of `self` makes this the only slice alive.
        unsafe { std::slice::from_raw_parts_mut(self.map.as_mut_ptr(), self.map.len()) }
    }

    /// The data after the header (16-byte aligned: mappings are page aligned and the header is
    /// 64 bytes).
    pub fn data(&self) -> &[u8] {
        &self.all()[HEADER_LEN..]
    }

    /// The data after the header, exclusively.
    pub fn data_mut(&mut self) -> &mut [u8] {
        &mut self.all_mut()[HEADER_LEN..]
    }

    /// The data after the header as a raw pointer, for memory shared between threads (the ring;
    /// module doc, point 6): valid for [`data_len`](Self::data_len) bytes for as long as `self`
    /// lives, 16-byte aligned. Writing through it while a [`data`](Self::data) slice lives is
    /// undefined behaviour; the caller's `SAFETY:` argument rules that out.
    pub fn data_ptr(&self) -> *mut u8 {
        // In bounds: HEADER_LEN ≤ the mapping's length (see `header`).
        self.map.as_mut_ptr().wrapping_add(HEADER_LEN)
    }

    pub fn data_len(&self) -> usize {
        self.map.len() - HEADER_LEN
    }

    /// Reads data bytes `at..at + buf.len()` with `pread`, not through the mapping: recovery
    /// reads this way (point 7), so an unreadable block is an `Io` error (EIO), never SIGBUS.
    pub fn read_data_at(&self, at: usize, buf: &mut [u8]) -> Result<(), MappedFileError> {
        let io = |source| MappedFileError::Io { path: self.path.clone(), source };
        let end = at.checked_add(buf.len()).filter(|&end| end <= self.data_len());
        if end.is_none() {
            return Err(io(std::io::Error::other(format!("read of {} bytes at {at} outside the file", buf.len()))));
        }
        self.file.read_exact_at(buf, (HEADER_LEN + at) as u64).map_err(io)
    }

    /// Writes `len` data bytes from `offset` to disk (`msync(MS_SYNC)`).
    pub fn flush_data(&self, offset: usize, len: usize) -> Result<(), MappedFileError> {
        self.flush_range(HEADER_LEN + offset, len)
    }

    fn flush_range(&self, offset: usize, len: usize) -> Result<(), MappedFileError> {
        self.map.flush_range(offset, len).map_err(|source| MappedFileError::Io { path: self.path.clone(), source })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Drops this mapping's pages from the process's page tables (`madvise(MADV_DONTNEED)`), so
    /// the resident set no longer counts them. The file's bytes do not change: a shared file
    /// mapping reads them back from the page cache, dirty pages included, at the next access. For
    /// a file written no more and seldom read (a full spool segment kept until it is released).
    /// Best effort: a refusal only leaves the pages counted.
    pub fn forget_pages(&self) {
        // SAFETY: the mapping is a shared one of the file (`MmapRaw::map_raw`): MADV_DONTNEED
        // drops only page-table entries, and the next read faults the same bytes back in from
        // the page cache (dirty ones included), so no slice of the mapping sees them change. The
        // range is the whole mapping, which stays mapped.
        if let Err(error) = unsafe { self.map.unchecked_advise(memmap2::UncheckedAdvice::DontNeed) } {
            tracing::debug!(path = %self.path.display(), %error, "pages of a mapped file stay resident");
        }
    }

    /// Maps every page of the file writable now (`MADV_POPULATE_WRITE`), as the writes to come
    /// would one page fault at a time. For a file written from end to end soon after it is made:
    /// on a disk it dirties every page at once. Best effort: a kernel without it (before 5.14)
    /// faults them in as before.
    pub fn populate_pages(&self) {
        if let Err(error) = self.map.advise(Advice::PopulateWrite) {
            tracing::debug!(path = %self.path.display(), %error, "pages of a mapped file fault in as written");
        }
    }

    /// Frees the whole pages inside data bytes `[offset, offset + len)`: a hole is punched there,
    /// so the memory (tmpfs) or blocks behind them go back to the system, and the process's
    /// resident set no longer counts them. The bytes read as zeros afterwards; nothing may be
    /// written there before [`take_back`](Self::take_back) (point 2). The partial pages at either
    /// end stay. Fails on a file system that cannot punch holes (nothing changed then).
    pub fn give_back(&self, offset: usize, len: usize) -> std::io::Result<()> {
        self.fallocate_pages(libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, offset, len)
    }

    /// Allocates again the pages [`give_back`](Self::give_back) freed for the same range, so they
    /// can be written through the mapping; a full disk (or tmpfs) is an error here instead of
    /// SIGBUS at the write.
    pub fn take_back(&self, offset: usize, len: usize) -> std::io::Result<()> {
        self.fallocate_pages(0, offset, len)
    }

    /// `fallocate(mode)` over the whole pages inside data bytes `[offset, offset + len)`.
    fn fallocate_pages(&self, mode: libc::c_int, offset: usize, len: usize) -> std::io::Result<()> {
        let Some((start, len)) = whole_pages(HEADER_LEN + offset, len) else { return Ok(()) };
        // SAFETY: fallocate reads no memory of ours; the descriptor stays open for the call. The
        // mapping stays valid: both modes keep the file's length (a hole inside it reads as zeros).
        let done = unsafe { libc::fallocate(self.file.as_raw_fd(), mode, start, len) };
        if done == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
    }
}

/// A growable byte buffer in memory that keeps its pages from one use to the next (module doc,
/// point 8). A shard writes each checkpoint into the pages the last one filled: written into
/// fresh memory, a checkpoint's every 4 KiB page cost a page fault, the kernel zeroing it and,
/// once the file was written, unmapping it again, which took a shard more time than serializing
/// (BENCHMARKS.md, "A checkpoint written into the pages of the last one"). A memory file rather
/// than the heap: the pages are counted as shared memory, like the rings', not as braid's private
/// memory, and [`reuse`](Self::reuse) gives back what recent uses did not need.
pub struct ScratchBytes {
    file: File,
    /// Uses in a row, up to the last, that wrote less than half of what is allocated.
    small_uses: u32,
    /// The whole file, mapped; `None` while the file is empty.
    map: Option<MmapRaw>,
    /// Bytes written since the last [`reuse`](Self::reuse).
    len: usize,
    /// Bytes of the file allocated (`fallocate`d, no hole): the most the mapping may be written.
    allocated: usize,
}

/// A [`ScratchBytes`] grows by at least this much, and to a multiple of it.
const SCRATCH_STEP: usize = 256 << 10;

/// Small uses in a row after which a [`ScratchBytes`] gives back what they left over: more than
/// a checkpoint chain's deltas (checkpoint/mod.rs, `MAX_DELTAS`), so a shard's buffer keeps the
/// pages of the whole checkpoint that comes after them instead of giving them back at each delta
/// and faulting them in again at the next whole one.
const SMALL_USES_BEFORE_SHRINK: u32 = 8;

impl ScratchBytes {
    pub fn new() -> std::io::Result<ScratchBytes> {
        // SAFETY: the name is a NUL-terminated literal; memfd_create reads nothing else of ours.
        let fd = unsafe { libc::memfd_create(c"braid-scratch".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned open by memfd_create and nothing else owns it.
        let file = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        Ok(ScratchBytes { file, small_uses: 0, map: None, len: 0, allocated: 0 })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends `bytes`; the error is the system's when the buffer cannot grow (out of memory).
    pub fn extend_from_slice(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        let at = self.len;
        self.grow_to(at + bytes.len())?;
        self.as_mut_slice()[at..].copy_from_slice(bytes);
        Ok(())
    }

    /// Appends zeros up to `len` bytes (the pages of an earlier use hold its bytes).
    pub fn zero_fill_to(&mut self, len: usize) -> std::io::Result<()> {
        let at = self.len;
        if len > at {
            self.grow_to(len)?;
            self.as_mut_slice()[at..].fill(0);
        }
        Ok(())
    }

    pub fn as_slice(&self) -> &[u8] {
        match &self.map {
            // SAFETY: module doc, points 5 and 8: the mapping is valid while `self` lives and
            // `len` ≤ `allocated` ≤ its length; writers need `&mut self`.
            Some(map) => unsafe { std::slice::from_raw_parts(map.as_ptr(), self.len) },
            None => &[],
        }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        match &self.map {
            // SAFETY: as in `as_slice`; the exclusive borrow of `self` makes this the only slice.
            Some(map) => unsafe { std::slice::from_raw_parts_mut(map.as_mut_ptr(), self.len) },
            None => &mut [],
        }
    }

    /// Starts again from empty, keeping the pages the last use wrote, except when it ends a run
    /// of [`SMALL_USES_BEFORE_SHRINK`] uses in a row that each wrote less than half of what is
    /// allocated: then the rest goes back to the system (a state that shrank does not keep its
    /// largest checkpoint's memory). Punched, not truncated: the file never shrinks under its
    /// mapping (point 3).
    pub fn reuse(&mut self) {
        let keep = self.len.next_multiple_of(SCRATCH_STEP);
        self.len = 0;
        if keep * 2 > self.allocated {
            self.small_uses = 0;
            return;
        }
        self.small_uses += 1;
        if self.small_uses < SMALL_USES_BEFORE_SHRINK {
            return;
        }
        self.small_uses = 0;
        let Some((start, len)) = whole_pages(keep, self.allocated - keep) else { return };
        // SAFETY: fallocate reads no memory of ours; the descriptor is open. Punching keeps the
        // file's length, so the mapping stays valid (point 8).
        let punched = unsafe {
            libc::fallocate(self.file.as_raw_fd(), libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, start, len)
        };
        if punched == 0 {
            self.allocated = keep;
        }
    }

    /// Makes `len` bytes writable (a checkpoint writes a row's few bytes at a time: the common
    /// case is a comparison).
    #[inline]
    fn grow_to(&mut self, len: usize) -> std::io::Result<()> {
        if len > self.allocated {
            self.allocate(len)?;
        }
        self.len = len;
        Ok(())
    }

    /// Allocates and maps more of the file, a quarter more than asked (a checkpoint grows its
    /// buffer a few times, not once per write).
    #[cold]
    fn allocate(&mut self, len: usize) -> std::io::Result<()> {
        let (from, target) =
            (self.allocated, len.max(self.allocated + self.allocated / 4).next_multiple_of(SCRATCH_STEP));
        let off = |n: usize| libc::off_t::try_from(n).map_err(|_| std::io::Error::other("scratch buffer too large"));
        let (start, more) = (off(from)?, off(target - from)?);
        // SAFETY: fallocate reads no memory of ours; the descriptor is open. It only extends the
        // file (point 8: grown before it is mapped further).
        if unsafe { libc::fallocate(self.file.as_raw_fd(), 0, start, more) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        self.allocated = target;
        match self.map.as_mut() {
            None => self.map = Some(MmapOptions::new().len(target).map_raw(&self.file)?),
            // SAFETY: the file is `target` bytes long now (allocated above), so the longer mapping
            // lies within it (point 8); no slice of the old one is alive (`&mut self`). mremap
            // keeps the pages already mapped in place: no page fault at their next write.
            Some(map) if map.len() < target => unsafe { map.remap(target, RemapOptions::new().may_move(true))? },
            Some(_) => {}
        }
        if let Some(map) = &self.map {
            // The new pages mapped in one call rather than one page fault each as the checkpoint
            // reaches them. Only a hint: a kernel without it (before 5.14) faults them in.
            let _ = map.advise_range(Advice::PopulateWrite, from, target - from);
        }
        Ok(())
    }
}

/// The whole pages inside file bytes `[start, start + len)`, as fallocate's offset and length.
fn whole_pages(start: usize, len: usize) -> Option<(libc::off_t, libc::off_t)> {
    // SAFETY: sysconf reads no memory of ours (the page size comes from the auxiliary vector).
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).ok().filter(|&p| p > 0)?;
    let (first, end) = (start.next_multiple_of(page), (start + len) / page * page);
    let len = end.checked_sub(first).filter(|&len| len > 0)?;
    Some((libc::off_t::try_from(first).ok()?, libc::off_t::try_from(len).ok()?))
}

/// The name a file is built under before [`MappedFile::create`] renames it to `path`:
/// `.NAME.tmp` beside it. Directories that list their files skip it (it never ends in their
/// suffix); one left by a crash is replaced by the next creation of the same file.
pub fn temporary_name(path: &Path) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    path.with_file_name(format!(".{name}.tmp"))
}

/// Whether `name` is a file [`MappedFile::create`] was building when it stopped.
pub fn is_temporary_name(name: &str) -> bool {
    name.starts_with('.') && name.ends_with(".tmp")
}

/// A file being replaced must not be in use by another braid (point 1): the rename would pull it
/// from under that braid's mapping.
fn refuse_if_locked(path: &Path) -> Result<(), MappedFileError> {
    match OpenOptions::new().read(true).write(true).open(path) {
        Ok(existing) => lock(&existing, path),
        Err(_) => Ok(()),
    }
}

fn lock(file: &File, path: &Path) -> Result<(), MappedFileError> {
    match file.try_lock() {
        Ok(()) => Ok(()),
        Err(TryLockError::WouldBlock) => Err(MappedFileError::Locked(path.to_owned())),
        Err(TryLockError::Error(source)) => Err(MappedFileError::Io { path: path.to_owned(), source }),
    }
}

/// Allocates every block of the first `len` bytes (no holes), extending the file.
fn allocate(file: &File, len: usize) -> std::io::Result<()> {
    let len = libc::off_t::try_from(len).map_err(|_| std::io::Error::other("file too large"))?;
    // SAFETY: posix_fallocate reads no memory of ours; the descriptor is open for writing and
    // stays open for the call.
    let errno = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len) };
    match errno {
        0 => Ok(()),
        e => Err(std::io::Error::from_raw_os_error(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_directories_of_killed_processes_are_removed_live_ones_kept() {
        let base = tempfile::tempdir().unwrap();
        // No process has a pid this large (the kernel's limit is 2^22).
        let dead = base.path().join("braid-replay-999999999-abc");
        let live = base.path().join(format!("braid-replay-{}-def", std::process::id()));
        let other = base.path().join("braid-replay-notapid");
        let not_ours = base.path().join("braid-bench-999999999-abc");
        for dir in [&dead, &live, &other, &not_ours] {
            std::fs::create_dir_all(dir.join("shard-0")).unwrap();
        }
        remove_abandoned(base.path(), "braid-replay-");
        assert!(!dead.exists());
        assert!(live.exists() && other.exists() && not_ours.exists());
    }

    /// Blocks of the memory file behind a scratch buffer (in bytes): what it holds in memory.
    fn held(scratch: &ScratchBytes) -> u64 {
        std::os::unix::fs::MetadataExt::blocks(&scratch.file.metadata().unwrap()) * 512
    }

    /// A scratch buffer keeps every byte through its growth, keeps its pages (and their place)
    /// from one use to the next, gives back what a much smaller use left over, and reports a
    /// size it cannot reach as an error, unchanged.
    #[test]
    fn scratch_bytes_grow_keep_their_pages_and_give_back_the_unused() {
        let mut scratch = ScratchBytes::new().unwrap();
        let pattern = |i: usize| (i % 251) as u8;
        let chunk: Vec<u8> = (0..1000).map(pattern).collect();
        for _ in 0..5_000 {
            scratch.extend_from_slice(&chunk).unwrap();
        }
        assert_eq!(scratch.len(), 5_000_000);
        assert!(scratch.as_slice().chunks(1000).all(|c| c == chunk), "every byte kept through the growth");
        let (place, holding) = (scratch.as_slice().as_ptr(), held(&scratch));
        assert!(holding >= 5_000_000, "allocated, no holes: {holding}");

        scratch.reuse();
        assert!(scratch.is_empty());
        scratch.zero_fill_to(4_000_000).unwrap();
        assert!(scratch.as_slice().iter().all(|&b| b == 0), "zeros over the last use's bytes");
        assert_eq!((scratch.as_slice().as_ptr(), held(&scratch)), (place, holding), "the same pages, in place");

        scratch.reuse();
        assert_eq!(held(&scratch), holding, "a use of more than half keeps everything");
        // Small uses between large ones (a chain's deltas between its whole checkpoints) keep
        // the pages; only a run of them gives the rest back.
        for _ in 1..SMALL_USES_BEFORE_SHRINK {
            scratch.extend_from_slice(&chunk).unwrap();
            scratch.reuse();
            assert_eq!(held(&scratch), holding, "a few small uses keep everything");
        }
        scratch.extend_from_slice(&chunk).unwrap();
        scratch.reuse();
        assert!(held(&scratch) <= (SCRATCH_STEP as u64), "a run of small uses gives back the rest: {}", held(&scratch));
        scratch.extend_from_slice(&chunk).unwrap();
        assert!(scratch.zero_fill_to(usize::MAX / 2).is_err());
        assert_eq!(scratch.as_slice(), &chunk[..], "a failed growth changes nothing");
    }

    const MAGIC: [u8; 8] = *b"braidtst";

    /// This mapping's resident KiB, from its block of /proc/self/smaps.
    fn resident(file: &MappedFile) -> u64 {
        let start = format!("{:x}-", file.map.as_ptr() as usize);
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let block = smaps.split_once(&start).expect("the mapping in smaps").1;
        let rss = block.lines().find(|l| l.starts_with("Rss:")).expect("its Rss line");
        rss.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    /// Pages forgotten leave the resident set and read back as they were written.
    #[test]
    fn forgotten_pages_read_back_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let mut file = MappedFile::create(&dir.path().join("f"), *b"braidtst", 1, 1 << 20).unwrap();
        let bytes: Vec<u8> = (0..1 << 20).map(|i: u32| (i % 251) as u8).collect();
        file.data_mut().copy_from_slice(&bytes);
        let before = resident(&file);
        file.forget_pages();
        let after = resident(&file);
        assert!(before >= 1024 && after < 64, "resident {before} KiB before, {after} KiB after");
        assert_eq!(file.data(), &bytes[..]);
    }

    /// A new file's pages, populated, are resident at once and still read as zeros.
    #[test]
    fn populated_pages_are_resident_and_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let file = MappedFile::create(&dir.path().join("f"), *b"braidtst", 1, 1 << 20).unwrap();
        let before = resident(&file);
        file.populate_pages();
        let after = resident(&file);
        assert!(before < 64 && after >= 1024, "resident {before} KiB before, {after} KiB after");
        assert!(file.data().iter().all(|&b| b == 0));
    }

    #[test]
    fn create_then_open_round_trips_data() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        {
            let mut f = MappedFile::create(&path, MAGIC, 3, 4096).unwrap();
            assert_eq!(f.data_len(), 4096);
            assert_eq!(f.data_ptr() as usize % 16, 0);
            f.data_mut()[100] = 42;
            f.flush_data(0, 4096).unwrap();
        }
        let f = MappedFile::open(&path, MAGIC, 3).unwrap();
        assert_eq!(f.data()[100], 42);
        assert_eq!(f.data().as_ptr(), f.data_ptr().cast_const());
        let blocks = std::fs::metadata(&path).map(|m| std::os::unix::fs::MetadataExt::blocks(&m)).unwrap();
        assert!(blocks * 512 >= 4096 + HEADER_LEN as u64, "fully allocated, no holes");
    }

    #[test]
    fn a_failed_creation_leaves_no_file_and_a_good_one_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        // More than any file system holds: posix_fallocate fails (EFBIG or ENOSPC).
        let failed = MappedFile::create(&path, MAGIC, 1, usize::MAX / 2);
        assert!(matches!(failed, Err(MappedFileError::Io { .. })), "expected an I/O error");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "nothing left behind");
        drop(MappedFile::create(&path, MAGIC, 1, 64).unwrap());
        let names: Vec<String> =
            std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        assert_eq!(names, ["f"]);
        assert!(MappedFile::open(&path, MAGIC, 1).is_ok());
    }

    #[test]
    fn a_second_opener_is_refused_while_locked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let _held = MappedFile::create(&path, MAGIC, 1, 64).unwrap();
        assert!(matches!(MappedFile::open(&path, MAGIC, 1), Err(MappedFileError::Locked(_))));
    }

    #[test]
    fn damaged_or_foreign_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        drop(MappedFile::create(&path, MAGIC, 1, 64).unwrap());
        let reason = |r: Result<MappedFile, MappedFileError>| match r {
            Err(MappedFileError::Invalid { reason, .. }) => reason,
            Err(e) => format!("other error: {e}"),
            Ok(_) => "accepted".into(),
        };
        assert_eq!(reason(MappedFile::open(&path, MAGIC, 2)), "version 1, this braid reads version 2");
        assert!(reason(MappedFile::open(&path, *b"braidxxx", 1)).starts_with("magic"));
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[9] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(reason(MappedFile::open(&path, MAGIC, 1)), "header checksum mismatch");
        bytes[9] ^= 1;
        bytes.truncate(100);
        std::fs::write(&path, &bytes).unwrap();
        assert!(reason(MappedFile::open(&path, MAGIC, 1)).contains("truncated or extended"));
        std::fs::write(&path, b"short").unwrap();
        assert!(reason(MappedFile::open(&path, MAGIC, 1)).contains("shorter than the header"));
    }
}
