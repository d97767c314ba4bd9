//! The oracle: replay's time semantics written again from CONTRACT.md ("Exact replay semantics",
//! rules 2–6 and the routing and ordering DESIGN.md "Operators" fixes), as plainly as they can be
//! written, sharing no time-rule code with the shard runtime (`tests/runtime.rs` holds the
//! runtime to it, for 1–4 shards, `_id`s included).
//!
//! Taken from braid, because they are tested elsewhere or are no time rule: the operators
//! themselves (`OperatorSpec::build`, in memory; each kind's semantics are checked against the
//! brute-force references), the plan, input decoding and the JSON of the output files (replay's
//! own, [`replay`]), the stable key hash. Written here, and only here:
//!
//! - **Stream clocks** (rules 3–4): at a tick, watermark = max ts − max_out_of_orderness − 1
//!   (−∞ before the first row); a stream that heard no row since the previous tick is idle once
//!   `T − last arrival ≥ idle_timeout` (the last arrival starts at the first line of all inputs;
//!   `0ms` never idles); one that heard a row is active.
//! - **Operator clocks** (rule 5), upstream first at every tick: max(previous, min over non-idle
//!   inputs); with every input idle and `idle_advance`, the watermark of the tick they all went
//!   idle plus the processing time since; an operator's output is idle when all its inputs are,
//!   and its watermark downstream is the smallest `output_watermark` of its instances.
//! - **Ticks**: every multiple of 200 ms of processing time runs, none skipped — the simplest
//!   rule that is right; the runtime's skipping must give the same outputs.
//! - **Processing time**: before a line with arrival `a`, time moves from one due processing
//!   timer or tick to the next up to `a`; a timer due at `p` fires when time reaches `p` (at a
//!   tick, before the tick's watermarks), operators upstream first. At the end of input every
//!   operator, upstream first, fires its pending timers and then goes to +∞ (rule 6).
//! - **Shards**: an operator is one instance per shard; a keyed row goes to instance
//!   `key_hash(key) % shards`, a broadcast row to every instance. Every instance judges a
//!   broadcast row against the same watermark, so they agree whether it is late (checked here),
//!   and it is reported late once.
//! - **Ranking**: what every instance emits at once (a watermark, processing time, a broadcast
//!   row) is put in order of the hash of the key it came from (the value under its first input's
//!   key field, rule 9; the result's own key when it has none), stably: ties keep shard order,
//!   and one key's results keep their order. One instance's answer to a keyed row keeps its own
//!   order.
//! - **Delivery**: breadth first — every result of one activation reaches all readers (in
//!   operator order, then input order) before their own results move on.

use std::collections::VecDeque;
use std::path::PathBuf;

use braid::operator::connect::END_OF_INPUT;
use braid::operator::{Operator, Output};
use braid::plan::{NodeRef, Plan};
use braid::record::id::key_hash;
use braid::record::{Key, Row};
use braid::shard::Emit;
use braid::time::Time;

/// Watermark ticks: every multiple of this processing time (rule 3).
const TICK_MS: i128 = 200;

/// A watermark moved by `by` ms; −∞ and +∞ do not move.
fn moved(watermark: Time, by: i128) -> Time {
    match watermark {
        Time::NEG_INF | Time::POS_INF => watermark,
        finite => Time::from_i128(finite.raw() + by),
    }
}

/// One input stream's time.
struct StreamTime {
    /// max_out_of_orderness + 1 ms.
    lag: i128,
    /// 0: never idle.
    idle_timeout: i128,
    max_ts: Option<i64>,
    last_arrival: i128,
    heard_since_tick: bool,
    idle: bool,
    readers: Vec<(usize, usize)>,
}

impl StreamTime {
    fn watermark(&self) -> Time {
        match self.max_ts {
            None => Time::NEG_INF,
            Some(ts) => Time::from_i128(i128::from(ts) - self.lag),
        }
    }

    fn at_tick(&mut self, t: i128) {
        let silent_for = t - self.last_arrival;
        let heard = std::mem::replace(&mut self.heard_since_tick, false);
        self.idle = !heard && (self.idle || (self.idle_timeout > 0 && silent_for >= self.idle_timeout));
    }
}

