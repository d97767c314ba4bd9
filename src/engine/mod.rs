//! The engine: input streams and operators wired as the plan says, driven by processing time.
//!
//! Sans-IO like the operators it hosts: the caller feeds rows with their arrival and advances
//! processing time; results and late rows come out through [`Emit`]. Replay drives it from files;
//! the runtime drives it from rings.
//!
//! Time (CONTRACT.md rules 3–6): before a row with arrival `a` is ingested, every tick `T` with
//! `now < T ≤ a` runs: streams first (watermark, idleness), then operators upstream first, each
//! taking `max(previous, min over non-idle inputs)` — or, with every input idle and
//! `idle_advance`, moving on with processing time. An operator whose inputs are operators reads
//! their output watermark (held back so their results are never late downstream).
//!
//! Skipped ticks: a tick that cannot change anything is not run — no stream received rows since
//! the last one and no operator advances with processing time; the next tick that matters is then
//! the next idleness transition. While some operator advances with processing time, ticks are
//! jumped over (to the next idleness transition or the last tick before the next row) when no
//! operator reads another's output, or when no operator holds anything a watermark could emit: a
//! jump gives the same watermarks as the steps it replaces (they are a function of the tick), but
//! upstream results emitted in one go would meet a downstream watermark that stepping would have
//! moved, and which of them are late downstream would change.
//!
//! Processing-time timers (connect's `CoProcess`): a timer due at `p` fires when processing time
//! reaches `p` — between ticks, or at the tick `p` itself before that tick runs — and the next
//! tick after a firing always runs (the timer may have changed what an operator holds, hence
//! output watermarks). Skipping never passes a due timer: a no-op stretch ends at it, and a jump
//! stops at the last tick at or before it, so the timer sees the watermark stepping would give.
//! At the end of input every pending processing timer fires, upstream first, before the
//! operator's watermark goes to +∞.
//!
//! Shards: each operator runs one instance per shard; a row goes to the instance of its key's
//! shard (`key_hash % shards`), a broadcast row to all. Watermarks are the operator's, the same
//! for every instance, and an operator's output watermark is the minimum over its instances. What
//! an operator emits on a watermark, on processing time, at the end or for a broadcast row (all
//! its instances at once) goes downstream ranked by [`origin_rank`] — the key it came from —
//! keeping each key's own order, so that order-sensitive operators there see the same order
//! whatever the shard count; anything else is emitted by one instance, in its order. So results
//! never depend on the shard count.

use std::collections::VecDeque;

use crate::operator::connect::END_OF_INPUT;
use crate::operator::{Operator, Output};
use crate::plan::{NodeRef, Plan};
use crate::record::{Key, Row};
use crate::time::clock::InputTime;
use crate::time::{OperatorClock, StreamClock, Time, next_tick, tick_at_or_before};

// Temporarily re-exported from their new homes until this module goes.
pub use crate::operator::host::{OperatorCounters, origin_rank};
pub use crate::shard::{Emit, Figures, StreamCounters};

struct StreamNode {
    clock: StreamClock,
    subscribers: Vec<(usize, usize)>,
    counters: StreamCounters,
}

struct OperatorNode {
    inputs: Vec<NodeRef>,
    clock: OperatorClock,
    /// One per shard.
    instances: Vec<Operator>,
    subscribers: Vec<(usize, usize)>,
    /// Its output stream is idle: all its inputs are (as of the last tick).
    idle: bool,
    /// Where its results carry the key they came from ([`origin_rank`]).
    origin: Option<usize>,
    counters: OperatorCounters,
}

pub struct Engine {
    streams: Vec<StreamNode>,
    operators: Vec<OperatorNode>,
    idle_advance: bool,
    /// Some operator reads another operator's output.
    chained: bool,
    now: i128,
    scratch: Output,
    queue: VecDeque<(NodeRef, Row)>,
    /// Run every tick, skipping none (the reference the skipping is tested against).
    step_every_tick: bool,
    /// Operators that can have processing-time timers (connect).
    clocked: Vec<usize>,
    /// A processing-time timer fired since the last tick.
    timers_fired: bool,
}

impl Engine {
    /// `start`: processing time of the first line of all inputs (idleness counts from there).
    /// Operator state in memory.
    pub fn new(plan: &Plan, shards: usize, start: i128) -> Engine {
        let build =
            |spec: &crate::operator::OperatorSpec, _shard: usize| Ok::<_, std::convert::Infallible>(spec.build());
        match Engine::build(plan, shards, start, build) {
            Ok(engine) => engine,
            Err(never) => match never {},
        }
    }

