//! The thread-per-core runtime: shard threads fed through memory-mapped rings.
//!
//! ```text
//!  feeder (the calling thread)                     collector (the calling thread)
//!   stream clocks, ticks, key hash → shard              ▲ results, late rows
//!        │ ring per shard: rows, ticks, processing time, end, progress
//!        ▼                                              │ ring per shard
//!   shard 0 … shard N−1: pinned threads, one monoio runtime each (worker.rs)
//!        ◄──── exchange: a ring per (shard, shard) for results read by another operator ────►
//! ```
//!
//! The feeder does what only it can: it owns the streams' clocks (watermarks, idleness) and
//! decides which ticks run, exactly as the engine does, and sends each tick — with every stream's
//! watermark and every operator's idleness — to every shard. Rows go to the shard of their key's
//! hash (`key_hash % shards`, the engine's routing), broadcast rows to all. Each shard runs an
//! instance of every operator for its keys; operator watermarks are computed on every shard from
//! the same inputs, so they agree. Output is the single-threaded [`Engine`](crate::engine::Engine)'s,
//! `_id`s included, for any shard count (`tags.rs` explains the ordering that makes this exact).
//!
//! Ticks: the feeder skips a tick only when no stream received rows since the last one and no
//! operator advances with processing time (the engine's first rule); it does not take the
//! engine's bigger jumps, and runs every tick while a `connect` operator may hold processing-time
//! timers — running a tick the engine skips changes nothing (`tests/tick_skipping.rs`).
//! Processing-time timers fire at the next event (a row's arrival or a tick) instead of between
//! events, each seeing its own due time as processing time, as in the engine.
//!
//! No locks on the row path: rings are single-producer single-consumer; a sleeping thread is
//! woken through its [`wake::Doorbell`]. A full ring is backpressure: the feeder waits
//! (draining results meanwhile), a shard stops taking feeder events until its frames fit.

pub mod driver;
pub mod tag;
pub mod wake;
pub mod wire;
mod worker;

use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread::JoinHandle;

use thiserror::Error;

use crate::config::{NodeRef, Plan};
use crate::engine::{Emit, Figures, OperatorCounters, StreamCounters};
use crate::operator::OperatorSpec;
use crate::record::frame::to_row;
use crate::record::{Key, Row};
use crate::ring::{FrameKind, Producer, PushError, Ring, RingError};
use crate::time::clock::InputTime;
use crate::time::{StreamClock, Time, next_tick};
use driver::{Driver, ShardRuntime};
use tag::MAX_DEPTH;
use wake::{Doorbell, Inbox, Outbox};
use wire::{Frame, TickEvent, Writer};
use worker::{Links, Worker};

/// Bytes of frames in a feeder → shard ring and in a shard → collector ring.
pub const FEED_RING_BYTES: usize = 4 << 20;
/// Bytes of frames in a shard → shard exchange ring.
pub const EXCHANGE_RING_BYTES: usize = 1 << 20;
/// Events between two publications of the feeder's rings.
const FEED_BATCH: usize = 64;

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
    #[error("encoding a row: {0}")]
    Frame(String),
    #[error("an operator chain longer than {MAX_DEPTH} operators")]
    TooDeep,
    #[error("{0} shards: at most 256 are supported")]
    TooManyShards(usize),
}

