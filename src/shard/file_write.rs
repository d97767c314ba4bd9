//! Writing a shard's checkpoint file from the shard's own thread without waiting for the disk
//! (DESIGN.md "State": "through io_uring on the shard thread so the shard never blocks on the
//! disk").
//!
//! Under monoio's io_uring driver the shard keeps a small io_uring of its own for its checkpoint
//! files and submits one linked chain per file: open (into the ring's one direct-descriptor
//! slot, forced to the kernel's workers with `IOSQE_ASYNC`, so that neither the open — which can
//! wait behind the file system's journal — nor the copy into the page cache runs on the shard
//! thread), write, `fsync` with `durability = "power"`, close, and last one byte sent to the
//! shard's own doorbell, so that a shard asleep for lack of input wakes when the file is done.
//! The shard reads the completions at its next round (no system call: the completion queue is
//! shared memory). Not monoio's file API: monoio submits a spawned task's operations only when
//! the shard's loop yields to it, which a busy shard does not do, and a loop that yields parks
//! in the driver until the disk answers.
//!
//! Under the legacy (epoll) driver — no io_uring — the shard writes the file itself, blocking
//! for as long as the disk takes. [`FileWrites::stalled`] adds up the time the shard thread spent
//! handing files to the disk on either path, so the difference can be measured (`braid bench
//! --checkpoint-interval-ms`, `MONOIO_FORCE_LEGACY_DRIVER=1`).

use std::ffi::CString;
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use io_uring::{IoUring, opcode, squeue, types};

use super::worker::{NOT_WRITTEN, SnapshotWrite, WRITTEN};
use crate::checkpoint::{CHECKPOINT_MEANWHILE, CHECKPOINT_SITE, CheckpointError};
use crate::state::snapshot::SnapshotBytes;
use crate::storage::write_faults;

/// Completion tags of a chain's operations.
const OPEN: u64 = 1;
const WRITE: u64 = 2;
const SYNC: u64 = 3;
const CLOSE: u64 = 4;
const BELL: u64 = 5;
/// The direct-descriptor slot the chain opens the file into.
const SLOT: u32 = 0;
/// The most one chain writes (the kernel caps a read or write near 2 GiB); a larger file takes
/// several chains.
const MAX_WRITE: usize = 1 << 30;
/// What the chain sends to the doorbell.
static BELL_BYTE: [u8; 1] = [1];

/// The shard's checkpoint file writes (module doc).
pub struct FileWrites {
    /// `None`: the legacy driver, or a kernel that refused a ring; files are written inline.
    ring: Option<IoUring>,
    /// The shard's doorbell socket (the waker end): the chain's last operation writes to it.
    bell: RawFd,
    in_flight: Option<InFlight>,
    stalled: Duration,
    /// The bytes of the last file whose outcome is in, for the shard to write its next one into.
    spent: Option<SnapshotBytes>,
}

/// A file being written: everything the submitted operations point at lives here until every
/// one of them has completed.
struct InFlight {
    write: SnapshotWrite,
    path: CString,
    /// Bytes of `write.bytes` written so far.
    written: usize,
    /// Completions still to come for the submitted chain.
    outstanding: u32,
    /// The first failure of the chain: which step, and the errno.
    failed: Option<(&'static str, i32)>,
    /// What the chain's write wrote.
    wrote: usize,
}

impl FileWrites {
    /// With io_uring when `uring` (the shard's runtime has it) and the kernel gives a ring;
    /// `bell` is the waker socket of the shard's doorbell.
    pub fn new(uring: bool, bell: RawFd) -> FileWrites {
        let ring = uring.then(|| {
            let ring = IoUring::new(8)?;
            ring.submitter().register_files_sparse(1)?;
            Ok::<_, std::io::Error>(ring)
        });
        let ring = ring.and_then(|made| {
            made.map_err(
                |error| tracing::warn!(%error, "No io_uring for checkpoint files; the shard writes them itself"),
            )
            .ok()
        });
        FileWrites { ring, bell, in_flight: None, stalled: Duration::ZERO, spent: None }
    }

