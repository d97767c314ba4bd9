//! The collector: the calling thread's side that drains the shards' output rings into an
//! [`Emit`] (replay's files, the service's sinks, the bench's counters) and gathers the figures
//! of a run (CONTRACT.md "Metrics") from the feeder's stream counters and the shards' reports.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use crate::operator::host::OperatorCounters;
use crate::record::frame::to_row;
use crate::record::{ArchivedRow, Row, Value};
use crate::ring::FrameKind;
use crate::time::Time;

use super::driver::Driver;
use super::result_latency::HeldResults;
use super::wake::{BellCounts, Inbox, NUDGE_AFTER};
use super::wire::Frame;
use super::{Runtime, RuntimeError};
use crate::checkpoint::Completed;
use crate::operator::{ExpiryReason, Side};

/// Rows a shard's window must hold before its hot key is reported.
pub const HOT_KEY_MIN_ROWS: u64 = 100;

/// Where a run's outputs go, on the calling thread.
pub trait Emit {
    /// Operator `operator` emitted `row`. `after_barrier`: it left after its operator instance
    /// passed the barrier of the checkpoint under way, so a restart from that checkpoint produces
    /// it again (its `_id` is in [`Completed::early`]); only a driver that commits checkpoints
    /// cares.
    fn result(&mut self, operator: usize, row: &Row, after_barrier: bool);
    /// [`result`](Self::result) of a result read in place from its frame (`archive`: the row's
    /// bytes there). Writers that can read it there (replay's files, the sinks' JSON) override
    /// it; the default copies it out.
    fn result_archived(&mut self, operator: usize, row: &ArchivedRow, _archive: &[u8], after_barrier: bool) {
        self.result(operator, &to_row(row), after_barrier);
    }
    /// `row` reached operator `operator` on input `input` late (`after_barrier` as for
    /// [`result`](Self::result)).
    fn late(&mut self, operator: usize, input: usize, row: &Row, after_barrier: bool);
    /// Operator `operator` gave up state before its watermark freed it (`reason`): a stored row
    /// of input `input`, or (`None`) the result an open window or aggregate would have emitted
    /// (`after_barrier` as for [`result`](Self::result)).
    fn expired(&mut self, operator: usize, reason: ExpiryReason, input: Option<usize>, row: &Row, after_barrier: bool);
    /// A result (or late row) of operator `operator` was too large for the rings: it goes to
    /// `dead_letter` with `_stream` the operator's name, `raw` its first KiB as JSON and
    /// `_reason` `too_large`. The runtime counts it ([`Figures::operator_too_large`]) whatever an
    /// `Emit` does with it.
    fn too_large(&mut self, _operator: usize, _raw: &str) {}
    /// Every shard has written its part of a checkpoint: the driver commits it (with its own
    /// positions as of now: everything emitted so far is before them).
    fn checkpointed(&mut self, _done: Completed) {}
}

/// What a run leaves to report (CONTRACT.md "Metrics").
#[derive(Clone, Debug, Default)]
pub struct Figures {
    pub streams: Vec<StreamCounters>,
    pub stream_watermarks: Vec<Time>,
    pub stream_idle: Vec<bool>,
    pub operator_counters: Vec<OperatorCounters>,
    pub operator_watermarks: Vec<Time>,
    /// Per operator over all shards: (rows, bytes).
    pub operator_state: Vec<(usize, usize)>,
    /// Per operator: results too large for the rings (dead letters `too_large`).
    pub operator_too_large: Vec<u64>,
    /// Per shard thread: the monoio driver it ran on.
    pub drivers: Vec<&'static str>,
    /// Per shard thread: bytes of frames waiting in its feed ring.
    pub shard_ring_used_bytes: Vec<u64>,
    /// Processing time the figures are as of (the feeder's).
    pub now: i128,
    /// Per shard: the key carrying most of its recent rows ([`HotKeys`](super::hot_keys::HotKeys)).
    pub hot_keys: Vec<Option<super::hot_keys::HotKey>>,
    /// Over all shard threads: time taking checkpoint snapshots and encoding shard files, and
    /// time handing the files to the disk ([`ShardReport`]).
    pub checkpoint_snapshot: std::time::Duration,
    pub checkpoint_stall: std::time::Duration,
    /// Over all shard threads: how long they held their results (result_latency.rs).
    pub shard_results_held: HeldResults,
    /// Per shard: its state bytes as the budget counts them, and whether it is full
    /// (state/budget.rs; all zero without `state_budget`).
    pub shard_state: Vec<(u64, bool)>,
    /// What the doorbells counted ([`BellCounts`]): the feeder's (the calling thread), then
    /// each shard's.
    pub feeder_bell: BellCounts,
    pub shard_bells: Vec<BellCounts>,
}

