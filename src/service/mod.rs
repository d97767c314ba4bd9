//! `braid run`: the service.
//!
//! ```text
//!  intake (the calling thread; its sleep drives the MQTT clients' tokio runtime, sources.rs)
//!   MQTT sources ── Delivery (bounded channel) ──────► journal → rows → shard rings
//!        ▲  PUBACK once confirmed ◄── Confirmations ──   │      (shard/: pinned shards)
//!   MQTT sinks  ◄── outbound spool per sink ◄── results ─┘ → file / stdout sinks
//!  io thread (tokio, current thread)
//!   signals, sd_notify (READY, WATCHDOG, STATUS), /metrics and /healthz
//! ```
//!
//! A *generation* is one plan running: its journal, runtime, sinks, sources and tasks. It starts
//! from the last checkpoint in `STATE_DIR/checkpoints/` (checkpoints.rs) and the journal entries
//! after it, and takes a checkpoint every `checkpoint_interval` and when it ends. SIGHUP
//! re-reads and validates the configuration on the io thread; an invalid or unchanged one is
//! logged and the running generation goes on; a changed one replaces the generation: the old one
//! ends with a checkpoint, and the new one restores from it every operator whose definition did
//! not change (name, kind, settings, inputs and their schemas); new or changed ones start empty,
//! named in a warning. SIGTERM or SIGINT stops intake first (unacknowledged messages stay with
//! the broker), lets the shards finish what they hold, takes a last checkpoint, flushes the sinks
//! (an MQTT sink drains its buffer while its uplink is up, bounded by [`DRAIN`]) and returns.

mod checkpoints;
mod ingest;
mod intake;
mod io;
mod journal;
mod outputs;
mod redelivery;
mod scratch;
mod sources;
mod taken;
mod view;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;

use crate::checkpoint::CheckpointDir;
use crate::config::{Durability, SinkKind, SourceKind};
use crate::plan::Plan;
use crate::shard::{Runtime, RuntimeError, RuntimeOptions};
use crate::sink::Patience;
use crate::sink::mqtt::Uplink;
use crate::source::Confirmations;
use crate::storage::write_faults;

use checkpoints::Schedule;
use intake::Intake;
pub use intake::{Control, Request};
use io::IoThread;
use journal::{Journal, JournalError};
use outputs::{OutputCounters, OutputError, Outputs};
use scratch::Scratch;
use sources::SourceRuntime;
use taken::Taken;
pub use view::LiveView;

/// How long a stop may spend on the shards' last results.
const SHARD_GRACE: Duration = Duration::from_secs(5);
/// How long a stopping MQTT sink keeps sending its buffer (systemd's TimeoutStopSec is longer).
pub const DRAIN: Duration = Duration::from_secs(10);
/// Deliveries waiting between the sources and the intake thread; beyond, sources stop acknowledging.
const INTAKE: usize = 4096;