    /// Starts writing `write` (one file at a time: the worker hands over the next only once
    /// this one's outcome is in).
    pub fn start(&mut self, write: SnapshotWrite) {
        #[allow(clippy::disallowed_methods)] // a figure of the checkpoint's cost, not a decision
        let began = Instant::now();
        if self.in_flight.is_some() {
            write.outcome.store(NOT_WRITTEN, Ordering::SeqCst);
        } else if self.ring.is_none() {
            let written = crate::checkpoint::write_file(&write.path, &write.bytes, write.sync);
            if let Err(error) = &written {
                failed(
                    &write.path,
                    &error.to_string(),
                    matches!(error, CheckpointError::Io { error, .. } if write_faults::is_disk_full(error)),
                );
            }
            self.settle(write, if written.is_ok() { WRITTEN } else { NOT_WRITTEN });
        } else {
            match CString::new(write.path.as_os_str().as_bytes()) {
                Ok(path) => {
                    let flight = InFlight { write, path, written: 0, outstanding: 0, failed: None, wrote: 0 };
                    self.submit(flight);
                }
                Err(_) => {
                    tracing::warn!(path = %write.path.display(), "A checkpoint path with a NUL byte");
                    write.outcome.store(NOT_WRITTEN, Ordering::SeqCst);
                }
            }
        }
        self.stalled += began.elapsed();
    }

    /// Reads the completions that came in; sets the file's outcome when its chain is done (or
    /// submits the rest after a short write).
    pub fn poll(&mut self) {
        let (Some(ring), Some(flight)) = (self.ring.as_mut(), self.in_flight.as_mut()) else { return };
        if ring.completion().is_empty() {
            return; // the common case while a file is on its way: one load of the queue's tail
        }
        #[allow(clippy::disallowed_methods)] // a figure of the checkpoint's cost, not a decision
        let began = Instant::now();
        for cqe in ring.completion() {
            let (step, result) = match cqe.user_data() {
                OPEN => ("open", cqe.result()),
                WRITE => ("write", cqe.result()),
                SYNC => ("sync", cqe.result()),
                CLOSE => ("close", cqe.result()),
                _ => ("ring the doorbell of", 0), // a full socket already holds a wake-up
            };
            if cqe.user_data() == WRITE && result > 0 {
                flight.wrote = result as usize;
            }
            if result < 0 && flight.failed.is_none() {
                flight.failed = Some((step, result));
            }
            flight.outstanding -= 1;
        }
        if flight.outstanding == 0
            && let Some(flight) = self.in_flight.take()
        {
            self.finish(flight);
        }
        self.stalled += began.elapsed();
    }

    /// Whether a file's outcome is waiting to be read by [`poll`](Self::poll).
    pub fn completed(&mut self) -> bool {
        self.ring.as_mut().is_some_and(|ring| !ring.completion().is_empty())
    }

    /// Time the shard thread spent handing files to the disk: the whole write on the legacy
    /// path; submitting and reading the outcome under io_uring.
    pub fn stalled(&self) -> Duration {
        self.stalled
    }

    /// The chain's operations are all done: the next chain, or the outcome.
    fn finish(&mut self, mut flight: InFlight) {
        if flight.failed.is_none() && flight.wrote == 0 {
            // Nothing written of a non-empty rest would loop forever: a failure too.
            flight.failed = Some(("write", -libc::ENOSPC));
        }
        if let Some((step, errno)) = flight.failed {
            let error = std::io::Error::from_raw_os_error(-errno);
            failed(&flight.write.path, &format!("cannot {step}: {error}"), write_faults::is_disk_full(&error));
            self.settle(flight.write, NOT_WRITTEN);
            return;
        }
        flight.written += flight.wrote;
        if flight.written < flight.write.bytes.len() {
            self.submit(flight);
            return;
        }
        self.settle(flight.write, WRITTEN);
    }

    /// The file's outcome is in: its bytes go back to the shard for its next file.
    fn settle(&mut self, write: SnapshotWrite, outcome: u8) {
        write.outcome.store(outcome, Ordering::SeqCst);
        self.spent = Some(write.bytes);
    }