    /// [`new`](Self::new) with each shard's operator state in mmap arenas under `dir/shard-N/`,
    /// as the shard runtime keeps it.
    pub fn new_in(
        plan: &Plan,
        shards: usize,
        start: i128,
        dir: &std::path::Path,
    ) -> Result<Engine, crate::state::arena::ArenaError> {
        Engine::build(plan, shards, start, |spec, shard| spec.build_in(&dir.join(format!("shard-{shard}"))))
    }

    fn build<E>(
        plan: &Plan,
        shards: usize,
        start: i128,
        mut build: impl FnMut(&crate::operator::OperatorSpec, usize) -> Result<Operator, E>,
    ) -> Result<Engine, E> {
        let shards = shards.max(1);
        let mut streams: Vec<StreamNode> = plan
            .streams
            .iter()
            .map(|s| StreamNode {
                clock: StreamClock::new(s.max_out_of_orderness, s.idle_timeout, start),
                subscribers: Vec::new(),
                counters: StreamCounters::default(),
            })
            .collect();
        let mut operators: Vec<OperatorNode> = plan
            .operators
            .iter()
            .enumerate()
            .map(|(op, o)| {
                Ok(OperatorNode {
                    origin: plan.origin_key_position(op),
                    inputs: o.inputs.clone(),
                    clock: OperatorClock::default(),
                    instances: (0..shards).map(|shard| build(&o.spec, shard)).collect::<Result<_, E>>()?,
                    subscribers: Vec::new(),
                    idle: false,
                    counters: OperatorCounters::new(o.inputs.len()),
                })
            })
            .collect::<Result<_, E>>()?;
        let mut chained = false;
        for (op, def) in plan.operators.iter().enumerate() {
            for (input, node) in def.inputs.iter().enumerate() {
                match *node {
                    NodeRef::Stream(s) => streams[s].subscribers.push((op, input)),
                    NodeRef::Operator(o) => {
                        chained = true;
                        operators[o].subscribers.push((op, input));
                    }
                }
            }
        }
        let idle_advance = plan.runtime.idle_advance;
        let clocked: Vec<usize> = (0..operators.len())
            .filter(|&op| matches!(operators[op].instances.first(), Some(Operator::Connect(_))))
            .collect();
        let mut scratch = Output::default();
        for &op in &clocked {
            for instance in &mut operators[op].instances {
                // Processing time starts at `start`; no timer exists yet, nothing can fire.
                instance.on_processing_time(start, &mut scratch);
            }
        }
        Ok(Engine {
            streams,
            operators,
            idle_advance,
            chained,
            now: start,
            scratch,
            queue: VecDeque::new(),
            step_every_tick: false,
            clocked,
            timers_fired: false,
        })
    }

    /// Runs every tick instead of skipping those that cannot change anything: slow, and the
    /// same output (`tests/tick_skipping.rs` holds braid to that).
    pub fn step_every_tick(&mut self, on: bool) {
        self.step_every_tick = on;
    }

    /// Runs every tick in (now, to] that can change anything.
    pub fn advance_to(&mut self, to: i128, emit: &mut impl Emit) {
        loop {
            let next = next_tick(self.now);
            let timer = self.next_processing_timer().filter(|&p| p <= to);
            if let Some(p) = timer.filter(|&p| p < next) {
                self.processing_time(p.max(self.now), emit);
                continue;
            }
            let mut t = next;
            if t > to {
                break;
            }
            let new_rows =
                self.step_every_tick || self.timers_fired || self.streams.iter().any(|s| s.clock.has_new_rows());
            if !new_rows && !self.advancing() {
                // Ticks change nothing before the next idleness transition; a timer due earlier
                // fires at its time (one due at the transition's tick fires in that tick).
                let idle = self.next_idle_transition(t).filter(|&due| due <= to);
                match (idle, timer) {
                    // A timer due at a tick fires in it, and that tick then runs.
                    (idle, Some(p)) if idle.is_none_or(|due| p < due) && tick_at_or_before(p) == p => t = p,
                    (idle, Some(p)) if idle.is_none_or(|due| p < due) => {
                        self.processing_time(p, emit);
                        continue;
                    }
                    (Some(due), _) => t = due,
                    (None, _) => break,
                }
            } else if !new_rows && (!self.chained || self.quiescent()) {
                t = self.next_idle_transition(t).unwrap_or(i128::MAX).min(tick_at_or_before(to));
                if let Some(p) = timer {
                    t = t.min(tick_at_or_before(p));
                }
            }
            self.tick(t, emit);
        }
        if to > self.now {
            self.processing_time(to, emit);
        }
    }