#[derive(Debug, Error)]
pub enum ShardError {
    #[error("building its runtime: {0}")]
    Runtime(std::io::Error),
    #[error("waiting for work: {0}")]
    Wait(std::io::Error),
    #[error("a frame of {0} bytes does not fit the rings")]
    TooLarge(usize),
    #[error("encoding a row: {0}")]
    Frame(String),
    #[error("an operator chain longer than {MAX_DEPTH} operators")]
    TooDeep,
    #[error("protocol: {0}")]
    Protocol(&'static str),
    #[error("operator state: {0}")]
    State(String),
    #[error("stopped: the runtime was dropped before the end of input")]
    Cancelled,
}

/// The plan as the shards use it.
pub struct Topology {
    pub shards: usize,
    pub ops: Vec<OpNode>,
    /// Per stream: the (operator, input) pairs reading it, in operator order.
    pub stream_readers: Vec<Vec<(usize, usize)>>,
    pub idle_advance: bool,
}

pub struct OpNode {
    pub spec: OperatorSpec,
    pub inputs: Vec<NodeRef>,
    /// The (operator, input) pairs reading this operator's results.
    pub readers: Vec<(usize, usize)>,
    /// Reads another operator: its inputs are merged in tag order.
    pub chained: bool,
    /// May hold processing-time timers (connect).
    pub clocked: bool,
    /// Where its results carry the key they came from ([`origin_rank`](crate::engine::origin_rank)).
    pub origin: Option<usize>,
}

impl Topology {
    pub fn new(plan: &Plan, shards: usize) -> Topology {
        let mut stream_readers = vec![Vec::new(); plan.streams.len()];
        let mut ops: Vec<OpNode> = plan
            .operators
            .iter()
            .enumerate()
            .map(|(op, o)| OpNode {
                origin: plan.origin_key_position(op),
                spec: o.spec.clone(),
                inputs: o.inputs.clone(),
                readers: Vec::new(),
                chained: o.inputs.iter().any(|n| matches!(n, NodeRef::Operator(_))),
                clocked: matches!(o.spec, OperatorSpec::Connect(_)),
            })
            .collect();
        for (op, def) in plan.operators.iter().enumerate() {
            for (input, node) in def.inputs.iter().enumerate() {
                match *node {
                    NodeRef::Stream(s) => stream_readers[s].push((op, input)),
                    NodeRef::Operator(u) => ops[u].readers.push((op, input)),
                }
            }
        }
        Topology { shards, ops, stream_readers, idle_advance: plan.runtime.idle_advance }
    }

