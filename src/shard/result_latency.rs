//! How long a shard holds a result: DESIGN.md's "a matched pair leaves the shard ≤ 10 µs (p99)
//! after its second row is read", measured on every shard of every run.
//!
//! A shard commits the results it made to the collector's ring at the end of each round, before
//! the work of a tick, a barrier or the end, after each of the first [`EAGER_COMMIT_ROWS`] rows
//! after a sleep that made any, and every [`COMMIT_EVERY_ROWS`] rows of a long round after them
//! (`Worker::round`, `Core::on_event`). A result therefore leaves the shard at most one
//! [`Stretch`] after the input that made it was read: each commit counts the stretch's duration,
//! from its first input read, once per result it carries, a histogram of upper bounds in fixed
//! buckets. For a row's results two of them: wall time, what a result waits, preemptions by
//! other threads of the machine included; and the shard thread's CPU time over the same stretch,
//! the shard's own work, for one stretch in [`CPU_SAMPLE_EVERY`] (a thread's CPU clock is a
//! system call, about 1 µs here, where the wall clock costs 30 ns). Results made as time
//! advanced (an outer join's unmatched rows at a tick, a window's) are no matched pairs: no
//! second row was read for them, and they wait for the rest of the tick's work, such as the rows
//! it evicts; they are counted apart, by wall time ([`HeldResults::of_time`]). `/metrics` shows
//! them as Prometheus histograms (`braid_shard_result_latency_seconds`,
//! `braid_shard_result_cpu_seconds`, `braid_shard_time_result_latency_seconds`), `braid bench`
//! and the MQTT bench read quantiles from them. Two wall clock reads a stretch that reads input (its
//! first input and its commit), none per row. Among the first rows after a sleep, a row
//! that made no result ends its stretch, as nothing waits on it: the next row's results count
//! from that row's read ("after its second row is read"), not from the row before it.

use std::time::{Duration, Instant};

/// Bucket upper bounds in µs (the last bucket, above them, is unbounded). Dense around the
/// 10 µs target; wide enough above to show a round held by a checkpoint's snapshot.
pub const BOUNDS_US: [u64; 14] = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 100_000];

/// Results counted per bucket of the duration of the stretch that held them, and those durations
/// summed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ResultLatency {
    /// `counts[i]`: results held at most `BOUNDS_US[i]` µs (above the last bound: the last
    /// entry); not cumulative.
    counts: [u64; BOUNDS_US.len() + 1],
    /// Over all results counted: their stretch's duration in ns, once per result.
    sum_ns: u128,
}

impl ResultLatency {
    /// A stretch of `took` carried `results` results.
    pub fn record(&mut self, took: Duration, results: u64) {
        let ns = took.as_nanos();
        let bucket = BOUNDS_US.iter().position(|&bound| ns <= u128::from(bound) * 1000).unwrap_or(BOUNDS_US.len());
        self.counts[bucket] += results;
        self.sum_ns += ns * u128::from(results);
    }

    /// Adds another shard's counts.
    pub fn add(&mut self, other: &ResultLatency) {
        for (mine, theirs) in self.counts.iter_mut().zip(other.counts) {
            *mine += theirs;
        }
        self.sum_ns += other.sum_ns;
    }

    /// Results counted.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The stretches' durations summed over every result counted.
    pub fn sum(&self) -> Duration {
        Duration::from_nanos(u64::try_from(self.sum_ns).unwrap_or(u64::MAX))
    }

    /// Cumulative counts per bucket bound, `None` standing for +Inf (a Prometheus histogram's
    /// `le` buckets).
    pub fn cumulative(&self) -> impl Iterator<Item = (Option<u64>, u64)> + '_ {
        let bounds = BOUNDS_US.iter().map(|&b| Some(b)).chain(std::iter::once(None));
        bounds.zip(self.counts.iter().scan(0, |total, &n| {
            *total += n;
            Some(*total)
        }))
    }

    /// The bound of the bucket that holds quantile `q` (0 < q ≤ 1) of the results: at least
    /// that share of them left their shard within it. `None` without results, or when the
    /// quantile lies above the last bound.
    pub fn quantile_bound_us(&self, q: f64) -> Option<u64> {
        let cumulative: Vec<_> = self.cumulative().collect();
        quantile_bucket(&cumulative, q).flatten()
    }
}

