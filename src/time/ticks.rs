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

use crate::plan::{NodeRef, Plan};

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

/// What a checkpoint keeps of a [`TickPlanner`].
#[derive(Clone, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct PlannerState {
    pub streams: Vec<StreamClock>,
    pub op_idle: Vec<bool>,
    pub now: i128,
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
            every_tick: every_tick || (0..plan.operators.len()).any(|op| plan.clocked(op)),
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

    /// The planner's progress, for a checkpoint.
    pub fn saved(&self) -> PlannerState {
        PlannerState { streams: self.streams.clone(), op_idle: self.op_idle.clone(), now: self.now }
    }

    /// Takes up the progress of [`saved`](Self::saved): `streams[s]` (`ops[o]`) names the saved
    /// stream (operator) that this planner's stream `s` (operator `o`) continues, if any (a
    /// reload may add, remove or reorder them; the settings stay this planner's). A stream
    /// without one starts as at a fresh start, its idleness counting from the saved time.
    pub fn restore(&mut self, saved: PlannerState, streams: &[Option<usize>], ops: &[Option<usize>]) {
        for (s, clock) in self.streams.iter_mut().enumerate() {
            *clock = match streams.get(s).copied().flatten().and_then(|from| saved.streams.get(from)) {
                Some(saved) => clock.restored(saved.clone()),
                None => clock.restarted_at(saved.now),
            };
        }
        for (o, idle) in self.op_idle.iter_mut().enumerate() {
            *idle = ops.get(o).copied().flatten().and_then(|from| saved.op_idle.get(from)).copied().unwrap_or(false);
        }
        self.now = saved.now;
    }

    pub fn stream_idle(&self, stream: usize) -> bool {
        self.streams[stream].is_idle()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::Time;

    /// Two streams (`b` turns idle after 1 s) joined by one interval join.
    fn plan(runtime: &str) -> Plan {
        let text = format!(
            "{runtime}
[streams.a]
key = \"k\"
time = {{ field = \"ts\", unit = \"ms\" }}
fields = {{ k = \"string\", ts = \"int\" }}
[streams.b]
key = \"k\"
time = {{ field = \"ts\", unit = \"ms\" }}
idle_timeout = \"1s\"
fields = {{ k = \"string\", ts = \"int\" }}
[operators.j]
kind = \"interval_join\"
left = \"a\"
right = \"b\"
lower = \"0ms\"
upper = \"1s\"
select = [\"left.ts\"]
"
        );
        crate::config::parse("test.toml", &text).unwrap_or_else(|e| panic!("{e:?}"))
    }

    /// Every tick the planner runs in (now, to].
    fn run(planner: &mut TickPlanner, to: i128) -> Vec<i128> {
        let mut ran = Vec::new();
        while let Some(t) = planner.next_tick(to) {
            ran.push(planner.tick(t).t);
        }
        planner.move_to(to);
        ran
    }

    #[test]
    fn without_rows_only_idleness_transitions_run() {
        let mut planner = TickPlanner::new(&plan(""), 0, false);
        assert_eq!(run(&mut planner, 10_000), vec![1_000], "b turns idle at 1 s; nothing else can change");
        assert!(planner.stream_idle(1));
        assert_eq!(run(&mut planner, 20_000), Vec::<i128>::new());
        assert_eq!(planner.now(), 20_000);
    }

    #[test]
    fn a_row_makes_the_next_tick_run_and_moves_the_watermark() {
        let mut planner = TickPlanner::new(&plan(""), 0, false);
        planner.on_row(0, 5_000, 150);
        assert_eq!(run(&mut planner, 150), Vec::<i128>::new(), "the tick at 200 is after 150");
        assert_eq!(run(&mut planner, 700), vec![200]);
        assert_eq!(planner.stream_watermark(0), Time::ms(4_999));
    }

    #[test]
    fn every_tick_runs_when_asked_or_while_an_operator_advances_with_processing_time() {
        let mut asked = TickPlanner::new(&plan(""), 0, true);
        assert_eq!(run(&mut asked, 1_000), vec![200, 400, 600, 800, 1_000]);
        let mut advancing = TickPlanner::new(&plan("[runtime]\nidle_advance = true"), 0, false);
        // `a` never turns idle (no idle_timeout): the join is not all idle, nothing advances.
        assert_eq!(run(&mut advancing, 2_000), vec![1_000]);
    }

    #[test]
    fn a_suspended_stream_does_not_turn_idle_and_resumes_counting_from_its_reconnection() {
        let mut planner = TickPlanner::new(&plan(""), 0, false);
        planner.suspend(&[1]);
        assert_eq!(run(&mut planner, 5_000), Vec::<i128>::new());
        planner.resume(&[1], 5_000);
        assert_eq!(run(&mut planner, 7_000), vec![6_000]);
        assert!(planner.stream_idle(1));
    }

    #[test]
    fn an_operator_is_idle_when_all_its_inputs_are() {
        let text = "[streams.a]\nkey = \"k\"\ntime = { field = \"ts\", unit = \"ms\" }\nidle_timeout = \"1s\"\n\
                    fields = { k = \"string\", ts = \"int\" }\n\
                    [operators.u]\nkind = \"union\"\ninputs = [\"a\"]\n";
        let plan = crate::config::parse("test.toml", text).unwrap_or_else(|e| panic!("{e:?}"));
        let mut planner = TickPlanner::new(&plan, 0, false);
        let t = planner.next_tick(10_000).unwrap_or_default();
        assert_eq!(planner.tick(t).op_idle, vec![true]);
    }
}