    /// Operators on the longest chain (a tag's path holds at most [`MAX_DEPTH`]).
    fn depth(&self) -> usize {
        let mut depth = vec![0usize; self.ops.len()];
        for (op, node) in self.ops.iter().enumerate() {
            let upstream = node.inputs.iter().filter_map(|n| match *n {
                NodeRef::Operator(u) => Some(depth[u]),
                NodeRef::Stream(_) => None,
            });
            depth[op] = 1 + upstream.max().unwrap_or(0);
        }
        depth.into_iter().max().unwrap_or(0)
    }
}

/// What a shard thread hands back when it ends.
#[derive(Clone)]
pub struct ShardReport {
    pub counters: Vec<OperatorCounters>,
    pub watermarks: Vec<Time>,
    /// Per operator: (rows, bytes).
    pub state: Vec<(usize, usize)>,
    pub driver: Driver,
}

/// A feeder → shard ring.
struct Feed {
    ring: Producer,
    bell: Arc<Doorbell>,
}

/// The running shards, fed and drained by the calling thread.
pub struct Runtime {
    shards: usize,
    feeds: Vec<Feed>,
    results: Vec<Inbox>,
    threads: Vec<Option<JoinHandle<Result<ShardReport, ShardError>>>>,
    /// Held shards wait here ([`RuntimeOptions::hold`]).
    gate: Option<Arc<Barrier>>,
    /// Per shard: its thread has ended (set before it wakes the feeder a last time).
    ended: Vec<Arc<AtomicBool>>,
    /// Set when the runtime is dropped before `finish`: the shards stop.
    cancel: Arc<AtomicBool>,
    /// Per shard: its figures as of its last tick (a live service shows them).
    live: Vec<Arc<Mutex<Option<ShardReport>>>>,
    /// Per shard: its feed ring's release position at the last [`Runtime::stalled_shards`].
    last_released: Vec<u64>,
    shard_bells: Vec<Arc<Doorbell>>,
    bell: Arc<Doorbell>,
    sleeper: UnixStream,
    streams: Vec<StreamClock>,
    stream_counters: Vec<StreamCounters>,
    /// Per operator: its inputs, to compute idleness at ticks.
    op_inputs: Vec<Vec<NodeRef>>,
    op_idle: Vec<bool>,
    idle_advance: bool,
    /// Some operator may hold processing-time timers: run every tick, send processing time.
    clocked: bool,
    chained: bool,
    every_tick: bool,
    now: i128,
    seq: u64,
    unpublished: usize,
    writer: Writer,
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
    /// Bytes of each shard → shard exchange ring ([`EXCHANGE_RING_BYTES`] by default).
    pub exchange_ring_bytes: usize,
    /// Shards wait until [`finish`](Runtime::finish) (or a full ring) before they start: the rings
    /// are filled first, so a benchmark measures the shards alone.
    pub hold: bool,
    /// Operators keep their stored rows on the heap instead of in arenas under `dir` (a
    /// baseline for `braid bench --memory-state`; nothing survives a restart).
    pub memory_state: bool,
}

impl<'a> RuntimeOptions<'a> {
    pub fn new(shards: usize, dir: &'a Path) -> RuntimeOptions<'a> {
        RuntimeOptions {
            shards,
            dir,
            every_tick: false,
            feed_ring_bytes: FEED_RING_BYTES,
            exchange_ring_bytes: EXCHANGE_RING_BYTES,
            hold: false,
            memory_state: false,
        }
    }
}

impl Runtime {
    /// Creates the rings in `options.dir` and starts the shard threads. `start`: processing time
    /// of the first line of all inputs (idleness counts from there).
    pub fn start(plan: &Plan, options: &RuntimeOptions<'_>, start: i128) -> Result<Runtime, RuntimeError> {
        let shards = options.shards.max(1);
        if shards > crate::config::MAX_SHARDS as usize {
            return Err(RuntimeError::TooManyShards(shards));
        }
        let topo = Arc::new(Topology::new(plan, shards));
        if topo.depth() > MAX_DEPTH {
            return Err(RuntimeError::TooDeep);
        }
        let (bell, sleeper) = Doorbell::new().map_err(RuntimeError::Doorbell)?;
        let mut shard_bells = Vec::new();
        let mut shard_sleepers = Vec::new();
        for _ in 0..shards {
            let (b, s) = Doorbell::new().map_err(RuntimeError::Doorbell)?;
            shard_bells.push(b);
            shard_sleepers.push(Some(s));
        }
        let ring = |name: String, bytes: usize| Ring::create(&options.dir.join(name), bytes);
        let mut feeds = Vec::new();
        let mut results = Vec::new();
        let mut links = Vec::new();
        for (j, shard_bell) in shard_bells.iter().enumerate() {
            let (feed, input) = ring(format!("shard-{j}.in.ring"), options.feed_ring_bytes)?;
            let (output, result) = ring(format!("shard-{j}.out.ring"), options.feed_ring_bytes)?;
            feeds.push(Feed { ring: feed, bell: Arc::clone(shard_bell) });
            results.push(Inbox { ring: result, bell: Arc::clone(shard_bell) });
            links.push(Links {
                input: Inbox { ring: input, bell: Arc::clone(&bell) },
                exchange_in: Vec::new(),
                exchange_out: (0..shards).map(|_| None).collect(),
                output: Outbox::new(output, Arc::clone(&bell)),
            });
        }
        for i in 0..shards {
            for j in (0..shards).filter(|&j| j != i) {
                let (out, inbox) = ring(format!("shard-{i}-to-{j}.ring"), options.exchange_ring_bytes)?;
                links[i].exchange_out[j] = Some(Outbox::new(out, Arc::clone(&shard_bells[j])));
                links[j].exchange_in.push((i, Inbox { ring: inbox, bell: Arc::clone(&shard_bells[i]) }));
            }
        }
        let cores = core_affinity::get_core_ids().unwrap_or_default();
        if shards > cores.len() && !cores.is_empty() {
            tracing::warn!(shards, cores = cores.len(), "more shards than cores: shards share cores round-robin");
        }
        let mut threads = Vec::new();
        let ended: Vec<Arc<AtomicBool>> = (0..shards).map(|_| Arc::default()).collect();
        let gate = options.hold.then(|| Arc::new(Barrier::new(shards + 1)));
        let cancel = Arc::new(AtomicBool::new(false));
        let live: Vec<Arc<Mutex<Option<ShardReport>>>> = (0..shards).map(|_| Arc::default()).collect();
        for (j, links) in links.into_iter().enumerate() {
            let live = Arc::clone(&live[j]);
            let topo = Arc::clone(&topo);
            let own_bell = Arc::clone(&shard_bells[j]);
            let main_bell = Arc::clone(&bell);
            let end_flag = Arc::clone(&ended[j]);
            let gate = gate.clone();
            let cancel = Arc::clone(&cancel);
            let state = (!options.memory_state).then(|| options.dir.join(format!("shard-{j}")));
            let sleeper = shard_sleepers[j].take();
            let core = cores.get(j % cores.len().max(1)).copied();
            let thread = std::thread::Builder::new()
                .name(format!("braid-shard-{j}"))
                .spawn(move || {
                    // Wakes the feeder however the shard ends, so it never waits on a dead shard.
                    let _wake_feeder = WakeOnDrop(end_flag, main_bell);
                    if let Some(core) = core {
                        core_affinity::set_for_current(core);
                    }
                    if let Some(gate) = gate {
                        gate.wait();
                    }
                    let worker = Worker::new(j, topo, links, state.as_deref(), live)?;
                    run_shard(j, worker, &own_bell, sleeper, &cancel)
                })
                .map_err(RuntimeError::Spawn)?;
            threads.push(Some(thread));
        }
        let clocked = topo.ops.iter().any(|o| o.clocked);
        let mut seq = 0;
        if clocked {
            // Processing time starts at `start` (the engine tells its connect instances at once).
            seq += 1;
            let mut writer = Writer::default();
            let payload = writer.event(seq, Some(start));
            for feed in &mut feeds {
                // The rings are empty: a small frame always fits.
                feed.ring
                    .push(FrameKind::ProcessingTime, payload)
                    .map_err(|_| RuntimeError::TooLarge(payload.len()))?;
            }
        }
        let mut stream_clocks = Vec::new();
        for s in &plan.streams {
            stream_clocks.push(StreamClock::new(s.max_out_of_orderness, s.idle_timeout, start));
        }
        Ok(Runtime {
            shards,
            feeds,
            results,
            threads,
            gate,
            ended,
            cancel,
            live,
            last_released: vec![0; shards],
            shard_bells,
            bell,
            sleeper,
            streams: stream_clocks,
            stream_counters: vec![StreamCounters::default(); plan.streams.len()],
            op_inputs: plan.operators.iter().map(|o| o.inputs.clone()).collect(),
            op_idle: vec![false; plan.operators.len()],
            idle_advance: plan.runtime.idle_advance,
            clocked,
            chained: topo.ops.iter().any(|o| o.chained),
            every_tick: options.every_tick,
            now: start,
            seq,
            unpublished: 0,
            writer: Writer::default(),
        })
    }