/// Of a histogram's buckets, (upper bound, cumulative count) in rising order, the bound of the
/// first that holds quantile `q` (0 < q ≤ 1) of the count: at least that share of the values lie
/// within it. `None` without values. The rule `braid bench` and the MQTT bench (which reads the
/// histogram back from `/metrics`) both read a quantile by.
pub fn quantile_bucket<B: Copy>(cumulative: &[(B, u64)], q: f64) -> Option<B> {
    let total = cumulative.last().map_or(0, |&(_, count)| count);
    if total == 0 {
        return None;
    }
    let wanted = ((total as f64) * q).ceil().max(1.0) as u64;
    cumulative.iter().find(|&&(_, below)| below >= wanted).map(|&(bound, _)| bound)
}

/// Input rows after which a shard commits the results made so far, even in the middle of what
/// its ring holds: under a burst a round reads thousands of rows, and the first ones' results
/// would wait for all of them (milliseconds). 64 rows' work is tens of µs; a commit is a store
/// to the ring's head and a look at the collector's flag.
pub const COMMIT_EVERY_ROWS: u32 = 64;

/// The first rows read after a sleep commit their results as soon as they are made, each on its
/// own, in the round that follows the sleep and in the rounds after it until they are used up:
/// at a gateway's rate a shard sleeps between a few rows, works on each cold, and a result that
/// waited for the rows read after it waited for their cold work too. Rows that came while the
/// first round worked are read by a second round just as cold: holding their results to that
/// round's end made most of the results held over 10 µs (BENCHMARKS.md, 29th session). A busy
/// shard does not sleep, and commits every [`COMMIT_EVERY_ROWS`] rows: a commit per row cost
/// `braid bench` 7–9 % more CPU a row.
pub const EAGER_COMMIT_ROWS: u32 = 16;

/// The stretches whose CPU time is measured: one in this many that read input.
pub const CPU_SAMPLE_EVERY: u32 = 16;

/// How long a shard held its results: those of rows by wall time and by its own CPU time (that
/// one sampled), DESIGN.md's "a matched pair leaves the shard" figure; those made as time
/// advanced by wall time, apart.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeldResults {
    pub wall: ResultLatency,
    pub cpu: ResultLatency,
    /// Results made as time advanced (a tick's watermark and timers, processing time, the end),
    /// timed from the read of the frame that advanced it: an outer join's unmatched rows, a
    /// window's results. No second row was read for them, and they wait for the rest of that
    /// frame's work (the rows it evicts), so they are kept out of `wall`.
    pub of_time: ResultLatency,
    /// Commits that carried results.
    pub commits: u64,
}

impl HeldResults {
    pub fn add(&mut self, other: &HeldResults) {
        self.wall.add(&other.wall);
        self.cpu.add(&other.cpu);
        self.of_time.add(&other.of_time);
        self.commits += other.commits;
    }

    /// Results counted, of rows and of time.
    pub fn count(&self) -> u64 {
        self.wall.count() + self.of_time.count()
    }
}

/// What [`Stretch::row_done`] asks of the shard after a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowDone {
    /// Commit the results made so far now.
    Commit,
    /// Nothing waits for a commit: the next input starts a new stretch.
    NothingHeld,
    /// The row stays in the stretch, which commits later.
    Hold,
}

/// What a shard made since its last commit, and since when: every input those results came of
/// was read after `began` (and, in a sampled stretch, the shard's CPU clock read at the first).
#[derive(Debug)]
pub struct Stretch {
    /// Results of rows ([`HeldResults::wall`]).
    results: u64,
    /// Results made as time advanced ([`HeldResults::of_time`]).
    results_of_time: u64,
    rows: u32,
    /// Rows after the last sleep that still commit eagerly ([`EAGER_COMMIT_ROWS`]).
    eager_rows: u32,
    began: Instant,
    /// Whether an input was read in this stretch yet (the sampling counts stretches that read).
    reading: bool,
    cpu_began: Option<Duration>,
    /// Stretches that read input, for the sampling of the CPU clock.
    stretches: u32,
}