    /// The bytes of the last file whose outcome is in ([`Worker::keep_snapshot_bytes`](super::worker::Worker::keep_snapshot_bytes)).
    pub fn take_spent(&mut self) -> Option<SnapshotBytes> {
        self.spent.take()
    }

    /// Submits the chain for the rest of `flight`'s bytes: open (truncating only for the first
    /// chain), write, (sync,) close, doorbell — hard-linked, so every step runs and reports
    /// even after one failed (a step on a file that did not open fails too), and the doorbell
    /// always rings.
    fn submit(&mut self, mut flight: InFlight) {
        let Some(ring) = self.ring.as_mut() else { return };
        let rest = &flight.write.bytes[flight.written..];
        let len = rest.len().min(MAX_WRITE) as u32;
        let file = types::Fixed(SLOT);
        let link = squeue::Flags::IO_HARDLINK;
        let truncate = if flight.written == 0 { libc::O_CREAT | libc::O_TRUNC } else { 0 };
        let slot = types::DestinationSlot::try_from_slot_target(SLOT).ok();
        let mut chain = vec![
            opcode::OpenAt::new(types::Fd(libc::AT_FDCWD), flight.path.as_ptr())
                // No O_CLOEXEC: a direct descriptor is no process descriptor (the kernel refuses it).
                .flags(libc::O_WRONLY | truncate)
                .mode(0o644)
                .file_index(slot)
                .build()
                .flags(link | squeue::Flags::ASYNC)
                .user_data(OPEN),
            opcode::Write::new(file, rest.as_ptr(), len)
                .offset(flight.written as u64)
                .build()
                .flags(link)
                .user_data(WRITE),
        ];
        if flight.write.sync {
            chain.push(opcode::Fsync::new(file).build().flags(link).user_data(SYNC));
        }
        chain.push(opcode::Close::new(file).build().flags(link).user_data(CLOSE));
        chain.push(
            opcode::Send::new(types::Fd(self.bell), BELL_BYTE.as_ptr(), 1)
                .flags(libc::MSG_DONTWAIT)
                .build()
                .user_data(BELL),
        );
        (flight.wrote, flight.failed, flight.outstanding) = (0, None, chain.len() as u32);
        // SAFETY: every operation points at memory that outlives it: the path and the bytes
        // (`flight.path`, `flight.write.bytes`, not touched until the chain completes) are moved
        // into `self.in_flight` below — moving the `InFlight` moves neither the path's heap
        // buffer nor the bytes (on the heap, or a mapping that stays mapped meanwhile) — and
        // dropped only after all the chain's completions are read (`poll`, or `Drop`, which
        // waits for them); the doorbell's socket belongs to the shard's `Doorbell`, which
        // outlives the shard thread and with it this value; the byte is a static. The file is
        // the ring's own direct descriptor (slot 0, registered in `new`), used by one chain at a
        // time. The ring has 8 entries and one chain of at most 5 is in flight.
        let pushed = unsafe { ring.submission().push_multiple(&chain) };
        let submitted = pushed.is_ok() && ring.submit().is_ok();
        if !submitted {
            tracing::warn!(path = %flight.write.path.display(), "Cannot submit a checkpoint file write");
            flight.write.outcome.store(NOT_WRITTEN, Ordering::SeqCst);
            if pushed.is_ok() {
                // Pushed but not submitted: the entries stay in the queue; wait them out below.
                self.in_flight = Some(flight);
                self.wait_out();
            }
            return;
        }
        self.in_flight = Some(flight);
    }

