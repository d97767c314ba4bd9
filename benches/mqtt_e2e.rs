//! MQTT end to end through mosquitto on loopback: is braid ever the bottleneck? (DESIGN.md
//! "Performance targets": braid's ingest ≥ 95 % of the rate mosquitto alone delivers to a plain
//! subscriber.) Not criterion: one measurement is a few processes talking over TCP for seconds.
//!
//! `cargo bench --bench mqtt_e2e` (about 1.5 minutes). Flags after `--`: `--messages N` (the
//! saturation load, default [`MESSAGES`]: N/2 devices), `--publishers P` (the saturation load's
//! publisher clients, default [`PUBLISHERS`]; the devices are dealt round-robin among them),
//! `--runs K` (default 3), `--saturation-only` (skips part 2), `--fixed-seconds S` (part 2's
//! length, default [`FIXED_SECONDS`]; braid's memory is read at its end: 60 s lets the rings wrap), `--sniff PREFIX` (diagnosis
//! only: a `mosquitto_sub -t '#'` records every message of the fixed-load runs with its receipt
//! time in `PREFIX-RUN-nodelay|default`, to split latency into hops; it adds a subscriber to the
//! broker), `--braid PATH` (another braid binary, e.g. one built from an older commit, to compare
//! two builds in one session), `--runtime 'KEY = VALUE'` (a line added to braid's `[runtime]`, e.g.
//! `checkpoint_interval = "1h"` to see what checkpoints cost; a `shards = N` line replaces the
//! default `"auto"`), `--passes K` (the saturation load K
//! times through one braid, K ≤ 3, each pass 10 s of event time after the previous and only the
//! last measured: braid's files and memory as after a while of running — the previous pass's rows
//! leave the state as the next one's arrive — not fresh), `--saturation-only` (skip the fixed
//! load), `--other-broker` (a fourth saturation measurement, (d) below). The bench runs only when Cargo passes `--bench`, so `cargo test --benches` builds it
//! and returns at once: never a timed test.
//!
//! Processes: a private mosquitto for every measurement (127.0.0.1, a free port, never 1883; no
//! persistence; `max_queued_messages 0`, so nothing is dropped when a subscriber falls behind;
//! `max_inflight_messages 1000`); the `braid` binary that `cargo bench` builds with the bench
//! profile next to this bench (`env!("CARGO_BIN_EXE_braid")`: Cargo builds a package's binaries
//! before its benches and integration tests and tells them the path), running `braid run` on the
//! gateway join of configs/gateway.toml (command ⋈ status on device, [−3 s, +5 s], left outer,
//! shards "auto") with its source on that mosquitto, its results sent back to the same mosquitto
//! (`up/effect/{device}`, QoS 1) by an MQTT sink, a fresh temporary state directory and
//! `[ops] listen` on a free port; and this bench's rumqttc clients.
//!
//! 1. **Saturation**, (a), (b), (c) in turn, `runs` times, each on a fresh mosquitto:
//!    - (a) baseline: the load generator (P clients, QoS 1, ≤ 1000 un-acked each, as fast as the
//!      broker acks) publishes N prepared messages on `devices/ID/status|command` and a plain
//!      rumqttc subscriber (QoS 1, `devices/#`) counts them: rate = N / (first → last receipt);
//!    - (b) the same load with braid subscribed instead, and a subscriber on `up/#` counting its
//!      results: braid's ingest rate = N / (first → last change of `braid_ingest_taken_total`,
//!      the messages the feeder journaled and put into the shards' rings, read on `/metrics`
//!      every 10 ms); results/s = results received / (first → last receipt). **Ratio = (b) / (a).**
//!    - (c) diagnosis: as (b), but braid writes its results to a file: the broker then carries
//!      the same traffic as in (a), so (c) / (a) is braid's ingest against mosquitto with the
//!      results' extra broker work taken out.
//!    - (d) with `--other-broker`: as (b), but the results go to a second mosquitto of their own
//!      (DESIGN.md: "results to a file or another broker"), counted there; the devices' broker
//!      carries the same traffic as in (a), and the second one's CPU is shown beside it.
//!
//!    Workload: N/2 devices, each one status then one command, all with the same event time (no
//!    row can be late), so every command matches exactly one status: N/2 `match` results
//!    (checked). The messages are prepared before the clock starts. Before each measurement braid
//!    is warmed up: a status and a command of device `warmup` until its result comes back
//!    (subscribed, joining, sink connected); the warm-up's results are not counted.
//! 2. **Fixed load below saturation**: `braid::demo::devices` (10 000 devices, 20 % commands,
//!    most followed by a status change 0.2–3 s later; `ts` = wall clock when the message is made)
//!    paced by its token bucket at min(½ × median baseline, 5 000 msg/s) for 5 s, into mosquitto
//!    as configured above (Nagle's algorithm on, its default) and with `set_tcp_nodelay true`,
//!    alternating. A subscriber on `up/#` times every `match` result: receipt − the making time
//!    of its later row, which the simulator notes to the µs ([`MadeAt`]; the result names its
//!    command by `cmd_id`, its status by device and `seq`), and receipt − `_ts` (the later row's
//!    `ts`, the same time truncated to the ms: 0–1 ms too long; the bench's only figure before
//!    BENCHMARKS.md "Latency timed to the µs"). Delivered = messages braid took / messages PUBACKed to the simulator. Before
//!    each, the same load (same seed) goes through a fresh mosquitto with no braid and a
//!    subscriber on `devices/#` times every message the same two ways: "mosquitto alone", the
//!    cost of one broker crossing on this machine; a result crosses twice (the device's message
//!    in, the result out). After each run the bench prints the shards' histograms from `/metrics`
//!    and the share of a row's results they held within 10 µs over the whole run and over its
//!    second half (read halfway and at the end): the join keeps 8 s of rows and the devices come
//!    within seconds, so the first half holds the state's growth (new segments, the key index
//!    doubling) and the second a state that keeps its size, as a gateway's does after a while.
//!
//! During every measured phase the bench reads CPU time per process and per braid thread from
//! `/proc` (`braid`: the intake — MQTT sources and sinks, journal, feeder, collector;
//! `braid-io`: `/metrics`, signals; `braid-shard-N`) and the cores' busy time from `/proc/stat`
//! ("others": work of other processes on the machine), and each braid thread's voluntary and
//! involuntary context switches from `/proc/PID/task/*/status`. On a 2-core machine braid,
//! mosquitto and the load generator share the CPU.
#![allow(clippy::unwrap_used, clippy::print_stdout, clippy::disallowed_methods)]

