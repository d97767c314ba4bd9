//! The service's checkpoints (checkpoint/ has the protocol): one every `checkpoint_interval`
//! of processing time and one at every clean stop or reload. A checkpoint of the service holds,
//! besides the runtime's state, where the journal stood at the barrier (a restart replays only
//! what came after), the processing time then, the fingerprints of the messages last taken
//! (redelivery.rs) and the rows the sinks took after the barrier (taken.rs). Once it is
//! committed the journal lets go of what the newest checkpoint before its chain covers (a file
//! of the chain may be found damaged at the next start; [`restorable`] then falls back to that
//! one, whose files are its own: checkpoint/mod.rs, "Chains"): `journal_retention` and
//! `journal_bytes` bound the journal only while checkpoints fail.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::checkpoint::{CHECKPOINT_MEANWHILE, CHECKPOINT_SITE, Chain, CheckpointDir, Loaded, Manifest};
use crate::config::Durability;
use crate::state::snapshot;
use crate::storage::write_faults;

use super::ServiceError;
use super::intake::Intake;
use super::redelivery::Recent;

/// Where the service stood at a barrier.
#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct ServiceBarrier {
    /// The journal position of the first entry after the barrier.
    pub journal_next: u64,
    /// Processing time at the barrier.
    pub now: i128,
    /// Per source by name: fingerprints of the messages last taken.
    pub recent: Vec<(String, Vec<u64>)>,
}

/// The driver's part of a service checkpoint.
#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
struct ServiceCheckpoint {
    barrier: Vec<u8>,
    /// Rows the sinks took after the barrier, before the checkpoint completed (taken.rs).
    early: Vec<u64>,
}

/// A checkpoint to start from.
pub struct Restored {
    pub loaded: Loaded,
    pub barrier: ServiceBarrier,
    pub early: Vec<u64>,
}

/// The newest checkpoint in `dir` that this run can start from. One taken with another shard
/// count is set aside (its directory renamed, a warning): the service starts fresh from what the
/// journal still holds, with no keyed state re-partitioned.
pub fn restorable(dir: &CheckpointDir, shards: usize) -> Option<Restored> {
    let read = |loaded: &Loaded| {
        snapshot::decode::<ServiceCheckpoint>(&loaded.manifest.driver)
            .and_then(|c| Ok((snapshot::decode::<ServiceBarrier>(&c.barrier)?, c.early)))
            .map_err(|error| format!("its service part does not read back: {error}"))
    };
    let (loaded, (barrier, early)) = dir.latest_valid(read)?;
    let epoch = loaded.manifest.epoch;
    if loaded.manifest.shards as usize != shards {
        let taken = loaded.manifest.shards;
        let aside = dir.root().with_file_name(format!("checkpoints.{taken}-shards.set-aside"));
        tracing::warn!(
            epoch,
            taken,
            shards,
            aside = %aside.display(),
            "Checkpoint taken with another shard count: set aside; starting from the journal alone"
        );
        let _ = std::fs::remove_dir_all(&aside);
        if let Err(error) = std::fs::rename(dir.root(), &aside) {
            tracing::warn!(%error, "Cannot set the checkpoints aside; clearing them");
            dir.clear();
        }
        return None;
    }
    Some(Restored { loaded, barrier, early })
}

/// When checkpoints are taken.
pub struct Schedule {
    interval: i128,
    next_due: i128,
    /// The last epoch used.
    pub epoch: u64,
    /// Processing time the checkpoint under way began at.
    began: i128,
    shards: u32,
    /// The journal position of the barrier of each committed checkpoint a start may still fall
    /// back to: a commit releases the journal only up to the newest one before its chain, so a
    /// start that finds a file of the chain damaged falls back to that one without losing input
    /// (quarantine.rs).
    journal_at: BTreeMap<u64, u64>,
    /// Which checkpoint the next one may write deltas of (checkpoint/mod.rs, "Chains").
    chain: Chain,
}

impl Schedule {
    /// Epochs go on after every one already in `dir` (committed or not); chains as long as the
    /// journal's retention (`retention_ms`) covers ([`Chain::within_retention`]).
    pub fn new(dir: &CheckpointDir, interval_ms: i64, retention_ms: i64, now: i128, shards: usize) -> Schedule {
        let epoch = dir.epochs().last().copied().unwrap_or(0);
        let interval = i128::from(interval_ms);
        Schedule {
            interval,
            next_due: now + interval,
            epoch,
            began: now,
            shards: shards as u32,
            journal_at: BTreeMap::new(),
            chain: Chain::within_retention(retention_ms, interval_ms),
        }
    }
}

impl Schedule {
    /// The run goes on from checkpoint `epoch`, whose barrier stood at `journal_next`.
    pub fn resumed(&mut self, epoch: u64, journal_next: u64) {
        self.journal_at.insert(epoch, journal_next);
    }

    /// Checkpoint `epoch` is committed: the journal lets go of what the newest checkpoint
    /// before its chain covers (module doc).
    fn committed(&mut self, epoch: u64, journal_next: u64, journal: &mut crate::service::journal::Journal) {
        let chain_from = self.chain.chain_from(epoch);
        self.chain.committed(epoch);
        self.journal_at.insert(epoch, journal_next);
        if let Some((&fallback, &position)) = self.journal_at.range(..chain_from).next_back() {
            journal.release_before(position);
            self.journal_at = self.journal_at.split_off(&fallback);
        }
    }
}