    /// Blocks until the chain in flight has completed (the memory it points at may then go).
    fn wait_out(&mut self) {
        let (Some(ring), Some(flight)) = (self.ring.as_mut(), self.in_flight.as_mut()) else { return };
        while flight.outstanding > 0 {
            if ring.submit_and_wait(1).is_err() {
                // Nothing more can be learned; the completions may still come, so the memory
                // stays (leaked) rather than freed under the kernel.
                std::mem::forget(self.in_flight.take());
                return;
            }
            for _ in ring.completion() {
                flight.outstanding -= 1;
            }
        }
        self.in_flight = None;
    }
}

impl Drop for FileWrites {
    /// A shard that stops with a file in flight waits for it: the kernel may still be reading
    /// the bytes.
    fn drop(&mut self) {
        self.wait_out();
    }
}

/// A checkpoint file could not be written: reported (storage/write_faults.rs, rate-limited; the
/// checkpoint is not committed, the previous one and the journal stay) and removed, so a full
/// disk does not keep the part that was written.
fn failed(path: &std::path::Path, error: &str, disk_full: bool) {
    write_faults::failed_with(CHECKPOINT_SITE, path, error, disk_full, CHECKPOINT_MEANWHILE);
    if let Err(error) = std::fs::remove_file(path)
        && error.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(path = %path.display(), %error, "Cannot remove a checkpoint file left half written");
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::AtomicU8;

    use super::*;
    use crate::shard::wake::Doorbell;
    use crate::storage::mapped_file::ScratchBytes;

    /// A file of `bytes`, written from the buffer of the last one (`files.take_spent()`) when
    /// there is one, as a shard does.
    fn job(
        files: &mut FileWrites,
        path: std::path::PathBuf,
        bytes: &[u8],
        sync: bool,
    ) -> (SnapshotWrite, Arc<AtomicU8>) {
        let outcome = Arc::new(AtomicU8::new(0));
        let mut kept = match files.take_spent() {
            Some(SnapshotBytes::Kept(kept)) => kept,
            _ => ScratchBytes::new().unwrap(),
        };
        kept.reuse();
        kept.extend_from_slice(bytes).unwrap();
        let bytes = SnapshotBytes::Kept(kept);
        (SnapshotWrite { path, bytes, sync, outcome: Arc::clone(&outcome) }, outcome)
    }

    /// The buffer of the file whose outcome just came in is back, holding that file's bytes.
    fn spent_holds(files: &mut FileWrites, bytes: &[u8]) {
        let spent = files.take_spent().expect("a file's buffer comes back whatever its outcome");
        assert!(matches!(spent, SnapshotBytes::Kept(_)));
        assert_eq!(&spent[..], bytes);
        files.spent = Some(spent);
    }

    /// Both paths write the whole file (synced or not) and report it; the io_uring one also rings
    /// the doorbell, so a sleeping shard hears of it; a file that cannot be created is reported
    /// as not written, and the next one goes through.
    #[test]
    fn files_are_written_on_both_paths_and_failures_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        for uring in [true, false] {
            let (bell, mut sleeper) = Doorbell::new().unwrap();
            let mut files = FileWrites::new(uring, bell.waker_fd());
            assert_eq!(files.ring.is_some(), uring, "this machine has io_uring (README: what the tests need)");
            let bytes: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
            for (n, sync) in [(0, false), (1, true)] {
                let path = dir.path().join(format!("{uring}-{n}"));
                let (write, outcome) = job(&mut files, path.clone(), &bytes, sync);
                files.start(write);
                if files.ring.is_some() {
                    use std::io::Read;
                    let mut byte = [0u8; 1];
                    sleeper.read_exact(&mut byte).unwrap(); // the chain's last operation
                    while outcome.load(Ordering::SeqCst) == 0 {
                        files.poll();
                    }
                }
                assert_eq!(outcome.load(Ordering::SeqCst), WRITTEN);
                assert_eq!(std::fs::read(&path).unwrap(), bytes);
                spent_holds(&mut files, &bytes);
            }
            let (write, outcome) = job(&mut files, dir.path().join("missing/dir/file"), &[1; 10], false);
            files.start(write);
            while outcome.load(Ordering::SeqCst) == 0 {
                files.poll();
            }
            assert_eq!(outcome.load(Ordering::SeqCst), NOT_WRITTEN);
            assert!(files.in_flight.is_none());
            spent_holds(&mut files, &[1; 10]);
            // A failed chain leaves the slot and the ring usable.
            let path = dir.path().join(format!("{uring}-after"));
            let (write, outcome) = job(&mut files, path.clone(), &[7; 5000], true);
            files.start(write);
            while outcome.load(Ordering::SeqCst) == 0 {
                files.poll();
            }
            assert_eq!(std::fs::read(&path).unwrap(), vec![7; 5000]);
        }
    }
}
