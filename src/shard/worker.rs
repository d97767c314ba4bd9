//! One shard: its [`OperatorHost`] of every operator, fed from the feeder's ring and from the
//! other shards, in exactly the single-threaded order of `tag.rs`.
//!
//! Operators that read only streams (the first level) take events straight from the feeder's
//! ring, which carries them in order. An operator that reads another operator's output (chained)
//! gets rows from every shard through the exchange; they wait in a queue ordered by [`Tag`]
//! together with the operator's own activations (ticks, processing time, the end), and an item
//! is processed only once every source has promised nothing earlier will come: the feeder by
//! sequence number, each upstream instance by the `Frontier` frames it sends after its rows. A
//! tick of a chained operator also waits for every upstream instance's output watermark of that
//! tick (`TickDone`), the minimum of which is the input's watermark.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::rc::Rc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use crate::checkpoint::{CheckpointDir, ShardFile, ShardIndex, SnapshotEntry, definition_hash};
use crate::config::OnStateFull;
use crate::operator::host::OperatorHost;
use crate::operator::{Output, Side};
use crate::plan::{NodeRef, Plan};
use crate::record::frame::to_row;
use crate::record::{ArchivedKey, ArchivedRow, Key, Row};
use crate::ring::FrameKind;
use crate::state::budget::{self, StateGauge};
use crate::state::snapshot::{InBuffer, SnapshotBuffer, SnapshotBytes};
use crate::storage::mapped_file::ScratchBytes;
use crate::time::Time;
use crate::time::clock::InputTime;

use super::result_latency::{HeldResults, RowDone, Stretch};
use super::tag::{Tag, finish_phase, tick_phase};
use super::wake::{Inbox, Outbox, OutboxError};
use super::wire::{Frame, SHARD_DONE, SHARD_FAILED, TickEvent, Writer};
use super::{ShardError, ShardReport};

/// (tick sequence, output watermark) of one upstream instance, oldest first.
type TickWatermarks = VecDeque<(u64, Time)>;

/// Work for an operator instance.
enum Work<'a> {
    Row {
        input: usize,
        row: Row,
    },
    /// A feeder row read in place from the ring (first-level operators only).
    Frame {
        input: usize,
        row: &'a ArchivedRow,
        bytes: &'a [u8],
    },
    Tick(Rc<TickEvent>),
    ProcessingTime(i128),
    /// Braid was down until this processing time (`ttl` clocks skip the gap).
    DowntimeEnds(i128),
    /// The barrier of checkpoint `epoch`: snapshot the operator here.
    Barrier(u64),
    FinishTimers,
    FinishWatermark,
}

/// A queued activation of a chained operator, ordered by (tag, input).
struct Pending {
    tag: Tag,
    input: usize,
    work: Work<'static>,
}

impl PartialEq for Pending {
    fn eq(&self, other: &Self) -> bool {
        (self.tag, self.input) == (other.tag, other.input)
    }
}
impl Eq for Pending {}
impl PartialOrd for Pending {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Pending {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.tag, self.input).cmp(&(other.tag, other.input))
    }
}

/// Where a shard shows its figures to the feeder's thread: its report once per tick, its state
/// bytes after every round (state/budget.rs).
pub struct Shown {
    pub live: Arc<Mutex<Option<ShardReport>>>,
    pub gauge: Arc<StateGauge>,
}

/// The rings of a shard.
pub struct Links {
    pub input: Inbox,
    /// From every other shard, with its index.
    pub exchange_in: Vec<(usize, Inbox)>,
    /// To each shard by index; `None` at this shard's own.
    pub exchange_out: Vec<Option<Outbox>>,
    pub output: Outbox,
    /// The largest row archive every ring carries ([`max_row_bytes`](super::max_row_bytes)).
    pub max_row: usize,
}

/// Everything but the inboxes, so a ring's frames can be handled while the ring is borrowed.
struct Core {
    id: usize,
    plan: Arc<Plan>,
    shards: usize,
    /// This shard's instance of every operator, in plan order.
    hosts: Vec<OperatorHost>,
    pending: Vec<BinaryHeap<Reverse<Pending>>>,
    exchange_out: Vec<Option<Outbox>>,
    output: Outbox,
    /// The largest row archive every ring carries: a bigger result goes to `dead_letter`.
    max_row: usize,
    /// Every feeder event before this tag has been read.
    feeder_frontier: Tag,
    /// `[op][shard]`: what each instance of an operator has promised (this shard's: its own).
    frontiers: Vec<Vec<Tag>>,
    announced: Vec<Tag>,
    /// `[reader op][input][shard]`: upstream output watermarks per tick sequence.
    tick_watermarks: Vec<Vec<Vec<TickWatermarks>>>,
    /// The operators' output buffers, lent to each activation: boxed, so lending moves a pointer
    /// instead of the whole `Output` (and its `Default` and drop) once per row.
    scratch: Option<Box<Output>>,
    writer: Writer,
    error: Option<ShardError>,
    /// Items processed since the last look (progress of a round).
    work_done: usize,
    /// Where this shard writes its checkpoint snapshots (none: checkpoints are off).
    checkpoints: Option<CheckpointDir>,
    /// The checkpoint whose barrier is going through this shard's operators.
    barrier: Option<BarrierInFlight>,
    /// Every shard's state bytes (state/budget.rs): this shard writes its own after each round.
    gauge: Arc<StateGauge>,
    /// `evict_oldest` found nothing it may evict while over the budget (at the last tick).
    evict_starved: bool,
    /// A shard file to write, for the thread's loop to take ([`Worker::take_snapshot_write`]).
    to_write: Option<SnapshotWrite>,
    /// A shard file being written: its epoch, and where the writer leaves its outcome.
    writing: Option<(u64, Arc<AtomicU8>)>,
    /// The buffer the last shard file was written from, for the next one: its pages are in
    /// place already ([`SnapshotBuffer::kept`]).
    kept: Option<ScratchBytes>,
    /// CPU time spent taking snapshots and encoding shard files.
    snapshot_time: std::time::Duration,
    /// Per operator: the checkpoint its last snapshot went into (0: none yet), which a delta
    /// applies to (checkpoint/mod.rs, "Chains").
    snapshot_epochs: Vec<u64>,
    /// Results made since the last commit to the collector's ring, and how long the commits
    /// held theirs (result_latency.rs).
    stretch: Stretch,
    held: HeldResults,
}

