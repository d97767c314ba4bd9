//! Starting and stopping the shard threads: the rings between them, pinning, each thread's
//! monoio runtime and its loop of rounds, and the ways a run ends (finish in collector.rs, stop,
//! drop).

use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread::JoinHandle;

use crate::plan::{MAX_CHAIN_DEPTH, MAX_SHARDS, Plan};
use crate::ring::{Checksums, FrameKind, Producer, Ring, RingError};
use crate::time::TickPlanner;

use super::driver::{Driver, MonoioRuntime};
use super::file_write::FileWrites;
use super::max_row_bytes;
use super::wake::{Doorbell, Inbox, Linger, Outbox, Sleeper};
use super::wire::Writer;
use super::worker::{Checkpoints, Links, Worker};
use super::{Emit, Feed, Runtime, RuntimeError, RuntimeOptions, ShardError, ShardReport, StreamCounters};

/// The rings of a run, seen from both ends.
struct Wiring {
    /// The feeder's doorbell and the socket it sleeps on.
    bell: Arc<Doorbell>,
    sleeper: UnixStream,
    shard_bells: Vec<Arc<Doorbell>>,
    shard_sleepers: Vec<UnixStream>,
    feeds: Vec<Feed>,
    results: Vec<Inbox>,
    links: Vec<Links>,
}