#[path = "mqtt_e2e/clients.rs"]
mod clients;
#[path = "mqtt_e2e/procs.rs"]
mod procs;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use braid::demo::devices::MadeAt;
use braid::shard::result_latency::quantile_bucket;
use clients::{Subscriber, Timing, publish_all, publish_pair, saturation_messages, wall_us};
use procs::{
    ALL_THREADS, Braid, BraidRun, Egress, Memory, Mosquitto, Switches, SystemTimes, ThreadTimes, histogram_bound,
    histogram_buckets, histogram_since, load1, metric, metrics, share_within,
};

/// Messages per saturation phase (a few seconds of mosquitto's rate here).
const MESSAGES: usize = 100_000;
/// Event time between two passes (`--passes`): past the join's upper bound (5 s) and its
/// out-of-orderness, so a pass's rows leave the state as the next pass's arrive; the passes after
/// the first are a few seconds ahead of the wall clock, within `max_skew` (30 s) for
/// [`MAX_PASSES`].
const PASS_STEP_MS: i64 = 10_000;
const MAX_PASSES: usize = 3;
const RUNS: usize = 3;
/// Load generator clients (`--publishers`).
const PUBLISHERS: usize = 2;
/// How often braid's `/metrics` is read while it ingests.
const POLL: Duration = Duration::from_millis(10);
/// The bound on waiting for braid to take or emit what it was given.
const DRAIN: Duration = Duration::from_secs(60);
/// The fixed load: at most this rate, for this long, from this many devices.
const FIXED_RATE_CAP: f64 = 5_000.0;
const FIXED_SECONDS: f64 = 5.0;
const FIXED_DEVICES: usize = 10_000;
/// The warm-up device (its results are not counted).
const WARMUP: &str = "warmup";

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if !args.iter().any(|a| a == "--bench") {
        eprintln!("mqtt_e2e: a benchmark, not a test; run it with `cargo bench --bench mqtt_e2e`");
        return;
    }
    let value = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let number = |name: &str, default: usize| value(name).map_or(default, |v| v.parse().unwrap());
    let (messages, runs) = (number("--messages", MESSAGES) / 2 * 2, number("--runs", RUNS).max(1));
    let passes = number("--passes", 1).clamp(1, MAX_PASSES);
    let load = Load { messages, publishers: number("--publishers", PUBLISHERS).max(1), passes };
    let sniff = value("--sniff");
    assert!(Path::new(procs::MOSQUITTO).exists(), "{} is missing: apt-get install -y mosquitto", procs::MOSQUITTO);
    let bin = BraidRun {
        bin: value("--braid").map_or_else(procs::braid_binary, std::path::PathBuf::from),
        runtime: value("--runtime").unwrap_or_default(),
    };
    let started = Instant::now();
    println!("mqtt_e2e: {}", procs::machine());
    println!("mqtt_e2e: braid = {}", bin.bin.display());
    if passes > 1 {
        println!("mqtt_e2e: {passes} passes of the saturation load through each braid, the last measured");
    }
    if !bin.runtime.is_empty() {
        println!("mqtt_e2e: [runtime] adds {}", bin.runtime);
    }
    println!(
        "mqtt_e2e: saturation: {messages} messages ({} devices × status + command), {} publishers, {runs} runs",
        messages / 2,
        load.publishers
    );
    let other_broker = args.iter().any(|a| a == "--other-broker");
    let mut saturation = Vec::new();
    for run in 1..=runs {
        let a = baseline(load);
        println!("  run {run} (a) mosquitto alone      {}", a.line());
        let b = through_braid(&bin, load, Results::SameBroker);
        println!("  run {run} (b) braid, results MQTT  {}", b.line());
        let c = through_braid(&bin, load, Results::File);
        println!("  run {run} (c) braid, results file  {}", c.line());
        let d = other_broker.then(|| through_braid(&bin, load, Results::OtherBroker));
        if let Some(d) = &d {
            println!("  run {run} (d) braid, results to another broker  {}", d.line());
        }
        saturation.push(Saturation { a, b, c, d });
    }
    let mut baselines: Vec<f64> = saturation.iter().map(|s| s.a.delivered).collect();
    baselines.sort_by(f64::total_cmp);
    let rate = (baselines[baselines.len() / 2] / 2.0).min(FIXED_RATE_CAP).floor();
    let fixed_runs = if args.iter().any(|a| a == "--saturation-only") { 0 } else { runs };
    let seconds = value("--fixed-seconds").map_or(FIXED_SECONDS, |s| s.parse().expect("--fixed-seconds SECONDS"));
    if fixed_runs > 0 {
        println!("mqtt_e2e: fixed load: {rate} msg/s for {seconds} s from {FIXED_DEVICES} devices, {runs} runs each");
    }
    let mut fixed = Vec::new();
    for run in 1..=fixed_runs {
        for nodelay in [false, true] {
            let sniff = sniff.as_ref().map(|p| format!("{p}-{run}-{}", if nodelay { "nodelay" } else { "default" }));
            let f = fixed_load(&bin, Pace { rate, seconds }, run as u64, nodelay, sniff.as_deref());
            println!("  run {run} {}", f.line());
            fixed.push(f);
        }
    }
    print_tables(load, &saturation, Pace { rate, seconds }, &fixed);
    println!("\nmqtt_e2e: {:.0} s in all", started.elapsed().as_secs_f64());
}

