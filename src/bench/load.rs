//! The synthetic load of `braid bench`: rows for every input stream of a config, in arrival
//! order, generated one event-time slice at a time (the design is in the parent module's doc).
//!
//! A slice covers `slice_ms` of event time, sized so that it holds about `--batch-rows` rows.
//! Every device of every source sends the rows whose event time falls in the slice; their
//! arrivals lie in [slice start, slice end + max_out_of_orderness). Rows arriving before the
//! slice's end are final (every later row has an event time, and so an arrival, at or after it)
//! and move, sorted by arrival, to `ready`; the others wait in `pending` for the next slice.

use std::collections::VecDeque;

use braid::operator::OperatorSpec;
use braid::operator::window::WindowKind;
use braid::plan::{NodeRef, Plan};
use braid::record::input::InputRows;
use braid::record::schema::Field;
use braid::record::{FieldType, Row, TimeSpec, TimeUnit, Value};

use super::BenchArgs;

/// Event times start here (an ordinary epoch-ms value, as in the criterion benches).
const EPOCH_MS: i64 = 1_700_000_000_000;
/// How far a late row's event time is set back beyond max_out_of_orderness.
const LATE_BY_MS: i64 = 2_000;
const SEED: u64 = 0x5eed_b4a1_d000_0b3c;
const WORDS: [&str; 8] = ["ok", "busy", "idle", "rebooting", "reboot", "set_mode", "ping", "update_fw"];

/// One input row, ready for `Runtime::ingest`.
pub(super) struct Input {
    pub(super) arrival: i64,
    pub(super) stream: usize,
    pub(super) row: Row,
}

/// The devices of one input stream.
struct Source {
    stream: usize,
    mean_gap_ms: f64,
    max_out_of_orderness: i64,
    /// Per device: the event time of its next row, and how many rows it sent.
    next_ts: Vec<i64>,
    sent: Vec<u64>,
}

/// Rows of every source in arrival order, one event-time slice at a time.
pub(super) struct Generator<'p> {
    plan: &'p Plan,
    sources: Vec<Source>,
    late_share: f64,
    rng: Rng,
    rows: InputRows,
    device_names: Vec<Box<str>>,
    /// Event time up to which rows have been generated.
    until: i64,
    slice_ms: i64,
    /// Generated, arrival at or after `until`: a later slice may still put rows before them.
    pending: Vec<Input>,
    /// Generated, arrival before `until`: final, in arrival order.
    ready: VecDeque<Input>,
}

