//! `braid bench`: synthetic load through the shard runtime that `braid run` uses, in process
//! (CONTRACT.md "Command line"; README.md "braid bench" documents the flags and every output
//! figure).
//!
//! Design:
//! - **Load.** Every input stream of the config gets rows from `--devices` devices (one key value
//!   each: `dev-000042` for a string key, 42 for an int key; a broadcast stream is one source).
//!   A device sends rows in event time with uniform gaps in [0.2, 1.8] × its mean gap and a
//!   random phase. The left input of each join runs at `--rate-per-device` rows/s; its right
//!   input at `--match-fanout / span`, where span is the event time a left row pairs over
//!   (interval join: upper − lower; window join: the window size or session gap), so a left row
//!   meets about `--match-fanout` right rows. Every other stream runs at `--rate-per-device`.
//!   The gateway config with the defaults is the workload of `benches/interval_join.rs`: a
//!   command every 5 s and a status every 4 s per device.
//! - **Arrival** (processing time) = event time + a uniform jitter in [0, max_out_of_orderness],
//!   so no row is late, except the `--late-share` whose event time is set back by
//!   max_out_of_orderness + 2 s (late whenever the stream is busy enough to hold its watermark
//!   up; the late count printed is the shards'). Rows are fed in arrival order.
//! - **Values**: the key; the time field in its unit (ms, s, RFC 3339); string fields whose name
//!   ends in `id` unique per row (17 B), other strings from a small pool; ints count up per
//!   device; floats uniform in [0, 200) (so about half of `where`/threshold comparisons hold);
//!   bools random; bytes a constant. Row ids are computed as replay computes them.
//! - **The path measured** is `braid run`'s: [`Runtime`] with `--shards` shard threads (pinned
//!   to cores while fewer than the cores), fed through mmap rings by the calling thread, which also collects
//!   the results ([`Emit`]). The rings and the shards' state live in a private directory
//!   `braid-bench-PID-…` under [`scratch_base`](braid::storage::mapped_file::scratch_base) (`/dev/shm`
//!   where there is one), removed at the end, as replay does.
//! - **What is measured.** Rows are generated in batches of `--batch-rows` before the clock
//!   starts for the batch: generation is not measured, and a batch's rows (about 250 B each)
//!   count in the RSS figures. Per batch, the measured part is what replay does with decoded
//!   rows — `Runtime::advance_to(arrival)` (the ticks), then `Runtime::ingest` — and then waiting
//!   until every shard has taken every frame of the batch from its feed ring, collecting results
//!   meanwhile, until no more come (the measured stretch ends with the last collection that
//!   brought results). The shards are therefore idle while the next batch is generated: no shard
//!   work goes unmeasured, and the measured time is the pipeline's (feeder encoding rows ‖
//!   shards joining ‖ collector decoding results), with one fill and one drain per batch.
//!   `Runtime::finish` is measured too. Results are counted, never written anywhere.
//! - **CPU time** is the process's (`CLOCK_PROCESS_CPUTIME_ID`: the feeding thread and every
//!   shard thread) over the measured stretches.
//! - **Latency** of a result: from the wall-clock instant its row was handed over (`ingest`
//!   called on the feeding thread) to the instant the result reaches [`Emit::result`] on that
//!   same thread — through the feed ring, the shard, and the result ring; one clock read per
//!   row and per traced result, both inside the measured time. Nothing on the result names the
//!   row that caused it, so results are traced by what they carry: a union row, or an interval
//!   join `match` (emitted when its second row is ingested), carries the key and the event time
//!   of a row handed over in the same batch, whose hand-over instant is kept in a map (cleared
//!   per batch). A match carries the later event time of its pair; when the other row of the
//!   pair was handed over last (the two arrived reordered, within max_out_of_orderness) the
//!   latency counts from the earlier hand-over, so it is an upper bound for those. Traced
//!   results are `results_at_ingest`; every other result (outer rows, windows, absence,
//!   temporal and connect results, all emitted at watermarks or processing time) is counted as
//!   `results_at_tick`, or `results_at_finish` when it reaches `Emit` during `finish`. As every
//!   batch is handed over before it is drained, the latency includes the wait behind the
//!   batch's earlier rows: it is a latency under saturation, and grows with `--batch-rows`
//!   (`--batch-rows 64`, one publication of the feeder, shows a lightly loaded pipeline's).
//! - **State** lives where a shard keeps it: interval joins, temporal joins and connects in mmap
//!   arenas in the private directory, so its pages are file-backed — in the resident set, not in
//!   the anonymous memory; `--memory-state` keeps it on the heap instead, as a baseline. State
//!   sizes are the shards' as of their last tick ([`Runtime::live_figures`]).
//! - **Memory** is the whole process's, shard threads included: peak RSS is
//!   `VmHWM` of /proc/self/status (what `getrusage` reports as `ru_maxrss`); anonymous RSS is `RssAnon` of /proc/self/status, read
//!   after every batch (untimed), at the end of input (before finish) and at the batch where the
//!   shards' state bytes peaked. The resident set includes the rings' touched pages (two
//!   [`FEED_RING_BYTES`](braid::shard::FEED_RING_BYTES) rings per shard, and an exchange ring per
//!   pair of shards).
//!
//! This is the one place in braid that measures wall-clock time (clippy.toml disallows
//! `Instant::now` elsewhere): see [`wall_clock`].

