#![allow(clippy::unwrap_used)]
//! Every operator kind through the shard runtime that `braid run` uses, one shard thread.
//!
//! Each case is a small config (like `configs/`), checked once with `config::parse`; the timed
//! part is `Runtime::start(&plan, &RuntimeOptions::new(1, dir), start)` (the shard thread, its
//! rings and arenas), then for every pre-built row in arrival order `advance_to(arrival)` +
//! `ingest(stream, &row, arrival)` on the calling thread (the feeder), then `finish`, which
//! waits for the shard and joins it. The sink (`Emit`, on the calling thread) only counts
//! results and late rows. Throughput = input rows. The feeder and the shard thread run at the
//! same time, so a case uses up to two cores; the single-threaded engine this bench measured
//! before is gone (issue 10). `dir` is a fresh directory under
//! `braid::storage::mapped_file::scratch_base()` (`/dev/shm` where there is one), made and removed outside
//! the timed part.
//!
//! Workload (BENCHMARKS.md "Operators, one shard, in-memory rows"): 1 000 devices (keys), 300 s
//! of event time from a fixed-seed splitmix64, so the same rows on every run. Each row arrives
//! 0–399 ms after its ts (below max_out_of_orderness 500 ms), rows are fed in arrival order, and
//! nothing is late (asserted at setup). Per case:
//!
//! - `union`: two sites each report every device's status every 4 s (±0.5 s); one result per row.
//! - `connect_threshold`: telemetry every 2 s per device; a keyed limit per device every 60 s.
//! - `connect_reconcile`: the gateway's commands (every 1–9 s per device); 90 % get an ack
//!   0.05–2 s later; one unsolicited ack per device every 50–150 s. Timeout 5 s.
//! - `window_join/*`, `cogroup/*`, `interval_join`: the gateway rows of `benches/interval_join.rs`
//!   (`command` every 1–9 s, `status` every 4 s ± 0.5 s, one device in ten without status).
//! - `temporal_join`: telemetry every 2 s per device; a config version per device every 30 s.
//! - `absence`: status every 2 s (±0.5 s) per device; after 1 % of reports the device is silent
//!   for 20–40 s. Timeout 10 s.
//!
//! The rows are cloned in `iter_batched` setup (`BatchSize::LargeInput`), not timed; the
//! runtime encodes each into its ring, and the rows are freed outside the timed part (see
//! [`run`]); dropping the shard's state, the rows it evicts and the results it emits is timed.
//! The setup prints each case's rows, results by kind and peak state (as of the shard's last
//! tick) to stderr (`case …`).

mod common;

use std::cell::OnceCell;
use std::hint::black_box;
use std::path::Path;
use std::time::Duration;

use braid::config;
use braid::operator::{ExpiryReason, ResultKind};
use braid::plan::Plan;
use braid::record::input::InputRows;
use braid::record::{Row, TimeSpec, Value};
use braid::shard::{Emit, Figures};
use braid::shard::{Runtime, RuntimeOptions};
use common::EPOCH_MS;
use common::gateway::{
    self, COMMAND_FIELDS, INTERVAL_JOIN, STATUS_FIELDS, STATUS_JITTER_MS, STATUS_PERIOD_MS, Status, dark, device,
    stream_row, stream_section,
};
use common::rng::Rng;
use criterion::{BatchSize, Criterion, SamplingMode, Throughput, criterion_group, criterion_main};
use tempfile::TempDir;

const DEVICES: usize = 1_000;
const SECONDS: i64 = 300;
/// A row arrives 0..this ms after its ts: less than max_out_of_orderness (500 ms), so no row is
/// late.
const ARRIVAL_DELAY_MS: i64 = 400;
const SEED: u64 = 0x5eed_b4a1_d000_0003;

// Streams: (name, fields). All are keyed by `device`, ms event times, max_out_of_orderness 500 ms
// (`common::gateway::stream_section`).

type Stream = (&'static str, &'static str);