/// One shard's checkpoint file, to be written off the shard's thread (threads.rs).
pub struct SnapshotWrite {
    pub path: std::path::PathBuf,
    pub bytes: SnapshotBytes,
    /// Synced after it is written (`durability = "power"`).
    pub sync: bool,
    /// Set by the writer: [`WRITTEN`] or [`NOT_WRITTEN`] (0 while it works).
    pub outcome: Arc<AtomicU8>,
}

/// Outcomes of a [`SnapshotWrite`].
pub const WRITTEN: u8 = 1;
pub const NOT_WRITTEN: u8 = 2;

/// A checkpoint barrier on its way through a shard's operators.
struct BarrierInFlight {
    epoch: u64,
    /// The checkpoint a snapshot may be a delta of (0: every snapshot whole).
    base: u64,
    /// The shard's file being written: each operator's snapshot goes in when the barrier
    /// reaches it (state/snapshot.rs, "Nesting without copies").
    buffer: SnapshotBuffer,
    /// Per operator: where its snapshot lies in `buffer`, once the barrier has reached it,
    /// and the checkpoint it is a delta of (0: whole).
    snapshots: Vec<Option<(InBuffer, u64)>>,
}

pub struct Worker {
    input: Inbox,
    exchange_in: Vec<(usize, Inbox)>,
    core: Core,
    /// Where the shard's figures are copied for a live service to show, once per tick.
    live: Arc<Mutex<Option<ShardReport>>>,
    ticks_seen: u64,
    /// Frames taken from the feeder's ring so far.
    input_frames: u64,
    /// The thread slept on its doorbell since the last round (result_latency.rs,
    /// `EAGER_COMMIT_ROWS`).
    slept: bool,
    ticks_shown: u64,
    /// The driver the shard's runtime runs on (shown with its figures).
    pub driver: super::driver::Driver,
    /// Time the thread spent handing checkpoint files to the disk (threads.rs sets it at the end).
    pub checkpoint_stall: std::time::Duration,
}

impl Worker {
    /// A shard whose operators keep their stored rows in arenas under `state` (its own directory),
    /// or on the heap without one.
    pub fn new(
        id: usize,
        plan: Arc<Plan>,
        shards: usize,
        links: Links,
        state: Option<&std::path::Path>,
        shown: Shown,
        checkpoints: Checkpoints,
    ) -> Result<Worker, ShardError> {
        let Shown { live, gauge } = shown;
        let ops = plan.operators.len();
        let mut hosts = plan
            .operators
            .iter()
            .enumerate()
            .map(|(op, o)| {
                let operator = state.map_or_else(|| Ok(o.spec.build()), |dir| o.spec.build_in(dir))?;
                Ok(OperatorHost::new(operator, o.inputs.len(), plan.origin_key_positions(op).iter().copied(), id)
                    .with_ttl(o.ttl))
            })
            .collect::<Result<Vec<_>, ShardError>>()?;
        if let Some(file) = &checkpoints.restore {
            restore(&plan, &mut hosts, file)?;
        }
        let core = Core {
            id,
            hosts,
            pending: (0..ops).map(|_| BinaryHeap::new()).collect(),
            exchange_out: links.exchange_out,
            output: links.output,
            max_row: links.max_row,
            feeder_frontier: Tag::MIN,
            frontiers: vec![vec![Tag::MIN; shards]; ops],
            announced: vec![Tag::MIN; ops],
            tick_watermarks: plan
                .operators
                .iter()
                .map(|o| o.inputs.iter().map(|_| vec![VecDeque::new(); shards]).collect())
                .collect(),
            scratch: Some(Box::default()),
            writer: Writer::default(),
            error: None,
            work_done: 0,
            checkpoints: checkpoints.dir,
            barrier: None,
            gauge,
            evict_starved: false,
            to_write: None,
            writing: None,
            kept: None,
            snapshot_time: std::time::Duration::ZERO,
            snapshot_epochs: vec![0; ops],
            stretch: Stretch::default(),
            held: HeldResults::default(),
            plan,
            shards,
        };
        Ok(Worker {
            input: links.input,
            exchange_in: links.exchange_in,
            core,
            live,
            ticks_seen: 0,
            input_frames: 0,
            slept: false,
            ticks_shown: 0,
            driver: super::driver::Driver::Legacy,
            checkpoint_stall: std::time::Duration::ZERO,
        })
    }

