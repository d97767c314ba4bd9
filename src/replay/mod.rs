//! `braid replay`: a deterministic offline run over JSON-lines files (CONTRACT.md "Replay").
//!
//! Processing time is simulated from each line's arrival, so idleness, ticks and lateness are the
//! same on every run and for every shard count. Rows run through the shard runtime
//! ([`crate::shard`]): `--shards` threads fed through rings in `runtime.state_dir` when the config
//! sets one, else in a private temporary directory removed at exit, with the shards' operator
//! state in mmap arenas beside them. Inputs are read and merged as the runtime consumes them
//! ([`input`]): memory is bounded by buffers and state, never by the size of the inputs.
//!
//! # Checkpoints and resume
//!
//! With a `state_dir`, a replay takes a checkpoint (crate::checkpoint) every
//! `checkpoint_interval` of processing time (arrival), in `STATE_DIR/replay-checkpoints/`; its
//! position in the merged input and its output files' lengths are part of it ([`Position`],
//! [`output::ReplayCheckpoint`]). Started again with the same config, shard count, inputs (path,
//! size, modification time) and outputs while such a checkpoint is there, a replay resumes from
//! it: the runtime's state is restored, the merged input skips what the checkpoint had taken, and
//! the outputs are appended to without writing a line twice (output.rs). Anything else starts
//! fresh. A replay that finishes deletes its checkpoints: the next one starts fresh.

mod file_writer;
pub mod input;
pub mod output;

use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::checkpoint::Completed;
use crate::checkpoint::{CheckpointDir, Loaded};
use crate::config::Durability;
use crate::operator::ExpiryReason;
use crate::plan::{Plan, Target};
use crate::record::input::InputRows;
use crate::record::view::RowView;
use crate::record::{ArchivedRow, Row};
use crate::shard::{Emit, Figures, Runtime, RuntimeError, RuntimeOptions};
use crate::source::Arrived;
use crate::state::snapshot;
use input::{Content, InputError, Inputs, Line, Order};
use output::{Committer, Outputs, ReplayCheckpoint};

/// Where a replay stood at a checkpoint's barrier.
#[derive(Clone, Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct Position {
    /// Of the config, shard count, inputs and outputs ([`fingerprint`]): a checkpoint resumes
    /// only the same replay.
    pub fingerprint: u64,
    /// Lines of the merged input taken before the barrier.
    pub lines: u64,
}

/// A replay that cannot run: exit status 1 (the configuration itself was valid).
#[derive(Debug, Error)]
pub enum ReplayError {
    #[error("--input {0}: not a stream of the config")]
    UnknownInput(String),
    #[error("--output {0}: no such stream, operator, OPERATOR.late, OPERATOR.expired or dead_letter")]
    UnknownOutput(String),
    #[error("--input {name}={path}: {error}")]
    Unreadable { name: String, path: PathBuf, error: std::io::Error },
    #[error("--output {name}={path}: {error}")]
    Uncreatable { name: String, path: PathBuf, error: std::io::Error },
    #[error("state directory {path}: {error}")]
    StateDir { path: PathBuf, error: std::io::Error },
    #[error("writing outputs: {0}")]
    Write(std::io::Error),
    #[error("runtime: {0}")]
    Runtime(#[from] RuntimeError),
}

pub struct ReplayArgs<'a> {
    pub shards: usize,
    /// Run every 200 ms tick, skipping none (for checking that skipping changes nothing).
    pub every_tick: bool,
    pub inputs: &'a [(String, PathBuf)],
    pub outputs: &'a [(String, PathBuf)],
    /// Bytes of line text per sorted run of an input out of arrival order
    /// ([`input::SORT_RUN_BYTES`]; tests make it tiny to spill many runs).
    pub sort_run_bytes: usize,
}