    /// The earliest processing time at which some operator's timer is due.
    fn next_processing_timer(&self) -> Option<i128> {
        self.clocked
            .iter()
            .flat_map(|&op| self.operators[op].instances.iter())
            .filter_map(Operator::next_processing_timer)
            .min()
    }

    /// Processing time moves to `now`: the clocked operators learn it, upstream first, and
    /// fire the timers due by then.
    fn processing_time(&mut self, now: i128, emit: &mut impl Emit) {
        self.now = self.now.max(now);
        for i in 0..self.clocked.len() {
            let op = self.clocked[i];
            let mut out = std::mem::take(&mut self.scratch);
            for instance in &mut self.operators[op].instances {
                self.timers_fired |= instance.next_processing_timer().is_some_and(|p| p <= now);
                instance.on_processing_time(now, &mut out);
            }
            self.drain_ranked(op, &mut out, emit);
        }
    }

    /// No operator holds anything that a moving watermark could emit.
    fn quiescent(&self) -> bool {
        self.operators.iter().all(|o| o.instances.iter().all(Operator::is_quiescent))
    }

    fn advancing(&self) -> bool {
        self.idle_advance && self.operators.iter().any(|o| o.idle)
    }

    fn next_idle_transition(&self, not_before: i128) -> Option<i128> {
        self.streams.iter().filter_map(|s| s.clock.idle_due()).map(|due| due.max(not_before)).min()
    }

    fn tick(&mut self, t: i128, emit: &mut impl Emit) {
        self.processing_time(t, emit);
        self.timers_fired = false;
        for stream in &mut self.streams {
            stream.clock.tick(t);
        }
        for op in 0..self.operators.len() {
            let inputs: Vec<InputTime> = self.operators[op].inputs.iter().map(|&n| self.input_time(n)).collect();
            let node = &mut self.operators[op];
            node.idle = inputs.iter().all(|i| i.idle);
            if let Some(watermark) = node.clock.tick(t, &inputs, self.idle_advance) {
                self.watermark_to(op, watermark, emit);
            }
        }
    }

    fn input_time(&self, node: NodeRef) -> InputTime {
        match node {
            NodeRef::Stream(s) => {
                let clock = &self.streams[s].clock;
                InputTime { watermark: clock.watermark(), idle: clock.is_idle() }
            }
            NodeRef::Operator(o) => {
                let op = &self.operators[o];
                let watermark = op.instances.iter().map(Operator::output_watermark).min().unwrap_or(Time::NEG_INF);
                InputTime { watermark, idle: op.idle }
            }
        }
    }

    fn watermark_to(&mut self, op: usize, watermark: Time, emit: &mut impl Emit) {
        let mut out = std::mem::take(&mut self.scratch);
        for instance in &mut self.operators[op].instances {
            instance.on_watermark(watermark, &mut out);
        }
        self.drain_ranked(op, &mut out, emit);
    }

    /// What all instances of `op` emitted at once goes downstream ranked by [`origin_rank`].
    fn drain_ranked(&mut self, op: usize, out: &mut Output, emit: &mut impl Emit) {
        let origin = self.operators[op].origin;
        out.results.sort_by_cached_key(|(_, row)| origin_rank(row, origin));
        self.drain(op, out, emit);
        self.scratch = std::mem::take(out);
        self.deliver_queued(emit);
    }

    /// Ingests one decoded row of input stream `stream` that arrived at `arrival`.
    pub fn ingest(&mut self, stream: usize, row: Row, arrival: i128, emit: &mut impl Emit) {
        self.streams[stream].counters.rows += 1;
        self.streams[stream].clock.on_row(row.ts, arrival);
        self.queue.push_back((NodeRef::Stream(stream), row));
        self.deliver_queued(emit);
    }

    /// Hands queued rows to the operators that read them, breadth first.
    fn deliver_queued(&mut self, emit: &mut impl Emit) {
        while let Some((source, row)) = self.queue.pop_front() {
            let count = match source {
                NodeRef::Stream(s) => self.streams[s].subscribers.len(),
                NodeRef::Operator(o) => self.operators[o].subscribers.len(),
            };
            let mut row = Some(row);
            for i in 0..count {
                let (op, input) = match source {
                    NodeRef::Stream(s) => self.streams[s].subscribers[i],
                    NodeRef::Operator(o) => self.operators[o].subscribers[i],
                };
                // The last reader takes the row itself; earlier ones get copies.
                let delivered = if i + 1 == count { row.take() } else { row.clone() };
                if let Some(delivered) = delivered {
                    self.operator_row(op, input, delivered, emit);
                }
            }
        }
    }

