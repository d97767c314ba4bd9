//! The thread-per-core runtime: shard threads fed through memory-mapped rings. Replay,
//! `braid run` and `braid bench` all run their operators here; there is no other engine.
//!
//! ```text
//!  feeder (the calling thread: feeder.rs)            collector (the calling thread: collector.rs)
//!   TickPlanner: stream clocks, which ticks run          ▲ results, late rows, figures
//!   key hash → shard                                     │
//!        │ ring per shard: rows, ticks, processing time, end, progress
//!        ▼                                              │ ring per shard
//!   shard 0 … shard N−1: pinned threads, one monoio runtime each (threads.rs, worker.rs)
//!        ◄──── exchange: a ring per (shard, shard) for results read by another operator ────►
//! ```
//!
//! The feeder does what only it can: its [`TickPlanner`](crate::time::TickPlanner) owns the
//! streams' clocks (watermarks, idleness) and decides which ticks run; each tick — with every
//! stream's watermark and every operator's idleness — goes to every shard. Rows go to the shard
//! of their key's hash (`key_hash % shards`), broadcast rows to all. Each shard runs an
//! [`OperatorHost`](crate::operator::host::OperatorHost) of every operator for its keys;
//! operator watermarks are computed on every shard from the same inputs, so they agree. The
//! output is the same for any shard count, `_id`s included (`tag.rs` explains the ordering that
//! makes this exact; tests/it/runtime.rs holds the runtime to an independent oracle).
//!
//! Processing-time timers fire at the next event (a row's arrival or a tick) instead of between
//! events, each seeing its own due time as processing time.
//!
//! No locks on the row path: rings are single-producer single-consumer; a sleeping thread is
//! woken through its [`wake::Doorbell`]. A full ring is backpressure: the feeder waits
//! (draining results meanwhile), a shard stops taking feeder events until its frames fit.

mod checkpoint;
mod collector;
pub mod driver;
mod feeder;
mod file_write;
pub mod hot_keys;
pub mod result_latency;
pub mod tag;
mod threads;
pub mod wake;
pub mod wire;
mod worker;

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Barrier, Mutex};
use std::thread::JoinHandle;

use thiserror::Error;

use crate::plan::{MAX_CHAIN_DEPTH, MAX_SHARDS};
use crate::ring::{Producer, RingError};
use crate::time::TickPlanner;
use wake::{Doorbell, Inbox, Sleeper};
use wire::Writer;

pub use collector::{Emit, Figures, ShardReport, StreamCounters};

/// Bytes of frames in a feeder → shard ring and in a shard → collector ring.
///
/// A ring cycles through all its pages, so each is resident (tmpfs) once the ring has wrapped:
/// 2 × 1 MiB a shard. 1 MiB holds about 5 000 gateway rows, more than a shard takes in a round
/// at any rate measured (replay at 1 M rows/s included); 4 MiB rings were no faster and cost
/// 6 MiB of resident memory a shard (BENCHMARKS.md "Memory at 10 k devices"). Not below the
/// exchange ring's size: the smaller ring bounds the largest row ([`max_row_bytes`]).
pub const FEED_RING_BYTES: usize = 1 << 20;
/// Bytes of frames in a shard → shard exchange ring.
pub const EXCHANGE_RING_BYTES: usize = 1 << 20;
/// The largest row archive the rings of a run carry, in every kind of frame (feed, result and
/// exchange rings; an arena segment holds more). An input row over it is refused by
/// [`Runtime::ingest`] with [`RuntimeError::RowTooLarge`] before anything is sent, and the caller
/// dead-letters it (`too_large`); a result over it goes to `dead_letter` from its shard. Neither
/// stops the run, and a journaled message that made one does the same again at a restart.
pub const fn max_row_bytes(feed_ring_bytes: usize, exchange_ring_bytes: usize) -> usize {
    let smallest = if feed_ring_bytes < exchange_ring_bytes { feed_ring_bytes } else { exchange_ring_bytes };
    crate::ring::max_payload(smallest).saturating_sub(wire::ROW_HEADER_MAX)
}
/// [`max_row_bytes`] of the default rings: `validate` refuses a `max_payload` above it.
pub const MAX_ROW_BYTES: usize = max_row_bytes(FEED_RING_BYTES, EXCHANGE_RING_BYTES);
/// Rows between two publications of a live feeder's rings ([`Publication::Live`]).
const FEED_BATCH: usize = 64;

/// When the feeder publishes its rings. Each publication may wake a sleeping shard (a system call
/// and two context switches).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Publication {
    /// Every [`FEED_BATCH`] rows, and at every tick: a live service's results do not wait for the
    /// next batch (the default).
    Live,
    /// Every this many events, rows and ticks alike: replay ([`Publication::REPLAY`]), whose
    /// results nobody waits for.
    Every(usize),
}

impl Publication {
    pub const REPLAY: Publication = Publication::Every(1024);

    /// Whether a tick that leaves `unpublished` events unpublished is published.
    fn at_tick(self, unpublished: usize) -> bool {
        match self {
            Publication::Live => true,
            Publication::Every(n) => unpublished >= n,
        }
    }