    /// Every operator host notes the rows of `trace`'s keys into it (`braid explain`).
    pub fn trace(&mut self, trace: &Arc<crate::operator::host::Trace>) {
        let shard = self.core.id;
        for (op, host) in self.core.hosts.iter_mut().enumerate() {
            host.trace(Arc::clone(trace), op, shard);
        }
    }

    /// One round: exchange frames, feeder events (unless an outbox is backed up), chained
    /// operators as far as their frontiers allow, frontiers announced, outboxes flushed.
    /// Returns whether anything happened.
    pub fn round(&mut self) -> Result<bool, ShardError> {
        let core = &mut self.core;
        core.work_done = 0;
        core.stretch.restart(core.chained_waiting());
        core.stretch.new_round(std::mem::take(&mut self.slept));
        let mut moved = core.check_snapshot_written();
        moved |= core.flush();
        for (from, inbox) in &mut self.exchange_in {
            let from = *from;
            moved |= inbox.read_frames(|frame| core.on_exchange(from, frame)) > 0;
        }
        if !core.backed_up() {
            let ticks = &mut self.ticks_seen;
            let frames = self.input.read_frames(|frame| {
                *ticks += u64::from(matches!(frame, Frame::Tick(_)));
                core.on_event(frame)
            });
            self.input_frames += frames as u64;
            moved |= frames > 0;
        }
        core.first_level_done();
        core.run_chained();
        core.announce();
        moved |= core.commit_results();
        core.account();
        if self.ticks_shown != self.ticks_seen {
            self.ticks_shown = self.ticks_seen;
            self.show_live();
        }
        let core = &mut self.core;
        match core.error.take() {
            Some(error) => Err(error),
            None => Ok(moved || core.work_done > 0),
        }
    }

    /// The thread woke from a sleep on its doorbell: the first rows read from the next round on
    /// commit their results eagerly, as they are worked on cold.
    pub fn woke(&mut self) {
        self.slept = true;
    }

    /// Frames taken from the feeder's ring so far.
    pub fn input_frames(&self) -> u64 {
        self.input_frames
    }

    /// A checkpoint file the shard wants written (the thread's loop writes it on a task).
    pub fn take_snapshot_write(&mut self) -> Option<SnapshotWrite> {
        self.core.to_write.take()
    }

    /// The bytes of a checkpoint file written (or not), back from the writer: the next
    /// checkpoint is written into the same pages.
    pub fn keep_snapshot_bytes(&mut self, bytes: SnapshotBytes) {
        if let SnapshotBytes::Kept(kept) = bytes {
            self.core.kept = Some(kept);
        }
    }

    /// Everything is processed and sent: the end of input went through every operator.
    pub fn finished(&self) -> bool {
        let core = &self.core;
        core.writing.is_none()
            && core.feeder_frontier == Tag::MAX
            && core.frontiers.iter().all(|f| f[core.id] == Tag::MAX)
            && core.pending.iter().all(BinaryHeap::is_empty)
            && !core.backed_up()
    }

    /// Whether frames arrived or backed-up frames now fit (checked after `prepare_sleep`).
    /// Feeder frames count only when they can be taken: a backed-up shard waits for room (its
    /// consumer rings when it frees some) instead of spinning.
    pub fn has_work(&mut self) -> bool {
        let moved = self.core.flush();
        moved
            || self.core.snapshot_write_done()
            || (!self.core.backed_up() && self.input.ring.has_frames())
            || self.exchange_in.iter().any(|(_, i)| i.ring.has_frames())
    }

    pub fn report(&self) -> ShardReport {
        let hosts = &self.core.hosts;
        ShardReport {
            counters: hosts.iter().map(|h| h.counters()).collect(),
            watermarks: hosts.iter().map(OperatorHost::watermark).collect(),
            state: hosts.iter().map(OperatorHost::state).collect(),
            driver: self.driver,
            checkpoint_snapshot: self.core.snapshot_time,
            checkpoint_stall: self.checkpoint_stall,
            held: self.core.held,
        }
    }

    /// Copies the shard's counters, watermarks and state sizes for the live service (a few
    /// small vectors per operator, once per tick: not on the row path).
    fn show_live(&self) {
        let report = self.report();
        // A poisoned lock only means a reader panicked; the figures are still worth replacing.
        *self.live.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(report);
    }
}

impl Core {
    /// This shard's state bytes for the intake (state/budget.rs, "At the budget"): full when
    /// at its budget, with `evict_oldest` only when eviction could not bring it under.
    fn account(&mut self) {
        let Some(budget) = self.plan.runtime.state_budget else { return };
        let bytes = self.state_bytes();
        let full = match self.plan.runtime.on_state_full {
            OnStateFull::Backpressure => bytes >= budget,
            OnStateFull::EvictOldest => self.evict_starved && bytes >= budget,
        };
        self.gauge.set(self.id, bytes, full);
    }

