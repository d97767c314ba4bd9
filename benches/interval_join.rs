//! The interval join operator alone, one shard, over rows archived in memory.
//!
//! Workload (BENCHMARKS.md "interval_join"): the gateway join of CONTRACT.md — `command` (left)
//! ⋈ `status` (right) on `device`, bounds [−3 s, +5 s], `select = ["left.cmd_id",
//! "left.device", "right.seq", "right.ts AS status_ts"]`. Per device: a status every 4 s
//! (±0.5 s jitter, seq counting up), a command on average every 5 s (uniform 1–9 s gaps); one
//! device in ten is "dark" (commands, no status), so a left outer join has `left_only` rows.
//! Rows are fed in event-time order; a watermark `tick − 501 ms` (max_out_of_orderness 500 ms)
//! is given at every 200 ms event-time tick, as the engine's ticks would; nothing is late. The
//! output is counted and cleared after every call, as the engine drains it. The rows, the
//! operator and its driver are `benches/common/join.rs`'s.
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

mod common;

use std::collections::{HashMap, VecDeque};
use std::hint::black_box;
use std::time::Duration;

use braid::operator::interval_join::{JoinType, LEFT, RIGHT};
use braid::record::Row;
use braid::time::TICK_MS;
use common::join::{Counts, Driver, LOWER_MS, MAX_OUT_OF_ORDERNESS_MS, PeakState, UPPER_MS};
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};

/// Feeds `rows` to a fresh join with a watermark at every 200 ms tick, then +∞.
fn run_join(join: JoinType, rows: Vec<(usize, Row)>) -> Counts {
    Driver::run(join, Counts::default(), rows)
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
    let rows = common::join::rows(devices, seconds);
    let (left, right) = rows.iter().fold((0, 0), |(l, r), (i, _)| if *i == LEFT { (l + 1, r) } else { (l, r + 1) });
    let inner = run_join(JoinType::Inner, rows.clone());
    let outer = run_join(JoinType::Left, rows.clone());
    let baseline = run_min_keyed_join(rows.clone());
    assert_eq!(inner.matches, baseline, "the baseline must find the same pairs");
    assert_eq!((inner.late, outer.late, inner.other, outer.other), (0, 0, 0, 0));
    let PeakState((state_rows, state_bytes)) = Driver::run(JoinType::Inner, PeakState::default(), rows.iter().cloned());
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