#[derive(Debug, Error)]
pub enum ServiceError {
    #[error("state directory {path}: {error}")]
    StateDir { path: PathBuf, error: std::io::Error },
    #[error("state directory {0} is in use by another braid (its lock is held)")]
    Locked(PathBuf),
    #[error(transparent)]
    Journal(#[from] JournalError),
    #[error(transparent)]
    Output(#[from] OutputError),
    #[error("runtime: {0}")]
    Runtime(RuntimeError),
    #[error("sink {sink}: {error}")]
    Uplink { sink: String, error: String },
    #[error("source {source_name}: {error}")]
    Source { source_name: String, error: String },
    #[error("io thread: {0}")]
    Io(String),
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    /// A file a start needs cannot be written (a full disk): tried again every second.
    #[error("{site}: {path}: {source}")]
    CannotWrite { site: String, path: PathBuf, source: std::io::Error },
}

/// What the service needs besides the plan.
pub struct ServiceOptions {
    /// Re-read on SIGHUP; `None` (the demo): SIGHUP is logged and ignored.
    pub config_path: Option<PathBuf>,
    /// Overrides `runtime.shards`.
    pub shards: Option<usize>,
    /// Set by a caller that stops the service itself (the demo after `--duration`).
    pub control: Arc<Control>,
    /// Where the service shows its figures (the demo reads its summary from it).
    pub view: Arc<LiveView>,
}

/// Runs the service until SIGTERM/SIGINT (or `options.control` asks for a stop).
pub fn run(plan: Plan, options: ServiceOptions) -> Result<(), ServiceError> {
    let state_dir = state_dir(&plan);
    std::fs::create_dir_all(&state_dir).map_err(|error| ServiceError::StateDir { path: state_dir.clone(), error })?;
    let _lock = lock(&state_dir)?;
    let view = Arc::clone(&options.view);
    let io = IoThread::start(Arc::clone(&options.control), Arc::clone(&view), options.config_path.clone())?;
    io.serve_ops(&plan.ops_listen)?;
    let sources =
        SourceRuntime::new().map_err(|e| ServiceError::Io(format!("cannot build the sources' runtime: {e}")))?;
    let mut plan = Arc::new(plan);
    // The plan that ran before a reload: the fallback when the new one cannot start.
    let mut previous: Option<Arc<Plan>> = None;
    loop {
        let mut started = false;
        let request = match generation(&plan, &state_dir, (&io, &sources), &options, &view, &mut started) {
            Ok(request) => request,
            Err(ServiceError::CannotWrite { site, path, source }) if !started => {
                // A full disk at the start: no exit (systemd would restart into the same disk).
                write_faults::failed(&site, &path, &source, "braid cannot start");
                crate::ops::systemd::Notifier::from_env().extend_timeout(2 * write_faults::RETRY_EVERY);
                if outputs::sleep_unless_stopped(write_faults::RETRY_EVERY, Patience::idle(&options.control.interrupt))
                {
                    continue;
                }
                break;
            }
            Err(error) if !started && previous.is_some() => {
                tracing::error!(%error, "the reloaded configuration cannot start; going back to the running one");
                plan = previous.take().unwrap_or(plan);
                io.reload_failed();
                options.control.clear_reload();
                continue;
            }
            Err(error) => {
                io.stopped();
                return Err(error);
            }
        };
        previous = None;
        match request {
            Request::Stop => break,
            Request::Reload => {
                if let Some(next) = io.take_reloaded() {
                    tracing::info!("configuration reloaded: restarting with the new plan");
                    previous = Some(std::mem::replace(&mut plan, Arc::new(next)));
                }
            }
            Request::Run => {}
        }
        options.control.clear_reload();
    }
    io.stopped();
    Ok(())
}

/// `runtime.state_dir`, else systemd's `$STATE_DIRECTORY`, else `/var/lib/braid`.
fn state_dir(plan: &Plan) -> PathBuf {
    plan.runtime
        .state_dir
        .clone()
        .or_else(|| std::env::var_os("STATE_DIRECTORY").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("/var/lib/braid"))
}

/// An exclusive lock on `STATE_DIR/braid.lock`, held while the service runs: two services on one
/// state directory would corrupt each other's journal and spools.
fn lock(state_dir: &Path) -> Result<std::fs::File, ServiceError> {
    let path = state_dir.join("braid.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|error| ServiceError::StateDir { path: path.clone(), error })?;
    // The same advisory lock as every mapped file (storage/mapped_file.rs, point 1).
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(ServiceError::Locked(state_dir.to_owned())),
        Err(std::fs::TryLockError::Error(error)) => Err(ServiceError::StateDir { path, error }),
    }
}

/// Wall-clock processing time, ms since the Unix epoch (the runtime's one reading of the clock).
#[allow(clippy::disallowed_methods)]
pub fn wall_clock() -> i128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i128)
}