mod load;
mod meter;
mod report;

use std::io;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use thiserror::Error;

use braid::checkpoint::CheckpointDir;
use braid::operator::{OperatorSpec, ResultKind};
use braid::plan::Plan;
use braid::shard::result_latency::HeldResults;
use braid::shard::wake::BellCounts;
use braid::shard::{Figures, Runtime, RuntimeError, RuntimeOptions};

use load::{Generator, Input};
use meter::{Meter, ProcStatus, context_switches, process_cpu_time};

/// The default config of `braid bench`: the gateway join.
pub const GATEWAY_CONFIG: &str = include_str!("../../configs/gateway.toml");
/// How the bundled config is named in messages and in `config=`.
pub const GATEWAY_CONFIG_NAME: &str = "configs/gateway.toml (bundled)";

/// Latencies above this (ns) are recorded as this.
const LATENCY_MAX_NS: u64 = 60_000_000_000;
/// How long the feeding thread sleeps at most while it waits for the shards (it is woken as soon
/// as a shard takes frames or sends results).
const DRAIN_WAIT: Duration = Duration::from_millis(1);

/// The flags of `braid bench`.
#[derive(clap::Args)]
pub struct BenchFlags {
    /// The config to load [default: the bundled gateway config].
    #[arg(long, env = "BRAID_CONFIG")]
    pub config: Option<PathBuf>,
    /// Keys (devices) per keyed input stream.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..))]
    devices: u32,
    /// Total input rows [default: 2000000].
    #[arg(long, conflicts_with = "seconds", value_parser = clap::value_parser!(u64).range(1..))]
    rows: Option<u64>,
    /// Instead of --rows: feed rows until this much wall-clock time has been measured.
    #[arg(long, value_parser = positive)]
    seconds: Option<f64>,
    /// Rows per second of event time per device, for a join's left input and for every stream
    /// no join reads on its right.
    #[arg(long, default_value_t = 0.2, value_parser = positive)]
    rate_per_device: f64,
    /// About how many right rows a left row meets: sets each join's right input rate.
    #[arg(long, default_value_t = 2.0, value_parser = non_negative)]
    match_fanout: f64,
    /// Share of rows sent late (event time set back behind the watermark), 0 to 1.
    #[arg(long, default_value_t = 0.0, value_parser = share)]
    late_share: f64,
    /// Shard threads of the runtime (as `braid run --shards`), fed by this thread.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=256))]
    shards: u16,
    /// Rows generated ahead of each measured stretch (they count in the RSS figures).
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..))]
    batch_rows: u32,
    /// Keep operator state on the heap instead of in mmap arenas (the shards' backend): a
    /// baseline.
    #[arg(long)]
    memory_state: bool,
    /// Take a checkpoint every this many ms of processing time (arrival), as `braid run` does
    /// every `checkpoint_interval`; then also restore the last one into a second runtime and
    /// time it. 0: no checkpoints. The generated rows' arrival times run far faster than the wall
    /// clock (every device's rows, as fast as the shards take them): `checkpoints=` says how many
    /// a run took, so `checkpoint_cpu_share` is what that many cost, not a gateway's share.
    #[arg(long, default_value_t = 0)]
    checkpoint_interval_ms: u64,
    /// Write the checkpoints under this directory (a disk) instead of the bench's scratch
    /// directory (`/dev/shm` where there is one); a fresh subdirectory is made and removed.
    #[arg(long, value_name = "DIR")]
    checkpoint_dir: Option<std::path::PathBuf>,
    /// Sync every checkpoint file and directory, as `durability = "power"` does.
    #[arg(long)]
    checkpoint_sync: bool,
}