/// One operator: its instances (one per shard) and its time.
struct OperatorTime {
    inputs: Vec<NodeRef>,
    readers: Vec<(usize, usize)>,
    shards: Vec<Operator>,
    watermark: Time,
    /// All its inputs were idle at the last tick (so is its output).
    idle: bool,
    /// With `idle_advance`: (the tick its inputs all went idle, its watermark then).
    dark: Option<(i128, Time)>,
    /// Where its results hold the key of the row they came from.
    origin: Vec<usize>,
}

/// What wakes every instance of an operator at once, or one row.
enum Wake {
    Row(usize, Row),
    Watermark(Time),
    ProcessingTime(i128),
}

/// The reference: feed it lines in processing order ([`Oracle::ingest`],
/// [`Oracle::advance_to`] for a line that is dead-lettered), then [`Oracle::finish`].
pub struct Oracle {
    streams: Vec<StreamTime>,
    operators: Vec<OperatorTime>,
    idle_advance: bool,
    now: i128,
    next_tick: i128,
    /// Results waiting to reach their readers: (operator, row).
    wave: VecDeque<(usize, Row)>,
}

/// The position of the key of a result's origin in operator `op`'s results (rule 9: under the
/// key field names of its first input, one per key field), if that input has a key.
fn origin_position(plan: &Plan, op: usize) -> Vec<usize> {
    let def = &plan.operators[op];
    let Some(&first) = def.inputs.first() else { return Vec::new() };
    let first = plan.node_schema(first);
    let positions: Option<Vec<usize>> = first
        .key
        .iter()
        .map(|&k| def.output.fields.iter().position(|field| field.name == first.fields[k].name))
        .collect();
    positions.unwrap_or_default()
}

impl Oracle {
    /// `start`: the arrival of the first line of all inputs.
    pub fn new(plan: &Plan, shards: usize, start: i128) -> Oracle {
        let mut streams: Vec<StreamTime> = plan
            .streams
            .iter()
            .map(|def| StreamTime {
                lag: i128::from(def.max_out_of_orderness) + 1,
                idle_timeout: i128::from(def.idle_timeout),
                max_ts: None,
                last_arrival: start,
                heard_since_tick: false,
                idle: false,
                readers: Vec::new(),
            })
            .collect();
        let mut operators: Vec<OperatorTime> = Vec::new();
        for (op, def) in plan.operators.iter().enumerate() {
            for (input, node) in def.inputs.iter().enumerate() {
                let readers = match *node {
                    NodeRef::Stream(s) => &mut streams[s].readers,
                    NodeRef::Operator(up) => &mut operators[up].readers,
                };
                readers.push((op, input));
            }
            let mut shards: Vec<Operator> = (0..shards.max(1)).map(|_| def.spec.build()).collect();
            let mut nothing = Output::default();
            shards.iter_mut().for_each(|instance| instance.on_processing_time(start, &mut nothing));
            assert!(nothing.is_empty(), "no timer can be due before the first line");
            operators.push(OperatorTime {
                inputs: def.inputs.clone(),
                readers: Vec::new(),
                shards,
                watermark: Time::NEG_INF,
                idle: false,
                dark: None,
                origin: origin_position(plan, op),
            });
        }
        let next_tick = (start.div_euclid(TICK_MS) + 1) * TICK_MS;
        Oracle {
            streams,
            operators,
            idle_advance: plan.runtime.idle_advance,
            now: start,
            next_tick,
            wave: VecDeque::new(),
        }
    }

    /// Processing time moves on to `to`: each due timer and each tick in order.
    pub fn advance_to(&mut self, to: i128, emit: &mut impl Emit) {
        loop {
            let timer = self.operators.iter().flat_map(|o| &o.shards).filter_map(Operator::next_processing_timer).min();
            match timer {
                Some(due) if due < self.next_tick && due <= to => self.processing_time(due.max(self.now), emit),
                _ if self.next_tick <= to => {
                    let t = self.next_tick;
                    self.next_tick += TICK_MS;
                    self.tick(t, emit);
                }
                _ => break,
            }
        }
        if to > self.now {
            self.processing_time(to, emit);
        }
    }

