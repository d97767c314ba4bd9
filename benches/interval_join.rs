//! The interval join operator alone, one shard, over rows archived in memory.
//!
//! Workload (BENCHMARKS.md "interval_join"): the gateway join of CONTRACT.md — `command` (left)
//! ⋈ `status` (right) on `device`, bounds [−3 s, +5 s], `select = ["left.cmd_id",
//! "left.device", "right.seq", "right.ts AS status_ts"]`. Per device: a status every 4 s
//! (±0.5 s jitter, seq counting up), a command on average every 5 s (uniform 1–9 s gaps); one
//! device in ten is "dark" (commands, no status), so a left outer join has `left_only` rows.
//! Rows are fed in event-time order; a watermark `tick − 501 ms` (max_out_of_orderness 500 ms)
//! is given at every 200 ms event-time tick, as the engine's ticks would; nothing is late. The
//! output is counted and cleared after every call, as the engine drains it.
//!
//! Baselines in the same run, over the same rows:
//! - `baseline_clone_rows`: clone (and drop) every row: the allocation floor of a `Row`.
//! - `baseline_min_keyed_join`: the least a keyed interval join must do — a std `HashMap` keyed
//!   by key hash with a `VecDeque` of rows per side, key compare + bounds check against every
//!   stored row of the other side, FIFO eviction at each tick, matches only counted (no result
//!   rows, no ids, no timers).
//!
//! Inputs are cloned in `iter_batched` setup (not timed); dropping rows the operator evicts and
//! the results it emits is timed, as it is part of the work.

#![allow(clippy::unwrap_used)]

use std::collections::{HashMap, VecDeque};
use std::hint::black_box;
use std::time::Duration;

use braid::operator::interval_join::{JoinType, LEFT, RIGHT};
use braid::operator::projection::Column;
use braid::operator::{IntervalJoin, IntervalJoinSpec, Output, Projection, ResultKind};
use braid::record::id::{IdHasher, key_hash};
use braid::record::{Key, Row, Value};
use braid::time::{TICK_MS, Time};
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};

const LOWER_MS: i64 = -3_000;
const UPPER_MS: i64 = 5_000;
const MAX_OUT_OF_ORDERNESS_MS: i64 = 500;
const STATUS_PERIOD_MS: i64 = 4_000;
const STATUS_JITTER_MS: i64 = 500;
/// Command gaps are uniform in [MIN, MAX): mean 5 s.
const COMMAND_GAP_MS: (i64, i64) = (1_000, 9_000);
/// Event times start here (an ordinary epoch-ms value).
const EPOCH_MS: i64 = 1_700_000_000_000;
const SEED: u64 = 0x5eed_b4a1_d000_0001;

/// splitmix64: a fixed-seed PRNG, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [lo, hi).
    fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.next() % (hi - lo) as u64) as i64
    }
}

const COMMANDS: [&str; 4] = ["reboot", "set_mode", "ping", "update_fw"];
const STATES: [&str; 3] = ["ok", "busy", "rebooting"];

/// Command fields: device, ts, cmd, arg, cmd_id. Status fields: device, ts, temp, state, seq.
fn row(stream: &str, ts: i64, device: &str, values: Vec<Value>, ids: &mut IdHasher) -> Row {
    let key = Key::Str(device.into());
    ids.begin().str(stream);
    for v in &values {
        ids.value(v);
    }
    Row { ts, key_hash: key_hash(&key), key, id: ids.finish(), values: values.into() }
}