impl BenchFlags {
    pub fn into_args(self) -> BenchArgs {
        BenchArgs {
            config_name: self.config.map_or_else(|| GATEWAY_CONFIG_NAME.to_owned(), |c| c.display().to_string()),
            devices: self.devices as usize,
            shards: usize::from(self.shards),
            load: self.seconds.map_or(Load::Rows(self.rows.unwrap_or(2_000_000)), Load::Seconds),
            rate_per_device: self.rate_per_device,
            match_fanout: self.match_fanout,
            late_share: self.late_share,
            batch_rows: self.batch_rows as usize,
            memory_state: self.memory_state,
            checkpoint_interval_ms: self.checkpoint_interval_ms,
            checkpoint_dir: self.checkpoint_dir,
            checkpoint_sync: self.checkpoint_sync,
        }
    }
}

fn positive(arg: &str) -> Result<f64, String> {
    arg.parse::<f64>().ok().filter(|v| v.is_finite() && *v > 0.0).ok_or_else(|| format!("{arg:?}: want a number > 0"))
}

fn non_negative(arg: &str) -> Result<f64, String> {
    arg.parse::<f64>().ok().filter(|v| v.is_finite() && *v >= 0.0).ok_or_else(|| format!("{arg:?}: want a number >= 0"))
}

fn share(arg: &str) -> Result<f64, String> {
    arg.parse::<f64>()
        .ok()
        .filter(|v| (0.0..=1.0).contains(v))
        .ok_or_else(|| format!("{arg:?}: want a share in [0, 1]"))
}

/// What `braid bench` was asked to do.
#[derive(Clone, Debug)]
pub struct BenchArgs {
    /// Names the config in the output.
    pub config_name: String,
    pub devices: usize,
    /// Shard threads.
    pub shards: usize,
    pub load: Load,
    /// Rows/s of event time per device of a join's left input (and of every stream no join
    /// reads on its right).
    pub rate_per_device: f64,
    /// About how many right rows a left row meets (sets the right inputs' rate).
    pub match_fanout: f64,
    /// Share of rows, in [0, 1], sent late.
    pub late_share: f64,
    pub batch_rows: usize,
    /// Operator state on the heap rather than in arenas.
    pub memory_state: bool,
    /// A checkpoint every this many ms of processing time; 0: none.
    pub checkpoint_interval_ms: u64,
    /// Where the checkpoints go (a fresh subdirectory of it); none: the bench's own directory.
    pub checkpoint_dir: Option<std::path::PathBuf>,
    /// Files and directories synced (`durability = "power"`).
    pub checkpoint_sync: bool,
}

/// How much load: a number of input rows, or a measured (wall-clock) time.
#[derive(Clone, Copy, Debug)]
pub enum Load {
    Rows(u64),
    Seconds(f64),
}