/// CPU use over a measured phase.
struct Cpu {
    seconds: f64,
    /// Average busy cores (0 … nproc) of the whole machine.
    cores_busy: f64,
    /// (process, share of one core), busiest first.
    processes: Vec<(String, f64)>,
    /// braid's threads: (name, share of one core), busiest first.
    braid_threads: Vec<(String, f64)>,
    /// Context switches of braid's threads: voluntary (sleeping and waking, hand-offs between
    /// threads) and involuntary (preempted by the broker or the load generator).
    braid_switches: Switches,
    load1: f64,
}

impl Cpu {
    fn share(&self, process: &str) -> f64 {
        self.processes.iter().find(|(p, _)| p == process).map_or(0.0, |(_, s)| *s)
    }

    /// CPU time of `process` per message, µs.
    fn us_per(&self, process: &str, messages: u64) -> f64 {
        self.share(process) * self.seconds / messages.max(1) as f64 * 1e6
    }

    fn summary(&self) -> String {
        let ours: f64 = self.processes.iter().map(|(_, s)| s).sum();
        let processes: Vec<String> = self.processes.iter().map(|(p, s)| format!("{p} {s:.2}")).collect();
        let threads: Vec<String> = self.braid_threads.iter().map(|(t, s)| format!("{t} {:.0}%", s * 100.0)).collect();
        let mut line = format!(
            "load {:.2}, cores busy {:.2} = {} + others {:.2}",
            self.load1,
            self.cores_busy,
            processes.join(" + "),
            (self.cores_busy - ours).max(0.0)
        );
        if !threads.is_empty() {
            let Switches { voluntary, involuntary } = self.braid_switches;
            line += &format!(
                "; braid threads: {}; {} context switches ({voluntary} voluntary, {involuntary} involuntary)",
                threads.join(", "),
                voluntary + involuntary
            );
        }
        line
    }
}