    fn state_bytes(&self) -> u64 {
        self.hosts.iter().map(|h| h.budget_bytes() as u64).sum()
    }

    /// `evict_oldest`: at a tick (a point of the feeder's order, so a replay of the same input
    /// evicts the same rows), a shard over its budget evicts stored rows oldest first by (ts, id)
    /// until it is under the low mark, each to `OPERATOR.expired` (state/budget.rs).
    fn evict_over_budget(&mut self) {
        let (Some(budget), OnStateFull::EvictOldest) =
            (self.plan.runtime.state_budget, self.plan.runtime.on_state_full)
        else {
            return;
        };
        self.evict_starved = false;
        if self.state_bytes() <= budget {
            return;
        }
        let low = budget::low_mark(budget);
        loop {
            let rows: usize = self.hosts.iter().map(|h| h.state().0).sum();
            let mut oldest = budget::Oldest::new(budget::batch_for(rows));
            for (op, host) in self.hosts.iter().enumerate() {
                host.offer_evictable(op, &mut oldest);
            }
            let candidates = oldest.into_sorted();
            if candidates.is_empty() {
                // Nothing evictable: the shard reports itself full (`account`) and the intake waits.
                self.evict_starved = true;
                return;
            }
            let mut evicted = 0;
            for candidate in &candidates {
                let mut out = self.scratch.take().unwrap_or_default();
                if self.hosts[candidate.op].evict(candidate, &mut out) {
                    evicted += 1;
                    for expired in out.expired.drain(..) {
                        let side = Side::Expired { reason: expired.reason, input: expired.input };
                        self.send_output(candidate.op, side, &expired.row);
                    }
                }
                self.scratch = Some(out);
                if self.state_bytes() <= low {
                    return;
                }
            }
            if evicted == 0 {
                // Candidates that were all gone: never so, but a loop must not bet on it.
                self.evict_starved = true;
                return;
            }
        }
    }

    fn backed_up(&self) -> bool {
        self.output.is_blocked() || self.exchange_out.iter().flatten().any(Outbox::is_blocked)
    }

    /// Flushes every outbox; a failure fails the shard (its next round returns it).
    fn flush(&mut self) -> bool {
        let mut moved = false;
        for outbox in std::iter::once(&mut self.output).chain(self.exchange_out.iter_mut().flatten()) {
            match outbox.flush() {
                Ok(flushed) => moved |= flushed,
                Err(error) => {
                    self.error.get_or_insert(error.into());
                }
            }
        }
        moved
    }

    /// Commits what the shard sent since the last commit (`flush`), counting how long its
    /// results waited for it (result_latency.rs): up to the commit, which makes them the
    /// collector's; the wake-up it may write after it is the collector's latency, not the shard's.
    fn commit_results(&mut self) -> bool {
        self.stretch.committed(&mut self.held);
        self.flush()
    }

    /// [`commit_results`](Self::commit_results) in the middle of a round: what is read next
    /// starts a new stretch.
    fn commit_midway(&mut self) {
        self.commit_results();
        self.stretch.restart(self.chained_waiting());
    }

    /// Input read earlier waits in a chained operator's queue.
    fn chained_waiting(&self) -> bool {
        self.pending.iter().any(|queue| !queue.is_empty())
    }

    fn fail(&mut self, error: ShardError) {
        self.error.get_or_insert(error);
    }

    /// A feeder event. The results made so far leave before the work of a tick, a barrier or the
    /// end (evictions, snapshots), those of that work right after it, those of the first rows
    /// after a sleep right after their row ([`EAGER_COMMIT_ROWS`](super::result_latency::EAGER_COMMIT_ROWS)),
    /// and the rest after every [`COMMIT_EVERY_ROWS`](super::result_latency::COMMIT_EVERY_ROWS)
    /// rows, so none waits for a whole round's work, for another input's evictions, or at a
    /// gateway's rate for the cold work of the rows read after it (result_latency.rs).
    fn on_event(&mut self, frame: Frame<'_>) {
        let row = matches!(frame, Frame::Row { .. });
        let control = !row && !matches!(frame, Frame::Progress { .. });
        if control && self.stretch.holds_results() {
            self.commit_results();
        }
        let long_enough = self.stretch.read(row);
        self.on_feeder_frame(frame);
        if long_enough || control {
            self.commit_midway();
        } else if row {
            match self.stretch.row_done() {
                RowDone::Commit => self.commit_midway(),
                RowDone::NothingHeld => self.stretch.restart(self.chained_waiting()),
                RowDone::Hold => {}
            }
        }
    }

