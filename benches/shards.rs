//! The shard runtime (`src/shard/`) alone: the gateway interval join on 1 shard and on 2 shards,
//! in the same run, from feeder rings filled before the clock starts.
//!
//! Workload (BENCHMARKS.md "Shard runtime (issue 3)"): the gateway config of CONTRACT.md
//! (`common::gateway::config()`: `command` ⋈ `status` on `device`, [−3 s, +5 s], inner,
//! max_out_of_orderness 500 ms), the rows of benches/interval_join.rs (same generator and seed):
//! 1 000 devices over 300 s and 10 000 devices over 90 s of event time. Rows are built once, in
//! memory, as replay builds them (`common::gateway::stream_row`), and fed in event-time order;
//! each arrives at its event time, so nothing is late (asserted).
//!
//! One iteration:
//! 1. untimed: a fresh runtime (`Runtime::start`, `RuntimeOptions { hold: true,
//!    feed_ring_bytes }`) in a new temporary directory (on `/dev/shm` when it exists, so the
//!    ring files are not written back to disk), then `advance_to(arrival)` + `ingest` of every
//!    row: the feeder encodes every row and tick into the rings while the shards wait. The rings
//!    hold the whole workload (sized at setup from the exact frame sizes), so the feeder never
//!    waits and never releases the shards early; a result seen before `finish` fails the bench.
//! 2. timed: `finish`, which releases the shards and drains their results on the calling thread
//!    (the collector: `wire::read` + `to_row` per result, then a counting [`Emit`]) until every
//!    shard has ended. This includes building each shard's monoio runtime and operator instances
//!    (with their state arenas), joining the threads, and unmapping the rings (the runtime is
//!    dropped inside `finish`).
//! 3. untimed: the directory is removed.
//!
//! The collector shares the machine's cores with the shards. `Throughput::Elements` = input
//! rows. Printed to stderr at setup: the workload (rows, results, ring bytes); after each case:
//! the median wall time of its iterations and the CPU time of the shards and of the collector
//! during `finish` (`CLOCK_PROCESS_CPUTIME_ID` minus `CLOCK_THREAD_CPUTIME_ID`).

#![allow(clippy::unwrap_used)]

mod common;

use std::hint::black_box;
use std::path::Path;
use std::time::{Duration, Instant};

use braid::config;
use braid::operator::{ExpiryReason, Side};
use braid::plan::Plan;
use braid::record::Row;
use braid::record::input::InputRows;
use braid::ring::FRAME_HEADER;
use braid::shard::Emit;
use braid::shard::wire::Writer;
use braid::shard::{Runtime, RuntimeOptions};
use braid::time::TICK_MS;
use common::EPOCH_MS;
use common::gateway::{self, Event, stream_row};
use common::rng::Rng;
use criterion::{Criterion, SamplingMode, Throughput, criterion_group, criterion_main};

/// Shard counts measured, in this order.
const SHARDS: [usize; 2] = [1, 2];
/// Ring bytes of a tick frame (header and padding included; 112 with two streams).
const TICK_FRAME: usize = 128;
/// Room left over in every ring.
const RING_SLACK: usize = 1 << 20;

#[allow(clippy::disallowed_methods, reason = "a bench times itself (iter_custom)")]
fn now() -> Instant {
    Instant::now()
}