/// Reads CPU times at the start of a phase; [`CpuWatch::stop`] at its end.
struct CpuWatch {
    pids: Vec<(&'static str, u32)>,
    threads: ThreadTimes,
    system: SystemTimes,
    at: Instant,
    load1: f64,
}

impl CpuWatch {
    fn start(pids: Vec<(&'static str, u32)>) -> CpuWatch {
        let load1 = load1();
        CpuWatch { threads: ThreadTimes::read(&pids), system: SystemTimes::read(), at: Instant::now(), pids, load1 }
    }

    fn stop(&self) -> Cpu {
        let seconds = self.at.elapsed().as_secs_f64();
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let now = ThreadTimes::read(&self.pids);
        let busy = now.busy_since(&self.threads, seconds);
        let processes = busy.iter().filter(|(_, t, _)| t == ALL_THREADS).map(|(p, _, s)| (p.clone(), *s)).collect();
        let braid_threads =
            busy.iter().filter(|(p, t, _)| p == "braid" && t != ALL_THREADS).map(|(_, t, s)| (t.clone(), *s)).collect();
        Cpu {
            seconds,
            cores_busy: SystemTimes::read().cores_busy_since(&self.system, cores),
            processes,
            braid_threads,
            braid_switches: now.switches_since(&self.threads, "braid"),
            load1: self.load1,
        }
    }
}

/// The saturation load: `messages` messages (`messages / 2` devices) from `publishers` clients.
#[derive(Clone, Copy)]
struct Load {
    messages: usize,
    publishers: usize,
    /// Passes of the saturation load through one braid, the last measured (`--passes`).
    passes: usize,
}

/// One saturation run.
struct Saturation {
    a: Baseline,
    b: ThroughBraid,
    c: ThroughBraid,
    /// With `--other-broker`.
    d: Option<ThroughBraid>,
}

/// Where braid's results go in a saturation measurement.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Results {
    /// (b): back into the devices' broker.
    SameBroker,
    /// (c): a file.
    File,
    /// (d): a second mosquitto.
    OtherBroker,
}

/// (a): mosquitto alone to a plain subscriber.
struct Baseline {
    /// Messages per second the subscriber received (first → last receipt).
    delivered: f64,
    /// Messages per second the broker acknowledged to the publishers.
    accepted: f64,
    cpu: Cpu,
}

impl Baseline {
    fn line(&self) -> String {
        format!(
            "delivered {:>6.0}/s (publishers acked {:>6.0}/s) | {}",
            self.delivered,
            self.accepted,
            self.cpu.summary()
        )
    }
}

fn baseline(Load { messages, publishers, .. }: Load) -> Baseline {
    let broker = Mosquitto::start(false);
    let subscriber = Subscriber::start(broker.port, "devices/#", "/none", Timing::Off);
    let lists = saturation_messages(messages / 2, publishers, wall_us() / 1000);
    let watch = CpuWatch::start(vec![("mosquitto", broker.pid()), ("bench", std::process::id())]);
    let published = publish_all(broker.port, lists, "a");
    let all = subscriber.wait_for(messages as u64, DRAIN);
    let cpu = watch.stop();
    let received = subscriber.finish();
    assert!(all, "the plain subscriber got {} of {messages}; mosquitto log:\n{}", received.count, broker.log());
    Baseline {
        delivered: received.rate(),
        accepted: published.messages as f64 / (published.end - published.start).as_secs_f64(),
        cpu,
    }
}

/// (b) or (c): the same load through braid.
struct ThroughBraid {
    /// Messages per second braid took (first → last change of `braid_ingest_taken_total`).
    ingest: f64,
    accepted: f64,
    /// Results: received on `up/#` (MQTT egress) or counted by braid (file egress).
    results: u64,
    /// Results per second received on `up/#` (first → last receipt); NaN for file egress.
    result_rate: f64,
    /// From the first publish to the last result received (MQTT egress).
    done: Option<Duration>,
    late: u64,
    dead_letters: u64,
    cpu: Cpu,
}

impl ThroughBraid {
    fn line(&self) -> String {
        let out = match self.done {
            Some(done) => format!(", out {:.0}/s, last after {:.2} s", self.result_rate, done.as_secs_f64()),
            None => String::new(),
        };
        format!(
            "ingest {:>6.0}/s (publishers acked {:>6.0}/s), {} results{out}, late {}, dead {} | {}",
            self.ingest,
            self.accepted,
            self.results,
            self.late,
            self.dead_letters,
            self.cpu.summary()
        )
    }
}

fn taken(braid: &Braid) -> Option<u64> {
    metrics(braid.ops_port).map(|m| metric(&m, "braid_ingest_taken_total", ""))
}

fn matches(braid: &Braid) -> u64 {
    metrics(braid.ops_port).map_or(0, |m| metric(&m, "braid_operator_results_total", "kind=\"match\""))
}

/// braid's match count once it reaches `target`, or after [`DRAIN`] (its figures are copied about
/// once a second).
fn matches_reach(braid: &Braid, target: u64) -> u64 {
    let since = Instant::now();
    while matches(braid) < target && since.elapsed() < DRAIN {
        std::thread::sleep(Duration::from_millis(100));
    }
    matches(braid)
}

/// Publishes warm-up pairs until braid has joined one: its result arrived on `up/#` (MQTT
/// egress) or braid counted it (file egress). Returns braid's taken count and match count once
/// they stand still.
fn warm_up(broker: &Mosquitto, braid: &Braid, results: Option<&Subscriber>) -> (u64, u64) {
    let joined = || match results {
        Some(r) => r.ignored() > 0,
        None => matches(braid) > 0,
    };
    let since = Instant::now();
    while !joined() {
        assert!(since.elapsed() < Duration::from_secs(30), "braid joined no warm-up pair; its log:\n{}", braid.log());
        publish_pair(broker.port, WARMUP);
        let tried = Instant::now();
        // braid's own figures are copied once a second.
        let patience = Duration::from_millis(if results.is_some() { 300 } else { 1200 });
        while !joined() && tried.elapsed() < patience {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    standstill(braid, results.is_some())
}

/// braid's taken count and match count once they stand still (its figures are copied about once
/// a second; with MQTT egress the results were seen arriving already, a shorter look will do).
fn standstill(braid: &Braid, results_seen: bool) -> (u64, u64) {
    let mut last = (taken(braid).unwrap(), matches(braid));
    loop {
        std::thread::sleep(Duration::from_millis(if results_seen { 100 } else { 1100 }));
        let now = (taken(braid).unwrap(), matches(braid));
        if now == last {
            return now;
        }
        last = now;
    }
}

/// Polls `braid_ingest_taken_total` until it reaches `target`; returns when it first moved past
/// `from` and when it reached `target` (each seen within [`POLL`]), and the CPU use until then.
fn watch_ingest(braid: &Braid, from: u64, target: u64, watch: &CpuWatch) -> (Instant, Instant, Cpu) {
    let since = Instant::now();
    let mut first = None;
    loop {
        let now = taken(braid).unwrap_or(from);
        let at = Instant::now();
        if now > from {
            first.get_or_insert(at);
        }
        if now >= target {
            return (first.unwrap_or(at), at, watch.stop());
        }
        assert!(
            since.elapsed() < DRAIN,
            "braid took {} of {} messages within {DRAIN:?}; its log:\n{}",
            now - from,
            target - from,
            braid.log()
        );
        std::thread::sleep(POLL);
    }
}

fn through_braid(bin: &BraidRun, Load { messages, publishers, passes }: Load, to: Results) -> ThroughBraid {
    let broker = Mosquitto::start(false);
    let results_broker = (to == Results::OtherBroker).then(|| Mosquitto::start(false));
    let results_port = results_broker.as_ref().map_or(broker.port, |b| b.port);
    let egress = if to == Results::File { Egress::File } else { Egress::Mqtt(results_port) };
    let mut braid = Braid::start(bin, broker.port, egress);
    let subscribe = || (egress != Egress::File).then(|| Subscriber::start(results_port, "up/#", WARMUP, Timing::Off));
    let mut results = subscribe();
    let (mut from, mut matched_before) = warm_up(&broker, &braid, results.as_ref());
    let first_ts = wall_us() / 1000;
    let pass_ts = |pass: usize| first_ts + pass as i64 * PASS_STEP_MS;
    let expected = messages as u64 / 2;
    for pass in 0..passes - 1 {
        publish_all(broker.port, saturation_messages(messages / 2, publishers, pass_ts(pass)), "b");
        let arrived = match &results {
            // The subscriber counts every pass's results.
            Some(subscriber) => subscriber.wait_for((pass as u64 + 1) * expected, DRAIN),
            None => matches_reach(&braid, matched_before + expected) >= matched_before + expected,
        };
        assert!(arrived, "pass {pass}: not all of its {expected} results; braid's log:\n{}", braid.log());
        (from, matched_before) = standstill(&braid, results.is_some());
    }
    if passes > 1
        && let Some(earlier) = results.take()
    {
        // The measured pass's results on a subscriber of their own (the earlier ones all arrived).
        earlier.finish();
        results = subscribe();
    }
    let lists = saturation_messages(messages / 2, publishers, pass_ts(passes - 1));
    // For a profiler to attach to the measured pass alone (the earlier ones grow the state).
    eprintln!("mqtt_e2e: measured pass begins, braid pid {}", braid.pid());
    let mut pids = vec![("braid", braid.pid()), ("mosquitto", broker.pid()), ("bench", std::process::id())];
    pids.extend(results_broker.as_ref().map(|b| ("mosquitto (results)", b.pid())));
    let watch = CpuWatch::start(pids);
    let (published, (first, last, cpu)) = std::thread::scope(|s| {
        let poller = s.spawn(|| watch_ingest(&braid, from, from + messages as u64, &watch));
        let published = publish_all(broker.port, lists, "b");
        (published, poller.join().unwrap())
    });
    let (results, result_rate, done) = match results {
        Some(subscriber) => {
            let all = subscriber.wait_for(expected, DRAIN);
            let received = subscriber.finish();
            assert!(all, "braid's results: {} of {expected} arrived; its log:\n{}", received.count, braid.log());
            (received.count, received.rate(), received.last.map(|l| l - published.start))
        }
        None => (matches_reach(&braid, matched_before + expected) - matched_before, f64::NAN, None),
    };
    let m = metrics(braid.ops_port).unwrap_or_default();
    braid.stop();
    assert_eq!(results, expected, "braid's results; its log:\n{}", braid.log());
    ThroughBraid {
        ingest: messages as f64 / (last - first).as_secs_f64(),
        accepted: published.messages as f64 / (published.end - published.start).as_secs_f64(),
        results,
        result_rate,
        done,
        late: metric(&m, "braid_operator_late_total", ""),
        dead_letters: metric(&m, "braid_stream_dead_letter_total", ""),
        cpu,
    }
}

/// 2: a fixed offered load through braid.
struct Fixed {
    nodelay: bool,
    published: u64,
    taken: u64,
    /// Publishes the simulator lost (connection drops, missing PUBACKs).
    errors: u64,
    matches: u64,
    /// Results of another kind seen (`left_only` comes ≥ 5.5 s after its command: rarely here).
    unmatched: u64,
    /// Publish → `match` result received.
    latency: Timed,
    cpu: Cpu,
    /// braid's, at the end of the phase (its results all received).
    memory: Memory,
    /// The same load through the same kind of broker with no braid, run just before.
    broker_alone: Timed,
    /// How long braid's shards held a result at p99, by wall time and by their CPU time over
    /// it, from the histograms' buckets (µs; upper bounds: `braid_shard_result_latency_seconds`,
    /// `braid_shard_result_cpu_seconds`).
    shard_held_us: (Option<f64>, Option<f64>),
}

/// (d) of every run that measured it (`--other-broker`).
fn print_other_broker(n: u64, saturation: &[Saturation]) {
    if saturation.iter().all(|s| s.d.is_none()) {
        return;
    }
    println!();
    println!(
        "Results to another broker (d): the devices' mosquitto carries the traffic of (a), a second one braid's results."
    );
    println!();
    println!(
        "| run | (a) mosquitto → subscriber | (d) braid ingest | **(d)/(a)** | (d) results out | CPU (a) mosquitto | CPU (d) mosquitto, devices | CPU (d) mosquitto, results | CPU (d) braid | **braid / mosquitto, devices** | braid switches / msg (voluntary) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for (i, Saturation { a, d, .. }) in saturation.iter().enumerate() {
        let Some(d) = d else { continue };
        println!(
            "| {} | {:.0} | {:.0} | **{:.2}** | {:.0} | {:.1} | {:.1} | {:.1} | {:.1} | **{:.2}** | {:.2} ({:.2}) |",
            i + 1,
            a.delivered,
            d.ingest,
            d.ingest / a.delivered,
            d.result_rate,
            a.cpu.us_per("mosquitto", n),
            d.cpu.us_per("mosquitto", n),
            d.cpu.us_per("mosquitto (results)", n),
            d.cpu.us_per("braid", n),
            d.cpu.us_per("braid", n) / d.cpu.us_per("mosquitto", n),
            d.cpu.braid_switches.total() as f64 / n as f64,
            d.cpu.braid_switches.voluntary as f64 / n as f64,
        );
    }
}

/// Publish → receipt, timed two ways: from `ts` (the making time in ms, as the payloads carry
/// it: 0–1 ms too long) and from the making time the simulator noted to the µs.
#[derive(Clone, Copy)]
struct Timed {
    ts: Latency,
    made: Latency,
}

impl Timed {
    fn of(received: &clients::Received) -> Timed {
        Timed { ts: Latency::of(&received.latency_us), made: Latency::of(&received.made_latency_us) }
    }
}

/// Publish → receipt times of one run, ms.
#[derive(Clone, Copy)]
struct Latency {
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
}

impl Latency {
    fn of(h: &hdrhistogram::Histogram<u64>) -> Latency {
        let ms = |us: u64| us as f64 / 1000.0;
        Latency { p50_ms: ms(h.value_at_quantile(0.5)), p99_ms: ms(h.value_at_quantile(0.99)), max_ms: ms(h.max()) }
    }
}

/// "p50 / p99 / max ms".
impl std::fmt::Display for Latency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:.1} / {:.1} / {:.1} ms", self.p50_ms, self.p99_ms, self.max_ms)
    }
}