impl<'p> Generator<'p> {
    pub(super) fn new(plan: &'p Plan, args: &BenchArgs) -> Generator<'p> {
        let rates = stream_rates(plan, args.rate_per_device, args.match_fanout);
        let mut rng = Rng(SEED ^ args.devices as u64);
        let mut sources = Vec::new();
        let mut rows_per_ms = 0.0;
        for (stream, def) in plan.streams.iter().enumerate() {
            let devices = if !def.schema.is_broadcast() { args.devices } else { 1 };
            let rate = rates[stream];
            if rate <= 0.0 || !rate.is_finite() {
                continue;
            }
            let mean_gap_ms = 1000.0 / rate;
            rows_per_ms += devices as f64 / mean_gap_ms;
            let next_ts = (0..devices).map(|_| EPOCH_MS + (rng.unit() * mean_gap_ms) as i64).collect();
            sources.push(Source {
                stream,
                mean_gap_ms,
                max_out_of_orderness: def.max_out_of_orderness.max(0),
                next_ts,
                sent: vec![0; devices],
            });
        }
        let slice_ms =
            if rows_per_ms > 0.0 { (args.batch_rows as f64 / rows_per_ms).clamp(1.0, 60_000.0) } else { 1.0 };
        Generator {
            plan,
            sources,
            late_share: args.late_share,
            rng,
            rows: InputRows::default(),
            device_names: (0..args.devices).map(|d| format!("dev-{d:06}").into_boxed_str()).collect(),
            until: EPOCH_MS,
            slice_ms: slice_ms as i64,
            pending: Vec::new(),
            ready: VecDeque::new(),
        }
    }

    /// Replaces `batch` with the next `want` rows in arrival order (fewer only with no sources).
    pub(super) fn fill(&mut self, batch: &mut Vec<Input>, want: usize) {
        batch.clear();
        while batch.len() < want && !self.sources.is_empty() {
            if self.ready.is_empty() {
                self.slice();
                continue;
            }
            let n = (want - batch.len()).min(self.ready.len());
            batch.extend(self.ready.drain(..n));
        }
    }

    /// Generates the rows with event times in [until, until + slice_ms).
    fn slice(&mut self) {
        let end = self.until + self.slice_ms;
        for s in 0..self.sources.len() {
            for device in 0..self.sources[s].next_ts.len() {
                while self.sources[s].next_ts[device] < end {
                    let source = &mut self.sources[s];
                    let ts = source.next_ts[device];
                    let seq = source.sent[device];
                    source.sent[device] += 1;
                    let gap = (source.mean_gap_ms * (0.2 + 1.6 * self.rng.unit())).round().max(1.0);
                    source.next_ts[device] += gap as i64;
                    let input = self.row(s, device, ts, seq);
                    self.pending.push(input);
                }
            }
        }
        self.until = end;
        // Stable: rows with equal arrivals stay in generation order.
        self.pending.sort_by_key(|i| i.arrival);
        let done = self.pending.partition_point(|i| i.arrival < end);
        self.ready.extend(self.pending.drain(..done));
    }

    fn row(&mut self, source: usize, device: usize, nominal_ts: i64, seq: u64) -> Input {
        let Source { stream, max_out_of_orderness, .. } = self.sources[source];
        let plan = self.plan;
        let def = &plan.streams[stream];
        let schema = &def.schema;
        let time = match schema.time {
            TimeSpec::Field { pos, unit } => Some((pos, unit, schema.fields[pos].ty)),
            TimeSpec::Ingest => None,
        };
        // Whole seconds for an int field in seconds, so the row's ts is what its value says.
        let on_time = match time {
            Some((_, TimeUnit::S, FieldType::Int)) => nominal_ts - nominal_ts.rem_euclid(1000),
            _ => nominal_ts,
        };
        let arrival = on_time + self.rng.below(max_out_of_orderness as u64 + 1) as i64;
        let late = self.late_share > 0.0 && self.rng.unit() < self.late_share;
        let ts = match time {
            None => arrival,
            Some(_) if late => on_time - max_out_of_orderness - LATE_BY_MS,
            Some(_) => on_time,
        };
        let mut values = Vec::with_capacity(schema.fields.len());
        for (pos, field) in schema.fields.iter().enumerate() {
            values.push(match time {
                _ if schema.key.contains(&pos) => match field.ty {
                    FieldType::Int => Value::Int(device as i64),
                    _ => Value::Str(self.device_names[device].clone()),
                },
                Some((time_pos, unit, ty)) if time_pos == pos => time_value(ts, unit, ty),
                _ => self.value(field, device, seq),
            });
        }
        let row = braid::source::row_of(def, values, ts, &mut self.rows);
        Input { arrival, stream, row }
    }

    fn value(&mut self, field: &Field, device: usize, seq: u64) -> Value {
        match field.ty {
            FieldType::String if field.name.ends_with("id") => Value::Str(format!("{device:06}-{seq:010}").into()),
            FieldType::String => Value::Str(WORDS[self.rng.below(WORDS.len() as u64) as usize].into()),
            FieldType::Int => Value::Int(seq as i64),
            FieldType::Float => Value::Float(self.rng.below(20_000) as f64 / 100.0),
            FieldType::Bool => Value::Bool(self.rng.below(2) == 1),
            FieldType::Bytes => Value::Str("AAECAw==".into()),
            FieldType::IdList => Value::IdList(Box::new([])),
        }
    }
}

/// Rows/s per device of each input stream: `rate` for a join's left input and for every stream
/// no join reads on its right; `fanout / span` for a join's right input.
fn stream_rates(plan: &Plan, rate: f64, fanout: f64) -> Vec<f64> {
    let mut rates: Vec<Option<f64>> = vec![None; plan.streams.len()];
    for def in &plan.operators {
        let span_ms = match &def.spec {
            OperatorSpec::IntervalJoin(spec) => Some(spec.upper - spec.lower),
            OperatorSpec::WindowJoin(spec) => Some(match spec.window.kind {
                WindowKind::Fixed { size, .. } => size,
                WindowKind::Session { gap } => gap,
            }),
            _ => None,
        };
        if let (Some(span_ms), [NodeRef::Stream(left), NodeRef::Stream(right)]) = (span_ms, def.inputs.as_slice())
            && left != right
        {
            rates[*left].get_or_insert(rate);
            rates[*right].get_or_insert(fanout * 1000.0 / span_ms.max(1) as f64);
        }
    }
    rates.into_iter().map(|r| r.unwrap_or(rate)).collect()
}

/// The time field's value for event time `ts` (ms).
fn time_value(ts: i64, unit: TimeUnit, ty: FieldType) -> Value {
    match (unit, ty) {
        (TimeUnit::S, FieldType::Int) => Value::Int(ts.div_euclid(1000)),
        (TimeUnit::S, _) => Value::Float(ts as f64 / 1000.0),
        (TimeUnit::Rfc3339, _) => Value::Str(rfc3339(ts).into()),
        (TimeUnit::Ms, _) => Value::Int(ts),
    }
}

/// `ts` (ms since the epoch) as `YYYY-MM-DDTHH:MM:SS.mmmZ` (days to civil date: H. Hinnant).
fn rfc3339(ts: i64) -> String {
    braid::time::rfc3339::format_ms(ts)
}

/// splitmix64: a fixed-seed PRNG, so every run sends the same rows.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [0, n) (n > 0).
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::tests::{args, gateway};

    #[test]
    fn rfc3339_round_trips_through_the_parser() {
        for ts in [0, EPOCH_MS, EPOCH_MS + 86_399_999, -1, 951_782_400_000, 4_102_444_800_123] {
            assert_eq!(braid::time::rfc3339::parse_ms(&rfc3339(ts)), Some(ts), "{}", rfc3339(ts));
        }
        assert_eq!(rfc3339(EPOCH_MS), "2023-11-14T22:13:20.000Z");
    }

    #[test]
    fn rows_come_in_arrival_order_within_the_disorder_bound() {
        let plan = gateway();
        let mut generator = Generator::new(&plan, &args(50, 3_000, 0.0));
        let mut batch = Vec::new();
        let mut last = i64::MIN;
        for _ in 0..6 {
            generator.fill(&mut batch, 500);
            assert_eq!(batch.len(), 500);
            for input in &batch {
                assert!(input.arrival >= last);
                assert!((0..=500).contains(&(input.arrival - input.row.ts)));
                last = input.arrival;
            }
        }
    }

    #[test]
    fn right_rate_follows_the_fanout() {
        let plan = gateway();
        let (command, status) = (plan.stream("command").unwrap(), plan.stream("status").unwrap());
        let rates = stream_rates(&plan, 0.2, 2.0);
        assert_eq!(rates[command], 0.2);
        assert!((rates[status] - 0.25).abs() < 1e-9, "2 matches over an 8 s span: {}", rates[status]);
    }
}