    /// First-level operators run a feeder event now, chained ones queue it.
    fn on_feeder_frame(&mut self, frame: Frame<'_>) {
        match frame {
            Frame::Row { seq, stream, row, bytes } => {
                self.feeder_frontier = Tag::event(seq + 1);
                for i in 0..self.plan.readers(NodeRef::Stream(stream)).len() {
                    let (op, input) = self.plan.readers(NodeRef::Stream(stream))[i];
                    if self.plan.chained(op) {
                        // Queued past this frame's life: a copy.
                        let work = Work::Row { input, row: to_row(row) };
                        self.pending[op].push(Reverse(Pending { tag: Tag::event(seq), input, work }));
                    } else {
                        self.activate(op, Tag::event(seq), Work::Frame { input, row, bytes });
                    }
                }
            }
            Frame::Tick(tick) => {
                self.feeder_frontier = Tag::event(tick.seq + 1);
                self.evict_over_budget();
                let (seq, t) = (tick.seq, tick.tick.t);
                let tick = Rc::new(tick);
                for op in 0..self.plan.operators.len() {
                    if self.plan.clocked(op) {
                        self.dispatch(op, Tag::phase(seq, tick_phase(0, op)), 0, Work::ProcessingTime(t));
                    }
                }
                for op in 0..self.plan.operators.len() {
                    self.dispatch(op, Tag::phase(seq, tick_phase(1, op)), 0, Work::Tick(Rc::clone(&tick)));
                }
            }
            Frame::ProcessingTime { seq, now, downtime } => {
                self.feeder_frontier = Tag::event(seq + 1);
                for op in 0..self.plan.operators.len() {
                    if self.plan.clocked(op) {
                        let work = if downtime { Work::DowntimeEnds(now) } else { Work::ProcessingTime(now) };
                        self.dispatch(op, Tag::phase(seq, tick_phase(0, op)), 0, work);
                    }
                }
            }
            Frame::End { seq } => {
                self.feeder_frontier = Tag::MAX;
                for op in 0..self.plan.operators.len() {
                    if self.plan.clocked(op) {
                        self.dispatch(op, Tag::phase(seq, finish_phase(op, 0)), 0, Work::FinishTimers);
                    }
                    self.dispatch(op, Tag::phase(seq, finish_phase(op, 1)), 0, Work::FinishWatermark);
                }
            }
            Frame::Progress { seq } => self.feeder_frontier = self.feeder_frontier.max(Tag::event(seq + 1)),
            Frame::Barrier { seq, epoch, base } => {
                self.feeder_frontier = Tag::event(seq + 1);
                if self.barrier.is_some() || self.checkpoints.is_none() {
                    self.fail(ShardError::Protocol("a checkpoint barrier the shard cannot take"));
                    return;
                }
                let snapshots = vec![None; self.plan.operators.len()];
                let buffer = CheckpointDir::shard_buffer_in(self.kept.take());
                self.barrier = Some(BarrierInFlight { epoch, base, buffer, snapshots });
                for op in 0..self.plan.operators.len() {
                    self.dispatch(op, Tag::event(seq), 0, Work::Barrier(epoch));
                }
            }
            Frame::Exchange { .. }
            | Frame::Frontier { .. }
            | Frame::TickDone { .. }
            | Frame::Output { .. }
            | Frame::Passed { .. } => {
                self.fail(ShardError::Protocol("a shard frame on the feeder's ring"));
            }
        }
    }

    fn dispatch(&mut self, op: usize, tag: Tag, input: usize, work: Work<'static>) {
        if self.plan.chained(op) {
            self.pending[op].push(Reverse(Pending { tag, input, work }));
        } else {
            self.activate(op, tag, work);
        }
    }

    /// A frame from shard `from`.
    fn on_exchange(&mut self, from: usize, frame: Frame<'_>) {
        self.stretch.read(false);
        match frame {
            Frame::Exchange { op, input, tag, row } => {
                let work = Work::Row { input, row: to_row(row) };
                self.pending[op].push(Reverse(Pending { tag, input, work }));
            }
            Frame::Frontier { op, tag } => self.frontiers[op][from] = tag,
            Frame::TickDone { op, seq, watermark } => self.record_tick(op, from, seq, watermark),
            _ => self.fail(ShardError::Protocol("a feeder frame on the exchange")),
        }
    }

    fn record_tick(&mut self, op: usize, shard: usize, seq: u64, watermark: Time) {
        for &(reader, input) in self.plan.readers(NodeRef::Operator(op)) {
            self.tick_watermarks[reader][input][shard].push_back((seq, watermark));
        }
    }

    /// First-level operators have run every event read: their frontier is the feeder's.
    fn first_level_done(&mut self) {
        for op in 0..self.plan.operators.len() {
            if !self.plan.chained(op) {
                self.frontiers[op][self.id] = self.feeder_frontier;
            }
        }
    }

    /// Runs every chained operator, upstream first, as far as its inputs' frontiers allow.
    fn run_chained(&mut self) {
        for op in 0..self.plan.operators.len() {
            if !self.plan.chained(op) {
                continue;
            }
            let frontier = self.input_frontier(op);
            while self.pending[op].peek().is_some_and(|p| p.0.tag < frontier) {
                if let Some(Reverse(p)) = self.pending[op].pop() {
                    self.activate(op, p.tag, p.work);
                }
            }
            self.frontiers[op][self.id] = frontier;
        }
    }

    /// Nothing before this can still reach operator `op` on this shard.
    fn input_frontier(&self, op: usize) -> Tag {
        let mut frontier = self.feeder_frontier;
        for node in &self.plan.operators[op].inputs {
            if let NodeRef::Operator(u) = *node {
                frontier = self.frontiers[u].iter().fold(frontier, |f, &t| f.min(t));
            }
        }
        frontier
    }