impl Fixed {
    fn mosquitto(&self) -> &'static str {
        if self.nodelay { "set_tcp_nodelay true" } else { "default (Nagle on)" }
    }

    fn line(&self) -> String {
        format!(
            "{}: published {} taken {} ({:.4}) errors {}, {} match results (+{} other): p50 {:.1} ms p99 {:.1} ms max {:.1} ms (mosquitto alone {}) | braid peak RSS {:.1} MiB, now anonymous {:.1} + files {:.1} + shared {:.1} | {}",
            self.mosquitto(),
            self.published,
            self.taken,
            self.taken as f64 / self.published.max(1) as f64,
            self.errors,
            self.matches,
            self.unmatched,
            self.latency.made.p50_ms,
            self.latency.made.p99_ms,
            self.latency.made.max_ms,
            self.broker_alone.made,
            mib(self.memory.peak_rss),
            mib(self.memory.anon),
            mib(self.memory.file),
            mib(self.memory.shmem),
            self.cpu.summary()
        )
    }
}

/// The fixed load's rate (messages/s) and length (s).
#[derive(Clone, Copy)]
struct Pace {
    rate: f64,
    seconds: f64,
}

/// The fixed load through a fresh mosquitto with no braid: a subscriber on the devices' topics
/// times every message by its `ts` and its noted making time, as a result is timed by its `_ts`
/// and its later row's. A result crosses the broker twice; this is what one crossing costs on
/// the same machine.
fn broker_alone(pace: Pace, seed: u64, nodelay: bool) -> Timed {
    let broker = Mosquitto::start(nodelay);
    let made_at = Arc::new(MadeAt::default());
    let inputs = Subscriber::start_timed(broker.port, "devices/#", "/none", Timing::Inputs, Some(Arc::clone(&made_at)));
    let (handle, _) =
        braid::demo::devices::spawn(device_sim(&broker, pace, seed, made_at), Arc::new(AtomicBool::new(false)))
            .unwrap();
    let published = handle.join().unwrap().sent();
    inputs.wait_for(published, Duration::from_secs(5));
    Timed::of(&inputs.finish())
}