/// `(input, row)` in event-time order over `devices` devices and `seconds` of event time.
fn workload(devices: usize, seconds: i64) -> Vec<(usize, Row)> {
    let mut rng = Rng(SEED ^ devices as u64);
    let mut ids = IdHasher::default();
    let end = EPOCH_MS + seconds * 1000;
    let mut rows = Vec::new();
    for d in 0..devices {
        let device = format!("dev-{d:06}");
        let dark = d % 10 == 9;
        if !dark {
            let phase = rng.range(0, STATUS_PERIOD_MS);
            let mut seq = 0i64;
            loop {
                let jitter = rng.range(-STATUS_JITTER_MS, STATUS_JITTER_MS);
                let ts = (EPOCH_MS + phase + seq * STATUS_PERIOD_MS + jitter).max(EPOCH_MS);
                if ts >= end {
                    break;
                }
                let temp = 20.0 + rng.range(0, 1500) as f64 / 100.0;
                let state = STATES[rng.range(0, STATES.len() as i64) as usize];
                let values = vec![
                    Value::Str(device.as_str().into()),
                    Value::Int(ts),
                    Value::Float(temp),
                    Value::Str(state.into()),
                    Value::Int(seq),
                ];
                rows.push((RIGHT, row("status", ts, &device, values, &mut ids)));
                seq += 1;
            }
        }
        let mut ts = EPOCH_MS + rng.range(0, COMMAND_GAP_MS.1);
        while ts < end {
            let cmd = COMMANDS[rng.range(0, COMMANDS.len() as i64) as usize];
            let values = vec![
                Value::Str(device.as_str().into()),
                Value::Int(ts),
                Value::Str(cmd.into()),
                Value::Str(format!("v={}", rng.range(0, 100)).into()),
                Value::Str(format!("c-{:016x}", rng.next()).into()),
            ];
            rows.push((LEFT, row("command", ts, &device, values, &mut ids)));
            ts += rng.range(COMMAND_GAP_MS.0, COMMAND_GAP_MS.1);
        }
    }
    rows.sort_by_key(|(input, row)| (row.ts, *input));
    rows
}

/// The gateway join as `[operators.effect]` of CONTRACT.md plans it.
fn gateway_join(join: JoinType) -> IntervalJoin {
    // Result: device (key), cmd_id (command pos 4), seq (status pos 4), status_ts (status pos 1), _kind.
    let columns = vec![
        Column::Key,
        Column::Field { input: LEFT, pos: 4 },
        Column::Field { input: RIGHT, pos: 4 },
        Column::Field { input: RIGHT, pos: 1 },
        Column::Kind,
    ];
    let projection = Projection { columns, rekey: None };
    IntervalJoin::new(IntervalJoinSpec { name: "effect".into(), lower: LOWER_MS, upper: UPPER_MS, join, projection })
}

#[derive(Default, Debug)]
struct Counts {
    matches: u64,
    left_only: u64,
    right_only: u64,
    /// Kinds an interval join never emits.
    other: u64,
    late: u64,
}

impl Counts {
    fn take(&mut self, out: &mut Output) {
        for (kind, _) in &out.results {
            match kind {
                ResultKind::Match => self.matches += 1,
                ResultKind::LeftOnly => self.left_only += 1,
                ResultKind::RightOnly => self.right_only += 1,
                _ => self.other += 1,
            }
        }
        self.late += out.late.len() as u64;
        out.results.clear();
        out.late.clear();
    }
}

/// Feeds `rows` to a fresh join with a watermark at every 200 ms tick, then +∞.
fn run_join(join: JoinType, rows: Vec<(usize, Row)>) -> Counts {
    let mut op = gateway_join(join);
    let mut out = Output::default();
    let mut counts = Counts::default();
    let tick = TICK_MS as i64;
    let mut next_tick = rows.first().map_or(0, |(_, r)| (r.ts / tick + 1) * tick);
    for (input, row) in rows {
        while row.ts >= next_tick {
            op.on_watermark(Time::ms(next_tick - MAX_OUT_OF_ORDERNESS_MS - 1), &mut out);
            counts.take(&mut out);
            next_tick += tick;
        }
        op.on_row(input, row, &mut out);
        counts.take(&mut out);
    }
    op.on_watermark(Time::POS_INF, &mut out);
    counts.take(&mut out);
    counts
}