    /// Runs the ticks in (now, to] that can change anything; processing time moves to `to`.
    pub fn advance_to(&mut self, to: i128, emit: &mut impl Emit) -> Result<(), RuntimeError> {
        loop {
            let mut t = next_tick(self.now);
            if t > to {
                break;
            }
            let new_rows = self.every_tick || self.clocked || self.streams.iter().any(StreamClock::has_new_rows);
            let advancing = self.idle_advance && self.op_idle.iter().any(|&i| i);
            if !new_rows && !advancing {
                // Nothing changes before the next idleness transition.
                match self.streams.iter().filter_map(StreamClock::idle_due).map(|d| d.max(t)).min() {
                    Some(due) if due <= to => t = due,
                    _ => break,
                }
            }
            self.tick(t, emit)?;
        }
        if to > self.now {
            self.now = to;
            if self.clocked {
                self.seq += 1;
                self.writer.event(self.seq, Some(to));
                self.send_written(None, FrameKind::ProcessingTime, emit)?;
            }
        }
        Ok(())
    }

    fn tick(&mut self, t: i128, emit: &mut impl Emit) -> Result<(), RuntimeError> {
        self.now = t;
        for clock in &mut self.streams {
            clock.tick(t);
        }
        let streams: Vec<InputTime> =
            self.streams.iter().map(|c| InputTime { watermark: c.watermark(), idle: c.is_idle() }).collect();
        for op in 0..self.op_inputs.len() {
            self.op_idle[op] = self.op_inputs[op].iter().all(|n| match *n {
                NodeRef::Stream(s) => streams[s].idle,
                NodeRef::Operator(u) => self.op_idle[u],
            });
        }
        self.seq += 1;
        let tick = TickEvent { seq: self.seq, t, streams, op_idle: self.op_idle.clone() };
        self.writer.tick(&tick);
        self.send_written(None, FrameKind::Tick, emit)?;
        self.publish(emit)
    }