    /// A decoded row of stream `stream` arriving at `arrival` (processing time moves there first).
    pub fn ingest(&mut self, stream: usize, row: Row, arrival: i128, emit: &mut impl Emit) {
        self.advance_to(arrival, emit);
        let s = &mut self.streams[stream];
        s.heard_since_tick = true;
        s.last_arrival = arrival;
        s.max_ts = Some(s.max_ts.map_or(row.ts, |m| m.max(row.ts)));
        for (op, input) in s.readers.clone() {
            self.wake(op, Wake::Row(input, row.clone()), emit);
        }
        self.spread(emit);
    }

    /// End of input (rule 6).
    pub fn finish(&mut self, emit: &mut impl Emit) {
        for op in 0..self.operators.len() {
            self.wake(op, Wake::ProcessingTime(END_OF_INPUT), emit);
            self.spread(emit);
            if self.operators[op].watermark < Time::POS_INF {
                self.operators[op].watermark = Time::POS_INF;
                self.wake(op, Wake::Watermark(Time::POS_INF), emit);
                self.spread(emit);
            }
        }
    }

    fn processing_time(&mut self, now: i128, emit: &mut impl Emit) {
        self.now = now;
        for op in 0..self.operators.len() {
            self.wake(op, Wake::ProcessingTime(now), emit);
            self.spread(emit);
        }
    }

    fn tick(&mut self, t: i128, emit: &mut impl Emit) {
        self.processing_time(t, emit);
        for stream in &mut self.streams {
            stream.at_tick(t);
        }
        for op in 0..self.operators.len() {
            let seen: Vec<(Time, bool)> = self.operators[op].inputs.iter().map(|&n| self.seen(n)).collect();
            let active_min = seen.iter().filter(|(_, idle)| !idle).map(|(w, _)| *w).min();
            let node = &mut self.operators[op];
            node.idle = active_min.is_none();
            if active_min.is_some() {
                node.dark = None;
            }
            let target = match (active_min, self.idle_advance) {
                (Some(w), _) => w,
                (None, true) => {
                    let (went_dark, then) = *node.dark.get_or_insert((t, node.watermark));
                    moved(then, t - went_dark)
                }
                (None, false) => continue,
            };
            if target > node.watermark {
                node.watermark = target;
                self.wake(op, Wake::Watermark(target), emit);
                self.spread(emit);
            }
        }
    }

    /// What an operator reading `node` sees of it: (watermark, idle).
    fn seen(&self, node: NodeRef) -> (Time, bool) {
        match node {
            NodeRef::Stream(s) => (self.streams[s].watermark(), self.streams[s].idle),
            NodeRef::Operator(up) => {
                let up = &self.operators[up];
                (up.shards.iter().map(Operator::output_watermark).min().unwrap_or(Time::NEG_INF), up.idle)
            }
        }
    }

    /// Wakes operator `op`: its late rows go out, its results go out and join the wave.
    fn wake(&mut self, op: usize, wake: Wake, emit: &mut impl Emit) {
        let node = &mut self.operators[op];
        let (answers, everyone) = match wake {
            Wake::Row(input, row) if row.key != Key::Broadcast => {
                let shard = (key_hash(&row.key) % node.shards.len() as u64) as usize;
                (each(&mut node.shards[shard..=shard], |instance, out| instance.on_row(input, row.clone(), out)), false)
            }
            Wake::Row(input, row) => {
                let mut answers = each(&mut node.shards, |instance, out| instance.on_row(input, row.clone(), out));
                let late: Vec<usize> = answers.iter().map(|a| a.late.len()).collect();
                assert!(
                    late.iter().all(|&l| l == late[0]),
                    "instances disagree on a broadcast row's lateness: {late:?}"
                );
                answers.iter_mut().skip(1).for_each(|a| a.late.clear());
                (answers, true)
            }
            Wake::Watermark(w) => (each(&mut node.shards, |instance, out| instance.on_watermark(w, out)), true),
            Wake::ProcessingTime(now) => {
                (each(&mut node.shards, |instance, out| instance.on_processing_time(now, out)), true)
            }
        };
        let mut results: Vec<Row> = Vec::new();
        for mut answer in answers {
            for (input, row) in answer.late.drain(..) {
                emit.late(op, input, &row, false);
            }
            results.extend(answer.take_results().into_iter().map(|(_, row)| row));
        }
        if everyone {
            let origin = &node.origin;
            let rank = |row: &Row| {
                let key = Key::from_values(&row.values, origin);
                key_hash(key.as_ref().unwrap_or(&row.key))
            };
            results.sort_by_cached_key(rank);
        }
        let feeds = !node.readers.is_empty();
        for row in results {
            emit.result(op, &row, false);
            if feeds {
                self.wave.push_back((op, row));
            }
        }
    }

