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
use std::path::Path;

use crate::checkpoint::{CheckpointDir, Completed};
use crate::plan::Target;

const LOG: &str = "taken.log";

pub struct Taken {
    checkpoints: CheckpointDir,
    log: Option<File>,
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
            checkpoints,
            log: None,
            pending: Vec::new(),
            closing: None,
            skip,
            early: Vec::new(),
            after_barrier: false,
            completed: None,
            dropped: 0,
        };
        taken.log_to(epoch);
        taken
    }

    /// Appends from now on to the log of `epoch`.
    fn log_to(&mut self, epoch: u64) {
        let dir = self.checkpoints.epoch_dir(epoch);
        let opened = std::fs::create_dir_all(&dir)
            .and_then(|()| OpenOptions::new().create(true).append(true).open(dir.join(LOG)));
        self.log = match opened {
            Ok(file) => Some(file),
            Err(error) => {
                tracing::warn!(dir = %dir.display(), %error, "Cannot keep the log of rows taken; a restart may repeat some");
                None
            }
        };
    }

    /// Whether the row (its JSON `line` for `target`) goes to the sinks: not if they took it
    /// before a restart. `early`: it left after the barrier of the checkpoint under way.
    pub fn admit(&mut self, target: Target, line: &[u8], early: bool) -> bool {
        let hash = hash(target, line);
        if early || self.after_barrier {
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
        if let Some((log, pending)) = self.closing.replace((log, pending)) {
            write_log(log, &pending);
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
    pub fn flush(&mut self) {
        if let Some((log, pending)) = self.closing.take() {
            write_log(log, &pending);
        }
        if !write_log(self.log.as_ref(), &self.pending) {
            self.log = None;
        }
        self.pending.clear();
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

/// Appends hashes to a log; false when it cannot (then a restart may repeat some rows).
fn write_log(log: Option<impl std::borrow::Borrow<File>>, hashes: &[u8]) -> bool {
    let Some(log) = log else { return true };
    let mut log: &File = log.borrow();
    let written = log.write_all(hashes);
    if written.is_err() {
        tracing::warn!("Cannot keep the log of rows taken; a restart may repeat some");
    }
    written.is_ok()
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