    /// Tells every other shard how far each operator instance here has come.
    fn announce(&mut self) {
        for op in 0..self.plan.operators.len() {
            let frontier = self.frontiers[op][self.id];
            if self.plan.readers(NodeRef::Operator(op)).is_empty() || frontier <= self.announced[op] {
                continue;
            }
            self.announced[op] = frontier;
            self.writer.frontier(op, &frontier);
            self.written_to_other_shards(FrameKind::Frontier);
        }
    }

    fn activate(&mut self, op: usize, tag: Tag, work: Work<'_>) {
        self.work_done += 1;
        if let Work::Barrier(epoch) = work {
            self.pass_barrier(op, epoch);
            return;
        }
        let mut out = self.scratch.take().unwrap_or_default();
        let mut input = 0;
        let mut tick_done = None;
        // A root that runs on every shard ranks its results (tag.rs).
        let mut ranked = true;
        let idle_advance = self.plan.runtime.idle_advance;
        // A row's results, or results made as time advanced (result_latency.rs, `of_time`).
        let of_row = matches!(work, Work::Row { .. } | Work::Frame { .. });
        match work {
            Work::Row { input: i, row } => {
                input = i;
                let broadcast = row.key == Key::Broadcast;
                ranked = broadcast && tag.depth == 0;
                self.hosts[op].on_row(i, row, broadcast, &mut out);
            }
            Work::Frame { input: i, row, bytes } => {
                input = i;
                ranked = matches!(row.key, ArchivedKey::Broadcast);
                self.hosts[op].on_frame(i, row, bytes, ranked, &mut out);
            }
            Work::Tick(tick) => {
                let inputs = self.input_times(op, &tick);
                self.hosts[op].on_tick(tick.tick.t, &inputs, idle_advance, &mut out);
                tick_done = Some(tick.seq);
            }
            Work::ProcessingTime(now) => self.hosts[op].on_processing_time(now, &mut out),
            Work::DowntimeEnds(now) => self.hosts[op].downtime_ends(now),
            Work::FinishTimers => self.hosts[op].finish_timers(&mut out),
            Work::FinishWatermark => self.hosts[op].finish_watermark(&mut out),
            Work::Barrier(_) => {} // taken above
        }
        self.route(op, input, &tag, ranked, of_row, &mut out);
        self.scratch = Some(out);
        if let Some(seq) = tick_done.filter(|_| !self.plan.readers(NodeRef::Operator(op)).is_empty()) {
            self.tick_done(op, seq);
        }
    }

    /// The barrier of checkpoint `epoch` reached operator `op`: its snapshot is taken and the
    /// collector told (results after this frame come after the barrier). Once every operator of
    /// the shard has passed, the shard's file is written.
    fn pass_barrier(&mut self, op: usize, epoch: u64) {
        let Some(barrier) = self.barrier.as_mut().filter(|b| b.epoch == epoch) else {
            self.fail(ShardError::Protocol("a barrier activation without its barrier"));
            return;
        };
        let began = crate::time::cpu::thread();
        // A delta only of this operator's snapshot in the checkpoint the barrier names.
        let delta = barrier.base != 0 && self.snapshot_epochs[op] == barrier.base;
        let snapshot = self.hosts[op].snapshot_into(&mut barrier.buffer, delta);
        if snapshot.is_ok() {
            self.hosts[op].note_snapshot();
            self.snapshot_epochs[op] = epoch;
        }
        self.snapshot_time += crate::time::cpu::thread().saturating_sub(began);
        let snapshot = match snapshot {
            Ok((level, false)) => (level, 0),
            Ok((level, true)) => (level, barrier.base),
            Err(error) => {
                let name = &self.plan.operators[op].name;
                self.fail(ShardError::State(format!("snapshot of operator {name}: {error}")));
                return;
            }
        };
        barrier.snapshots[op] = Some(snapshot);
        let all_passed = barrier.snapshots.iter().all(Option::is_some);
        self.writer.passed(op as u32, epoch);
        self.push_output(FrameKind::Passed);
        if all_passed {
            self.write_snapshots();
        }
    }

    /// Hands the shard's file of the checkpoint whose barrier every operator has passed to the
    /// thread's loop, which writes it on a task of its own (io_uring where the driver has it) so
    /// the shard goes on meanwhile. A write that fails (a full or broken disk) fails the
    /// checkpoint, not the run: the collector is told, and the previous checkpoint stays the one
    /// a restart uses.
    fn write_snapshots(&mut self) {
        let (Some(barrier), Some(dir)) = (self.barrier.take(), self.checkpoints.as_ref()) else { return };
        let epoch = barrier.epoch;
        let operators = barrier
            .snapshots
            .into_iter()
            .enumerate()
            .map(|(op, level)| {
                let name = self.plan.operators[op].name.clone();
                let (level, base) = level.unwrap_or_default();
                SnapshotEntry::new(name, definition_hash(&self.plan, op), level, base)
            })
            .collect();
        let index = ShardIndex { epoch, shard: self.id as u32, shards: self.shards as u32, operators };
        let began = crate::time::cpu::thread();
        let encoded = dir.shard_file_in(&index, barrier.buffer);
        self.snapshot_time += crate::time::cpu::thread().saturating_sub(began);
        match encoded {
            Ok((path, bytes)) => {
                let outcome = Arc::new(AtomicU8::new(0));
                self.writing = Some((epoch, Arc::clone(&outcome)));
                self.to_write = Some(SnapshotWrite { path, bytes, sync: dir.syncs(), outcome });
            }
            Err(error) => self.snapshot_written(epoch, Err(error.to_string())),
        }
    }