/// CPU time of `clock` (a `CLOCK_*_CPUTIME_ID`).
fn cpu(clock: libc::clockid_t) -> Duration {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `t` is a valid, writable timespec; `clock` is one of the CPU-time clocks.
    let r = unsafe { libc::clock_gettime(clock, &mut t) };
    assert_eq!(r, 0, "clock_gettime");
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// A row ready for `Runtime::ingest`.
struct Input {
    stream: usize,
    arrival: i128,
    row: Row,
}

/// Counts what the collector hands over.
#[derive(Default)]
struct Count {
    results: u64,
    late: u64,
}

impl Emit for Count {
    fn result(&mut self, _operator: usize, _row: &Row, _after_barrier: bool) {
        self.results += 1;
    }

    fn late(&mut self, _operator: usize, _input: usize, _row: &Row, _after_barrier: bool) {
        self.late += 1;
    }

    // These plans have no `ttl` and no byte budget: nothing expires.
    fn expired(&mut self, _: usize, _: ExpiryReason, _: Option<usize>, _: &Row, _: bool) {}
}

/// Adds up the ring bytes the collector's results took on the way (as `Output` frames).
#[derive(Default)]
struct OutputBytes {
    writer: Writer,
    results: u64,
    late: u64,
    bytes: usize,
}

impl Emit for OutputBytes {
    fn result(&mut self, operator: usize, row: &Row, _after_barrier: bool) {
        self.results += 1;
        self.bytes += frame_bytes(self.writer.output(operator, Side::Result, row).unwrap().len());
    }

    fn late(&mut self, _operator: usize, _input: usize, _row: &Row, _after_barrier: bool) {
        self.late += 1;
    }

    // These plans have no `ttl` and no byte budget: nothing expires.
    fn expired(&mut self, _: usize, _: ExpiryReason, _: Option<usize>, _: &Row, _: bool) {}
}

/// Ring bytes of a frame with this payload: header, payload padded to 16.
fn frame_bytes(payload: usize) -> usize {
    FRAME_HEADER + payload.next_multiple_of(FRAME_HEADER)
}

struct Workload {
    plan: Plan,
    inputs: Vec<Input>,
    results: u64,
    /// Bytes of each ring: the whole input and the whole output fit.
    ring_bytes: usize,
}

/// The rows of `common::join::rows(devices, seconds)`, built for the gateway config's streams.
fn inputs(plan: &Plan, devices: usize, seconds: i64) -> Vec<Input> {
    let (command, status) = (plan.stream("command").unwrap(), plan.stream("status").unwrap());
    let mut rng = Rng(common::join::SEED ^ devices as u64);
    let mut ids = InputRows::default();
    let mut inputs = Vec::new();
    gateway::gateway(&mut rng, devices, EPOCH_MS + seconds * 1000, |device, event| {
        let (stream, ts, values) = match event {
            Event::Status(s) => (status, s.ts, s.values(device)),
            Event::Command(c) => (command, c.ts, c.values(device)),
        };
        let row = stream_row(&mut ids, &plan.streams[stream], ts, values);
        inputs.push(Input { stream, arrival: i128::from(ts), row });
    });
    // Event-time order, commands first at equal ts (as `common::join::rows`).
    inputs.sort_by_key(|i| (i.row.ts, i.stream != command));
    inputs
}

/// A fresh runtime in `dir` with every row ingested, its shards held; `emit` sees what the
/// collector drained meanwhile (nothing, unless a full ring released the shards early).
fn fed(plan: &Plan, inputs: &[Input], shards: usize, dir: &Path, ring_bytes: usize, emit: &mut impl Emit) -> Runtime {
    let options = RuntimeOptions { feed_ring_bytes: ring_bytes, hold: true, ..RuntimeOptions::new(shards, dir) };
    let start = inputs.first().map_or(0, |i| i.arrival);
    let mut runtime = Runtime::start(plan, &options, start).unwrap();
    for i in inputs {
        runtime.advance_to(i.arrival, emit).unwrap();
        runtime.ingest(i.stream, &i.row, i.arrival, emit).unwrap();
    }
    runtime
}

/// A new directory for the ring files: on `/dev/shm` (tmpfs) when there is one.
fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir_in(braid::storage::mapped_file::scratch_base()).unwrap()
}

fn setup(devices: usize, seconds: i64) -> Workload {
    let plan = config::parse("gateway.toml", &gateway::config()).expect("the bench config is valid");
    let inputs = inputs(&plan, devices, seconds);
    let mut writer = Writer::default();
    let row_bytes: usize =
        inputs.iter().map(|i| frame_bytes(writer.row_event(0, i.stream, &i.row).unwrap().len())).sum();
    let span_ms = inputs.last().unwrap().arrival - inputs[0].arrival;
    let ticks = (span_ms / TICK_MS) as usize + 2;
    let input_bytes = row_bytes + ticks * TICK_FRAME + RING_SLACK;

    // One run on one shard, with room to spare, counts the results and the ring bytes they take.
    let mut out = OutputBytes::default();
    let dir = tempdir();
    let runtime = fed(&plan, &inputs, 1, dir.path(), (2 * input_bytes).next_multiple_of(FRAME_HEADER), &mut out);
    assert_eq!(out.results, 0, "held shards ran before finish");
    runtime.finish(&mut out).unwrap();
    assert_eq!(out.late, 0, "nothing is late");
    let ring_bytes = (input_bytes.max(out.bytes + RING_SLACK)).next_multiple_of(FRAME_HEADER);
    let commands = inputs.iter().filter(|i| i.stream == plan.stream("command").unwrap()).count();
    eprintln!(
        "workload {devices} keys, {seconds} s: {} rows ({commands} command + {} status), {} results ({:.2} per \
         command), 0 late; row frames {row_bytes} B ({:.0} B/row), result frames {} B ({:.0} B/result); rings of \
         {ring_bytes} B",
        inputs.len(),
        inputs.len() - commands,
        out.results,
        out.results as f64 / commands as f64,
        row_bytes as f64 / inputs.len() as f64,
        out.bytes,
        out.bytes as f64 / out.results as f64,
    );
    Workload { plan, inputs, results: out.results, ring_bytes }
}

/// Per case: the wall time of every iteration's `finish`, and the CPU time spent in it.
#[derive(Default)]
struct Stats {
    walls: Vec<Duration>,
    shard_cpu: Duration,
    collector_cpu: Duration,
}