impl Runtime {
    /// Creates the rings in `options.dir` and starts the shard threads. `start`: processing time
    /// of the first line of all inputs (idleness counts from there).
    pub fn start(plan: &Plan, options: &RuntimeOptions<'_>, start: i128) -> Result<Runtime, RuntimeError> {
        let shards = options.shards.max(1);
        if shards > MAX_SHARDS {
            return Err(RuntimeError::TooManyShards(shards));
        }
        if plan.longest_chain() > MAX_CHAIN_DEPTH {
            return Err(RuntimeError::TooDeep);
        }
        if let Some(loaded) = options.restore
            && loaded.shards.len() != shards
        {
            let taken = loaded.shards.len();
            return Err(RuntimeError::Checkpoint(format!("taken with {taken} shards, this run has {shards}")));
        }
        let shared_plan = Arc::new(plan.clone());
        let Wiring { bell, sleeper, shard_bells, shard_sleepers, mut feeds, results, links } = wire(options, shards)?;
        let gate = options.hold.then(|| Arc::new(Barrier::new(shards + 1)));
        let ended: Vec<Arc<AtomicBool>> = (0..shards).map(|_| Arc::default()).collect();
        let built: Vec<Arc<AtomicBool>> = (0..shards).map(|_| Arc::default()).collect();
        let cancel = Arc::new(AtomicBool::new(false));
        let live: Vec<Arc<Mutex<Option<ShardReport>>>> = (0..shards).map(|_| Arc::default()).collect();
        let gauge = Arc::new(crate::state::budget::StateGauge::new(shards));
        let cores = core_affinity::get_core_ids().unwrap_or_default();
        // A shard is pinned to a core of its own only while a core is left for the threads that
        // feed it and collect from it (replay's calling thread, `braid run`'s intake and MQTT io).
        // With a shard on every core those would share pinned shards' cores, and the scheduler could
        // not move a shard out of their way: 2 shards on 2 cores replayed in 0.87× the time
        // unpinned (BENCHMARKS.md, "Replay without a first pass").
        let pinned = shards < cores.len();
        if shards > cores.len() && !cores.is_empty() {
            tracing::warn!(shards, cores = cores.len(), "more shards than cores: shards share the cores");
        } else if !pinned && !cores.is_empty() {
            tracing::debug!(
                shards,
                cores = cores.len(),
                "a shard per core: shards not pinned, so the feeding threads run beside them"
            );
        }
        let mut threads = Vec::new();
        for (j, (links, sleeper)) in links.into_iter().zip(shard_sleepers).enumerate() {
            let shard = Shard {
                id: j,
                plan: Arc::clone(&shared_plan),
                shards,
                links,
                sleeper,
                bell: Arc::clone(&shard_bells[j]),
                wake_feeder: WakeOnDrop(Arc::clone(&ended[j]), Arc::clone(&bell)),
                built: Arc::clone(&built[j]),
                gate: gate.clone(),
                cancel: Arc::clone(&cancel),
                live: Arc::clone(&live[j]),
                gauge: Arc::clone(&gauge),
                trace: options.trace.clone(),
                linger: options.pacing.shard_linger,
                state: (!options.memory_state).then(|| options.dir.join(format!("shard-{j}"))),
                checkpoints: Checkpoints {
                    dir: options.checkpoints.clone(),
                    restore: options.restore.map(|loaded| loaded.shards[j].clone()),
                },
                core: cores.get(j).copied().filter(|_| pinned),
            };
            let thread = std::thread::Builder::new()
                .name(format!("braid-shard-{j}"))
                .spawn(move || shard.run())
                .map_err(RuntimeError::Spawn)?;
            threads.push(Some(thread));
        }
        let clocked = (0..plan.operators.len()).any(|op| plan.clocked(op));
        let mut seq = 0;
        // A restored connect knows processing time from its snapshot.
        if clocked && options.restore.is_none() {
            // Processing time starts at `start` (connect instances learn it before anything else).
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
        let mut runtime = Runtime {
            shards,
            feeds,
            results,
            threads,
            gate,
            ended,
            built,
            cancel,
            live,
            gauge,
            last_released: vec![0; shards],
            shard_bells,
            bell,
            sleeper: Sleeper::new(sleeper),
            planner: TickPlanner::new(plan, start, options.every_tick),
            stream_counters: vec![StreamCounters::default(); plan.streams.len()],
            hot_keys: vec![super::hot_keys::HotKeys::default(); shards],
            op_inputs: plan.operators.iter().map(|o| o.inputs.len()).collect(),
            stream_names: plan.streams.iter().map(|s| s.name.clone()).collect(),
            operator_names: plan.operators.iter().map(|o| o.name.clone()).collect(),
            clocked,
            chained: (0..plan.operators.len()).any(|op| plan.chained(op)),
            seq,
            unpublished: 0,
            publication: options.publication,
            feeder_spins: options.pacing.feeder_spins,
            writer: Writer::default(),
            max_row: max_row_bytes(options.feed_ring_bytes, options.exchange_ring_bytes),
            too_large: vec![0; plan.operators.len()],
            checkpoints: options.checkpoints.is_some(),
            in_flight: None,
        };
        if let Some(loaded) = options.restore {
            runtime.restore_feeder(&loaded.manifest.feeder).map_err(|e| RuntimeError::Checkpoint(e.to_string()))?;
        }
        Ok(runtime)
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

    /// Waits until every shard has built its operators — restored them from the checkpoint the
    /// runtime started from, if any: the end of a restart's restore (`braid bench` times it).
    pub fn wait_built(&mut self, emit: &mut impl Emit) -> Result<(), RuntimeError> {
        while !self.built.iter().all(|b| b.load(Ordering::SeqCst)) {
            self.wait(emit, std::time::Duration::from_millis(50), || false)?;
        }
        Ok(())
    }

    /// Lets held shards start.
    pub(super) fn release(&mut self) {
        if let Some(gate) = self.gate.take() {
            gate.wait();
        }
    }

    pub(super) fn join(&mut self, shard: usize) -> Result<ShardReport, RuntimeError> {
        match self.threads[shard].take().map(JoinHandle::join) {
            Some(Ok(Ok(report))) => Ok(report),
            Some(Ok(Err(error))) => Err(RuntimeError::Shard { shard, error }),
            Some(Err(_)) | None => Err(RuntimeError::ShardLost(shard)),
        }
    }

    /// The first shard whose thread ended, with its error (before `finish`, a shard can only end
    /// by failing). The feeder stops sleeping first: it is about to return the error.
    pub(super) fn lost_shard(&mut self) -> Option<RuntimeError> {
        let lost = self.ended.iter().position(|e| e.load(Ordering::SeqCst))?;
        self.bell.awake();
        Some(self.join(lost).err().unwrap_or(RuntimeError::ShardLost(lost)))
    }

    /// Some shard is at its state budget with nothing it may evict: the intake takes no more
    /// input until it is under again (state/budget.rs, `backpressure`).
    pub fn state_full(&self) -> bool {
        self.gauge.any_full()
    }

    /// Per shard: its state bytes and whether it is full, as it last counted them.
    pub fn shard_state(&self) -> Vec<(u64, bool)> {
        self.gauge.shards()
    }

    /// Shards that have frames waiting in their feed ring and released none since the previous
    /// call (a live service calls this now and then for its watchdog). When there are any, every
    /// shard is nudged (wake.rs, "A guard besides the proof").
    pub fn stalled_shards(&mut self) -> usize {
        let mut stalled = 0;
        for (feed, last) in self.feeds.iter().zip(&mut self.last_released) {
            let released = feed.ring.released();
            if feed.ring.used_bytes() > 0 && released == *last {
                stalled += 1;
            }
            *last = released;
        }
        if stalled > 0 {
            self.nudge_shards();
        }
        stalled
    }

    /// Nudges every shard whose thread has not ended, after a wait only they could end found no
    /// wake-up for [`NUDGE_AFTER`](super::wake::NUDGE_AFTER) (any of them may be the one the
    /// others wait on, through an exchange ring).
    pub(super) fn nudge_shards(&self) {
        tracing::debug!("no wake-up from the shards for a while: nudging them");
        for (bell, ended) in self.shard_bells.iter().zip(&self.ended) {
            if !ended.load(Ordering::SeqCst) {
                bell.nudge();
            }
        }
    }
}

/// Creates every ring and doorbell of a run with `shards` shards.
fn wire(options: &RuntimeOptions<'_>, shards: usize) -> Result<Wiring, RuntimeError> {
    let (bell, sleeper) = Doorbell::new().map_err(RuntimeError::Doorbell)?;
    let mut shard_bells = Vec::new();
    let mut shard_sleepers = Vec::new();
    for _ in 0..shards {
        let (b, s) = Doorbell::new().map_err(RuntimeError::Doorbell)?;
        shard_bells.push(b);
        shard_sleepers.push(s);
    }
    // Created afresh by every run and never opened again: memory between threads, no crc.
    let ring = |name: String, bytes: usize| {
        let (mut producer, consumer) = Ring::create_with(&options.dir.join(name), bytes, Checksums::Off)?;
        if options.give_back_ring_pages {
            give_back_pages(&mut producer, bytes);
        }
        Ok::<_, RingError>((producer, consumer))
    };
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
            max_row: max_row_bytes(options.feed_ring_bytes, options.exchange_ring_bytes),
        });
    }
    for i in 0..shards {
        for j in (0..shards).filter(|&j| j != i) {
            let (out, inbox) = ring(format!("shard-{i}-to-{j}.ring"), options.exchange_ring_bytes)?;
            links[i].exchange_out[j] = Some(Outbox::new(out, Arc::clone(&shard_bells[j])));
            links[j].exchange_in.push((i, Inbox { ring: inbox, bell: Arc::clone(&shard_bells[i]) }));
        }
    }
    Ok(Wiring { bell, sleeper, shard_bells, shard_sleepers, feeds, results, links })
}

