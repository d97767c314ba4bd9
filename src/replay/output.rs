//! Replay outputs: one JSON-lines file per `--output NAME=FILE`, every one created even when
//! nothing is written to it.
//!
//! With checkpoints (a `state_dir`), the outputs take part in them: at a completed checkpoint
//! every file is flushed and its length noted, with the lines written after the barrier had gone
//! by (a restart from the checkpoint writes them again). A resumed replay opens the files it
//! wrote, cuts a torn last line, and does not write again the lines it finds after the
//! checkpoint's length nor those noted: each line is skipped as often as it is found there
//! (a multiset of line hashes), so the files end as one uninterrupted run's.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use crate::checkpoint::{CheckpointDir, Completed, Manifest};
use crate::operator::{ExpiryReason, Side};
use crate::plan::{Plan, Target};
use crate::record::decode::TOO_LARGE;
use crate::record::schema::Schema;
use crate::record::view::RowView;
use crate::record::{ArchivedRow, Row, json};
use crate::shard::Emit;
use crate::state::snapshot;

use super::file_writer::{FileWriter, Lines};

/// A file's part in a checkpoint.
#[derive(Clone, Debug, Default, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct FileState {
    /// Bytes written (and flushed) when the checkpoint completed.
    pub len: u64,
    /// Hashes of the lines among them that were written after the barrier.
    pub early: Vec<u64>,
}

/// What a replay checkpoint keeps beside the runtime's state.
#[derive(Clone, Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct ReplayCheckpoint {
    /// The driver's state at the barrier ([`super::Position`]).
    pub position: Vec<u8>,
    pub files: Vec<FileState>,
}

/// An output file: written, and its part in checkpoints kept, by a thread of its own
/// (file_writer.rs).
struct OutFile {
    target: Target,
    file: FileWriter,
}

/// The schema a file's archived results are written with: its operator's output.
fn result_schema(plan: &Plan, target: Target) -> Option<Schema> {
    match target {
        Target::Operator(op) => Some(plan.operators[op].output.clone()),
        _ => None,
    }
}

/// Where completed checkpoints are committed.
pub struct Committer {
    pub dir: CheckpointDir,
    pub shards: u32,
    /// `durability = "power"`: files are synced before a checkpoint names their length.
    pub sync: bool,
    /// Fault injection for crash tests: the process ends abruptly, as `kill -9` would end it
    /// (no buffer flushed), right after committing this epoch ([`FAULT_EXIT_AFTER_CHECKPOINT`]).
    pub exit_after: Option<u64>,
}

/// Environment variable naming a checkpoint epoch after whose commit replay exits at once with
/// [`FAULT_EXIT`] (crash tests: the golden recovery cases).
pub const FAULT_EXIT_AFTER_CHECKPOINT: &str = "BRAID_FAULT_EXIT_AFTER_CHECKPOINT";
/// The exit status of that fault.
pub const FAULT_EXIT: i32 = 113;

pub struct Outputs<'p> {
    plan: &'p Plan,
    files: Vec<OutFile>,
    buf: Vec<u8>,
    error: Option<std::io::Error>,
    committer: Option<Committer>,
    /// A barrier has been sent and its checkpoint is not complete yet.
    after_barrier: bool,
    /// The epoch of the last checkpoint committed.
    pub committed: Option<u64>,
}

impl<'p> Outputs<'p> {
    /// Creates (truncates) every output file.
    pub fn create(plan: &'p Plan, outputs: &[(Target, &Path)]) -> Result<Outputs<'p>, (usize, std::io::Error)> {
        let mut files = Vec::new();
        for (i, (target, path)) in outputs.iter().enumerate() {
            let file = File::create(path).map_err(|e| (i, e))?;
            let lines = Lines::new(file, 0, HashMap::new(), result_schema(plan, *target));
            files.push(OutFile::new(*target, lines).map_err(|e| (i, e))?);
        }
        Ok(Outputs::with_files(plan, files))
    }

    /// Opens the files of a replay that resumes from a checkpoint (their states, in `--output`
    /// order): each keeps what it holds but a torn last line.
    pub fn resume(
        plan: &'p Plan,
        outputs: &[(Target, &Path)],
        states: &[FileState],
    ) -> Result<Outputs<'p>, (usize, std::io::Error)> {
        let mut files = Vec::new();
        for (i, ((target, path), state)) in outputs.iter().zip(states).enumerate() {
            let schema = result_schema(plan, *target);
            files.push(OutFile::resume(*target, path, state, schema).map_err(|e| (i, e))?);
        }
        Ok(Outputs::with_files(plan, files))
    }