    /// Tells the collector how the shard's file of checkpoint `epoch` went.
    fn snapshot_written(&mut self, epoch: u64, outcome: Result<(), String>) {
        let passed = match outcome {
            Ok(()) => SHARD_DONE,
            Err(error) => {
                if crate::storage::write_faults::is_failing(crate::checkpoint::CHECKPOINT_SITE) {
                    // Reported already, with the path and rate-limited (storage/write_faults.rs).
                    tracing::debug!(shard = self.id, epoch, %error, "Checkpoint not written; the previous one stays");
                } else {
                    tracing::warn!(shard = self.id, epoch, %error, "Checkpoint not written; the previous one stays");
                }
                SHARD_FAILED
            }
        };
        self.writer.passed(passed, epoch);
        self.push_output(FrameKind::Passed);
    }

    /// Whether the writer has finished the shard's file.
    fn snapshot_write_done(&self) -> bool {
        self.writing.as_ref().is_some_and(|(_, outcome)| outcome.load(Ordering::SeqCst) != 0)
    }

    /// The writer has finished the shard's file: the collector hears of it.
    fn check_snapshot_written(&mut self) -> bool {
        if !self.snapshot_write_done() {
            return false;
        }
        let Some((epoch, outcome)) = self.writing.take() else { return false };
        let written = outcome.load(Ordering::SeqCst) == WRITTEN;
        self.snapshot_written(epoch, if written { Ok(()) } else { Err("writing the shard file failed".into()) });
        true
    }

    /// Sends the frame just written into `self.writer` to the collector.
    fn push_output(&mut self, kind: FrameKind) {
        if let Err(e) = self.output.push(kind, &self.writer.buf) {
            self.fail(e.into());
        }
    }

    /// After a tick: this instance's output watermark, for the operators reading it.
    fn tick_done(&mut self, op: usize, seq: u64) {
        let watermark = self.hosts[op].output_watermark();
        self.record_tick(op, self.id, seq, watermark);
        self.writer.tick_done(op, seq, watermark);
        self.written_to_other_shards(FrameKind::TickDone);
    }

    /// Sends the frame just written into `self.writer` to every other shard.
    fn written_to_other_shards(&mut self, kind: FrameKind) {
        let Core { writer, exchange_out, error, .. } = self;
        for outbox in exchange_out.iter_mut().flatten() {
            if let Err(e) = outbox.push(kind, &writer.buf) {
                error.get_or_insert(e.into());
            }
        }
    }

    /// What operator `op` sees of its inputs at `tick`.
    fn input_times(&mut self, op: usize, tick: &TickEvent) -> Vec<InputTime> {
        let Core { plan, tick_watermarks, .. } = self;
        plan.operators[op]
            .inputs
            .iter()
            .enumerate()
            .map(|(input, node)| match *node {
                NodeRef::Stream(s) => tick.tick.streams[s],
                NodeRef::Operator(u) => {
                    let mut watermark = Time::POS_INF;
                    for per_shard in &mut tick_watermarks[op][input] {
                        while per_shard.front().is_some_and(|&(seq, _)| seq < tick.seq) {
                            per_shard.pop_front();
                        }
                        // The frontier rule guarantees the entry; without it, assume nothing.
                        let upstream = match per_shard.front() {
                            Some(&(seq, w)) if seq == tick.seq => w,
                            _ => Time::NEG_INF,
                        };
                        watermark = watermark.min(upstream);
                    }
                    InputTime { watermark, idle: tick.tick.op_idle[u] }
                }
            })
            .collect()
    }

    /// Sends what an activation produced: late rows and results to the sinks, results also to
    /// the instances of the operators reading them.
    fn route(&mut self, op: usize, input: usize, tag: &Tag, ranked: bool, of_row: bool, out: &mut Output) {
        for (late_input, row) in out.late.drain(..) {
            self.send_output(op, Side::Late(late_input), &row);
        }
        for expired in out.expired.drain(..) {
            self.send_output(op, Side::Expired { reason: expired.reason, input: expired.input }, &expired.row);
        }
        let readers = self.plan.readers(NodeRef::Operator(op)).len();
        let heap = out.results.len();
        let made = (heap + out.archived.len()) as u64;
        if of_row {
            self.stretch.made(made);
        } else {
            self.stretch.made_of_time(made);
        }
        for (index, (_, row)) in out.results.drain(..).enumerate() {
            // A result too large for the rings is a dead letter, and reaches no reader either.
            if self.send_output(op, Side::Result, &row) && readers > 0 {
                self.hand_to_readers(op, input, tag, ranked, index, &row);
            }
        }
        // Results already archived go out as they are; only a reader downstream (on the
        // exchange) or a too-large stand-in needs the row itself.
        for i in 0..out.archived.len() {
            let archive = out.archived.bytes(i);
            let sent = archive.len() <= self.max_row;
            if sent {
                self.writer.output_archive(op, Side::Result, archive);
                self.push_output(FrameKind::Output);
            }
            if !sent || readers > 0 {
                let row = to_row(out.archived.rows.row(i));
                if !sent {
                    self.send_output(op, Side::Result, &row);
                } else {
                    self.hand_to_readers(op, input, tag, ranked, heap + i, &row);
                }
            }
        }
        out.archived.clear();
    }