impl Default for Stretch {
    fn default() -> Stretch {
        Stretch {
            results: 0,
            results_of_time: 0,
            rows: 0,
            eager_rows: 0,
            began: now(),
            reading: false,
            cpu_began: None,
            stretches: 0,
        }
    }
}

impl Stretch {
    /// A new stretch begins, timed from its first input, unless `carried`: input read before
    /// still waits to be worked on (a chained operator's queue), and its results must count from
    /// when it was read. Every result comes of an input read in its stretch or carried into it.
    pub fn restart(&mut self, carried: bool) {
        self.rows = 0;
        if !carried {
            self.reading = false;
            self.cpu_began = None;
        }
    }

    /// A round begins; `after_sleep`: the shard slept before it, and the first rows read from
    /// now on commit eagerly ([`EAGER_COMMIT_ROWS`]), in this round and in the next ones until
    /// they are used up.
    pub fn new_round(&mut self, after_sleep: bool) {
        if after_sleep {
            self.eager_rows = EAGER_COMMIT_ROWS;
        }
    }

    /// A row's work is done (once per row): what becomes of the stretch before the next input.
    /// Among the first rows of a round after a sleep ([`EAGER_COMMIT_ROWS`]), results made so far
    /// leave now; with none made, nothing waits, and the next row's results count from that row's
    /// read (DESIGN.md: "after its second row is read"), not from the read of a row that made
    /// none. Later rows, and every row of a busy shard, stay in the stretch.
    pub fn row_done(&mut self) -> RowDone {
        let eager = self.eager_rows > 0;
        self.eager_rows = self.eager_rows.saturating_sub(1);
        match (eager, self.results > 0) {
            (true, true) => RowDone::Commit,
            (true, false) => RowDone::NothingHeld,
            (false, _) => RowDone::Hold,
        }
    }

    /// An input frame is being handled; for a row, whether the stretch has run long enough to
    /// commit after it ([`COMMIT_EVERY_ROWS`]).
    pub fn read(&mut self, row: bool) -> bool {
        if !self.reading {
            // From the first input read (DESIGN.md: "after its second row is read"), not from the
            // round's start, whose flushes and ring checks come before any input.
            self.began = now();
            self.reading = true;
            self.stretches = self.stretches.wrapping_add(1);
            if self.stretches.is_multiple_of(CPU_SAMPLE_EVERY) {
                self.cpu_began = Some(crate::time::cpu::thread());
            }
        }
        self.rows += u32::from(row);
        self.rows >= COMMIT_EVERY_ROWS
    }

    /// `n` results of a row were made and sent to the collector's ring (not committed yet).
    pub fn made(&mut self, n: u64) {
        self.results += n;
    }

    /// `n` results made as time advanced were sent to the collector's ring
    /// ([`HeldResults::of_time`]).
    pub fn made_of_time(&mut self, n: u64) {
        self.results_of_time += n;
    }

    /// Whether results wait for a commit.
    pub fn holds_results(&self) -> bool {
        self.results + self.results_of_time > 0
    }

    /// The results made so far were committed: each counts the stretch so far into `held`.
    pub fn committed(&mut self, held: &mut HeldResults) {
        if !self.holds_results() {
            return;
        }
        let took = now().saturating_duration_since(self.began);
        if self.results > 0 {
            held.wall.record(took, self.results);
            if let Some(cpu_began) = self.cpu_began {
                held.cpu.record(crate::time::cpu::thread().saturating_sub(cpu_began), self.results);
            }
        }
        if self.results_of_time > 0 {
            held.of_time.record(took, self.results_of_time);
        }
        (self.results, self.results_of_time) = (0, 0);
        held.commits += 1;
    }
}