impl Stats {
    /// One iteration; returns the time `finish` took.
    fn run(&mut self, w: &Workload, shards: usize) -> Duration {
        let dir = tempdir();
        let mut count = Count::default();
        let runtime = fed(&w.plan, &w.inputs, shards, dir.path(), w.ring_bytes, &mut count);
        assert_eq!(count.results, 0, "held shards ran before finish: a feeder ring filled up");
        let (process, thread) = (cpu(libc::CLOCK_PROCESS_CPUTIME_ID), cpu(libc::CLOCK_THREAD_CPUTIME_ID));
        let start = now();
        let figures = runtime.finish(&mut count).unwrap();
        let wall = start.elapsed();
        let collector = cpu(libc::CLOCK_THREAD_CPUTIME_ID) - thread;
        let all = cpu(libc::CLOCK_PROCESS_CPUTIME_ID) - process;
        assert_eq!((count.results, count.late), (w.results, 0));
        black_box(figures);
        self.walls.push(wall);
        self.shard_cpu += all.saturating_sub(collector);
        self.collector_cpu += collector;
        wall
    }

    /// Prints the case's figures; returns its median wall time (none if it did not run).
    fn report(&mut self, name: &str, rows: usize) -> Option<Duration> {
        if self.walls.is_empty() {
            return None;
        }
        self.walls.sort();
        let median = self.walls[self.walls.len() / 2];
        let n = self.walls.len() as u32;
        let wall: Duration = self.walls.iter().sum();
        eprintln!(
            "{name}: {n} iterations, median finish {:.1} ms ({:.3} M rows/s); per iteration: shard CPU {:.1} ms, \
             collector CPU {:.1} ms, {:.2} cores busy",
            median.as_secs_f64() * 1e3,
            rows as f64 / median.as_secs_f64() / 1e6,
            (self.shard_cpu / n).as_secs_f64() * 1e3,
            (self.collector_cpu / n).as_secs_f64() * 1e3,
            (self.shard_cpu + self.collector_cpu).as_secs_f64() / wall.as_secs_f64(),
        );
        Some(median)
    }
}

fn shards(c: &mut Criterion) {
    for (devices, seconds) in [(1_000, 300), (10_000, 90)] {
        let w = setup(devices, seconds);
        let rows = w.inputs.len();
        let group_name = format!("shards/gateway_{}k_keys", devices / 1000);
        let mut group = c.benchmark_group(&group_name);
        group.throughput(Throughput::Elements(rows as u64));
        group.sample_size(10);
        // One iteration is a whole workload (0.1–1 s): the same iterations in every sample.
        group.sampling_mode(SamplingMode::Flat);
        let mut medians = Vec::new();
        for shards in SHARDS {
            let name = if shards == 1 { "1_shard".to_string() } else { format!("{shards}_shards") };
            let mut stats = Stats::default();
            group.bench_function(&name, |b| b.iter_custom(|iters| (0..iters).map(|_| stats.run(&w, shards)).sum()));
            if let Some(median) = stats.report(&format!("{group_name}/{name}"), rows) {
                medians.push((shards, median));
            }
        }
        if let [(1, one), (n, many)] = medians[..] {
            eprintln!(
                "{group_name}: {n} shards / 1 shard throughput {:.2} (medians of this run's iterations)",
                one.as_secs_f64() / many.as_secs_f64()
            );
        }
        group.finish();
    }
}

/// What the join-quality counters cost (issue 15; BENCHMARKS.md "Cost of the join-quality
/// counters"): the 10 k-keys workload on 1 shard (every row is evicted, so every row is counted),
/// each iteration a pair — counting on and off ([`braid::operator::count_join_quality`]), in
/// alternating order — so both see the same machine; the ratio of the medians and the median of
/// the pairs' ratios.
fn join_quality_cost(c: &mut Criterion) {
    let w = setup(10_000, 90);
    let rows = w.inputs.len();
    let mut group = c.benchmark_group("shards/join_quality_cost");
    group.throughput(Throughput::Elements(rows as u64));
    group.sample_size(10);
    group.sampling_mode(SamplingMode::Flat);
    let (mut on, mut off) = (Stats::default(), Stats::default());
    let mut ratios = Vec::new();
    group.bench_function("pairs_on_and_off", |b| {
        b.iter_custom(|iters| {
            let mut timed = Duration::ZERO;
            for i in 0..iters {
                // Half the pairs run "off" first, so neither side always runs second.
                let mut measure = |counting: bool| {
                    braid::operator::count_join_quality(counting);
                    let wall = if counting { on.run(&w, 1) } else { off.run(&w, 1) };
                    braid::operator::count_join_quality(true);
                    wall
                };
                let (with, without) = if i % 2 == 0 {
                    let with = measure(true);
                    (with, measure(false))
                } else {
                    let without = measure(false);
                    (measure(true), without)
                };
                ratios.push(without.as_secs_f64() / with.as_secs_f64());
                timed += with;
            }
            timed
        })
    });
    let with = on.report("shards/join_quality_cost/counting_on", rows);
    let without = off.report("shards/join_quality_cost/counting_off", rows);
    if let (Some(with), Some(without)) = (with, without) {
        ratios.sort_by(f64::total_cmp);
        eprintln!(
            "shards/join_quality_cost: throughput with / without the counters {:.4} (medians), median pair {:.4}, \
             {} pairs",
            without.as_secs_f64() / with.as_secs_f64(),
            ratios[ratios.len() / 2],
            ratios.len()
        );
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(5));
    targets = shards, join_quality_cost
}
criterion_main!(benches);