/// The fixed load's simulated devices, publishing to `broker` and noting when each message was
/// made in `made_at`.
fn device_sim(
    broker: &Mosquitto,
    Pace { rate, seconds }: Pace,
    seed: u64,
    made_at: Arc<MadeAt>,
) -> braid::demo::devices::DeviceSim {
    braid::demo::devices::DeviceSim {
        url_host: "127.0.0.1".into(),
        port: broker.port,
        devices: FIXED_DEVICES,
        rate,
        seed,
        qos: rumqttc::QoS::AtLeastOnce,
        limit: Some((rate * seconds) as u64),
        made_at: Some(made_at),
    }
}

fn fixed_load(bin: &BraidRun, pace: Pace, seed: u64, nodelay: bool, sniff: Option<&str>) -> Fixed {
    let broker_alone = broker_alone(pace, seed, nodelay);
    let broker = Mosquitto::start(nodelay);
    let mut braid = Braid::start(bin, broker.port, Egress::Mqtt(broker.port));
    let made_at = Arc::new(MadeAt::default());
    let results = Subscriber::start_timed(broker.port, "up/#", WARMUP, Timing::Results, Some(Arc::clone(&made_at)));
    let (from, _) = warm_up(&broker, &braid, Some(&results));
    let mut sniffer = sniff.map(|file| {
        let child = std::process::Command::new("mosquitto_sub")
            .args(["-p", &broker.port.to_string(), "-q", "1", "-t", "#", "-F", "%U %t %p"])
            .stdout(std::fs::File::create(file).unwrap())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(300));
        child
    });
    let sim = device_sim(&broker, pace, seed, made_at);
    let watch =
        CpuWatch::start(vec![("braid", braid.pid()), ("mosquitto", broker.pid()), ("bench", std::process::id())]);
    let (handle, _) = braid::demo::devices::spawn(sim, Arc::new(AtomicBool::new(false))).unwrap();
    // The shards' histograms halfway through: the second half's results are those of a state that
    // has stopped growing (the join keeps 8 s of rows, and the devices have all been seen).
    let ops_port = braid.ops_port;
    let halfway = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs_f64(pace.seconds / 2.0));
        metrics(ops_port)
    });
    let stats = handle.join().unwrap();
    let halfway = halfway.join().unwrap();
    let published = stats.sent();
    let (_, _, cpu) = watch_ingest(&braid, from, from + published, &watch);
    // Results still on their way: wait until braid's sink has nothing queued and the count rests.
    let since = Instant::now();
    let mut last = results.count();
    while since.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(200));
        let queued = metrics(braid.ops_port).map_or(0, |m| metric(&m, "braid_sink_queued_bytes", ""));
        if queued == 0 && results.count() == last {
            break;
        }
        last = results.count();
    }
    let taken = taken(&braid).unwrap_or(from) - from;
    if let Some(child) = sniffer.as_mut() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let received = results.finish();
    let memory = Memory::read(braid.pid());
    let held = metrics(braid.ops_port).unwrap_or_default();
    for name in [
        "braid_shard_result_latency_seconds",
        "braid_shard_result_cpu_seconds",
        "braid_shard_time_result_latency_seconds",
    ] {
        let buckets: Vec<&str> = held.lines().filter(|l| l.starts_with(&format!("{name}_bucket"))).collect();
        println!("  {name}: {}", buckets.join(" · "));
    }
    print_held_halves(halfway.as_deref(), &held);
    let held_us = |name| histogram_bound(&held, name, 0.99).map(|s| s * 1e6);
    let shard_held_us = (held_us("braid_shard_result_latency_seconds"), held_us("braid_shard_result_cpu_seconds"));
    braid.stop();
    Fixed {
        nodelay,
        published,
        taken,
        errors: stats.errors.load(Ordering::Relaxed),
        matches: received.latency_us.len(),
        unmatched: received.unmatched,
        latency: Timed::of(&received),
        cpu,
        memory,
        broker_alone,
        shard_held_us,
    }
}