/// What `braid explain` watches of a replay besides the outputs: every line as it enters (the
/// runtime as it stands then) and everything the operators emit. Every method defaults to nothing.
pub trait Observer {
    /// Options for the runtime (the trace to attach).
    fn runtime_options(&self, _options: &mut RuntimeOptions<'_>) {}
    /// A line of stream `stream` arrived at `arrival` and its row `row` was ingested (`runtime`
    /// has run the ticks up to `arrival`).
    fn row(&mut self, _stream: usize, _arrival: i64, _row: RowView<'_>, _runtime: &Runtime) {}
    /// A line of stream `stream` arrived at `arrival` and went to `dead_letter`.
    fn dead_letter(&mut self, _stream: usize, _arrival: i64, _raw: &[u8], _reason: &str) {}
    /// Operator `operator` emitted `row`.
    fn result(&mut self, _operator: usize, _row: RowView<'_>) {}
    /// Whether this observer watches anything: a replay that is watched runs once, never starting
    /// again (what was watched could not be taken back), so it reads its inputs' order first.
    fn watches(&self) -> bool {
        true
    }
}

/// Watches nothing: a plain `braid replay`.
struct Unobserved;
impl Observer for Unobserved {
    fn watches(&self) -> bool {
        false
    }
}

/// The replay's outputs and its observer, as one [`Emit`].
struct Observed<'o, 'p> {
    outputs: Outputs<'p>,
    observer: &'o mut dyn Observer,
}

impl Emit for Observed<'_, '_> {
    fn result(&mut self, operator: usize, row: &Row, after_barrier: bool) {
        self.observer.result(operator, RowView::Heap(row));
        self.outputs.result(operator, row, after_barrier);
    }

    fn result_archived(&mut self, operator: usize, row: &ArchivedRow, archive: &[u8], after_barrier: bool) {
        self.observer.result(operator, RowView::Archived(row));
        self.outputs.result_archived(operator, row, archive, after_barrier);
    }

    fn late(&mut self, operator: usize, input: usize, row: &Row, after_barrier: bool) {
        self.outputs.late(operator, input, row, after_barrier);
    }

    fn expired(&mut self, operator: usize, reason: ExpiryReason, input: Option<usize>, row: &Row, after_barrier: bool) {
        self.outputs.expired(operator, reason, input, row, after_barrier);
    }

    fn too_large(&mut self, operator: usize, raw: &str) {
        self.outputs.too_large(operator, raw);
    }

    fn checkpointed(&mut self, done: Completed) {
        self.outputs.checkpointed(done);
    }
}

/// What a finished replay did.
pub struct Summary {
    pub lines: usize,
    pub figures: Figures,
}

pub fn run(plan: &Plan, args: &ReplayArgs<'_>) -> Result<Summary, ReplayError> {
    run_observed(plan, args, &mut Unobserved)
}

/// [`run`], with `observer` watching.
///
/// A replay that can start again from nothing (its inputs and outputs are regular files, it
/// takes no checkpoints, nobody watches) takes its inputs' arrival order on trust: no first pass
/// reads them before it starts (input/mod.rs, [`Order::Trust`]). If one turns out not to be in
/// order, everything is dropped (runtime, state, what the outputs hold) and the replay runs again
/// with the first pass, which sorts that file: the same output as if it had done so at once.
pub fn run_observed(plan: &Plan, args: &ReplayArgs<'_>, observer: &mut dyn Observer) -> Result<Summary, ReplayError> {
    let order = if observer.watches() || !can_start_again(plan, args) { Order::Scan } else { Order::Trust };
    match replay(plan, args, observer, order) {
        Err(Stopped::OutOfOrder(flag)) => {
            let (name, path) = &args.inputs[flag];
            tracing::info!(input = %name, path = %path.display(), "Input not in arrival order: replay starts again, sorting it");
            replay(plan, args, observer, Order::Scan).map_err(|stopped| stopped.into_error(args))
        }
        done => done.map_err(|stopped| stopped.into_error(args)),
    }
}

/// Whether a replay can be dropped halfway and run again from nothing: no checkpoints (they
/// would hold positions in the wrong order) and only regular files (a pipe is read once, and
/// what went to a terminal or a pipe cannot be taken back).
fn can_start_again(plan: &Plan, args: &ReplayArgs<'_>) -> bool {
    let regular_or_new = |path: &PathBuf| match std::fs::metadata(path) {
        Ok(meta) => meta.is_file(),
        Err(error) => error.kind() == std::io::ErrorKind::NotFound,
    };
    plan.runtime.state_dir.is_none()
        && args.inputs.iter().all(|(_, path)| std::fs::metadata(path).is_ok_and(|m| m.is_file()))
        && args.outputs.iter().all(|(_, path)| regular_or_new(path))
}

/// Why one run of a replay stopped.
enum Stopped {
    Failed(ReplayError),
    /// An input taken to be in arrival order ([`Order::Trust`]) is not: `--input` number `flag`.
    OutOfOrder(usize),
}

impl Stopped {
    /// The replay's error (`args` names the inputs).
    fn into_error(self, args: &ReplayArgs<'_>) -> ReplayError {
        match self {
            Stopped::Failed(error) => error,
            // Only a run with `Order::Trust` stops so; the run after it scans.
            Stopped::OutOfOrder(flag) => {
                let (name, path) = &args.inputs[flag];
                let error = std::io::Error::other("out of arrival order though its first pass found it in order");
                ReplayError::Unreadable { name: name.clone(), path: path.clone(), error }
            }
        }
    }
}

impl<E: Into<ReplayError>> From<E> for Stopped {
    fn from(error: E) -> Stopped {
        Stopped::Failed(error.into())
    }
}

/// One run of a replay, reading its inputs in `order`.
fn replay(plan: &Plan, args: &ReplayArgs<'_>, observer: &mut dyn Observer, order: Order) -> Result<Summary, Stopped> {
    let inputs = args
        .inputs
        .iter()
        .map(|(name, path)| {
            plan.stream(name).map(|s| (s, path.as_path())).ok_or_else(|| ReplayError::UnknownInput(name.clone()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let outputs = args
        .outputs
        .iter()
        .map(|(name, path)| {
            plan.target(name).map(|t| (t, path.as_path())).ok_or_else(|| ReplayError::UnknownOutput(name.clone()))
        })
        .collect::<Result<Vec<(Target, &Path)>, _>>()?;
    let state = StateDir::open(plan)?;
    let dir = state.fresh_run_dir(plan)?;
    let sync = plan.runtime.durability == Durability::Power;
    let checkpoints = plan.runtime.state_dir.as_ref().map(|d| CheckpointDir::new(d.join("replay-checkpoints"), sync));
    let fingerprint = fingerprint(plan, args);
    let resume = checkpoints.as_ref().and_then(|c| resumable(c, fingerprint));
    let input_error = |error| match error {
        InputError::Read(flag, error) => {
            let (name, path) = &args.inputs[flag];
            Stopped::Failed(ReplayError::Unreadable { name: name.clone(), path: path.clone(), error })
        }
        InputError::Spill(path, error) => Stopped::Failed(ReplayError::StateDir { path, error }),
        InputError::OutOfOrder(flag) => Stopped::OutOfOrder(flag),
    };
    let mut inputs = Inputs::open(&inputs, &plan.streams, &dir, args.sort_run_bytes, order).map_err(input_error)?;
    let opened = match &resume {
        Some(resume) => Outputs::resume(plan, &outputs, &resume.files),
        None => Outputs::create(plan, &outputs),
    };
    let mut outputs = opened.map_err(|(i, error)| {
        let (name, path) = &args.outputs[i];
        ReplayError::Uncreatable { name: name.clone(), path: path.clone(), error }
    })?;
    let shards = args.shards.max(1);
    if let Some(dir) = &checkpoints {
        let exit_after = std::env::var(output::FAULT_EXIT_AFTER_CHECKPOINT).ok().and_then(|v| v.parse().ok());
        outputs.commit_to(Committer { dir: dir.clone(), shards: shards as u32, sync, exit_after });
    }
    let start = inputs.peek_arrival().map_err(input_error)?.map_or(0, i128::from);
    let mut options = RuntimeOptions {
        every_tick: args.every_tick,
        publication: crate::shard::Publication::REPLAY,
        checkpoints: checkpoints.clone(),
        restore: resume.as_ref().map(|r| &r.loaded),
        ..RuntimeOptions::new(shards, &dir)
    };
    observer.runtime_options(&mut options);
    let mut runtime = Runtime::start(plan, &options, start)?;
    let mut sinks = Observed { outputs, observer };
    let mut rows = InputRows::default();
    let taken = resume.as_ref().map_or(0, |r| r.position.lines);
    let mut epoch = resume.as_ref().map_or(0, |r| r.loaded.manifest.epoch);
    let interval = i128::from(plan.runtime.checkpoint_interval);
    let mut next_checkpoint = None;
    let mut count: u64 = 0;
    while let Some(line) = inputs.next().map_err(input_error)? {
        count += 1;
        if count <= taken {
            continue;
        }
        let arrival = i128::from(line.arrival);
        if checkpoints.is_some() {
            runtime.advance_to(arrival, &mut sinks)?;
            let due = *next_checkpoint.get_or_insert(arrival + interval);
            if arrival >= due && !runtime.checkpoint_in_flight() {
                epoch += 1;
                let position = Position { fingerprint, lines: count - 1 };
                let position = snapshot::encode(&position).map_err(|e| RuntimeError::Checkpoint(e.to_string()))?;
                // Told first: the barrier may pass and its checkpoint complete within the call.
                sinks.outputs.barrier(true);
                if !runtime.checkpoint(epoch, 0, position, &mut sinks)? {
                    sinks.outputs.barrier(false);
                }
                next_checkpoint = Some(arrival + interval);
            }
        }
        feed(plan, &mut runtime, &mut sinks, &mut rows, line)?;
    }
    let figures = runtime.finish(&mut sinks)?;
    sinks.outputs.finish().map_err(ReplayError::Write)?;
    if let Some(dir) = &checkpoints {
        dir.clear();
    }
    Ok(Summary { lines: count as usize, figures })
}

/// A checkpoint to resume from, read back.
struct Resume {
    loaded: Loaded,
    position: Position,
    files: Vec<output::FileState>,
}

/// The newest checkpoint in `dir` if it is one of this same replay; else none (and the
/// checkpoints there are cleared: this replay starts fresh).
fn resumable(dir: &CheckpointDir, fingerprint: u64) -> Option<Resume> {
    let loaded = dir.latest()?;
    let read = snapshot::decode::<ReplayCheckpoint>(&loaded.manifest.driver)
        .and_then(|saved| Ok((snapshot::decode::<Position>(&saved.position)?, saved.files)));
    match read {
        Ok((position, files)) if position.fingerprint == fingerprint => {
            tracing::info!(epoch = loaded.manifest.epoch, lines = position.lines, "Replay resumes from its checkpoint");
            Some(Resume { loaded, position, files })
        }
        Ok(_) => {
            tracing::info!("A checkpoint of another replay (config, shards, inputs or outputs differ): starting fresh");
            dir.clear();
            None
        }
        Err(error) => {
            tracing::warn!(%error, "Replay checkpoint set aside: it does not read back; starting fresh");
            dir.clear();
            None
        }
    }
}

/// What makes two replays the same: the checked config, the shard count, tick skipping, every
/// input (name, path, size, modification time) and output (name, path).
fn fingerprint(plan: &Plan, args: &ReplayArgs<'_>) -> u64 {
    let inputs: Vec<String> = args
        .inputs
        .iter()
        .map(|(name, path)| {
            let meta = std::fs::metadata(path).ok();
            let size = meta.as_ref().map(std::fs::Metadata::len);
            let modified = meta.and_then(|m| m.modified().ok());
            format!("{name}={}:{size:?}:{modified:?}", path.display())
        })
        .collect();
    let text = format!("{plan:?}|{}|{}|{inputs:?}|{:?}", args.shards.max(1), args.every_tick, args.outputs);
    xxhash_rust::xxh3::xxh3_64(text.as_bytes())
}

fn feed(
    plan: &Plan,
    runtime: &mut Runtime,
    sinks: &mut Observed<'_, '_>,
    rows: &mut InputRows,
    line: Line<'_>,
) -> Result<(), RuntimeError> {
    let arrival = line.arrival;
    runtime.advance_to(i128::from(arrival), sinks)?;
    let def = &plan.streams[line.stream];
    let decoded = match &line.content {
        Content::Row(fields) => Ok(fields),
        Content::DeadLetter(reason) => Err(*reason),
    };
    let input = Arrived { stream: line.stream, line: line.bytes, decoded, arrival };
    crate::source::ingest(
        runtime,
        def,
        input,
        rows,
        sinks,
        |sinks, row, runtime| {
            sinks.observer.row(line.stream, arrival, row, runtime);
            sinks.outputs.input_row(line.stream, row);
        },
        |sinks, label, raw| {
            sinks.observer.dead_letter(line.stream, arrival, line.bytes, label);
            sinks.outputs.dead_letter(line.stream, raw, label);
        },
    )
}

/// Names of private replay directories: `braid-replay-PID-…`.
const PRIVATE_PREFIX: &str = "braid-replay-";

/// Where replay keeps its rings and state: `runtime.state_dir`, or a temporary directory removed
/// on drop.
enum StateDir {
    Configured,
    Private(tempfile::TempDir),
}

impl StateDir {
    fn path<'a>(&'a self, plan: &'a Plan) -> &'a Path {
        match (self, &plan.runtime.state_dir) {
            (StateDir::Private(dir), _) => dir.path(),
            (StateDir::Configured, Some(path)) => path,
            (StateDir::Configured, None) => Path::new("."),
        }
    }

    /// `replay/` inside it, emptied: a replay starts fresh (its rings and the shards' arenas),
    /// and never touches the state of a service using the same `state_dir`.
    fn fresh_run_dir(&self, plan: &Plan) -> Result<PathBuf, ReplayError> {
        let dir = self.path(plan).join("replay");
        let error = |error| ReplayError::StateDir { path: dir.clone(), error };
        match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(error(e)),
            _ => {}
        }
        std::fs::create_dir_all(&dir).map_err(error)?;
        Ok(dir)
    }

    fn open(plan: &Plan) -> Result<StateDir, ReplayError> {
        match &plan.runtime.state_dir {
            Some(path) => std::fs::create_dir_all(path)
                .map(|()| StateDir::Configured)
                .map_err(|error| ReplayError::StateDir { path: path.clone(), error }),
            None => {
                let base = crate::storage::mapped_file::scratch_base();
                crate::storage::mapped_file::remove_abandoned(&base, PRIVATE_PREFIX);
                let prefix = format!("{PRIVATE_PREFIX}{}-", std::process::id());
                tempfile::Builder::new()
                    .prefix(&prefix)
                    .tempdir_in(&base)
                    .or_else(|_| tempfile::Builder::new().prefix(&prefix).tempdir())
                    .map(StateDir::Private)
                    .map_err(|error| ReplayError::StateDir { path: base, error })
            }
        }
    }
}