const COMMAND: Stream = ("command", COMMAND_FIELDS);
const STATUS: Stream = ("status", STATUS_FIELDS);
const STATUS_SITE_A: Stream = ("status_site_a", STATUS_FIELDS);
const STATUS_SITE_B: Stream = ("status_site_b", STATUS_FIELDS);
const ACK: Stream = ("ack", r#"device = "string", ts = "int", ack_id = "string", code = "int""#);
const TELEMETRY: Stream = ("telemetry", r#"device = "string", ts = "int", temp = "float""#);
const DEVICE_LIMITS: Stream =
    ("device_limits", r#"device = "string", ts = "int", max_temp = "float", set_by = "string""#);
const DEVICE_CONFIG: Stream =
    ("device_config", r#"device = "string", ts = "int", max_temp = "float", profile = "string""#);

// Operators: one per case.

const UNION: &str = r#"
[operators.all_status]
kind = "union"
inputs = ["status_site_a", "status_site_b"]
"#;

const THRESHOLD: &str = r#"
[operators.over_limit]
kind = "connect"
function = "threshold"
left = "telemetry"
right = "device_limits"
value = "temp"
limit = "max_temp"
select = ["left.device", "left.temp", "right.max_temp", "right.set_by"]
"#;

const RECONCILE: &str = r#"
[operators.acked]
kind = "connect"
function = "reconcile"
left = "command"
right = "ack"
timeout = "5s"
select = ["left.cmd_id", "left.cmd", "right.ack_id", "right.ts AS ack_ts"]
"#;

/// The gateway rows joined per window: `window` is the TOML value of `window`.
macro_rules! window_join {
    ($window:literal) => {
        concat!(
            r#"
[operators.effect_window]
kind = "window_join"
left = "command"
right = "status"
window = "#,
            $window,
            r#"
select = ["left.cmd_id", "left.device", "right.seq", "right.ts AS status_ts"]
"#
        )
    };
}

/// The gateway rows aggregated per window (left join): `name` is the operator's, `window` the
/// TOML value of `window`.
macro_rules! cogroup {
    ($name:literal, $window:literal) => {
        concat!(
            "\n[operators.",
            $name,
            r#"]
kind = "cogroup"
left = "command"
right = "status"
window = "#,
            $window,
            r#"
join = "left"
aggregate = ["count(left) AS commands", "count(right) AS statuses", "sum(right.temp) AS temp_sum",
             "max(right.temp) AS max_temp", "last(right.state) AS last_state", "first(left.cmd) AS first_cmd"]
"#
        )
    };
}

const WINDOW_JOIN_TUMBLING: &str = window_join!(r#"{ kind = "tumbling", size = "8s" }"#);
const WINDOW_JOIN_SLIDING: &str = window_join!(r#"{ kind = "sliding", size = "8s", slide = "4s" }"#);
const WINDOW_JOIN_SESSION: &str = window_join!(r#"{ kind = "session", gap = "2s" }"#);
const COGROUP_TUMBLING: &str = cogroup!("per_window", r#"{ kind = "tumbling", size = "8s" }"#);
const COGROUP_SESSION: &str = cogroup!("per_session", r#"{ kind = "session", gap = "2s" }"#);

const TEMPORAL_JOIN: &str = r#"
[operators.with_limits]
kind = "temporal_join"
left = "telemetry"
right = "device_config"
join = "left"
select = ["left.device", "left.temp", "right.max_temp", "right.profile", "right.ts AS config_ts"]
"#;

const ABSENCE: &str = r#"
[operators.silent_devices]
kind = "absence"
input = "status"
timeout = "10s"
"#;

/// One input row before it is built: its stream, ts and values in the stream's field order.
struct Event {
    stream: &'static str,
    ts: i64,
    values: Vec<Value>,
}

/// A row ready for `Runtime::ingest`.
#[derive(Clone)]
struct Input {
    stream: usize,
    arrival: i128,
    row: Row,
}

const PROFILES: [&str; 3] = ["eco", "normal", "boost"];

fn end_ms() -> i64 {
    EPOCH_MS + SECONDS * 1000
}

/// Per device kept by `keep`: a row every `period` ms (± `jitter`) from a random phase in
/// [0, `period`); `values(rng, device, ts, seq)` makes its values.
fn periodic(
    rng: &mut Rng,
    stream: &'static str,
    keep: impl Fn(usize) -> bool,
    period: (i64, i64),
    mut values: impl FnMut(&mut Rng, &str, i64, i64) -> Vec<Value>,
) -> Vec<Event> {
    let mut events = Vec::new();
    for d in (0..DEVICES).filter(|&d| keep(d)) {
        let dev = device(d);
        gateway::periodic(rng, end_ms(), period, |rng, ts, seq| {
            events.push(Event { stream, ts, values: values(rng, &dev, ts, seq) });
        });
    }
    events
}

fn status_values(rng: &mut Rng, dev: &str, ts: i64, seq: i64) -> Vec<Value> {
    Status::draw(rng, ts, seq).values(dev)
}

fn telemetry_values(rng: &mut Rng, dev: &str, ts: i64, _seq: i64) -> Vec<Value> {
    vec![Value::Str(dev.into()), Value::Int(ts), Value::Float(20.0 + rng.range(0, 1500) as f64 / 100.0)]
}

/// Commands per device with uniform 1–9 s gaps (mean 5 s), from a random start in [0, 9 s).
fn commands(rng: &mut Rng) -> Vec<Event> {
    let mut events = Vec::new();
    for d in 0..DEVICES {
        let dev = device(d);
        gateway::commands(rng, end_ms(), |c| {
            events.push(Event { stream: "command", ts: c.ts, values: c.values(&dev) })
        });
    }
    events
}

/// The gateway rows: commands, and a status every 4 s (±0.5 s) from all but one device in ten.
/// Unlike `common::gateway::gateway`, all the statuses are drawn first, then all the commands.
fn gateway(rng: &mut Rng) -> Vec<Event> {
    let mut events = periodic(rng, "status", |d| !dark(d), (STATUS_PERIOD_MS, STATUS_JITTER_MS), status_values);
    events.extend(commands(rng));
    events
}

fn union(rng: &mut Rng) -> Vec<Event> {
    let mut events = periodic(rng, "status_site_a", |_| true, (4_000, 500), status_values);
    events.extend(periodic(rng, "status_site_b", |_| true, (4_000, 500), status_values));
    events
}

fn threshold(rng: &mut Rng) -> Vec<Event> {
    let mut events = periodic(rng, "telemetry", |_| true, (2_000, 500), telemetry_values);
    events.extend(periodic(
        rng,
        "device_limits",
        |_| true,
        (60_000, 0),
        |rng, dev, ts, _| {
            let limit = 30.0 + rng.range(0, 400) as f64 / 100.0;
            vec![Value::Str(dev.into()), Value::Int(ts), Value::Float(limit), Value::Str("ops".into())]
        },
    ));
    events
}

fn reconcile(rng: &mut Rng) -> Vec<Event> {
    let mut events = commands(rng);
    let ack = |rng: &mut Rng, dev: &str, ts: i64| Event {
        stream: "ack",
        ts,
        values: vec![
            Value::Str(dev.into()),
            Value::Int(ts),
            Value::Str(format!("a-{:016x}", rng.next()).into()),
            Value::Int(rng.range(0, 3)),
        ],
    };
    let mut acks: Vec<Event> = Vec::new();
    for command in &events {
        let Value::Str(dev) = &command.values[0] else { unreachable!() };
        let ts = command.ts + rng.range(50, 2_000);
        if rng.range(0, 10) != 0 && ts < end_ms() {
            acks.push(ack(rng, dev, ts));
        }
    }
    for d in 0..DEVICES {
        let dev = device(d);
        let mut ts = EPOCH_MS + rng.range(0, 150_000);
        while ts < end_ms() {
            acks.push(ack(rng, &dev, ts));
            ts += rng.range(50_000, 150_000);
        }
    }
    events.extend(acks);
    events
}

fn temporal(rng: &mut Rng) -> Vec<Event> {
    let mut events = periodic(rng, "telemetry", |_| true, (2_000, 500), telemetry_values);
    events.extend(periodic(
        rng,
        "device_config",
        |_| true,
        (30_000, 0),
        |rng, dev, ts, _| {
            let limit = 30.0 + rng.range(0, 400) as f64 / 100.0;
            vec![Value::Str(dev.into()), Value::Int(ts), Value::Float(limit), Value::Str(rng.pick(&PROFILES).into())]
        },
    ));
    events
}

/// Status every 2 s (±0.5 s); after 1 % of reports, 20–40 s of silence.
fn absence(rng: &mut Rng) -> Vec<Event> {
    let mut events = Vec::new();
    for d in 0..DEVICES {
        let dev = device(d);
        let mut at = EPOCH_MS + rng.range(0, 2_000);
        let mut seq = 0;
        loop {
            let ts = (at + rng.range(-500, 500)).max(EPOCH_MS);
            if ts >= end_ms() {
                break;
            }
            events.push(Event { stream: "status", ts, values: status_values(rng, &dev, ts, seq) });
            seq += 1;
            at += if rng.range(0, 100) == 0 { rng.range(20_000, 40_000) } else { 2_000 };
        }
    }
    events
}

/// Builds rows as replay does (`common::gateway::stream_row`), each arriving 0–399 ms after its
/// ts; sorted by arrival.
fn build(plan: &Plan, events: Vec<Event>, rng: &mut Rng) -> Vec<Input> {
    let mut ids = InputRows::default();
    let mut inputs: Vec<Input> = events
        .into_iter()
        .map(|e| {
            let stream = plan.stream(e.stream).unwrap();
            let def = &plan.streams[stream];
            assert_eq!(e.values.len(), def.schema.fields.len(), "{}: values in field order", e.stream);
            if let TimeSpec::Field { pos, .. } = def.schema.time {
                assert_eq!(e.values[pos], Value::Int(e.ts), "{}: the time field", e.stream);
            }
            let row = stream_row(&mut ids, def, e.ts, e.values);
            let arrival = i128::from(e.ts + rng.range(0, ARRIVAL_DELAY_MS));
            Input { stream, arrival, row }
        })
        .collect();
    inputs.sort_by_key(|i| i.arrival);
    inputs
}

/// Counts what the runtime emits.
#[derive(Default, Debug)]
struct Counts {
    results: u64,
    late: u64,
}

impl Emit for Counts {
    fn result(&mut self, _operator: usize, _row: &Row, _after_barrier: bool) {
        self.results += 1;
    }

    fn late(&mut self, _operator: usize, _input: usize, _row: &Row, _after_barrier: bool) {
        self.late += 1;
    }

    // These plans have no `ttl` and no byte budget: nothing expires.
    fn expired(&mut self, _: usize, _: ExpiryReason, _: Option<usize>, _: &Row, _: bool) {}
}

/// One shard thread with its rings and state in `dir`: every row in arrival order, then the end
/// of input; `probe` sees the runtime after each row.
fn run_with(plan: &Plan, inputs: &[Input], dir: &Path, mut probe: impl FnMut(&Runtime)) -> (Figures, Counts) {
    let start = inputs.first().map_or(0, |i| i.arrival);
    let mut runtime = Runtime::start(plan, &RuntimeOptions::new(1, dir), start).unwrap();
    let mut counts = Counts::default();
    for Input { stream, arrival, row } in inputs {
        runtime.advance_to(*arrival, &mut counts).unwrap();
        runtime.ingest(*stream, row, *arrival, &mut counts).unwrap();
        probe(&runtime);
    }
    (runtime.finish(&mut counts).unwrap(), counts)
}

/// The timed part. The runtime (its thread, rings and the state it still holds) is dropped
/// inside; the rows and the directory are handed back, so that freeing the rows (12–15 MB,
/// which makes glibc consolidate its free lists) and removing the directory are not timed.
fn run(plan: &Plan, (inputs, dir): (Vec<Input>, TempDir)) -> (Counts, Vec<Input>, TempDir) {
    let counts = run_with(plan, &inputs, dir.path(), |_| {}).1;
    (counts, inputs, dir)
}

/// A fresh directory for the rings and the shard's arenas: on `/dev/shm` (tmpfs) when there is
/// one, so nothing is written back to disk.
fn scratch_dir() -> TempDir {
    tempfile::tempdir_in(braid::storage::mapped_file::scratch_base()).unwrap()
}

struct Case {
    name: &'static str,
    streams: &'static [Stream],
    operator: &'static str,
    workload: fn(&mut Rng) -> Vec<Event>,
}

const CASES: [Case; 11] = [
    Case { name: "union", streams: &[STATUS_SITE_A, STATUS_SITE_B], operator: UNION, workload: union },
    Case { name: "connect_threshold", streams: &[TELEMETRY, DEVICE_LIMITS], operator: THRESHOLD, workload: threshold },
    Case { name: "connect_reconcile", streams: &[COMMAND, ACK], operator: RECONCILE, workload: reconcile },
    Case {
        name: "window_join/tumbling",
        streams: &[COMMAND, STATUS],
        operator: WINDOW_JOIN_TUMBLING,
        workload: gateway,
    },
    Case { name: "window_join/sliding", streams: &[COMMAND, STATUS], operator: WINDOW_JOIN_SLIDING, workload: gateway },
    Case { name: "window_join/session", streams: &[COMMAND, STATUS], operator: WINDOW_JOIN_SESSION, workload: gateway },
    Case { name: "cogroup/tumbling", streams: &[COMMAND, STATUS], operator: COGROUP_TUMBLING, workload: gateway },
    Case { name: "cogroup/session", streams: &[COMMAND, STATUS], operator: COGROUP_SESSION, workload: gateway },
    Case { name: "interval_join", streams: &[COMMAND, STATUS], operator: INTERVAL_JOIN, workload: gateway },
    Case { name: "temporal_join", streams: &[TELEMETRY, DEVICE_CONFIG], operator: TEMPORAL_JOIN, workload: temporal },
    Case { name: "absence", streams: &[STATUS], operator: ABSENCE, workload: absence },
];

/// The case's plan and rows; prints what it does (rows per stream, results by kind, peak state).
fn setup(case: &Case) -> (Plan, Vec<Input>) {
    let streams: String = case.streams.iter().map(|(name, fields)| stream_section(name, fields)).collect();
    let text = streams + case.operator;
    let plan = config::parse("bench.toml", &text).unwrap_or_else(|e| panic!("{}: {e}", case.name));
    assert_eq!(plan.operators.len(), 1);
    let mut rng = Rng(SEED);
    let events = (case.workload)(&mut rng);
    let inputs = build(&plan, events, &mut rng);
    let mut per_stream = vec![0usize; plan.streams.len()];
    for input in &inputs {
        per_stream[input.stream] += 1;
    }
    let mut peak = (0, 0);
    let mut seen = 0u64;
    let dir = scratch_dir();
    let (figures, counts) = run_with(&plan, &inputs, dir.path(), |runtime| {
        seen += 1;
        if seen.is_multiple_of(256) {
            peak = peak.max(runtime.live_figures().operator_state[0]);
        }
    });
    assert_eq!(counts.late, 0, "{}: nothing is late", case.name);
    let streams: Vec<String> = plan.streams.iter().zip(&per_stream).map(|(s, n)| format!("{} {n}", s.name)).collect();
    let kinds: Vec<String> = ResultKind::ALL
        .iter()
        .zip(figures.operator_counters[0].results.iter().copied())
        .filter(|(_, n)| *n > 0)
        .map(|(kind, n)| format!("{} {n}", kind.as_str()))
        .collect();
    eprintln!(
        "case {}: {} rows ({}); {} results ({}), {:.3} per input row; peak state {} rows, {} bytes",
        case.name,
        inputs.len(),
        streams.join(", "),
        counts.results,
        kinds.join(", "),
        counts.results as f64 / inputs.len() as f64,
        peak.0,
        peak.1
    );
    (plan, inputs)
}

fn operators(c: &mut Criterion) {
    let mut group = c.benchmark_group("operators");
    group.sample_size(10);
    // One iteration is a whole workload (0.05–1 s): the same iterations in every sample.
    group.sampling_mode(SamplingMode::Flat);
    for case in &CASES {
        // The rows are counted here and built only if the case runs (a name filter skips the rest).
        group.throughput(Throughput::Elements((case.workload)(&mut Rng(SEED)).len() as u64));
        let prepared = OnceCell::new();
        group.bench_function(case.name, |b| {
            let (plan, inputs) = prepared.get_or_init(|| setup(case));
            b.iter_batched(
                || (inputs.clone(), scratch_dir()),
                |input| black_box(run(plan, input)),
                BatchSize::LargeInput,
            )
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    targets = operators
}
criterion_main!(benches);