    /// Ingests one decoded row of stream `stream` that arrived at `arrival`.
    pub fn ingest(
        &mut self,
        stream: usize,
        row: &Row,
        arrival: i128,
        emit: &mut impl Emit,
    ) -> Result<(), RuntimeError> {
        self.stream_counters[stream].rows += 1;
        self.streams[stream].on_row(row.ts, arrival);
        self.seq += 1;
        let seq = self.seq;
        self.writer.row_event(seq, stream, row).map_err(|e| RuntimeError::Frame(e.to_string()))?;
        let shard = (row.key != Key::Broadcast).then(|| (row.key_hash % self.shards as u64) as usize);
        self.send_written(shard, FrameKind::Row, emit)?;
        self.unpublished += 1;
        if self.unpublished >= FEED_BATCH {
            self.publish(emit)?;
        }
        Ok(())
    }

    /// `braid run`: the input of `streams` cannot reach braid (their source is disconnected):
    /// they do not turn idle until [`resume_streams`](Self::resume_streams).
    pub fn suspend_streams(&mut self, streams: &[usize]) {
        for &s in streams {
            self.streams[s].suspend();
        }
    }

    /// The input of `streams` reaches braid again at processing time `now` (call before
    /// `advance_to(now)`): idleness counts from `now`.
    pub fn resume_streams(&mut self, streams: &[usize], now: i128) {
        for &s in streams {
            self.streams[s].resume(now);
        }
    }

    /// A line of stream `stream` went to `dead_letter`.
    pub fn count_dead_letter(&mut self, stream: usize, reason: &str) {
        let counters = &mut self.stream_counters[stream];
        counters.rows += 1;
        *counters.dead_letters.entry(reason.to_owned()).or_default() += 1;
    }

    /// End of input: every operator goes to +∞; waits for the shards to finish and drains them.
    pub fn finish(mut self, emit: &mut impl Emit) -> Result<Figures, RuntimeError> {
        self.seq += 1;
        self.writer.event(self.seq, None);
        self.send_written(None, FrameKind::EndOfInput, emit)?;
        self.publish(emit)?;
        self.release();
        let mut reports: Vec<Option<ShardReport>> = (0..self.shards).map(|_| None).collect();
        while reports.iter().any(Option::is_none) {
            self.bell.prepare_sleep();
            let drained = self.collect(emit);
            // Any shard that ended is joined at once: one that failed may leave the others
            // waiting for it forever, so its error must not wait behind them.
            let ended: Vec<usize> =
                (0..self.shards).filter(|&s| reports[s].is_none() && self.ended[s].load(Ordering::SeqCst)).collect();
            for &shard in &ended {
                reports[shard] = Some(self.join(shard)?);
            }
            let joined = !ended.is_empty();
            if drained || joined {
                self.bell.awake();
            } else {
                self.bell.wait_blocking(&mut self.sleeper);
            }
        }
        self.collect(emit);
        Ok(self.figures(reports.into_iter().flatten().collect()))
    }

    /// The feeder's doorbell: a live source rings it after handing over a message, so a feeder
    /// waiting in [`wait`](Self::wait) wakes for input as it does for results.
    pub fn doorbell(&self) -> Arc<Doorbell> {
        Arc::clone(&self.bell)
    }

    /// Publishes every frame ingested so far to the shards (a live feeder calls this after each
    /// batch: its rows are then in the shards' rings) and drains results.
    pub fn flush(&mut self, emit: &mut impl Emit) -> Result<(), RuntimeError> {
        self.publish(emit)
    }

    /// Drains results; when there are none and `has_input` says no input waits, sleeps until a
    /// shard or a source rings the doorbell, or `timeout` passes. A shard that ended (it can only
    /// fail before `finish`) is an error.
    pub fn wait(
        &mut self,
        emit: &mut impl Emit,
        timeout: std::time::Duration,
        has_input: impl Fn() -> bool,
    ) -> Result<(), RuntimeError> {
        self.bell.prepare_sleep();
        if self.collect(emit) || has_input() {
            self.bell.awake();
            return Ok(());
        }
        if let Some(lost) = self.ended.iter().position(|e| e.load(Ordering::SeqCst)) {
            self.bell.awake();
            return Err(self.join(lost).err().unwrap_or(RuntimeError::ShardLost(lost)));
        }
        // A zero timeout would mean "block forever" to the socket.
        let timeout = timeout.max(std::time::Duration::from_millis(1));
        if self.sleeper.set_read_timeout(Some(timeout)).is_ok() {
            self.bell.wait_blocking(&mut self.sleeper);
        } else {
            self.bell.awake();
        }
        Ok(())
    }