/// A row's results held in the shards within 10 µs, over the whole run and over its second half
/// (scraped `halfway` and at the end: `held`), with the bucket that holds the p99 of each; a
/// halfway scrape that failed says so rather than passing for a half without results.
fn print_held_halves(halfway: Option<&str>, held: &str) {
    const NAME: &str = "braid_shard_result_latency_seconds";
    // The 10 µs bucket's bound as /metrics prints it, with room for its decimal rounding.
    const TEN_US: f64 = 10e-6 * (1.0 + 1e-9);
    let show = |buckets: &[(f64, u64)]| match (share_within(buckets, TEN_US), quantile_bucket(buckets, 0.99)) {
        (Some(share), Some(p99)) => format!("{share:.2} % (p99 ≤ {} µs)", bound(Some(p99 * 1e6))),
        _ => "no results".to_string(),
    };
    println!(
        "  a row's results held ≤ 10 µs in the shards: whole run {}; second half {}",
        show(&histogram_buckets(held, NAME)),
        halfway.map_or_else(|| "not read".to_string(), |halfway| show(&histogram_since(halfway, held, NAME))),
    );
}

fn print_tables(Load { messages, publishers, .. }: Load, saturation: &[Saturation], pace: Pace, fixed: &[Fixed]) {
    let n = messages as u64;
    println!();
    println!(
        "Saturation: {messages} messages ({} devices), QoS 1, {publishers} publishers. Rates in messages/s; CPU in µs per input message.",
        messages / 2
    );
    println!();
    println!(
        "| run | load (1 min) | (a) mosquitto → subscriber | (b) braid ingest | **(b)/(a)** | (b) results out | (c) braid ingest, results to a file | (c)/(a) | CPU (a) mosquitto | CPU (b) mosquitto | CPU (b) braid | **braid / mosquitto (b)** | CPU (c) mosquitto | CPU (c) braid | **braid / mosquitto (c)** | braid switches / msg (b) / (c) | of which voluntary (b) / (c) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (i, Saturation { a, b, c, .. }) in saturation.iter().enumerate() {
        println!(
            "| {} | {:.2} / {:.2} / {:.2} | {:.0} | {:.0} | **{:.2}** | {:.0} | {:.0} | {:.2} | {:.1} | {:.1} | {:.1} | **{:.2}** | {:.1} | {:.1} | **{:.2}** | {:.2} / {:.2} | {:.2} / {:.2} |",
            i + 1,
            a.cpu.load1,
            b.cpu.load1,
            c.cpu.load1,
            a.delivered,
            b.ingest,
            b.ingest / a.delivered,
            b.result_rate,
            c.ingest,
            c.ingest / a.delivered,
            a.cpu.us_per("mosquitto", n),
            b.cpu.us_per("mosquitto", n),
            b.cpu.us_per("braid", n),
            b.cpu.us_per("braid", n) / b.cpu.us_per("mosquitto", n),
            c.cpu.us_per("mosquitto", n),
            c.cpu.us_per("braid", n),
            c.cpu.us_per("braid", n) / c.cpu.us_per("mosquitto", n),
            b.cpu.braid_switches.total() as f64 / n as f64,
            c.cpu.braid_switches.total() as f64 / n as f64,
            b.cpu.braid_switches.voluntary as f64 / n as f64,
            c.cpu.braid_switches.voluntary as f64 / n as f64,
        );
    }
    print_other_broker(n, saturation);
    if fixed.is_empty() {
        return;
    }
    println!();
    println!(
        "Fixed load: {} msg/s for {} s, {FIXED_DEVICES} devices. Latency: publish → result received, from the later row's making time as the simulator noted it (µs), then from its `ts` (ms: 0–1 ms too long); mosquitto alone: the same load's messages publish → received with no braid, just before (a result crosses the broker twice). braid's memory at the end, MiB.",
        pace.rate, pace.seconds
    );
    println!();
    println!(
        "| run | mosquitto | load (1 min) | published | taken / published | match results | p50 | p99 | max | mosquitto alone p50 / p99 / max | by `ts` (ms): p50 / p99 / max | mosquitto alone by `ts` | braid's shards held a result, p99 wall / CPU (µs, at most) | CPU braid | CPU mosquitto | braid switches / msg (voluntary) | peak RSS | anonymous | files | shared memory |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (i, f) in fixed.iter().enumerate() {
        println!(
            "| {} | {} | {:.2} | {} | {:.4} | {} | {:.2} ms | {:.2} ms | {:.1} ms | {} | {} | {} | {} / {} | {:.1} µs | {:.1} µs | {:.2} ({:.2}) | {:.1} | {:.1} | {:.1} | {:.1} |",
            i / 2 + 1,
            f.mosquitto(),
            f.cpu.load1,
            f.published,
            f.taken as f64 / f.published.max(1) as f64,
            f.matches,
            f.latency.made.p50_ms,
            f.latency.made.p99_ms,
            f.latency.made.max_ms,
            f.broker_alone.made,
            f.latency.ts,
            f.broker_alone.ts,
            bound(f.shard_held_us.0),
            bound(f.shard_held_us.1),
            f.cpu.us_per("braid", f.published),
            f.cpu.us_per("mosquitto", f.published),
            f.cpu.braid_switches.total() as f64 / f.published.max(1) as f64,
            f.cpu.braid_switches.voluntary as f64 / f.published.max(1) as f64,
            mib(f.memory.peak_rss),
            mib(f.memory.anon),
            mib(f.memory.file),
            mib(f.memory.shmem),
        );
    }
}

/// A histogram bucket bound for the table: `na` without one, `inf` above the last.
fn bound(us: Option<f64>) -> String {
    us.map_or_else(|| "na".to_owned(), |us| if us.is_finite() { format!("{us:.0}") } else { "inf".to_owned() })
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}