impl Intake<'_> {
    /// Sends the barrier of the next checkpoint when one is due and none is under way.
    pub(super) fn checkpoint_if_due(&mut self) -> Result<(), ServiceError> {
        if self.now < self.schedule.next_due || self.runtime.checkpoint_in_flight() {
            return Ok(());
        }
        self.schedule.next_due = self.now + self.schedule.interval;
        self.begin_checkpoint()?;
        Ok(())
    }

    /// Sends a barrier now; false when one is already under way.
    fn begin_checkpoint(&mut self) -> Result<bool, ServiceError> {
        let recent = self
            .plan
            .sources
            .iter()
            .zip(&self.recent)
            .map(|(def, recent)| (def.name.clone(), recent.fingerprints()))
            .collect();
        let barrier = ServiceBarrier { journal_next: self.journal.positions().end, now: self.now, recent };
        let barrier = snapshot::encode(&barrier).map_err(|e| ServiceError::Checkpoint(e.to_string()))?;
        let epoch = self.schedule.epoch + 1;
        // Told first: the barrier may pass and its checkpoint complete within the call.
        self.outputs.taken.barrier(true);
        let base = self.schedule.chain.begin(epoch);
        let sent = self.runtime.checkpoint(epoch, base, barrier, &mut self.outputs)?;
        if sent {
            self.schedule.epoch = epoch;
            self.schedule.began = self.now;
        } else {
            self.outputs.taken.barrier(false);
        }
        Ok(sent)
    }

    /// Commits the checkpoint that completed, if one did, and lets the journal go of what it
    /// covers. A commit that fails (a full or broken disk) leaves the previous checkpoint in use
    /// and the journal as it is.
    pub(super) fn commit_completed(&mut self) {
        let Some((done, early)) = self.outputs.taken.take_completed() else { return };
        if self.outputs.lost_at_stop {
            // A result was not queued at the stop: the next start must produce it again.
            tracing::warn!(epoch = done.epoch, "Checkpoint not committed: a result could not be queued at the stop");
            return;
        }
        let epoch = done.epoch;
        let barrier = match snapshot::decode::<ServiceBarrier>(&done.driver) {
            Ok(barrier) => barrier,
            Err(error) => {
                tracing::warn!(epoch, %error, "Checkpoint not committed");
                return;
            }
        };
        // The results before the barrier may still be in a file sink's buffer (collected in this
        // round): they must be in the file before the manifest lets their input go, or a kill -9
        // right after the commit would lose them (the next start resumes after the barrier).
        if !self.outputs.flush() {
            tracing::warn!(epoch, "A file sink cannot write; checkpoint not committed");
            return;
        }
        if !self.journal_durable() {
            // Input before the barrier may not be on the disk: a power loss would lose it.
            tracing::warn!(epoch, "The journal could not be synced; checkpoint not committed");
            return;
        }
        if self.plan.runtime.durability == Durability::Power
            && let Err(error) = self.outputs.sync()
        {
            tracing::warn!(epoch, %error, "Sinks cannot be synced; checkpoint not committed");
            return;
        }
        let committed = snapshot::encode(&ServiceCheckpoint { barrier: done.driver, early })
            .map_err(|e| e.to_string())
            .and_then(|driver| {
                let chain_from = self.schedule.chain.chain_from(epoch);
                let manifest =
                    Manifest { epoch, shards: self.schedule.shards, feeder: done.feeder, driver, chain_from };
                self.outputs.taken.dir().commit(&manifest).map_err(|e| e.to_string())
            });
        if let Err(error) = committed {
            let path = self.outputs.taken.dir().epoch_dir(epoch);
            let disk_full = error.contains("No space left") || error.contains("quota exceeded");
            write_faults::failed_with(CHECKPOINT_SITE, &path, &error, disk_full, CHECKPOINT_MEANWHILE);
            return;
        }
        write_faults::recovered(CHECKPOINT_SITE);
        self.schedule.committed(epoch, barrier.journal_next, &mut self.journal);
        let control = &self.control;
        control.checkpoint_epoch.store(epoch, Ordering::Relaxed);
        let took = u64::try_from(self.now - self.schedule.began).unwrap_or(0);
        control.checkpoint_millis.store(took, Ordering::Relaxed);
        control.checkpoint_bytes.store(self.outputs.taken.dir().epoch_bytes(epoch), Ordering::Relaxed);
    }

    /// A clean stop or a reload: one last checkpoint of everything taken, so the next start
    /// repeats nothing. Waits at most `grace` for each of the one under way and the last.
    pub(super) fn final_checkpoint(&mut self, grace: Duration) -> Result<(), ServiceError> {
        self.finish_checkpoint(grace)?;
        if self.begin_checkpoint()? {
            self.finish_checkpoint(grace)?;
        }
        if self.runtime.checkpoint_in_flight() {
            tracing::warn!(
                "The last checkpoint did not complete in time: the next start repeats what came after the one before"
            );
        }
        Ok(())
    }

    /// Waits (at most `grace`) for the checkpoint under way, and commits it.
    fn finish_checkpoint(&mut self, grace: Duration) -> Result<(), ServiceError> {
        let step = Duration::from_millis(5);
        let mut waited = Duration::ZERO;
        while self.runtime.checkpoint_in_flight() && waited < grace {
            self.runtime.wait(&mut self.outputs, step, || false)?;
            waited += step;
        }
        self.commit_completed();
        Ok(())
    }
}

impl Recent {
    /// The fingerprints a checkpoint kept for `source`, if it did.
    pub fn from_barrier(barrier: &ServiceBarrier, source: &str) -> Recent {
        let kept = barrier.recent.iter().find(|(name, _)| name == source).map(|(_, f)| f.clone());
        Recent::restored(kept.unwrap_or_default())
    }
}