    /// Stops without ending the input (a service stopping or reloading; its journal restores the
    /// state at the next start): publishes what was ingested, waits up to `grace` until the
    /// shards have taken every frame and their results are drained, then stops them.
    #[allow(clippy::disallowed_methods)] // the runtime bounds its own wait by the clock
    pub fn stop(mut self, emit: &mut impl Emit, grace: std::time::Duration) -> Result<(), RuntimeError> {
        self.publish(emit)?;
        self.release();
        let deadline = std::time::Instant::now() + grace;
        let mut quiet_rounds = 0;
        while std::time::Instant::now() < deadline && quiet_rounds < 3 {
            let pending = self.feeds.iter().any(|f| f.ring.used_bytes() > 0);
            let drained = self.collect(emit);
            quiet_rounds = if pending || drained { 0 } else { quiet_rounds + 1 };
            self.wait(emit, std::time::Duration::from_millis(5), || false)?;
        }
        Ok(())
    }

    /// Lets held shards start.
    fn release(&mut self) {
        if let Some(gate) = self.gate.take() {
            gate.wait();
        }
    }

    fn join(&mut self, shard: usize) -> Result<ShardReport, RuntimeError> {
        match self.threads[shard].take().map(JoinHandle::join) {
            Some(Ok(Ok(report))) => Ok(report),
            Some(Ok(Err(error))) => Err(RuntimeError::Shard { shard, error }),
            Some(Err(_)) | None => Err(RuntimeError::ShardLost(shard)),
        }
    }

    /// Shards that have frames waiting in their feed ring and released none since the previous
    /// call (a live service calls this now and then for its watchdog).
    pub fn stalled_shards(&mut self) -> usize {
        let mut stalled = 0;
        for (feed, last) in self.feeds.iter().zip(&mut self.last_released) {
            let released = feed.ring.released();
            if feed.ring.used_bytes() > 0 && released == *last {
                stalled += 1;
            }
            *last = released;
        }
        stalled
    }

    /// The figures so far: the feeder's stream counters and clocks, and each shard's operator
    /// figures as of its last tick.
    pub fn live_figures(&self) -> Figures {
        let reports: Vec<ShardReport> = self
            .live
            .iter()
            .filter_map(|l| l.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone())
            .collect();
        self.figures(reports)
    }

    fn figures(&self, reports: Vec<ShardReport>) -> Figures {
        let ops = self.op_inputs.len();
        let mut figures = Figures {
            streams: self.stream_counters.clone(),
            stream_watermarks: self.streams.iter().map(StreamClock::watermark).collect(),
            stream_idle: self.streams.iter().map(StreamClock::is_idle).collect(),
            operator_counters: self.op_inputs.iter().map(|i| OperatorCounters::new(i.len())).collect(),
            operator_watermarks: vec![Time::NEG_INF; ops],
            operator_state: vec![(0, 0); ops],
            drivers: reports.iter().map(|r| r.driver.as_str()).collect(),
            shard_ring_used_bytes: self.feeds.iter().map(|f| f.ring.used_bytes()).collect(),
        };
        for report in &reports {
            for op in 0..ops {
                figures.operator_counters[op].add(&report.counters[op]);
                figures.operator_watermarks[op] = report.watermarks[op];
                figures.operator_state[op].0 += report.state[op].0;
                figures.operator_state[op].1 += report.state[op].1;
            }
        }
        figures
    }

    /// Writes every result the shards have sent so far. Returns whether there was any.
    fn collect(&mut self, emit: &mut impl Emit) -> bool {
        let mut any = false;
        for inbox in &mut self.results {
            any |= inbox.read(|f| {
                if let Frame::Output { op, input, row } = wire::read(f.kind, f.payload) {
                    let row = to_row(row);
                    if input == wire::RESULT {
                        emit.result(op, &row);
                    } else {
                        emit.late(op, input as usize, &row);
                    }
                }
            }) > 0;
        }
        any
    }

    /// Sends the frame just written into `self.writer` to `shard`, or to every shard.
    fn send_written(
        &mut self,
        shard: Option<usize>,
        kind: FrameKind,
        emit: &mut impl Emit,
    ) -> Result<(), RuntimeError> {
        // Lent out while `send` (which needs `&mut self`) pushes it; no copy.
        let payload = std::mem::take(&mut self.writer.buf);
        let shards = shard.map_or(0..self.shards, |s| s..s + 1);
        let sent = shards.into_iter().try_for_each(|s| self.send(s, kind, &payload, emit));
        self.writer.buf = payload;
        sent
    }