/// Chunks a ring is cut into for giving its pages back: the first two are its window.
const GIVE_BACK_CHUNKS: usize = 16;

/// Has the producer give back the pages of its free chunks; a file system that cannot only
/// leaves them resident.
fn give_back_pages(producer: &mut Producer, ring_bytes: usize) {
    let chunk = ring_bytes / GIVE_BACK_CHUNKS;
    if let Err(error) = producer.give_back_pages(chunk) {
        tracing::debug!(%error, "a shard ring keeps all its pages");
    }
}

impl Drop for Runtime {
    /// A runtime dropped before `finish` (an error): the shards are told to stop, woken, and
    /// joined, so no thread is left waiting for input that will never come.
    fn drop(&mut self) {
        self.stop_threads();
    }
}

impl Runtime {
    fn stop_threads(&mut self) {
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

/// The clock a shard paces its lingering by (never a decision of the operators).
#[allow(clippy::disallowed_methods)]
fn clock() -> std::time::Instant {
    std::time::Instant::now()
}

/// Marks a shard ended and wakes the feeder, however the shard's thread ends, so the feeder never
/// waits on a dead shard.
struct WakeOnDrop(Arc<AtomicBool>, Arc<Doorbell>);

impl Drop for WakeOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
        self.1.ring();
    }
}