/// The largest state (rows, bytes as the operator counts them) seen at a tick; setup only.
fn peak_state(rows: &[(usize, Row)]) -> (usize, usize) {
    let mut op = gateway_join(JoinType::Inner);
    let mut out = Output::default();
    let mut peak = (0, 0);
    let tick = TICK_MS as i64;
    let mut next_tick = rows.first().map_or(0, |(_, r)| (r.ts / tick + 1) * tick);
    for (input, row) in rows {
        while row.ts >= next_tick {
            op.on_watermark(Time::ms(next_tick - MAX_OUT_OF_ORDERNESS_MS - 1), &mut out);
            peak = peak.max((op.state_rows(), op.state_bytes()));
            out.results.clear();
            next_tick += tick;
        }
        op.on_row(*input, row.clone(), &mut out);
        out.results.clear();
    }
    peak
}

/// The baseline join: hash probe, key compare, bounds check, FIFO eviction; matches counted.
fn run_min_keyed_join(rows: Vec<(usize, Row)>) -> u64 {
    let mut state: HashMap<u64, [VecDeque<Row>; 2]> = HashMap::new();
    let mut matches = 0u64;
    let tick = TICK_MS as i64;
    let mut next_tick = rows.first().map_or(0, |(_, r)| (r.ts / tick + 1) * tick);
    for (input, row) in rows {
        if row.ts >= next_tick {
            while row.ts >= next_tick {
                next_tick += tick;
            }
            let watermark = next_tick - tick - MAX_OUT_OF_ORDERNESS_MS - 1;
            state.retain(|_, sides| {
                while sides[LEFT].front().is_some_and(|r| r.ts + UPPER_MS < watermark) {
                    sides[LEFT].pop_front();
                }
                while sides[RIGHT].front().is_some_and(|r| r.ts - LOWER_MS < watermark) {
                    sides[RIGHT].pop_front();
                }
                !(sides[LEFT].is_empty() && sides[RIGHT].is_empty())
            });
        }
        let sides = state.entry(row.key_hash).or_default();
        for other in sides[1 - input].iter().filter(|o| o.key == row.key) {
            let (l, r) = if input == LEFT { (row.ts, other.ts) } else { (other.ts, row.ts) };
            if l + LOWER_MS <= r && r <= l + UPPER_MS {
                matches += 1;
            }
        }
        sides[input].push_back(row);
    }
    matches
}

fn bench_keys(c: &mut Criterion, devices: usize, seconds: i64) {
    let rows = workload(devices, seconds);
    let (left, right) = rows.iter().fold((0, 0), |(l, r), (i, _)| if *i == LEFT { (l + 1, r) } else { (l, r + 1) });
    let inner = run_join(JoinType::Inner, rows.clone());
    let outer = run_join(JoinType::Left, rows.clone());
    let baseline = run_min_keyed_join(rows.clone());
    assert_eq!(inner.matches, baseline, "the baseline must find the same pairs");
    assert_eq!((inner.late, outer.late, inner.other, outer.other), (0, 0, 0, 0));
    let (state_rows, state_bytes) = peak_state(&rows);
    eprintln!(
        "workload {devices} keys, {seconds} s: {} rows ({left} command, {right} status); inner {:?}; left outer \
         {:?}; matches per command {:.2}; peak state {state_rows} rows, {state_bytes} bytes",
        rows.len(),
        inner,
        outer,
        inner.matches as f64 / left as f64
    );

    let mut group = c.benchmark_group(format!("interval_join/{}k_keys", devices / 1000));
    group.throughput(Throughput::Elements(rows.len() as u64));
    group.sample_size(10);
    group.bench_function("inner", |b| {
        b.iter_batched(|| rows.clone(), |rows| black_box(run_join(JoinType::Inner, rows)), BatchSize::LargeInput)
    });
    group.bench_function("left_outer", |b| {
        b.iter_batched(|| rows.clone(), |rows| black_box(run_join(JoinType::Left, rows)), BatchSize::LargeInput)
    });
    group.bench_function("baseline_min_keyed_join", |b| {
        b.iter_batched(|| rows.clone(), |rows| black_box(run_min_keyed_join(rows)), BatchSize::LargeInput)
    });
    group.bench_function("baseline_clone_rows", |b| b.iter(|| black_box(rows.clone())));
    group.finish();
}

fn interval_join(c: &mut Criterion) {
    bench_keys(c, 1_000, 300);
    bench_keys(c, 10_000, 90);
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(5));
    targets = interval_join
}
criterion_main!(benches);