/// A bench that could not run: exit status 1.
#[derive(Debug, Error)]
pub enum BenchError {
    #[error("private directory for the rings and state in {path}: {error}")]
    Dir { path: PathBuf, error: io::Error },
    #[error("shard runtime: {0}")]
    Runtime(#[from] RuntimeError),
}

/// Figures of one run (README.md "braid bench" names each).
#[derive(Debug)]
pub struct Report {
    pub args: BenchArgs,
    pub rows: u64,
    pub event_seconds: f64,
    /// Measured time: every batch's feeding and draining, plus finish.
    pub wall: Duration,
    /// CPU time of the process (feeding thread and shard threads) over the same stretches.
    pub cpu: Duration,
    pub finish: Duration,
    pub results_at_ingest: u64,
    pub results_at_tick: u64,
    pub results_at_finish: u64,
    pub late_rows: u64,
    /// Matches per left row of the first join (interval, window or temporal).
    pub match_fanout: Option<f64>,
    /// p50, p99, max in ns; `None` when no result was traced to its row.
    pub latency_ns: Option<(u64, u64, u64)>,
    /// How long the shards held their results (shard/result_latency.rs): DESIGN.md's "a matched
    /// pair leaves the shard" figure, as an upper bound per result.
    pub shard_results_held: HeldResults,
    pub peak_rss_kib: Option<u64>,
    pub rss_end_kib: Option<u64>,
    pub anon_rss_start_kib: Option<u64>,
    pub anon_rss_end_kib: Option<u64>,
    pub anon_rss_peak_kib: Option<u64>,
    pub anon_rss_at_peak_state_kib: Option<u64>,
    /// (rows, bytes) of all operators' state where the bytes peaked, and at the end of input.
    pub state_peak: (usize, usize),
    pub state_end: (usize, usize),
    /// Per operator: name, counters line for the table.
    pub operators: Vec<String>,
    /// Where operator state lived: `arenas` (mmap files, as on a shard) or `memory`
    /// (`--memory-state`).
    pub state_backend: &'static str,
    /// With `--checkpoint-interval-ms`: what the checkpoints cost.
    pub checkpoints: Option<CheckpointFigures>,
    /// What the doorbells counted over the run: the feeding thread's, and the shards' summed.
    pub feeder_bell: BellCounts,
    pub shard_bells: BellCounts,
    /// The process's context switches over the measured stretches: (voluntary, involuntary).
    pub context_switches: (u64, u64),
}

/// What checkpoints cost in a bench run.
#[derive(Debug, Default)]
pub struct CheckpointFigures {
    pub committed: u64,
    /// Bytes of every committed checkpoint's files, summed, and the largest.
    pub bytes_total: u64,
    pub bytes_max: u64,
    /// Wall time from a barrier's sending to its checkpoint's commit: median and largest.
    pub duration_p50: Duration,
    pub duration_max: Duration,
    /// Restoring the last checkpoint into a second runtime until its shards answer a barrier.
    pub restore: Option<Duration>,
    pub restored_bytes: u64,
    /// Over all shard threads: CPU time taking the snapshots and encoding the files, and wall
    /// time handing the
    /// files to the disk (the whole write on the legacy driver; shard/file_write.rs).
    pub shard_snapshot: Duration,
    pub shard_stall: Duration,
}

/// Names of the bench's private directories: `braid-bench-PID-…`.
const PRIVATE_PREFIX: &str = "braid-bench-";

/// The directory for the rings and the shards' arenas, removed on drop: in `/dev/shm` where
/// there is one (their pages count in the resident set, not in the anonymous memory), else in
/// the system's temporary directory.
fn private_dir() -> Result<tempfile::TempDir, BenchError> {
    let base = braid::storage::mapped_file::scratch_base();
    braid::storage::mapped_file::remove_abandoned(&base, PRIVATE_PREFIX);
    let prefix = format!("{PRIVATE_PREFIX}{}-", std::process::id());
    tempfile::Builder::new()
        .prefix(&prefix)
        .tempdir_in(&base)
        .or_else(|_| tempfile::Builder::new().prefix(&prefix).tempdir())
        .map_err(|error| BenchError::Dir { path: base, error })
}

/// The bench's only clock: the bench is the one place in braid that measures wall-clock time
/// (operators and the runtime get processing time passed in, STYLE.md 4).
#[allow(clippy::disallowed_methods)]
fn wall_clock() -> Instant {
    Instant::now()
}

/// Runs the load through the shard runtime and measures it.
pub fn run(plan: &Plan, args: &BenchArgs) -> Result<Report, BenchError> {
    let dir = private_dir()?;
    let disk_dir = match &args.checkpoint_dir {
        Some(base) => Some(
            tempfile::Builder::new()
                .prefix(PRIVATE_PREFIX)
                .tempdir_in(base)
                .map_err(|error| BenchError::Dir { path: base.clone(), error })?,
        ),
        None => None,
    };
    let checkpoint_root = disk_dir.as_ref().map_or_else(|| dir.path().join("checkpoints"), |d| d.path().to_owned());
    let checkpoints =
        (args.checkpoint_interval_ms > 0).then(|| CheckpointDir::new(checkpoint_root, args.checkpoint_sync));
    let options = RuntimeOptions {
        memory_state: args.memory_state,
        checkpoints: checkpoints.clone(),
        ..RuntimeOptions::new(args.shards, dir.path())
    };
    let interval = i64::try_from(args.checkpoint_interval_ms).unwrap_or(i64::MAX);
    let mut next_checkpoint: Option<i64> = None;
    let mut generator = Generator::new(plan, args);
    let mut meter = Meter::new(plan, args.batch_rows);
    let mut batch: Vec<Input> = Vec::with_capacity(args.batch_rows);
    let mut status = ProcStatus::new();
    let anon_rss_start_kib = status.read().kib("RssAnon");
    // Declared after `dir`, so dropped (threads joined, rings unmapped) before it on every path.
    let mut runtime: Option<Runtime> = None;
    let (mut rows, mut busy, mut cpu) = (0u64, Duration::ZERO, Duration::ZERO);
    let mut switches = (0, 0);
    let (mut first_arrival, mut last_arrival) = (None, 0i64);
    let (mut state_peak, mut anon_rss_peak_kib, mut anon_rss_at_peak_state_kib) = ((0, 0), None, None);
    loop {
        let want = match args.load {
            Load::Rows(total) => usize::try_from(total - rows).unwrap_or(usize::MAX).min(args.batch_rows),
            Load::Seconds(s) if busy.as_secs_f64() >= s => 0,
            Load::Seconds(_) => args.batch_rows,
        };
        if want == 0 {
            break;
        }
        generator.fill(&mut batch, want);
        let Some(first) = batch.first() else { break };
        let runtime = match &mut runtime {
            Some(runtime) => runtime,
            None => runtime.insert(Runtime::start(plan, &options, i128::from(first.arrival))?),
        };
        first_arrival.get_or_insert(first.arrival);
        rows += batch.len() as u64;
        last_arrival = batch.last().map_or(last_arrival, |i| i.arrival);
        meter.new_batch();
        let (started, cpu_started, switches_started) = (wall_clock(), process_cpu_time(), context_switches());
        for Input { arrival, stream, row } in batch.drain(..) {
            runtime.advance_to(i128::from(arrival), &mut meter)?;
            if let Some(dir) = &checkpoints
                && arrival >= *next_checkpoint.get_or_insert(arrival + interval)
                && !runtime.checkpoint_in_flight()
            {
                next_checkpoint = Some(arrival + interval);
                meter.checkpoint(runtime, dir, args.shards)?;
            }
            meter.hand_over(&row);
            runtime.ingest(stream, &row, i128::from(arrival), &mut meter)?;
        }
        let drained = drain(runtime, &mut meter)?;
        busy += drained.saturating_duration_since(started);
        cpu += process_cpu_time().saturating_sub(cpu_started);
        add_switches(&mut switches, switches_started);
        // Untimed: state and memory.
        let state = state(&runtime.live_figures());
        let anon = status.read().kib("RssAnon");
        anon_rss_peak_kib = anon_rss_peak_kib.max(anon);
        if state.1 > state_peak.1 {
            state_peak = state;
            anon_rss_at_peak_state_kib = anon;
        }
    }
    let state_end = runtime.as_ref().map_or((0, 0), |r| state(&r.live_figures()));
    let restore = match &checkpoints {
        Some(checkpoints) => time_restore(plan, args, checkpoints, &dir)?,
        None => None,
    };
    let (anon_rss_end_kib, rss_end_kib) = (status.read().kib("RssAnon"), status.kib("VmRSS"));
    let (started, cpu_started, switches_started) = (wall_clock(), process_cpu_time(), context_switches());
    meter.finishing = true;
    let figures = runtime.map(|r| r.finish(&mut meter)).transpose()?;
    let finish = wall_clock().saturating_duration_since(started);
    cpu += process_cpu_time().saturating_sub(cpu_started);
    add_switches(&mut switches, switches_started);
    let latency = &meter.latency;
    let latency_ns =
        (!latency.is_empty()).then(|| (latency.value_at_quantile(0.5), latency.value_at_quantile(0.99), latency.max()));
    let (late_rows, match_fanout, operators) = match &figures {
        Some(figures) => operator_figures(plan, figures),
        None => (0, None, Vec::new()),
    };
    // The runtime is gone (threads joined, rings and arenas unmapped): the directory can go.
    drop(dir);
    Ok(Report {
        args: args.clone(),
        rows,
        event_seconds: first_arrival.map_or(0.0, |first| (last_arrival - first) as f64 / 1000.0),
        wall: busy + finish,
        cpu,
        finish,
        results_at_ingest: meter.at_ingest,
        results_at_tick: meter.at_tick,
        results_at_finish: meter.at_finish,
        late_rows,
        match_fanout,
        latency_ns,
        shard_results_held: figures.as_ref().map_or_else(HeldResults::default, |f| f.shard_results_held),
        peak_rss_kib: status.read().kib("VmHWM"),
        rss_end_kib,
        anon_rss_start_kib,
        anon_rss_end_kib,
        anon_rss_peak_kib,
        anon_rss_at_peak_state_kib,
        state_peak,
        state_end,
        operators,
        state_backend: if args.memory_state { "memory" } else { "arenas" },
        checkpoints: checkpoints.map(|_| CheckpointFigures {
            shard_snapshot: figures.as_ref().map_or(Duration::ZERO, |f| f.checkpoint_snapshot),
            shard_stall: figures.as_ref().map_or(Duration::ZERO, |f| f.checkpoint_stall),
            ..meter.checkpoint_figures(restore)
        }),
        feeder_bell: figures.as_ref().map_or_else(BellCounts::default, |f| f.feeder_bell),
        shard_bells: figures.as_ref().map_or_else(BellCounts::default, |f| {
            f.shard_bells.iter().fold(BellCounts::default(), |mut sum, &b| {
                sum += b;
                sum
            })
        }),
        context_switches: switches,
    })
}

/// Adds the context switches since `started` to `sum`.
fn add_switches(sum: &mut (u64, u64), started: (u64, u64)) {
    let now = context_switches();
    sum.0 += now.0.saturating_sub(started.0);
    sum.1 += now.1.saturating_sub(started.1);
}

/// Restores the last committed checkpoint into a second runtime (its own rings and arenas) and
/// times it from reading the files until every shard has restored its operators. (time, bytes of
/// the checkpoint); `None` without a checkpoint.
fn time_restore(
    plan: &Plan,
    args: &BenchArgs,
    checkpoints: &CheckpointDir,
    dir: &tempfile::TempDir,
) -> Result<Option<(Duration, u64)>, BenchError> {
    let started = wall_clock();
    let Some(loaded) = checkpoints.latest() else { return Ok(None) };
    tracing::info!(ms = wall_clock().saturating_duration_since(started).as_millis() as u64, "restore: checkpoint read");
    let bytes = checkpoints.epoch_bytes(loaded.manifest.epoch);
    let restore_dir = dir.path().join("restore");
    std::fs::create_dir_all(&restore_dir).map_err(|error| BenchError::Dir { path: restore_dir.clone(), error })?;
    let answers = CheckpointDir::new(restore_dir.join("checkpoints"), false);
    let options = RuntimeOptions {
        memory_state: args.memory_state,
        checkpoints: Some(answers),
        restore: Some(&loaded),
        ..RuntimeOptions::new(args.shards, &restore_dir)
    };
    let mut restored = Runtime::start(plan, &options, 0)?;
    tracing::info!(ms = wall_clock().saturating_duration_since(started).as_millis() as u64, "restore: runtime started");
    restored.wait_built(&mut meter::Nothing)?;
    let took = wall_clock().saturating_duration_since(started);
    drop(restored);
    Ok(Some((took, bytes)))
}

/// Publishes what was fed, waits until every shard has taken every frame from its feed ring,
/// and collects results until none come. Returns when the work ended: the later of the instant
/// the feed rings were found empty and the last collection that brought results (the final
/// wait, which finds none, is not work).
fn drain(runtime: &mut Runtime, meter: &mut Meter) -> Result<Instant, RuntimeError> {
    runtime.flush(meter)?;
    runtime.wait_taken(meter, DRAIN_WAIT)?;
    let mut ended = wall_clock();
    // A shard commits the results of the frames it took at the end of its round, after it
    // released them: they are collected here, in this batch, not after its hand-overs are gone.
    loop {
        let before = meter.results();
        runtime.wait(meter, DRAIN_WAIT, || false)?;
        runtime.flush(meter)?;
        if meter.results() == before {
            return Ok(ended);
        }
        ended = wall_clock();
    }
}

/// (rows, bytes) of every operator's state, over all shards.
fn state(figures: &Figures) -> (usize, usize) {
    figures.operator_state.iter().fold((0, 0), |a, s| (a.0 + s.0, a.1 + s.1))
}

/// Late rows over all operators, the fanout of the first join, one line per
/// operator for the table.
fn operator_figures(plan: &Plan, figures: &Figures) -> (u64, Option<f64>, Vec<String>) {
    let mut late = 0;
    let mut fanout = None;
    let mut lines = Vec::new();
    for (def, c) in plan.operators.iter().zip(&figures.operator_counters) {
        late += c.late.iter().sum::<u64>();
        let matches = c.results[ResultKind::Match as usize];
        let pairs = matches!(
            def.spec,
            OperatorSpec::IntervalJoin(_) | OperatorSpec::WindowJoin(_) | OperatorSpec::TemporalJoin(_)
        );
        if pairs && fanout.is_none() && c.rows_in[0] > 0 {
            fanout = Some(matches as f64 / c.rows_in[0] as f64);
        }
        let results: Vec<String> = ResultKind::ALL
            .iter()
            .filter(|&&k| c.results[k as usize] > 0)
            .map(|&k| format!("{} {}", k.as_str(), c.results[k as usize]))
            .collect();
        let rows_in: Vec<String> = c.rows_in.iter().map(u64::to_string).collect();
        lines.push(format!(
            "{}: rows in {}; results {}; late {}",
            def.name,
            rows_in.join(" / "),
            if results.is_empty() { "none".to_owned() } else { results.join(", ") },
            c.late.iter().sum::<u64>()
        ));
    }
    (late, fanout, lines)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn args(devices: usize, rows: u64, late_share: f64) -> BenchArgs {
        BenchArgs {
            config_name: GATEWAY_CONFIG_NAME.into(),
            devices,
            shards: 2,
            load: Load::Rows(rows),
            rate_per_device: 0.2,
            match_fanout: 2.0,
            late_share,
            batch_rows: 500,
            memory_state: false,
            checkpoint_interval_ms: 0,
            checkpoint_dir: None,
            checkpoint_sync: false,
        }
    }

    pub(super) fn gateway() -> Plan {
        braid::config::parse("gateway.toml", GATEWAY_CONFIG).unwrap()
    }

    #[test]
    fn a_run_joins_without_late_rows_and_counts_every_result() {
        let report = run(&gateway(), &args(100, 20_000, 0.0)).unwrap();
        assert_eq!(report.rows, 20_000);
        assert_eq!(report.late_rows, 0);
        let fanout = report.match_fanout.unwrap();
        assert!((1.5..2.5).contains(&fanout), "fanout {fanout}");
        assert!(report.results_at_ingest > 0 && report.latency_ns.is_some());
        // Every result left a shard in some round, and was counted there once.
        let held = &report.shard_results_held;
        assert_eq!(held.count(), report.results());
        // A row's results apart from those made as time advanced (the outer rows of ticks and
        // of the end). The meter counts only matches as made at ingest: a row's results also
        // hold its own outer row when it came after its last chance.
        assert!(held.wall.count() >= report.results_at_ingest);
        let of_time = report.results_at_tick + report.results_at_finish;
        assert!((1..=of_time).contains(&held.of_time.count()), "{:?} of {of_time}", held.of_time);
        assert!((1..held.wall.count()).contains(&held.cpu.count()), "a sample: {:?}", held.cpu);
        let mut text = Vec::new();
        report.write_figures(&mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(text.lines().all(|l| l.split_once('=').is_some_and(|(k, v)| !k.is_empty() && !v.is_empty())));
        assert!(text.contains("rows=20000\n"));
    }

    #[test]
    fn a_late_share_makes_late_rows() {
        let report = run(&gateway(), &args(100, 20_000, 0.1)).unwrap();
        let share = report.late_rows as f64 / report.rows as f64;
        assert!((0.07..0.13).contains(&share), "late share {share}");
    }
}