    /// Whether a row that leaves `unpublished` events unpublished is published.
    fn after_row(self, unpublished: usize) -> bool {
        match self {
            Publication::Live => unpublished >= FEED_BATCH,
            Publication::Every(n) => unpublished >= n,
        }
    }
}

#[derive(Debug, Error)]
pub enum RuntimeError {
    #[error("ring: {0}")]
    Ring(#[from] RingError),
    #[error("shard wake-up socket: {0}")]
    Doorbell(std::io::Error),
    #[error("starting shard thread: {0}")]
    Spawn(std::io::Error),
    #[error("shard {shard}: {error}")]
    Shard { shard: usize, error: ShardError },
    #[error("shard {0} stopped unexpectedly")]
    ShardLost(usize),
    #[error("a row of {0} bytes does not fit the shard rings")]
    TooLarge(usize),
    /// A ring that gave back pages could not allocate them again ([`PushError::NoSpace`](crate::ring::PushError::NoSpace)).
    #[error("a shard ring cannot allocate its pages again (its file system is full): {0}")]
    RingSpace(std::io::Error),
    /// Nothing happened: the row is the caller's to dead-letter as `too_large`.
    #[error("a row of {bytes} bytes is larger than the shard rings carry ({max} bytes)")]
    RowTooLarge { bytes: usize, max: usize },
    #[error("encoding a row: {0}")]
    Frame(String),
    #[error("an operator chain longer than {MAX_CHAIN_DEPTH} operators")]
    TooDeep,
    #[error("{0} shards: at most {MAX_SHARDS} are supported")]
    TooManyShards(usize),
    #[error("checkpoint: {0}")]
    Checkpoint(String),
}

#[derive(Debug, Error)]
pub enum ShardError {
    #[error("building its runtime: {0}")]
    Runtime(std::io::Error),
    #[error("waiting for work: {0}")]
    Wait(std::io::Error),
    #[error("a frame of {0} bytes does not fit the rings")]
    TooLarge(usize),
    #[error("a ring cannot allocate its pages again (its file system is full): {0}")]
    RingSpace(std::io::Error),
    #[error("encoding a row: {0}")]
    Frame(String),
    #[error("an operator chain longer than {MAX_CHAIN_DEPTH} operators")]
    TooDeep,
    #[error("protocol: {0}")]
    Protocol(&'static str),
    #[error("operator state: {0}")]
    State(String),
    #[error("stopped: the runtime was dropped before the end of input")]
    Cancelled,
}

/// A feeder → shard ring.
struct Feed {
    ring: Producer,
    bell: Arc<Doorbell>,
}

/// The running shards, fed (feeder.rs) and drained (collector.rs) by the calling thread.
pub struct Runtime {
    shards: usize,
    feeds: Vec<Feed>,
    results: Vec<Inbox>,
    threads: Vec<Option<JoinHandle<Result<ShardReport, ShardError>>>>,
    /// Held shards wait here ([`RuntimeOptions::hold`]).
    gate: Option<Arc<Barrier>>,
    /// Per shard: its thread has ended (set before it wakes the feeder a last time).
    ended: Vec<Arc<AtomicBool>>,
    /// Per shard: its operators are built (and restored from the checkpoint, if any).
    built: Vec<Arc<AtomicBool>>,
    /// Set when the runtime is dropped before `finish`: the shards stop.
    cancel: Arc<AtomicBool>,
    /// Per shard: its figures as of its last tick (a live service shows them).
    live: Vec<Arc<Mutex<Option<ShardReport>>>>,
    /// Every shard's state bytes, as each last counted them (state/budget.rs).
    gauge: Arc<crate::state::budget::StateGauge>,
    /// Per shard: its feed ring's release position at the last [`Runtime::stalled_shards`].
    last_released: Vec<u64>,
    shard_bells: Vec<Arc<Doorbell>>,
    bell: Arc<Doorbell>,
    sleeper: Sleeper,
    /// Stream clocks and which ticks run.
    planner: TickPlanner,
    stream_counters: Vec<StreamCounters>,
    /// Per shard: which key carries most of its rows.
    hot_keys: Vec<hot_keys::HotKeys>,
    /// Inputs per operator (for the figures).
    op_inputs: Vec<usize>,
    /// Names of the streams and operators (a checkpoint's feeder state goes by name).
    stream_names: Vec<String>,
    operator_names: Vec<String>,
    /// Some operator may hold processing-time timers: send processing time.
    clocked: bool,
    chained: bool,
    seq: u64,
    unpublished: usize,
    /// [`RuntimeOptions::publication`].
    publication: Publication,
    /// [`Pacing::feeder_spins`].
    feeder_spins: bool,
    writer: Writer,
    /// [`max_row_bytes`] of this run's rings.
    max_row: usize,
    /// Per operator: results too large for the rings, sent to `dead_letter`.
    too_large: Vec<u64>,
    /// Barriers may be sent ([`RuntimeOptions::checkpoints`]).
    checkpoints: bool,
    in_flight: Option<checkpoint::InFlight>,
}

pub struct RuntimeOptions<'a> {
    pub shards: usize,
    /// Where the ring files (created fresh) and each shard's state directory `shard-N/` (its
    /// operators' arenas, opened as found) go.
    pub dir: &'a Path,
    /// Run every tick (the reference the skipping is tested against).
    pub every_tick: bool,
    /// Bytes of each feeder → shard and shard → collector ring ([`FEED_RING_BYTES`] by default).
    pub feed_ring_bytes: usize,
    /// When the feeder publishes its rings ([`Publication::Live`] by default).
    pub publication: Publication,
    /// Bytes of each shard → shard exchange ring ([`EXCHANGE_RING_BYTES`] by default).
    pub exchange_ring_bytes: usize,
    /// Shards wait until [`finish`](Runtime::finish) (or a full ring) before they start: the rings
    /// are filled first, so a benchmark measures the shards alone.
    pub hold: bool,
    /// Operators keep their stored rows on the heap instead of in arenas under `dir` (a
    /// baseline for `braid bench --memory-state`; nothing survives a restart).
    pub memory_state: bool,
    /// Where the shards write checkpoints ([`Runtime::checkpoint`]); none: checkpoints are off.
    pub checkpoints: Option<crate::checkpoint::CheckpointDir>,
    /// The checkpoint to start from (taken with the same number of shards).
    pub restore: Option<&'a crate::checkpoint::Loaded>,
    /// Operator hosts note the rows of these keys and their watermarks' moves (`braid explain`).
    pub trace: Option<Arc<crate::operator::host::Trace>>,
    /// How the threads wait for input ([`Pacing::LOCAL`] by default).
    pub pacing: Pacing,
    /// The rings keep their frames in their first eighth while the consumer keeps up and give
    /// back the pages of the rest (ring/mod.rs "Giving pages back"): `braid run`, whose rings
    /// carry a few KiB at a time and would otherwise keep every page resident once they have
    /// wrapped. Off by default: replay and `braid bench` run their consumers behind by more than
    /// that, and would take chunks back and give them back again and again.
    pub give_back_ring_pages: bool,
}

/// How the runtime's threads wait for input: as fast as it is read (replay, `braid bench`) or
/// at the network's pace (`braid run`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pacing {
    /// While frames come faster than [`wake::LINGER_PACE`], a shard that ran out of work sleeps
    /// this long without raising its flag, so the feeder does not ring it, and takes what came
    /// meanwhile in one round (zero: it never lingers).
    pub shard_linger: std::time::Duration,
    /// The feeder looks at its rings for a few µs before it sleeps ([`wake::Doorbell::spin`]).
    pub feeder_spins: bool,
}