/// What a shard thread starts with.
struct Shard {
    id: usize,
    plan: Arc<Plan>,
    shards: usize,
    links: Links,
    sleeper: UnixStream,
    bell: Arc<Doorbell>,
    wake_feeder: WakeOnDrop,
    /// Set once its operators are built and restored (the feeder's [`Runtime::wait_built`]).
    built: Arc<AtomicBool>,
    /// Held shards wait here until the feeder releases them.
    gate: Option<Arc<Barrier>>,
    cancel: Arc<AtomicBool>,
    live: Arc<Mutex<Option<ShardReport>>>,
    /// Every shard's state bytes (state/budget.rs).
    gauge: Arc<crate::state::budget::StateGauge>,
    trace: Option<Arc<crate::operator::host::Trace>>,
    /// [`Pacing::shard_linger`](super::Pacing::shard_linger).
    linger: std::time::Duration,
    /// Its operators' state directory (none: state on the heap).
    state: Option<std::path::PathBuf>,
    checkpoints: Checkpoints,
    core: Option<core_affinity::CoreId>,
}

impl Shard {
    /// The thread's body: pinned, its monoio runtime, rounds of work, sleeping on its doorbell
    /// when idle.
    fn run(self) -> Result<ShardReport, ShardError> {
        let Shard {
            id,
            plan,
            shards,
            links,
            sleeper,
            bell,
            wake_feeder,
            built,
            gate,
            cancel,
            live,
            gauge,
            trace,
            linger,
            state,
            checkpoints,
            core,
        } = self;
        let _wake_feeder = wake_feeder;
        if let Some(core) = core {
            core_affinity::set_for_current(core);
        }
        if let Some(gate) = gate {
            gate.wait();
        }
        let shown = super::worker::Shown { live, gauge };
        let mut worker = Worker::new(id, plan, shards, links, state.as_deref(), shown, checkpoints)?;
        if let Some(trace) = trace {
            worker.trace(&trace);
        }
        built.store(true, Ordering::SeqCst);
        _wake_feeder.1.ring();
        let mut runtime = MonoioRuntime::build().map_err(ShardError::Runtime)?;
        worker.driver = runtime.driver();
        let mut files = FileWrites::new(worker.driver == Driver::IoUring, bell.waker_fd());
        tracing::debug!(shard = id, driver = worker.driver.as_str(), "shard started");
        runtime.block_on(async move {
            sleeper.set_nonblocking(true).map_err(ShardError::Wait)?;
            let mut sleeper = monoio::net::UnixStream::from_std(sleeper).map_err(ShardError::Wait)?;
            let mut buf = vec![0u8; 64];
            let mut linger = Linger::new(linger, clock());
            loop {
                if cancel.load(Ordering::Relaxed) {
                    return Err(ShardError::Cancelled);
                }
                files.poll();
                if let Some(bytes) = files.take_spent() {
                    worker.keep_snapshot_bytes(bytes);
                }
                let moved = worker.round()?;
                if let Some(write) = worker.take_snapshot_write() {
                    files.start(write);
                }
                if moved {
                    continue;
                }
                if worker.finished() {
                    break;
                }
                if let Some(pause) = linger.on_idle(worker.input_frames(), clock) {
                    // The thread is this runtime's only task: blocking it holds up nothing else
                    // (io_uring completions wait in their queue).
                    std::thread::sleep(pause);
                    continue;
                }
                if bell.spin(|| worker.has_work() || files.completed()) {
                    continue;
                }
                bell.prepare_sleep();
                // SeqCst against the dropping runtime's store then ring (the doorbell's Dekker pair).
                if worker.has_work() || files.completed() || cancel.load(Ordering::SeqCst) {
                    bell.awake();
                    continue;
                }
                use monoio::io::AsyncReadRent;
                let asleep = bell.counts();
                bell.parking();
                let (read, returned) = sleeper.read(buf).await;
                buf = returned;
                bell.awake();
                worker.woke();
                if let Err(e) = read {
                    return Err(ShardError::Wait(e));
                }
                let woken = bell.counts();
                // Woken by a nudge, not a ring, and work waits: the wake-up it should have had was
                // lost (wake.rs, "A guard besides the proof"). Said, so the next one can be traced.
                if woken.nudged != asleep.nudged && woken.rung == asleep.rung && worker.has_work() {
                    tracing::warn!(shard = id, "a shard woke to a nudge and found work no wake-up announced");
                }
            }
            // Read once at the end: the stall goes on counting until the last file's outcome.
            worker.checkpoint_stall = files.stalled();
            Ok::<_, ShardError>(worker.report())
        })
    }
}