/// The clock of the stretches (a figure, never a decision of the operators).
#[allow(clippy::disallowed_methods)]
fn now() -> Instant {
    Instant::now()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{
        COMMIT_EVERY_ROWS, CPU_SAMPLE_EVERY, EAGER_COMMIT_ROWS, HeldResults, ResultLatency, RowDone, Stretch,
        quantile_bucket,
    };

    #[test]
    fn each_result_counts_its_rounds_duration_in_the_first_bucket_that_holds_it() {
        let mut latency = ResultLatency::default();
        latency.record(Duration::from_nanos(900), 3);
        latency.record(Duration::from_micros(10), 96);
        latency.record(Duration::from_nanos(10_001), 1);
        let cumulative: Vec<_> = latency.cumulative().collect();
        assert_eq!(cumulative[0], (Some(1), 3));
        assert_eq!(cumulative[3], (Some(10), 99), "a bound includes itself");
        assert_eq!(cumulative[4], (Some(20), 100));
        assert_eq!(cumulative.last(), Some(&(None, 100)));
        assert_eq!(latency.quantile_bound_us(0.5), Some(10));
        assert_eq!(latency.quantile_bound_us(0.99), Some(10));
        assert_eq!(latency.quantile_bound_us(1.0), Some(20));
        assert_eq!(latency.sum(), Duration::from_nanos(900 * 3 + 10_000 * 96 + 10_001));
    }

    #[test]
    fn shards_add_up_and_beyond_the_last_bound_is_unbounded() {
        let mut one = ResultLatency::default();
        one.record(Duration::from_millis(150), 2);
        let mut all = ResultLatency::default();
        assert_eq!(all.quantile_bound_us(0.99), None, "no results, no figure");
        all.record(Duration::from_micros(3), 2);
        all.add(&one);
        assert_eq!(all.count(), 4);
        assert_eq!(all.quantile_bound_us(0.5), Some(5));
        assert_eq!(all.quantile_bound_us(0.99), None, "above 100 ms");
        // The same rule over buckets read back from Prometheus text (the MQTT bench).
        let read_back = [(1e-6, 0), (5e-6, 2), (0.1, 2), (f64::INFINITY, 4)];
        assert_eq!(quantile_bucket(&read_back, 0.5), Some(5e-6));
        assert_eq!(quantile_bucket(&read_back, 0.99), Some(f64::INFINITY));
        assert_eq!(quantile_bucket(&[(1e-6, 0), (f64::INFINITY, 0)], 0.5), None);
    }

    #[test]
    fn a_stretch_counts_its_results_once_at_their_commit_and_asks_for_one_after_enough_rows() {
        let mut stretch = Stretch::default();
        let mut held = HeldResults::default();
        stretch.committed(&mut held);
        assert_eq!(held.wall.count(), 0, "nothing made, nothing counted");
        for _ in 1..COMMIT_EVERY_ROWS {
            assert!(!stretch.read(true));
        }
        assert!(!stretch.read(false), "a tick is no row");
        assert!(stretch.read(true), "the 64th row asks for a commit");
        stretch.made(3);
        assert!(stretch.holds_results());
        stretch.committed(&mut held);
        stretch.committed(&mut held);
        assert_eq!((held.wall.count(), held.cpu.count()), (3, 0), "counted once; the CPU clock not sampled yet");
        assert_eq!(held.commits, 1);
        stretch.restart(false);
        assert!(!stretch.read(true), "a restart starts the count of rows again");
        stretch.made(2);
        stretch.restart(true);
        stretch.committed(&mut held);
        assert_eq!(held.wall.count(), 5);
    }

    #[test]
    fn the_first_rows_after_a_sleep_ask_for_a_commit_of_their_results_over_the_rounds_they_come_in_and_later_ones_do_not()
     {
        let mut stretch = Stretch::default();
        let mut held = HeldResults::default();
        stretch.new_round(false);
        stretch.read(true);
        stretch.made(1);
        assert_eq!(stretch.row_done(), RowDone::Hold, "a shard that never slept commits at a round's end");
        stretch.committed(&mut held);
        stretch.restart(false);
        stretch.new_round(true);
        stretch.read(true);
        assert_eq!(stretch.row_done(), RowDone::NothingHeld, "a row that made nothing asks for no commit");
        for row in 1..EAGER_COMMIT_ROWS {
            if row == 3 {
                // Rows that came while the first round worked: as cold, in a round of their own.
                stretch.new_round(false);
            }
            stretch.read(true);
            stretch.made(1);
            assert_eq!(stretch.row_done(), RowDone::Commit, "row {row} after the sleep");
            stretch.committed(&mut held);
            stretch.restart(false);
        }
        stretch.read(true);
        stretch.made(1);
        assert_eq!(
            stretch.row_done(),
            RowDone::Hold,
            "past the first rows after a sleep, results wait for the round's end"
        );
        stretch.new_round(false);
        stretch.read(true);
        assert_eq!(stretch.row_done(), RowDone::Hold, "nor does the next round without a sleep");
        stretch.new_round(true);
        stretch.read(true);
        assert_eq!(stretch.row_done(), RowDone::Commit, "a round after a sleep commits its first row's results");
        assert_eq!(held.commits, u64::from(EAGER_COMMIT_ROWS));
    }

    /// After a sleep, a row that made no result leaves nothing waiting: the next row's results
    /// are timed from that row's read, not from the read of the row before it (whose work, here
    /// a 150 ms pause, no result waited for). A busy shard's stretch keeps its first read.
    #[test]
    fn after_a_sleep_a_result_is_timed_from_the_read_of_its_row_not_of_a_row_that_made_none() {
        let mut stretch = Stretch::default();
        let mut held = HeldResults::default();
        stretch.new_round(true);
        stretch.read(true);
        std::thread::sleep(Duration::from_millis(150));
        assert_eq!(stretch.row_done(), RowDone::NothingHeld);
        stretch.restart(false);
        stretch.read(true);
        stretch.made(1);
        assert_eq!(stretch.row_done(), RowDone::Commit);
        stretch.committed(&mut held);
        let bound = held.wall.quantile_bound_us(1.0);
        assert!(bound.is_some_and(|us| us <= 100_000), "the row before it counted: {bound:?}");
    }

    #[test]
    fn a_stretch_is_timed_from_its_first_input_not_from_the_rounds_start() {
        let mut stretch = Stretch::default();
        let mut held = HeldResults::default();
        stretch.restart(false);
        std::thread::sleep(Duration::from_millis(150));
        stretch.read(true);
        stretch.made(1);
        stretch.committed(&mut held);
        assert_eq!(held.wall.count(), 1);
        let bound = held.wall.quantile_bound_us(1.0);
        assert!(bound.is_some_and(|us| us <= 100_000), "the 150 ms before the first read counted: {bound:?}");
    }

    #[test]
    fn one_stretch_in_so_many_that_read_is_timed_by_the_cpu_clock_too() {
        let mut stretch = Stretch::default();
        let mut held = HeldResults::default();
        for _ in 0..2 * CPU_SAMPLE_EVERY {
            stretch.restart(false);
            stretch.committed(&mut held);
            stretch.restart(false);
            stretch.read(true);
            stretch.read(true);
            stretch.made(1);
            stretch.committed(&mut held);
        }
        assert_eq!((held.wall.count(), held.cpu.count()), (u64::from(2 * CPU_SAMPLE_EVERY), 2));
    }

    /// Results made as time advanced are no matched pairs: they are counted apart from a row's,
    /// timed from the read of the frame that advanced it, and hold a commit as a row's do.
    #[test]
    fn results_made_as_time_advanced_are_counted_apart_from_a_rows() {
        let mut stretch = Stretch::default();
        let mut held = HeldResults::default();
        for _ in 0..CPU_SAMPLE_EVERY {
            stretch.restart(false);
            stretch.read(false); // a tick
            stretch.made_of_time(2);
            assert!(stretch.holds_results());
            stretch.committed(&mut held);
            assert!(!stretch.holds_results());
        }
        assert_eq!(
            (held.wall.count(), held.cpu.count(), held.of_time.count()),
            (0, 0, 2 * u64::from(CPU_SAMPLE_EVERY))
        );
        stretch.restart(false);
        stretch.read(true);
        stretch.made(3);
        stretch.made_of_time(1);
        stretch.committed(&mut held);
        assert_eq!((held.wall.count(), held.of_time.count(), held.count()), (3, 33, 36));
        assert_eq!(held.commits, u64::from(CPU_SAMPLE_EVERY) + 1);
    }
}