impl Pacing {
    /// Input read from files or generated: the next frame is always close, a short spin finds it.
    pub const LOCAL: Pacing = Pacing { shard_linger: std::time::Duration::ZERO, feeder_spins: true };

    /// Input from the network (BENCHMARKS.md "Fewer wake-ups per MQTT message").
    ///
    /// It comes as a stream of small publications, a few messages per read from the broker. A
    /// shard that slept on its doorbell after each one cost a wake-up byte from the feeder and
    /// two context switches per publication: at 40 k messages/s that was most of a shard's time.
    /// Lingering 1 ms while the input is fast, it takes 20–40 frames a round; a result then
    /// leaves up to 1 ms later, while the deliveries' acknowledgements to the broker do not wait
    /// for it (the feeder confirms them once they are in the rings). Input slower than the pace
    /// is taken as it comes.
    ///
    /// The feeder does not spin: deliveries come at the broker's pace, and a spin of a few µs
    /// almost never saw the next one (it was a third of the feeder thread's time).
    pub const NETWORK: Pacing = Pacing { shard_linger: std::time::Duration::from_millis(1), feeder_spins: false };
}

impl<'a> RuntimeOptions<'a> {
    /// Bytes of the ring files a runtime with these options preallocates in `dir`: a feed and a
    /// result ring per shard, an exchange ring per ordered pair of shards (headers included).
    pub fn ring_file_bytes(&self) -> u64 {
        let ring = |bytes: usize| (bytes + crate::storage::mapped_file::HEADER_LEN) as u64;
        let shards = self.shards as u64;
        2 * shards * ring(self.feed_ring_bytes) + shards * shards.saturating_sub(1) * ring(self.exchange_ring_bytes)
    }

    pub fn new(shards: usize, dir: &'a Path) -> RuntimeOptions<'a> {
        RuntimeOptions {
            shards,
            dir,
            every_tick: false,
            feed_ring_bytes: FEED_RING_BYTES,
            publication: Publication::Live,
            exchange_ring_bytes: EXCHANGE_RING_BYTES,
            hold: false,
            memory_state: false,
            checkpoints: None,
            restore: None,
            trace: None,
            pacing: Pacing::LOCAL,
            give_back_ring_pages: false,
        }
    }
}