    fn operator_row(&mut self, op: usize, input: usize, row: Row, emit: &mut impl Emit) {
        let mut out = std::mem::take(&mut self.scratch);
        let node = &mut self.operators[op];
        node.counters.rows_in[input] += 1;
        let shards = node.instances.len();
        if row.key == Key::Broadcast {
            // Every instance judges lateness against the same operator watermark, so they agree:
            // a late broadcast row is reported once, not once per shard.
            for (shard, instance) in node.instances.iter_mut().enumerate() {
                let late = out.late.len();
                instance.on_row(input, row.clone(), &mut out);
                if shard > 0 {
                    out.late.truncate(late);
                }
            }
            let origin = node.origin;
            out.results.sort_by_cached_key(|(_, row)| origin_rank(row, origin));
        } else {
            node.instances[(row.key_hash % shards as u64) as usize].on_row(input, row, &mut out);
        }
        self.drain(op, &mut out, emit);
        self.scratch = out;
    }

    /// Emits what operator `op` produced and queues its results for the operators reading it.
    fn drain(&mut self, op: usize, out: &mut Output, emit: &mut impl Emit) {
        let node = &mut self.operators[op];
        for (input, row) in out.late.drain(..) {
            node.counters.late[input] += 1;
            emit.late(op, input, &row);
        }
        let feeds = !node.subscribers.is_empty();
        for (kind, row) in out.results.drain(..) {
            node.counters.results[kind as usize] += 1;
            emit.result(op, &row);
            if feeds {
                self.queue.push_back((NodeRef::Operator(op), row));
            }
        }
    }

    /// End of input: every operator, upstream first, goes to +∞ (rule 6).
    pub fn finish(&mut self, emit: &mut impl Emit) {
        for op in 0..self.operators.len() {
            if self.clocked.contains(&op) {
                let mut out = std::mem::take(&mut self.scratch);
                for instance in &mut self.operators[op].instances {
                    instance.on_processing_time(END_OF_INPUT, &mut out);
                }
                self.drain_ranked(op, &mut out, emit);
            }
            if let Some(watermark) = self.operators[op].clock.advance_to(Time::POS_INF) {
                self.watermark_to(op, watermark, emit);
            }
        }
    }

    /// A line of input stream `stream` could not be used (it went to `dead_letter`).
    pub fn count_dead_letter(&mut self, stream: usize, reason: &str) {
        let counters = &mut self.streams[stream].counters;
        counters.rows += 1;
        *counters.dead_letters.entry(reason.to_owned()).or_default() += 1;
    }

    pub fn figures(&self) -> Figures {
        let ops = 0..self.operators.len();
        Figures {
            streams: self.streams.iter().map(|s| s.counters.clone()).collect(),
            stream_watermarks: self.streams.iter().map(|s| s.clock.watermark()).collect(),
            stream_idle: self.streams.iter().map(|s| s.clock.is_idle()).collect(),
            operator_counters: self.operators.iter().map(|o| o.counters.clone()).collect(),
            operator_watermarks: ops.clone().map(|op| self.operator_watermark(op)).collect(),
            operator_state: ops.map(|op| self.operator_state(op)).collect(),
            drivers: Vec::new(),
            shard_ring_used_bytes: Vec::new(),
        }
    }

    pub fn stream_counters(&self, stream: usize) -> &StreamCounters {
        &self.streams[stream].counters
    }

    pub fn stream_watermark(&self, stream: usize) -> Time {
        self.streams[stream].clock.watermark()
    }

    pub fn stream_idle(&self, stream: usize) -> bool {
        self.streams[stream].clock.is_idle()
    }

    pub fn operator_watermark(&self, op: usize) -> Time {
        self.operators[op].clock.watermark()
    }

    pub fn operator_counters(&self, op: usize) -> &OperatorCounters {
        &self.operators[op].counters
    }

    /// Live state of operator `op` over all shards: (rows, bytes).
    pub fn operator_state(&self, op: usize) -> (usize, usize) {
        let instances = &self.operators[op].instances;
        (instances.iter().map(Operator::state_rows).sum(), instances.iter().map(Operator::state_bytes).sum())
    }
}
