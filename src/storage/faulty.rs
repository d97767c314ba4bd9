//! A fault-injecting [`Storage`] for tests: wraps another backend and makes one chosen call fail.
//!
//! Calls are counted across every file the backend made: `create`, `open`, `write`, `sync`
//! (`read` and `remove` are not counted). [`Faulty::fail_at`] picks the n-th call from now and the
//! [`Fault`]:
//!
//! - `Enospc`: the call fails with ENOSPC and does nothing (a full disk at create or write);
//! - `Eio`: the call fails with EIO and does nothing;
//! - `Torn`: a write lands only its first half, then fails with EIO — what a crash in the middle
//!   of a write leaves behind (other calls: EIO);
//! - `CrcFlip`: a write lands with one bit of its middle byte flipped and reports success —
//!   damage on the medium, for the next walk to catch (other calls succeed unchanged).
//!
//! Reads are not counted; [`Faulty::unreadable`] makes a byte range of every file whose name
//! ends with a given suffix fail `read_at` with EIO (a bad block under the file).

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use super::{MappedFileError, Storage, StoredFile};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    Enospc,
    Eio,
    Torn,
    CrcFlip,
}

#[derive(Default)]
struct Plan {
    calls: u64,
    fail: Option<(u64, Fault)>,
    /// File name suffix and data byte range that `read_at` cannot read.
    unreadable: Vec<(String, std::ops::Range<usize>)>,
}

impl Plan {
    /// Counts a call; the fault if this is the chosen one.
    fn next(&mut self) -> Option<Fault> {
        self.calls += 1;
        match self.fail {
            Some((at, fault)) if at == self.calls => {
                self.fail = None;
                Some(fault)
            }
            _ => None,
        }
    }
}

type Shared = Arc<Mutex<Plan>>;

fn next(plan: &Shared) -> Option<Fault> {
    plan.lock().unwrap_or_else(PoisonError::into_inner).next()
}

fn error(path: &Path, fault: Fault) -> MappedFileError {
    let code = if fault == Fault::Enospc { libc::ENOSPC } else { libc::EIO };
    MappedFileError::Io { path: path.to_owned(), source: std::io::Error::from_raw_os_error(code) }
}

/// The wrapping backend.
pub struct Faulty {
    inner: Arc<dyn Storage>,
    plan: Shared,
}

impl Faulty {
    pub fn new(inner: Arc<dyn Storage>) -> Arc<Faulty> {
        Arc::new(Faulty { inner, plan: Shared::default() })
    }

    /// Over the product's mmap backend.
    pub fn mmap() -> Arc<Faulty> {
        Faulty::new(super::Mmap::shared())
    }

    /// Makes the `n`-th counted call from now (1 = the next one) fail with `fault`.
    pub fn fail_at(&self, n: u64, fault: Fault) {
        let mut plan = self.plan.lock().unwrap_or_else(PoisonError::into_inner);
        plan.fail = Some((plan.calls + n, fault));
    }

    /// Makes data bytes `range` of every file whose name ends with `suffix` unreadable: `read_at`
    /// of any byte in it fails with EIO.
    pub fn unreadable(&self, suffix: &str, range: std::ops::Range<usize>) {
        self.plan.lock().unwrap_or_else(PoisonError::into_inner).unreadable.push((suffix.to_owned(), range));
    }

    /// Calls counted so far.
    pub fn calls(&self) -> u64 {
        self.plan.lock().unwrap_or_else(PoisonError::into_inner).calls
    }

    /// Whether the chosen fault has not happened yet.
    pub fn pending(&self) -> bool {
        self.plan.lock().unwrap_or_else(PoisonError::into_inner).fail.is_some()
    }
}

impl Storage for Faulty {
    fn create(
        &self,
        path: &Path,
        magic: [u8; 8],
        version: u32,
        data_len: usize,
    ) -> Result<Box<dyn StoredFile>, MappedFileError> {
        match next(&self.plan) {
            Some(Fault::CrcFlip) | None => {}
            Some(fault) => return Err(error(path, fault)),
        }
        let inner = self.inner.create(path, magic, version, data_len)?;
        Ok(Box::new(FaultyFile { inner, plan: Arc::clone(&self.plan) }))
    }

    fn open(&self, path: &Path, magic: [u8; 8], version: u32) -> Result<Box<dyn StoredFile>, MappedFileError> {
        match next(&self.plan) {
            Some(Fault::CrcFlip) | None => {}
            Some(fault) => return Err(error(path, fault)),
        }
        let inner = self.inner.open(path, magic, version)?;
        Ok(Box::new(FaultyFile { inner, plan: Arc::clone(&self.plan) }))
    }
}

struct FaultyFile {
    inner: Box<dyn StoredFile>,
    plan: Shared,
}

impl StoredFile for FaultyFile {
    fn path(&self) -> &Path {
        self.inner.path()
    }

    fn read(&self) -> &[u8] {
        self.inner.read()
    }

    fn read_at(&self, at: usize, buf: &mut [u8]) -> Result<(), MappedFileError> {
        let name = self.inner.path().to_string_lossy().into_owned();
        let plan = self.plan.lock().unwrap_or_else(PoisonError::into_inner);
        let bad = plan
            .unreadable
            .iter()
            .any(|(suffix, range)| name.ends_with(suffix.as_str()) && range.start < at + buf.len() && at < range.end);
        drop(plan);
        if bad {
            return Err(error(self.inner.path(), Fault::Eio));
        }
        self.inner.read_at(at, buf)
    }

    fn write(&mut self, at: usize, bytes: &[u8]) -> Result<(), MappedFileError> {
        match next(&self.plan) {
            None => self.inner.write(at, bytes),
            Some(Fault::Torn) => {
                self.inner.write(at, &bytes[..bytes.len() / 2])?;
                Err(error(self.inner.path(), Fault::Torn))
            }
            Some(Fault::CrcFlip) => {
                let mut flipped = bytes.to_vec();
                if let Some(byte) = flipped.get_mut(bytes.len() / 2) {
                    *byte ^= 0x10;
                }
                self.inner.write(at, &flipped)
            }
            Some(fault) => Err(error(self.inner.path(), fault)),
        }
    }

    fn sync(&self, at: usize, len: usize) -> Result<(), MappedFileError> {
        match next(&self.plan) {
            Some(Fault::CrcFlip) | None => self.inner.sync(at, len),
            Some(fault) => Err(error(self.inner.path(), fault)),
        }
    }

    fn remove(self: Box<Self>) -> Result<(), MappedFileError> {
        self.inner.remove()
    }
}
