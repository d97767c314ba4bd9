//! What the sinks took since the last checkpoint, so that a restart does not hand them a row
//! again (CONTRACT.md "Extensions under way": results the sinks took before the last checkpoint
//! are not emitted again).
//!
//! A restart from checkpoint `E` runs the journal entries after `E`'s barrier again, which
//! produces again every row the sinks took after that barrier: the rows taken after the barrier
//! but before `E` completed (the checkpoint's `early` list) and those taken after it completed
//! (this log). Every row handed to the sinks is noted by a hash of its target and its JSON line
//! (`_id`, content and all: dead letters and input rows have no `_id` of their own), appended to
//! `CHECKPOINTS/EPOCH/taken.log` of the last completed checkpoint (8 bytes a row), written to the
//! kernel with every batch right after the sinks flushed the rows (never before: a hash logged
//! for a row a `kill -9` caught in a sink's buffer would drop the row at the next start). At a start from `E`, the hashes of
//! `E`'s `early` list and of the logs of `E` and of every later epoch directory make a multiset:
//! a row whose hash is in it is dropped once per occurrence (counted), so a row the sinks took
//! once is not taken twice, and a row that really occurs twice still passes twice.
//!
//! What remains: rows of the batch a `kill -9` interrupts between the sinks' flush and the log's
//! may come again (a few rows at most, never after a clean stop).

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use crate::checkpoint::{CheckpointDir, Completed};
use crate::plan::Target;
use crate::storage::write_faults;

const LOG: &str = "taken.log";
/// How the log's write failures are reported (storage/write_faults.rs).
const SITE: &str = "taken log";
const MEANWHILE: &str = "the hashes of the rows taken wait in memory (8 bytes a row)";

pub struct Taken {
    checkpoints: CheckpointDir,
    /// `None` while it cannot be opened (a full disk): opened again at the next flush.
    log: Option<File>,
    /// The epoch whose log takes the hashes now, and that log's path.
    log_epoch: u64,
    log_path: PathBuf,
    /// Hashes noted since the last [`flush`](Taken::flush): they reach the log only then, after
    /// the sinks have flushed the rows they name (a hash in the log for a row a `kill -9` kept in
    /// a sink's buffer would drop that row at the next start).
    pending: Vec<u8>,
    /// The log of the checkpoint before the one that just completed, with the hashes still to
    /// go into it at the next flush.
    closing: Option<(Option<File>, Vec<u8>)>,
    /// Rows already taken, still to come again: hash → how many times.
    skip: HashMap<u64, u32>,
    /// Hashes of the rows taken after the barrier of the checkpoint under way.
    early: Vec<u64>,
    /// A barrier was sent and its checkpoint is not complete: input rows and dead letters taken
    /// now come after it.
    after_barrier: bool,
    /// A checkpoint completed, with its `early` list, for the intake to commit.
    completed: Option<(Completed, Vec<u64>)>,
    /// Rows dropped because the sinks had taken them.
    pub dropped: u64,
    /// The last row admitted went into `early` too (what [`retract`](Taken::retract) undoes).
    last_early: bool,
}

impl Taken {
    /// Starts from checkpoint `from` (its epoch and `early` list; none: no checkpoint yet, the
    /// whole journal runs again) and the logs of it and of every later epoch.
    pub fn open(checkpoints: CheckpointDir, from: Option<(u64, &[u64])>) -> Taken {
        let (epoch, early) = from.unwrap_or((0, &[]));
        let mut skip: HashMap<u64, u32> = HashMap::new();
        for &hash in early {
            *skip.entry(hash).or_default() += 1;
        }
        for dir in checkpoints.epochs().into_iter().filter(|&e| e >= epoch).map(|e| checkpoints.epoch_dir(e)) {
            for hash in read_log(&dir.join(LOG)) {
                *skip.entry(hash).or_default() += 1;
            }
        }
        let mut taken = Taken {
            log_path: checkpoints.epoch_dir(epoch).join(LOG),
            checkpoints,
            log: None,
            log_epoch: epoch,
            pending: Vec::new(),
            closing: None,
            skip,
            early: Vec::new(),
            after_barrier: false,
            completed: None,
            dropped: 0,
            last_early: false,
        };
        taken.log_to(epoch);
        taken
    }

    /// Appends from now on to the log of `epoch`.
    fn log_to(&mut self, epoch: u64) {
        let dir = self.checkpoints.epoch_dir(epoch);
        (self.log_epoch, self.log_path) = (epoch, dir.join(LOG));
        let opened = std::fs::create_dir_all(&dir)
            .and_then(|()| OpenOptions::new().create(true).append(true).open(&self.log_path));
        self.log = match opened {
            Ok(file) => Some(file),
            Err(error) => {
                write_faults::failed(SITE, &self.log_path, &error, MEANWHILE);
                None
            }
        };
    }

    /// Whether the row (its JSON `line` for `target`) goes to the sinks: not if they took it
    /// before a restart. `early`: it left after the barrier of the checkpoint under way.
    pub fn admit(&mut self, target: Target, line: &[u8], early: bool) -> bool {
        let hash = hash(target, line);
        self.last_early = early || self.after_barrier;
        if self.last_early {
            self.early.push(hash);
        }
        if let Some(count) = self.skip.get_mut(&hash).filter(|c| **c > 0) {
            *count -= 1;
            self.dropped += 1;
            return false;
        }
        self.pending.extend_from_slice(&hash.to_le_bytes());
        true
    }

