//! The tick planner: the one home of "which ticks run" (CONTRACT.md rules 3–5).
//!
//! It owns every input stream's [`StreamClock`] and each operator's idleness, and decides which
//! 200 ms ticks of processing time run. Replay, `braid run` and `braid bench` all drive the shard
//! runtime, whose feeder asks this planner; nothing else decides ticks.
//!
//! At a tick `T` the streams take their watermarks and idleness first (a stream turns idle at the
//! first tick with `T − last arrival ≥ idle_timeout`, and is active again at the tick after a
//! row); then an operator is idle when every one of its inputs is (an operator input is idle when
//! that operator is). The operators' watermarks are computed from what a tick carries, on every
//! shard alike ([`OperatorHost`](crate::operator::host::OperatorHost)).
//!
//! The skip rule: a tick that cannot change anything is not run. That is a tick before which no
//! stream received a row since the previous tick, while no operator advances with processing
//! time (`idle_advance` with all its inputs idle): stream watermarks only move with rows and
//! operator watermarks only with stream watermarks, so the next tick that matters is the next
//! idleness transition. Every tick runs when asked to ([`TickPlanner::new`]'s `every_tick`, the
//! check that skipping changes nothing) and while some operator may hold processing-time timers
//! (connect): a timer's firing can change what an operator holds and so its output watermark.
//! A replay spanning days therefore does not step through millions of empty ticks.
//!
//! Outages: a stream whose source is disconnected is suspended (it does not turn idle; its
//! silence says nothing about the devices) and resumes with idleness counted from the
//! reconnection.

use crate::config::{NodeRef, Plan};
use crate::operator::OperatorSpec;

use super::clock::InputTime;
use super::{StreamClock, next_tick};

/// What one tick tells every shard: each stream's watermark and idleness, and each operator's
/// idleness, at processing time `t`.
#[derive(Clone, Debug, PartialEq)]
pub struct Tick {
    pub t: i128,
    pub streams: Vec<InputTime>,
    pub op_idle: Vec<bool>,
}

pub struct TickPlanner {
    streams: Vec<StreamClock>,
    /// Per operator: its inputs, to judge its idleness at a tick.
    op_inputs: Vec<Vec<NodeRef>>,
    op_idle: Vec<bool>,
    idle_advance: bool,
    /// Run every tick: asked for, or some operator may hold processing-time timers.
    every_tick: bool,
    now: i128,
}

impl TickPlanner {
    /// `start`: processing time of the first input (idleness counts from there).
    pub fn new(plan: &Plan, start: i128, every_tick: bool) -> TickPlanner {
        TickPlanner {
            streams: plan
                .streams
                .iter()
                .map(|s| StreamClock::new(s.max_out_of_orderness, s.idle_timeout, start))
                .collect(),
            op_inputs: plan.operators.iter().map(|o| o.inputs.clone()).collect(),
            op_idle: vec![false; plan.operators.len()],
            idle_advance: plan.runtime.idle_advance,
            every_tick: every_tick || plan.operators.iter().any(|o| matches!(o.spec, OperatorSpec::Connect(_))),
            now: start,
        }
    }

    /// Processing time so far: the last tick run, or where [`move_to`](Self::move_to) put it.
    pub fn now(&self) -> i128 {
        self.now
    }

    /// A row of `stream` with event time `ts` arrived at `arrival`.
    pub fn on_row(&mut self, stream: usize, ts: i64, arrival: i128) {
        self.streams[stream].on_row(ts, arrival);
    }

    /// The first tick in `(now, to]` that can change anything, if any (the skip rule above).
    pub fn next_tick(&self, to: i128) -> Option<i128> {
        let t = next_tick(self.now);
        if t > to {
            return None;
        }
        let new_rows = self.every_tick || self.streams.iter().any(StreamClock::has_new_rows);
        let advancing = self.idle_advance && self.op_idle.iter().any(|&idle| idle);
        if new_rows || advancing {
            return Some(t);
        }
        // Nothing changes before the next idleness transition.
        self.streams.iter().filter_map(StreamClock::idle_due).map(|due| due.max(t)).min().filter(|&due| due <= to)
    }

    /// Runs tick `t` (from [`next_tick`](Self::next_tick)): stream clocks, then operator idleness.
    pub fn tick(&mut self, t: i128) -> Tick {
        self.now = t;
        for clock in &mut self.streams {
            clock.tick(t);
        }
        let streams: Vec<InputTime> =
            self.streams.iter().map(|c| InputTime { watermark: c.watermark(), idle: c.is_idle() }).collect();
        // Plan order is upstream first, so an operator input's idleness is already this tick's.
        for op in 0..self.op_inputs.len() {
            self.op_idle[op] = self.op_inputs[op].iter().all(|node| match *node {
                NodeRef::Stream(s) => streams[s].idle,
                NodeRef::Operator(u) => self.op_idle[u],
            });
        }
        Tick { t, streams, op_idle: self.op_idle.clone() }
    }

    /// Processing time moves to `to` between ticks; returns whether it moved.
    pub fn move_to(&mut self, to: i128) -> bool {
        let moved = to > self.now;
        self.now = self.now.max(to);
        moved
    }

    /// `braid run`: the input of `streams` cannot reach braid (their source is disconnected):
    /// they do not turn idle until [`resume`](Self::resume).
    pub fn suspend(&mut self, streams: &[usize]) {
        for &s in streams {
            self.streams[s].suspend();
        }
    }

    /// The input of `streams` reaches braid again at processing time `now` (call before the
    /// ticks up to `now`): idleness counts from `now`.
    pub fn resume(&mut self, streams: &[usize], now: i128) {
        for &s in streams {
            self.streams[s].resume(now);
        }
    }

    pub fn stream_watermark(&self, stream: usize) -> crate::time::Time {
        self.streams[stream].watermark()
    }

    pub fn stream_idle(&self, stream: usize) -> bool {
        self.streams[stream].is_idle()
    }
}