    /// Hands result number `index` of an activation to every operator reading `op`'s output.
    fn hand_to_readers(&mut self, op: usize, input: usize, tag: &Tag, ranked: bool, index: usize, row: &Row) {
        let rank = ranked.then(|| self.hosts[op].rank(row));
        let Some(child) = tag.child(op, input, self.id, index, rank) else {
            self.fail(ShardError::TooDeep);
            return;
        };
        for i in 0..self.plan.readers(NodeRef::Operator(op)).len() {
            let (reader, reader_input) = self.plan.readers(NodeRef::Operator(op))[i];
            self.deliver(reader, reader_input, child, row);
        }
    }

    /// A row of `op`'s output `side`, for the sinks; false when it was too large for the rings
    /// and went to `dead_letter` as its stand-in instead.
    fn send_output(&mut self, op: usize, side: Side, row: &Row) -> bool {
        let mut sent = true;
        let mut pushed = self.writer.output(op, side, row).map(drop);
        if pushed.is_ok() && self.writer.row_len > self.max_row {
            sent = false;
            let stand_in = too_large_stand_in(&self.plan, op, side, row);
            pushed = self.writer.output(op, Side::TooLarge, &stand_in).map(drop);
        }
        let pushed = match pushed {
            Ok(()) => self.output.push(FrameKind::Output, &self.writer.buf).map_err(ShardError::from),
            Err(e) => Err(ShardError::Frame(e.to_string())),
        };
        if let Err(e) = pushed {
            self.fail(e);
        }
        sent
    }

    /// Hands a result to the instance of `reader` that owns its key (every one for a broadcast).
    fn deliver(&mut self, reader: usize, input: usize, tag: Tag, row: &Row) {
        let shards = self.shards;
        let owner = (row.key_hash % shards as u64) as usize;
        for shard in 0..shards {
            if row.key != Key::Broadcast && shard != owner {
                continue;
            }
            if shard == self.id {
                let work = Work::Row { input, row: row.clone() };
                self.pending[reader].push(Reverse(Pending { tag, input, work }));
                continue;
            }
            let pushed = match self.writer.exchange(reader, input, &tag, row) {
                Ok(payload) => match &mut self.exchange_out[shard] {
                    Some(outbox) => outbox.push(FrameKind::Exchange, payload).map_err(ShardError::from),
                    None => Ok(()),
                },
                Err(e) => Err(ShardError::Frame(e.to_string())),
            };
            if let Err(e) = pushed {
                self.error.get_or_insert(e);
            }
        }
    }
}

/// What goes to the collector instead of a row of `op` too large for the rings: the row with its
/// values replaced by the first KiB of its JSON (what `dead_letter`'s `raw` shows).
fn too_large_stand_in(plan: &Plan, op: usize, side: Side, row: &Row) -> Row {
    const RAW_BYTES: usize = 1024;
    let mut json = Vec::new();
    plan.write_side_row(&mut json, op, side, row);
    json.truncate(RAW_BYTES);
    let raw = String::from_utf8_lossy(&json).trim_end().to_owned();
    Row { values: vec![crate::record::Value::Str(raw.into())].into(), ..row.clone() }
}

/// A shard's part in checkpoints: where it writes them, and the file it starts from.
#[derive(Default)]
pub struct Checkpoints {
    pub dir: Option<CheckpointDir>,
    pub restore: Option<ShardFile>,
}

/// Restores each operator whose definition is unchanged from its snapshot in `file`; the others
/// (new, or changed by a reload) start empty, named in a warning.
fn restore(plan: &Plan, hosts: &mut [OperatorHost], file: &ShardFile) -> Result<(), ShardError> {
    for (op, host) in hosts.iter_mut().enumerate() {
        let name = &plan.operators[op].name;
        let saved = file.operators.iter().find(|s| s.name == *name && s.definition == definition_hash(plan, op));
        let Some(saved) = saved else {
            if file.shard == 0 {
                tracing::warn!(operator = %name, "Operator new or changed since the checkpoint: it starts empty");
            }
            continue;
        };
        host.restore_chain(&saved.chain())
            .map_err(|error| ShardError::State(format!("restoring operator {name} from its checkpoint: {error}")))?;
    }
    Ok(())
}

impl From<crate::state::arena::ArenaError> for ShardError {
    fn from(e: crate::state::arena::ArenaError) -> ShardError {
        ShardError::State(e.to_string())
    }
}

impl From<OutboxError> for ShardError {
    fn from(e: OutboxError) -> ShardError {
        match e {
            OutboxError::TooLarge(bytes) => ShardError::TooLarge(bytes),
            OutboxError::NoSpace(error) => ShardError::RingSpace(error),
        }
    }
}