    /// The row [`admit`](Self::admit) let through last did not reach every sink after all (the
    /// service stopped while a sink waited for room): it is not noted as taken, so the next start
    /// hands it over again.
    pub fn retract(&mut self) {
        self.pending.truncate(self.pending.len().saturating_sub(8));
        if std::mem::take(&mut self.last_early) {
            self.early.pop();
        }
    }

    /// A barrier is about to be sent (`false`: it was not sent after all).
    pub fn barrier(&mut self, sent: bool) {
        self.after_barrier = sent;
    }

    /// Every shard wrote its part of `done`: its `early` list is closed (with the rows still to
    /// come again, which come after it too) and the log starts again in its directory.
    pub fn completed(&mut self, done: Completed) {
        self.after_barrier = false;
        let mut early = std::mem::take(&mut self.early);
        for (&hash, &count) in &self.skip {
            early.extend(std::iter::repeat_n(hash, count as usize));
        }
        // The rows noted so far were taken before the completion: they go to the old log, at
        // the next flush (after the sinks').
        let (log, pending) = (self.log.take(), std::mem::take(&mut self.pending));
        if let Some((log, mut pending)) = self.closing.replace((log, pending)) {
            // Two completions within one batch: the older log gets what it can now.
            let _ = write_log(log.as_ref(), &mut pending, &self.log_path);
        }
        self.log_to(done.epoch);
        self.completed = Some((done, early));
    }

    /// The checkpoint that completed since the last call, to be committed.
    pub fn take_completed(&mut self) -> Option<(Completed, Vec<u64>)> {
        self.completed.take()
    }

    /// Hands the hashes noted so far to the kernel: after every batch, once the sinks have
    /// flushed the rows they name.
    ///
    /// A write the file system refuses (a full disk) keeps the hashes not written in memory, for
    /// the next flush: a hash is never given up, so a restart never repeats a row because the
    /// disk was full for a while (8 bytes a row wait meanwhile; the journal holds the input then).
    pub fn flush(&mut self) {
        let path = self.log_path.clone();
        let mut written = true;
        if let Some((log, mut pending)) = self.closing.take()
            && write_log(log.as_ref(), &mut pending, &path).is_err()
        {
            written = false;
            self.closing = Some((log, pending));
        }
        if self.log.is_none() && !self.pending.is_empty() {
            self.log_to(self.log_epoch);
            written &= self.log.is_some();
        }
        if self.closing.is_none() && self.log.is_some() {
            written &= write_log(self.log.as_ref(), &mut self.pending, &path).is_ok();
        }
        if written {
            write_faults::recovered(SITE);
        }
    }

    /// Forces the log to the disk (`durability = "power"`).
    pub fn sync(&mut self) -> std::io::Result<()> {
        self.flush();
        match &self.log {
            Some(log) => log.sync_data(),
            None => Ok(()),
        }
    }

    pub fn dir(&self) -> &CheckpointDir {
        &self.checkpoints
    }
}

/// Appends hashes to a log, taking out of `hashes` what was written (also when a write fails
/// part way: the rest follows at the next call, the log stays 8-byte aligned).
fn write_log(log: Option<&File>, hashes: &mut Vec<u8>, path: &Path) -> std::io::Result<()> {
    let Some(mut log) = log else {
        hashes.clear();
        return Ok(());
    };
    let mut done = 0;
    let result = loop {
        // Nothing (left) to write is no system call: the intake flushes after every round.
        if done == hashes.len() {
            break Ok(());
        }
        match log.write(&hashes[done..]) {
            Ok(0) => break Err(std::io::Error::from(std::io::ErrorKind::WriteZero)),
            Ok(n) => done += n,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(error) => break Err(error),
        }
    };
    hashes.drain(..done);
    if let Err(error) = &result {
        write_faults::failed(SITE, path, error, MEANWHILE);
    }
    result
}

/// A row's identity for the sinks: its target and its JSON line.
fn hash(target: Target, line: &[u8]) -> u64 {
    let (kind, index) = match target {
        Target::Stream(s) => (0u8, s),
        Target::Operator(o) => (1, o),
        Target::Late(o) => (2, o),
        Target::DeadLetter => (3, 0),
        Target::Expired(o) => (4, o),
    };
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    hasher.update(&[kind]);
    hasher.update(&(index as u64).to_le_bytes());
    hasher.update(line);
    hasher.digest()
}

/// The hashes of a log (a torn last one is left out); none when there is no log.
fn read_log(path: &Path) -> Vec<u64> {
    let mut bytes = Vec::new();
    if File::open(path).and_then(|mut f| f.read_to_end(&mut bytes)).is_err() {
        return Vec::new();
    }
    bytes.chunks_exact(8).map(|c| u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Expected: hashes the disk refuses (ENOSPC: /dev/full) stay pending, the log is shown as a
    /// failing write site, and they are written, in full and 8-byte aligned, once a write goes
    /// through: a full disk never makes a restart repeat a row.
    #[test]
    fn hashes_the_disk_refuses_wait_and_are_written_later() {
        let full = OpenOptions::new().append(true).open("/dev/full").expect("/dev/full");
        let mut hashes: Vec<u8> = (0u64..3).flat_map(u64::to_le_bytes).collect();
        let error = write_log(Some(&full), &mut hashes, Path::new("/x/taken.log")).unwrap_err();
        assert!(write_faults::is_disk_full(&error));
        assert_eq!(hashes.len(), 24, "nothing given up");
        assert!(write_faults::is_failing(SITE));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LOG);
        let log = OpenOptions::new().create(true).append(true).open(&path).unwrap();
        write_log(Some(&log), &mut hashes, &path).unwrap();
        assert!(hashes.is_empty());
        assert_eq!(read_log(&path), [0, 1, 2]);
    }
}