    /// Hands waiting results to their readers, breadth first, until none is left.
    fn spread(&mut self, emit: &mut impl Emit) {
        while let Some((from, row)) = self.wave.pop_front() {
            for (op, input) in self.operators[from].readers.clone() {
                self.wake(op, Wake::Row(input, row.clone()), emit);
            }
        }
    }
}

/// What each of `instances` answers to `call`, in shard order.
fn each(instances: &mut [Operator], mut call: impl FnMut(&mut Operator, &mut Output)) -> Vec<Output> {
    let answer = |instance: &mut Operator| {
        let mut out = Output::default();
        call(instance, &mut out);
        out
    };
    instances.iter_mut().map(answer).collect()
}

/// `braid replay` with the oracle instead of the runtime: the same inputs, decoding, dead letters
/// and output files (created even when empty), through replay's own reading and writing.
pub fn replay(plan: &Plan, shards: usize, inputs: &[(String, PathBuf)], outputs: &[(String, PathBuf)]) {
    use braid::record::decode::check_time_window;
    use braid::replay::input::{Content, Inputs, Order, SORT_RUN_BYTES};
    use braid::replay::output::Outputs;
    let files: Vec<(usize, &std::path::Path)> =
        inputs.iter().map(|(name, path)| (plan.stream(name).unwrap(), path.as_path())).collect();
    let spill = tempfile::tempdir().unwrap();
    let mut read = Inputs::open(&files, &plan.streams, spill.path(), SORT_RUN_BYTES, Order::Scan).unwrap();
    let targets: Vec<_> = outputs.iter().map(|(name, path)| (plan.target(name).unwrap(), path.as_path())).collect();
    let mut sinks = Outputs::create(plan, &targets).unwrap();
    let start = read.peek_arrival().unwrap().map_or(0, i128::from);
    let mut oracle = Oracle::new(plan, shards, start);
    let mut ids = braid::record::input::InputRows::default();
    while let Some(line) = read.next().unwrap() {
        let arrival = i128::from(line.arrival);
        oracle.advance_to(arrival, &mut sinks);
        let def = &plan.streams[line.stream];
        let decoded = match line.content {
            Content::DeadLetter(reason) => Err(reason),
            Content::Row(fields) => {
                let ts = fields.ts.unwrap_or(line.arrival);
                let values = fields.to_values(std::str::from_utf8(line.bytes).unwrap());
                check_time_window(ts, line.arrival, def.max_age, def.max_skew).map(|()| (values, ts))
            }
        };
        match decoded {
            Ok((values, ts)) => {
                let row = braid::source::row_of(def, values, ts, &mut ids);
                sinks.input_row(line.stream, braid::record::view::RowView::Heap(&row));
                oracle.ingest(line.stream, row, arrival, &mut sinks);
            }
            Err(reason) => {
                let label = reason.label(&def.schema);
                sinks.dead_letter(line.stream, &braid::record::decode::dead_letter_raw(line.bytes, reason), &label);
            }
        }
    }
    oracle.finish(&mut sinks);
    sinks.finish().unwrap();
}