/// Runs one plan until a stop or a reload is asked for. `started` turns true once it runs live
/// (an error before that leaves nothing running: tasks end when their senders are dropped).
fn generation(
    plan: &Arc<Plan>,
    state_dir: &Path,
    (io, sources): (&IoThread, &SourceRuntime),
    options: &ServiceOptions,
    view: &Arc<LiveView>,
    started: &mut bool,
) -> Result<Request, ServiceError> {
    let stop = Arc::clone(&options.control.interrupt);
    let uplinks = open_uplinks(plan, state_dir)?;
    let counters = OutputCounters::new(plan.operators.len());
    let shards = options.shards.or(plan.runtime.shards).unwrap_or_else(default_shards);
    let power = plan.runtime.durability == Durability::Power;
    let checkpoints = CheckpointDir::new(state_dir.join("checkpoints"), power);
    let restored = checkpoints::restorable(&checkpoints, shards);
    let early = restored.as_ref().map(|r| (r.loaded.manifest.epoch, r.early.as_slice()));
    let taken = Taken::open(checkpoints.clone(), early);
    let mut outputs = Outputs::open(Arc::clone(plan), &uplinks, Arc::clone(&counters), Arc::clone(&stop), taken)?;
    // A sink that waits (a full buffer, a full disk) runs the sources and the MQTT sinks, on this
    // thread: the sink that frees the room among them.
    let running = sources.clone();
    outputs.meanwhile(Box::new(move |how_long| running.run_for(how_long)));
    let journal = Journal::open(&state_dir.join("journal"), plan.runtime.journal_bytes, plan.runtime.journal_retention)
        .map_err(|error| match error.open_write_failure() {
            Some((path, source)) => ServiceError::CannotWrite { site: intake::JOURNAL_SITE.into(), path, source },
            None => error.into(),
        })?;
    write_faults::recovered(intake::JOURNAL_SITE);
    let start = match &restored {
        Some(restored) => restored.barrier.now,
        None => journal.entries().next().map_or_else(wall_clock, |e| e.arrival),
    };
    // Rings and arenas start empty: the checkpoint and the journal after it rebuild the state.
    // They live off the state disk (scratch.rs), and go when the generation ends.
    let needed = RuntimeOptions::new(shards, state_dir).ring_file_bytes();
    let scratch = Scratch::open(plan.runtime.scratch_dir.as_deref(), state_dir, needed)?;
    scratch.fresh()?;
    tracing::info!(path = %scratch.path().display(), chosen = ?scratch.chosen, "rings and arenas (scratch)");
    let runtime_options = RuntimeOptions {
        checkpoints: Some(checkpoints.clone()),
        restore: restored.as_ref().map(|r| &r.loaded),
        pacing: crate::shard::Pacing::NETWORK,
        give_back_ring_pages: true,
        ..RuntimeOptions::new(shards, scratch.path())
    };
    let mut runtime = Runtime::start(plan, &runtime_options, start)?;
    runtime
        .sleep_with(|bell| sources.sleeper(bell))
        .map_err(|e| ServiceError::Io(format!("cannot sleep with the sources: {e}")))?;
    if let Some(restored) = &restored {
        let manifest = &restored.loaded.manifest;
        let (epoch, chain_from) = (manifest.epoch, manifest.chain_from);
        tracing::info!(epoch, chain_from, "state restored from the last checkpoint");
    }
    let doorbell = runtime.doorbell();
    let (intake_tx, intake_rx) = crossbeam_channel::bounded(INTAKE);
    let confirmations = Confirmations::new(plan.sources.len());
    let links = intake::Links {
        intake: intake_rx,
        confirmations: Arc::clone(&confirmations),
        control: Arc::clone(&options.control),
        view: Arc::clone(view),
    };
    let (interval, retention) = (plan.runtime.checkpoint_interval, plan.runtime.journal_retention);
    let schedule = Schedule::new(&checkpoints, interval, retention, start, shards);
    let mut intake = Intake::new(plan, runtime, journal, outputs, links, start, schedule);
    if let Some(restored) = &restored {
        intake.resume_from(restored.loaded.manifest.epoch, &restored.barrier);
    }
    let replayed = intake.replay_journal()?;
    // Logged also when there was nothing after the checkpoint: the start is done either way.
    tracing::info!(entries = replayed, "journal replayed: operator state rebuilt");
    let feed = io::SourceFeed { runtime: sources, intake: intake_tx, confirmations, doorbell };
    let mut tasks = io.start_generation(plan, state_dir, &uplinks, feed)?;
    intake.start_live(wall_clock(), tasks.status().0)?;
    view.set(Arc::clone(plan), counters, tasks.status(), Arc::clone(&options.control));
    view.update_figures(Some(intake.runtime.live_figures()));
    *started = true;
    let request = intake.run(wall_clock, sources);
    // Intake stops first: what the sources still hold is not acknowledged, the broker keeps it.
    tasks.stop_sources(sources);
    let stopped = intake.stop(SHARD_GRACE).map(drop);
    tasks.stop_sinks(sources, DRAIN);
    view.update_figures(None);
    stopped?;
    request
}

fn default_shards() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

fn open_uplinks(plan: &Plan, state_dir: &Path) -> Result<Vec<Arc<Uplink>>, ServiceError> {
    let mut uplinks = Vec::new();
    for def in plan.sinks.iter().filter(|s| s.kind == SinkKind::Mqtt) {
        let dir = state_dir.join("sinks").join(&def.name);
        let uplink = Uplink::open(def, &dir).map_err(|e| match e.write_failure() {
            Some((path, source)) => ServiceError::CannotWrite { site: format!("sink {}", def.name), path, source },
            None => ServiceError::Uplink { sink: def.name.clone(), error: e.to_string() },
        })?;
        write_faults::recovered(&format!("sink {}", def.name));
        uplinks.push(uplink);
    }
    Ok(uplinks)
}

/// The address an `embedded` source's broker listens on.
pub fn embedded_listen(plan: &Plan, source: usize) -> Option<std::net::SocketAddr> {
    let def = &plan.sources[source];
    match (&def.kind, &def.listen) {
        (SourceKind::Embedded, None) => Some(crate::config::DEFAULT_EMBEDDED_LISTEN),
        (SourceKind::Embedded, Some(listen)) => listen.parse().ok(),
        (SourceKind::Mqtt, _) => None,
    }
}