/// Counters of one input stream.
#[derive(Clone, Debug, Default)]
pub struct StreamCounters {
    /// Rows received, decoded or not.
    pub rows: u64,
    /// Dead letters by reason label (`missing_field:ts`, …).
    pub dead_letters: BTreeMap<String, u64>,
}

/// What a shard thread hands back when it ends (and shows a live service once per tick).
#[derive(Clone)]
pub struct ShardReport {
    pub counters: Vec<OperatorCounters>,
    pub watermarks: Vec<Time>,
    /// Per operator: (rows, bytes).
    pub state: Vec<(usize, usize)>,
    pub driver: Driver,
    /// Checkpoint work on the shard thread: CPU time taking the snapshots and encoding the shard file,
    /// and handing the file to the disk (all of the write on the legacy driver,
    /// shard/file_write.rs).
    pub checkpoint_snapshot: std::time::Duration,
    pub checkpoint_stall: std::time::Duration,
    /// How long the shard held its results (result_latency.rs).
    pub held: HeldResults,
}

impl Runtime {
    /// End of input: every operator goes to +∞; waits for the shards to finish and drains them.
    pub fn finish(mut self, emit: &mut impl Emit) -> Result<Figures, RuntimeError> {
        self.seq += 1;
        self.writer.event(self.seq, None);
        self.send_written(None, FrameKind::EndOfInput, emit)?;
        self.publish(emit)?;
        self.release();
        let mut reports: Vec<Option<ShardReport>> = (0..self.shards).map(|_| None).collect();
        while reports.iter().any(Option::is_none) {
            let (results, ended) = (&self.results, &self.ended);
            self.bell.spin(|| results_waiting(results) || ended.iter().any(|e| e.load(Ordering::Relaxed)));
            self.bell.prepare_sleep();
            let drained = self.collect(emit);
            // Any shard that ended is joined at once: one that failed may leave the others
            // waiting for it forever, so its error must not wait behind them.
            let ended: Vec<usize> =
                (0..self.shards).filter(|&s| reports[s].is_none() && self.ended[s].load(Ordering::SeqCst)).collect();
            for &shard in &ended {
                reports[shard] = Some(self.join(shard)?);
            }
            if drained || !ended.is_empty() {
                self.bell.awake();
            } else if !self.bell.wait_blocking(&mut self.sleeper, NUDGE_AFTER) {
                self.nudge_shards();
            }
        }
        self.collect(emit);
        Ok(self.figures(reports.into_iter().flatten().collect()))
    }

    /// Drains results; when there are none and `has_input` says no input waits, sleeps until a
    /// shard or a source rings the doorbell, or `timeout` passes. A shard that ended (it can only
    /// fail before `finish`) is an error.
    pub fn wait(
        &mut self,
        emit: &mut impl Emit,
        timeout: std::time::Duration,
        has_input: impl Fn() -> bool,
    ) -> Result<(), RuntimeError> {
        if self.collect(emit) {
            return Ok(());
        }
        let results = &self.results;
        if self.feeder_spins && self.bell.spin(|| results_waiting(results) || has_input()) {
            self.collect(emit);
            return Ok(());
        }
        self.bell.prepare_sleep();
        if self.collect(emit) || has_input() {
            self.bell.awake();
            return Ok(());
        }
        if let Some(lost) = self.lost_shard() {
            return Err(lost);
        }
        self.sleep(timeout);
        Ok(())
    }

    /// After `prepare_sleep` found nothing: sleeps until rung or `timeout` passes. Returns whether
    /// it was rung.
    fn sleep(&mut self, timeout: std::time::Duration) -> bool {
        self.bell.wait_blocking(&mut self.sleeper, timeout)
    }

