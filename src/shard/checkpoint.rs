//! The runtime's side of checkpoints (checkpoint/mod.rs has the whole story): the feeder puts
//! the barrier into every ring and notes its own state; the collector watches the barrier pass
//! each operator instance, tells results that left after it apart, and hands the driver the
//! completed checkpoint once every shard has written its snapshots.

use crate::checkpoint::{Completed, Early};
use crate::record::ArchivedRow;
use crate::record::frame::to_row;
use crate::ring::FrameKind;
use crate::state::snapshot::{self, SnapshotError};
use crate::time::ticks::PlannerState;

use super::wire::{SHARD_DONE, SHARD_FAILED};
use super::{Emit, Runtime, RuntimeError, StreamCounters};
use crate::operator::Side;

/// A checkpoint whose barrier is on its way through the shards.
pub(super) struct InFlight {
    epoch: u64,
    /// `[shard][op]`: the barrier passed that instance.
    passed: Vec<Vec<bool>>,
    /// Shards that wrote their file, and shards that could not.
    written: usize,
    failed: usize,
    feeder: Vec<u8>,
    driver: Vec<u8>,
    early: Vec<Early>,
}

/// A stream's counters: its name, rows, and dead letters by reason.
type SavedStream = (String, u64, Vec<(String, u64)>);

/// What a checkpoint keeps of the feeder.
#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
struct FeederState {
    planner: PlannerState,
    seq: u64,
    streams: Vec<SavedStream>,
    /// Operator names, in the planner's order.
    operators: Vec<String>,
}

impl Runtime {
    /// Starts checkpoint `epoch` right here, between two events (call it after
    /// [`advance_to`](Self::advance_to), so the barrier follows a tick boundary): `driver` is the
    /// driver's state at this point (where its input stands), handed back with the completed
    /// checkpoint ([`Emit::checkpointed`]). `base`: a committed checkpoint, the last one taken,
    /// that operators may write deltas of (checkpoint/mod.rs, "Chains"); 0 for whole snapshots.
    /// Returns false, starting nothing, when checkpoints are off or the previous one is still
    /// under way.
    pub fn checkpoint(
        &mut self,
        epoch: u64,
        base: u64,
        driver: Vec<u8>,
        emit: &mut impl Emit,
    ) -> Result<bool, RuntimeError> {
        if !self.checkpoints || self.in_flight.is_some() {
            return Ok(false);
        }
        let feeder = self.feeder_snapshot().map_err(|e| RuntimeError::Frame(e.to_string()))?;
        self.seq += 1;
        self.writer.barrier(self.seq, epoch, base);
        self.in_flight = Some(InFlight {
            epoch,
            passed: vec![vec![false; self.op_inputs.len()]; self.shards],
            written: 0,
            failed: 0,
            feeder,
            driver,
            early: Vec::new(),
        });
        self.send_written(None, FrameKind::Barrier, emit)?;
        self.publish(emit)?;
        Ok(true)
    }

    /// Whether a checkpoint is under way.
    pub fn checkpoint_in_flight(&self) -> bool {
        self.in_flight.is_some()
    }

    /// The feeder's state, taken before the barrier's sequence number is drawn (a restart sends
    /// the next event with the barrier's number, as the run that took it did after it).
    fn feeder_snapshot(&self) -> Result<Vec<u8>, SnapshotError> {
        let streams = self
            .stream_counters
            .iter()
            .zip(&self.stream_names)
            .map(|(c, name)| (name.clone(), c.rows, c.dead_letters.iter().map(|(r, n)| (r.clone(), *n)).collect()))
            .collect();
        let operators = self.operator_names.clone();
        snapshot::encode(&FeederState { planner: self.planner.saved(), seq: self.seq, streams, operators })
    }

    /// Takes up the feeder's state of a checkpoint. Streams and operators are matched by name:
    /// after a reload, new ones start fresh and removed ones are dropped.
    pub(super) fn restore_feeder(&mut self, bytes: &[u8]) -> Result<(), SnapshotError> {
        let saved: FeederState = snapshot::decode(bytes)?;
        let by_name = |names: &[String], name: &String| names.iter().position(|n| n == name);
        let saved_streams: Vec<String> = saved.streams.iter().map(|(name, ..)| name.clone()).collect();
        let streams: Vec<Option<usize>> = self.stream_names.iter().map(|n| by_name(&saved_streams, n)).collect();
        let ops: Vec<Option<usize>> = self.operator_names.iter().map(|n| by_name(&saved.operators, n)).collect();
        self.planner.restore(saved.planner, &streams, &ops);
        // The barrier took `seq + 1`; the next event gets the number after it.
        self.seq = saved.seq + 1;
        for (counters, from) in self.stream_counters.iter_mut().zip(streams) {
            if let Some((_, rows, dead)) = from.and_then(|s| saved.streams.get(s)) {
                *counters = StreamCounters { rows: *rows, dead_letters: dead.iter().cloned().collect() };
            }
        }
        Ok(())
    }

    /// A `Passed` frame from `shard`.
    pub(super) fn on_passed(&mut self, shard: usize, op: u32, epoch: u64, emit: &mut impl Emit) {
        let Some(flight) = self.in_flight.as_mut().filter(|f| f.epoch == epoch) else { return };
        match op {
            SHARD_DONE => flight.written += 1,
            SHARD_FAILED => flight.failed += 1,
            op => {
                if let Some(passed) = flight.passed[shard].get_mut(op as usize) {
                    *passed = true;
                }
            }
        }
        if flight.written + flight.failed < self.shards {
            return;
        }
        let Some(flight) = self.in_flight.take() else { return };
        if flight.failed > 0 {
            if crate::storage::write_faults::is_failing(crate::checkpoint::CHECKPOINT_SITE) {
                // Reported already, with the path and rate-limited (storage/write_faults.rs).
                tracing::debug!(
                    epoch,
                    shards = flight.failed,
                    "Checkpoint failed on some shards; the previous one stays"
                );
            } else {
                tracing::warn!(
                    epoch,
                    shards = flight.failed,
                    "Checkpoint failed on some shards; the previous one stays"
                );
            }
            return;
        }
        emit.checkpointed(Completed { epoch, feeder: flight.feeder, driver: flight.driver, early: flight.early });
    }

    /// Hands a result, late or expired row of `op` from `shard` to `emit`, noting it when it
    /// left after its instance passed the barrier of the checkpoint under way.
    /// A row read in place from an `Output` frame: a result is handed over as it lies (written
    /// out from there), a side row copied out.
    pub(super) fn emit_output(
        &mut self,
        shard: usize,
        op: usize,
        side: Side,
        row: &ArchivedRow,
        archive: &[u8],
        emit: &mut impl Emit,
    ) {
        let flight = self.in_flight.as_mut().filter(|f| f.passed[shard].get(op).copied().unwrap_or(false));
        let after_barrier = flight.is_some();
        if let Some(flight) = flight {
            flight.early.push(Early { op: op as u32, input: side.code(), id: row.id.to_native() });
        }
        match side {
            Side::Result => emit.result_archived(op, row, archive, after_barrier),
            Side::Late(input) => emit.late(op, input, &to_row(row), after_barrier),
            Side::Expired { reason, input } => emit.expired(op, reason, input, &to_row(row), after_barrier),
            // The collector hands stand-ins to `Emit::too_large` before this.
            Side::TooLarge => {}
        }
    }
}