    fn with_files(plan: &'p Plan, files: Vec<OutFile>) -> Outputs<'p> {
        Outputs {
            plan,
            files,
            buf: Vec::with_capacity(512),
            error: None,
            committer: None,
            after_barrier: false,
            committed: None,
        }
    }

    /// Completed checkpoints are committed there.
    pub fn commit_to(&mut self, committer: Committer) {
        self.committer = Some(committer);
    }

    /// A barrier is about to be sent: the input rows and dead letters written from now until
    /// its checkpoint completes are noted (results say themselves whether they come after it).
    /// `false`: it was not sent after all.
    pub fn barrier(&mut self, sent: bool) {
        self.after_barrier = sent;
    }

    fn wants(&self, target: Target) -> bool {
        self.files.iter().any(|f| f.target == target)
    }

    /// Writes the line in `self.buf` to every file of `target`; `early`: a restart from the
    /// checkpoint under way writes it again.
    fn write(&mut self, target: Target, early: bool) {
        for out in self.files.iter_mut().filter(|f| f.target == target) {
            if let Err(e) = out.file.text(&self.buf, early) {
                self.error.get_or_insert(e);
            }
        }
        self.buf.clear();
    }

    pub fn input_row(&mut self, stream: usize, row: RowView<'_>) {
        if self.wants(Target::Stream(stream)) {
            let def = &self.plan.streams[stream];
            json::write_input_row(&mut self.buf, &def.schema, &def.name, row);
            self.write(Target::Stream(stream), self.after_barrier);
        }
    }

    pub fn dead_letter(&mut self, stream: usize, raw: &str, reason: &str) {
        let plan = self.plan;
        self.dead_letter_of(&plan.streams[stream].name, raw, reason);
    }

    /// A dead letter whose `_stream` is `name` (an input stream, or an operator's output).
    fn dead_letter_of(&mut self, name: &str, raw: &str, reason: &str) {
        if self.wants(Target::DeadLetter) {
            json::write_dead_letter(&mut self.buf, name, raw, reason);
            self.write(Target::DeadLetter, self.after_barrier);
        }
    }

    /// Flushes every file; the first write error, if any.
    pub fn finish(mut self) -> std::io::Result<()> {
        for out in &mut self.files {
            if let Err(e) = out.file.checkpoint(false) {
                self.error.get_or_insert(e);
            }
        }
        self.error.map_or(Ok(()), Err)
    }

    /// Flushes every file and notes its state for checkpoint `done`, then commits it.
    fn commit(&mut self, done: Completed) -> Result<(), String> {
        let Some(committer) = &self.committer else { return Ok(()) };
        let mut files = Vec::with_capacity(self.files.len());
        for out in &mut self.files {
            files.push(out.file.checkpoint(committer.sync).map_err(|e| e.to_string())?);
        }
        let driver = snapshot::encode(&ReplayCheckpoint { position: done.driver, files }).map_err(|e| e.to_string())?;
        // Whole snapshots only: the chain is the checkpoint itself.
        let manifest = Manifest {
            epoch: done.epoch,
            shards: committer.shards,
            feeder: done.feeder,
            driver,
            chain_from: done.epoch,
        };
        committer.dir.commit(&manifest).map_err(|e| e.to_string())?;
        self.committed = Some(done.epoch);
        if committer.exit_after == Some(done.epoch) {
            // As abrupt as a kill: no destructor runs, no output buffer is flushed.
            std::process::exit(FAULT_EXIT);
        }
        Ok(())
    }
}

impl OutFile {
    fn new(target: Target, lines: Lines) -> std::io::Result<OutFile> {
        Ok(OutFile { target, file: FileWriter::new(lines)? })
    }

    /// Opens `path` as a resumed replay finds it: the whole lines after `state.len` and the lines
    /// `state.early` names are not written again; a torn last line is cut.
    fn resume(target: Target, path: &Path, state: &FileState, schema: Option<Schema>) -> std::io::Result<OutFile> {
        let mut file = OpenOptions::new().read(true).write(true).open(path)?;
        let len = file.metadata()?.len();
        if len < state.len {
            let message = format!("{} holds {len} bytes, its checkpoint says {}", path.display(), state.len);
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, message));
        }
        let mut tail = Vec::new();
        file.seek(SeekFrom::Start(state.len))?;
        file.read_to_end(&mut tail)?;
        let whole = tail.iter().rposition(|&b| b == b'\n').map_or(0, |at| at + 1);
        let mut skip: HashMap<u64, u32> = HashMap::new();
        for hash in tail[..whole].split_inclusive(|&b| b == b'\n').map(xxhash_rust::xxh3::xxh3_64) {
            *skip.entry(hash).or_default() += 1;
        }
        for &hash in &state.early {
            *skip.entry(hash).or_default() += 1;
        }
        let end = state.len + whole as u64;
        file.set_len(end)?;
        file.seek(SeekFrom::Start(end))?;
        OutFile::new(target, Lines::new(file, end, skip, schema))
    }
}

impl Emit for Outputs<'_> {
    fn result(&mut self, operator: usize, row: &Row, early: bool) {
        if self.wants(Target::Operator(operator)) {
            json::write_result(&mut self.buf, &self.plan.operators[operator].output, RowView::Heap(row));
            self.write(Target::Operator(operator), early);
        }
    }

    /// The archive goes as it is: its file's writer thread writes the line (file_writer.rs).
    fn result_archived(&mut self, operator: usize, _row: &ArchivedRow, archive: &[u8], early: bool) {
        for out in self.files.iter_mut().filter(|f| f.target == Target::Operator(operator)) {
            if let Err(e) = out.file.archived_result(archive, early) {
                self.error.get_or_insert(e);
            }
        }
    }

    fn late(&mut self, operator: usize, input: usize, row: &Row, early: bool) {
        if self.wants(Target::Late(operator)) {
            self.plan.write_side_row(&mut self.buf, operator, Side::Late(input), row);
            self.write(Target::Late(operator), early);
        }
    }

    fn expired(&mut self, operator: usize, reason: ExpiryReason, input: Option<usize>, row: &Row, early: bool) {
        if self.wants(Target::Expired(operator)) {
            self.plan.write_side_row(&mut self.buf, operator, Side::Expired { reason, input }, row);
            self.write(Target::Expired(operator), early);
        }
    }

    fn too_large(&mut self, operator: usize, raw: &str) {
        let plan = self.plan;
        self.dead_letter_of(&plan.operators[operator].name, raw, TOO_LARGE);
    }

    fn checkpointed(&mut self, done: Completed) {
        self.after_barrier = false;
        let epoch = done.epoch;
        if let Err(error) = self.commit(done) {
            tracing::warn!(epoch, %error, "Replay checkpoint not committed; the previous one stays");
        }
    }
}