    /// Waits until every shard has taken every frame of its feed ring (a released ring wakes the
    /// feeder only when it asks for room: `ring/mod.rs` "Asking for room"), draining results
    /// meanwhile; each sleep lasts at most `timeout`.
    pub fn wait_taken(&mut self, emit: &mut impl Emit, timeout: std::time::Duration) -> Result<(), RuntimeError> {
        // Time slept without a wake-up: past NUDGE_AFTER the shards are nudged.
        let mut quiet = std::time::Duration::ZERO;
        loop {
            self.collect(emit);
            let feeds = &self.feeds;
            if self.bell.spin(|| feeds.iter().all(|f| f.ring.used_bytes() == 0)) {
                return Ok(());
            }
            for feed in self.feeds.iter().filter(|f| f.ring.used_bytes() > 0) {
                feed.ring.want_room();
            }
            // Looked at again after raising the flags: space released before a shard saw them
            // is found here (the ring's Dekker pair), so the sleep below misses nothing.
            self.bell.prepare_sleep();
            if self.feeds.iter().all(|f| f.ring.used_bytes() == 0) {
                self.bell.awake();
                return Ok(());
            }
            if self.collect(emit) {
                self.bell.awake();
                continue;
            }
            if let Some(lost) = self.lost_shard() {
                return Err(lost);
            }
            if self.sleep(timeout) {
                quiet = std::time::Duration::ZERO;
            } else {
                quiet += timeout;
                if quiet >= NUDGE_AFTER {
                    quiet = std::time::Duration::ZERO;
                    self.nudge_shards();
                }
            }
        }
    }

    /// The figures so far: the feeder's stream counters and clocks, and each shard's operator
    /// figures as of its last tick.
    pub fn live_figures(&self) -> Figures {
        let reports: Vec<ShardReport> = self
            .live
            .iter()
            .filter_map(|l| l.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone())
            .collect();
        self.figures(reports)
    }

    fn figures(&self, reports: Vec<ShardReport>) -> Figures {
        let ops = self.op_inputs.len();
        let streams = 0..self.stream_counters.len();
        let mut figures = Figures {
            streams: self.stream_counters.clone(),
            stream_watermarks: streams.clone().map(|s| self.planner.stream_watermark(s)).collect(),
            stream_idle: streams.map(|s| self.planner.stream_idle(s)).collect(),
            operator_counters: self.op_inputs.iter().map(|&inputs| OperatorCounters::new(inputs)).collect(),
            operator_watermarks: vec![Time::NEG_INF; ops],
            operator_state: vec![(0, 0); ops],
            operator_too_large: self.too_large.clone(),
            drivers: reports.iter().map(|r| r.driver.as_str()).collect(),
            shard_ring_used_bytes: self.feeds.iter().map(|f| f.ring.used_bytes()).collect(),
            now: self.planner.now(),
            hot_keys: self.hot_keys.iter().map(|h| h.report(HOT_KEY_MIN_ROWS)).collect(),
            checkpoint_snapshot: reports.iter().map(|r| r.checkpoint_snapshot).sum(),
            checkpoint_stall: reports.iter().map(|r| r.checkpoint_stall).sum(),
            shard_results_held: reports.iter().fold(HeldResults::default(), |mut all, r| {
                all.add(&r.held);
                all
            }),
            shard_state: self.shard_state(),
            feeder_bell: self.bell.counts(),
            shard_bells: self.shard_bells.iter().map(|b| b.counts()).collect(),
        };
        for report in &reports {
            for op in 0..ops {
                figures.operator_counters[op].add(&report.counters[op]);
                figures.operator_watermarks[op] = report.watermarks[op];
                figures.operator_state[op].0 += report.state[op].0;
                figures.operator_state[op].1 += report.state[op].1;
            }
        }
        figures
    }

    /// Writes every result the shards have sent so far. Returns whether there was any.
    pub(super) fn collect(&mut self, emit: &mut impl Emit) -> bool {
        let mut any = false;
        let mut results = std::mem::take(&mut self.results);
        for (shard, inbox) in results.iter_mut().enumerate() {
            any |= inbox.read_frames(|frame| match frame {
                Frame::Output { op, side: Side::TooLarge, row, .. } => {
                    self.too_large[op] += 1;
                    let stand_in = to_row(row);
                    let raw = match stand_in.values.first() {
                        Some(Value::Str(raw)) => raw.as_ref(),
                        _ => "",
                    };
                    emit.too_large(op, raw);
                }
                Frame::Output { op, side, row, archive } => self.emit_output(shard, op, side, row, archive, emit),
                Frame::Passed { op, epoch } => self.on_passed(shard, op, epoch, emit),
                _ => {}
            }) > 0;
        }
        self.results = results;
        any
    }
}

/// Whether a shard has committed results not collected yet.
fn results_waiting(results: &[Inbox]) -> bool {
    results.iter().any(|r| r.ring.has_frames())
}