    /// Pushes a frame to a shard, waiting (and draining results) while its ring is full.
    fn send(
        &mut self,
        shard: usize,
        kind: FrameKind,
        payload: &[u8],
        emit: &mut impl Emit,
    ) -> Result<(), RuntimeError> {
        loop {
            match self.feeds[shard].ring.push(kind, payload) {
                Ok(()) => return Ok(()),
                Err(PushError::TooLarge) => return Err(RuntimeError::TooLarge(payload.len())),
                Err(PushError::Full) => {}
            }
            self.publish_rings();
            self.release();
            self.bell.prepare_sleep();
            if self.collect(emit) {
                self.bell.awake();
                continue;
            }
            if self.feeds[shard].ring.push(kind, payload).is_ok() {
                self.bell.awake();
                return Ok(());
            }
            if let Some(lost) = self.ended.iter().position(|e| e.load(Ordering::SeqCst)) {
                self.bell.awake();
                return Err(self.join(lost).err().unwrap_or(RuntimeError::ShardLost(lost)));
            }
            self.bell.wait_blocking(&mut self.sleeper);
        }
    }

    /// Publishes the frames pushed so far (with the feeder's progress when operators are
    /// chained, so their shards can move on) and drains results.
    fn publish(&mut self, emit: &mut impl Emit) -> Result<(), RuntimeError> {
        self.unpublished = 0;
        if self.chained {
            self.writer.event(self.seq, None);
            self.send_written(None, FrameKind::Progress, emit)?;
        }
        self.publish_rings();
        self.collect(emit);
        Ok(())
    }

    fn publish_rings(&mut self) {
        for feed in &mut self.feeds {
            if feed.ring.commit() {
                feed.bell.ring();
            }
        }
    }
}

impl Drop for Runtime {
    /// A runtime dropped before `finish` (an error): the shards are told to stop, woken, and
    /// joined, so no thread is left waiting for input that will never come.
    fn drop(&mut self) {
        if self.threads.iter().all(Option::is_none) {
            return;
        }
        self.cancel.store(true, Ordering::SeqCst);
        self.release();
        for bell in &self.shard_bells {
            bell.ring();
        }
        for thread in self.threads.iter_mut().filter_map(Option::take) {
            // Its outcome no longer matters: the run already failed.
            let _ = thread.join();
        }
    }
}

struct WakeOnDrop(Arc<AtomicBool>, Arc<Doorbell>);

impl Drop for WakeOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
        self.1.ring();
    }
}

/// A shard thread: its monoio runtime, rounds of work, sleeping on its doorbell when idle.
fn run_shard(
    id: usize,
    mut worker: Worker,
    bell: &Doorbell,
    sleeper: Option<UnixStream>,
    cancel: &AtomicBool,
) -> Result<ShardReport, ShardError> {
    let mut runtime = ShardRuntime::build().map_err(ShardError::Runtime)?;
    let driver = runtime.driver();
    worker.driver = driver;
    tracing::debug!(shard = id, driver = driver.as_str(), "shard started");
    runtime.block_on(async move {
        let sleeper = sleeper.ok_or(ShardError::Protocol("no wake-up socket"))?;
        sleeper.set_nonblocking(true).map_err(ShardError::Wait)?;
        let mut sleeper = monoio::net::UnixStream::from_std(sleeper).map_err(ShardError::Wait)?;
        let mut buf = vec![0u8; 64];
        loop {
            if cancel.load(Ordering::Relaxed) {
                return Err(ShardError::Cancelled);
            }
            if worker.round()? {
                continue;
            }
            if worker.finished() {
                break;
            }
            bell.prepare_sleep();
            // SeqCst against the dropping runtime's store then ring (the doorbell's Dekker pair).
            if worker.has_work() || cancel.load(Ordering::SeqCst) {
                bell.awake();
                continue;
            }
            use monoio::io::AsyncReadRent;
            let (read, returned) = sleeper.read(buf).await;
            buf = returned;
            bell.awake();
            if let Err(e) = read {
                return Err(ShardError::Wait(e));
            }
        }
        Ok::<_, ShardError>(worker.report(driver))
    })
}
