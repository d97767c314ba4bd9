//! Measuring a bench run: which results are traced back to the row whose ingest emitted them
//! (latency from hand-over on the feeding thread to the result reaching [`Emit`] there), the
//! process's CPU time, and its memory from /proc/self/status.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::io::Read;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use braid::checkpoint::{Chain, CheckpointDir, Completed, Manifest};
use braid::operator::{ExpiryReason, OperatorSpec, ResultKind};
use braid::plan::{OperatorDef, Plan};
use braid::record::{Row, Value};
use braid::shard::{Emit, Runtime, RuntimeError};

use super::{CheckpointFigures, LATENCY_MAX_NS, wall_clock};

/// Which results of an operator are traced to the row whose ingest emitted them.
#[derive(Clone, Copy)]
enum Trace {
    /// Every result: a union passes its input rows through (their key and event time).
    Rows,
    /// Results whose `_kind` (value `kind`) is `match`: an interval join emits a pair when its
    /// second row is ingested, with the key and the later event time of the two.
    Matches { kind: usize },
    /// None: the operator emits at watermarks or at processing time.
    Untraced,
}

impl Trace {
    fn of(def: &OperatorDef) -> Trace {
        match def.spec {
            OperatorSpec::Union(_) => Trace::Rows,
            OperatorSpec::IntervalJoin(_) => def
                .output
                .fields
                .iter()
                .position(|f| f.name == "_kind")
                .map_or(Trace::Untraced, |kind| Trace::Matches { kind }),
            OperatorSpec::Connect(_)
            | OperatorSpec::WindowJoin(_)
            | OperatorSpec::CoGroup(_)
            | OperatorSpec::WindowAggregate(_)
            | OperatorSpec::TemporalJoin(_)
            | OperatorSpec::Absence(_) => Trace::Untraced,
        }
    }

    fn traces(self, row: &Row) -> bool {
        match self {
            Trace::Rows => true,
            Trace::Matches { kind } => {
                matches!(row.values.get(kind), Some(Value::Str(k)) if **k == *ResultKind::Match.as_str())
            }
            Trace::Untraced => false,
        }
    }
}

/// Hashes a (key hash, event time) pair: the key hash is already a good hash.
#[derive(Default)]
struct PairHasher(u64);

impl Hasher for PairHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(29) ^ v).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    fn write_i64(&mut self, v: i64) {
        self.write_u64(v as u64);
    }
}

/// Counts results and times those traced to their row.
pub(super) struct Meter {
    /// Instants are kept as ns since this one.
    epoch: Instant,
    /// Per operator: which of its results are traced.
    trace: Vec<Trace>,
    /// The rows of the current batch: (key hash, event time) → hand-over, ns since `epoch`.
    handed: HashMap<(u64, i64), u64, BuildHasherDefault<PairHasher>>,
    pub(super) finishing: bool,
    pub(super) latency: Histogram<u64>,
    pub(super) at_ingest: u64,
    pub(super) at_tick: u64,
    pub(super) at_finish: u64,
    checkpoints: Checkpoints,
}

impl Meter {
    pub(super) fn new(plan: &Plan, batch_rows: usize) -> Meter {
        let latency = match Histogram::new_with_bounds(1, LATENCY_MAX_NS, 3) {
            Ok(h) => h,
            Err(e) => unreachable!("constant histogram bounds are valid: {e:?}"),
        };
        Meter {
            epoch: wall_clock(),
            trace: plan.operators.iter().map(Trace::of).collect(),
            handed: HashMap::with_capacity_and_hasher(batch_rows, BuildHasherDefault::default()),
            finishing: false,
            latency,
            at_ingest: 0,
            at_tick: 0,
            at_finish: 0,
            checkpoints: Checkpoints::default(),
        }
    }

    fn now_ns(&self) -> u64 {
        u64::try_from(wall_clock().saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    /// Forgets the previous batch's rows (its results are all in).
    pub(super) fn new_batch(&mut self) {
        self.handed.clear();
    }

    pub(super) fn results(&self) -> u64 {
        self.at_ingest + self.at_tick + self.at_finish
    }

    /// `row` is being handed to the runtime.
    pub(super) fn hand_over(&mut self, row: &Row) {
        let at = self.now_ns();
        self.handed.insert((row.key_hash, row.ts), at);
    }
}

/// Checkpoints of a bench run: when each barrier went, what each committed checkpoint took.
#[derive(Default)]
pub(super) struct Checkpoints {
    epoch: u64,
    sent: Option<Instant>,
    dir: Option<CheckpointDir>,
    shards: u32,
    durations: Vec<Duration>,
    bytes: Vec<u64>,
    /// Chains of deltas, as `braid run` takes them (checkpoint/mod.rs, "Chains").
    chain: Chain,
}

impl Meter {
    /// Sends the next checkpoint's barrier; it is committed (into `dir`) when it completes.
    pub(super) fn checkpoint(
        &mut self,
        runtime: &mut Runtime,
        dir: &CheckpointDir,
        shards: usize,
    ) -> Result<(), RuntimeError> {
        self.checkpoints.epoch += 1;
        self.checkpoints.shards = shards as u32;
        self.checkpoints.dir.get_or_insert_with(|| dir.clone());
        self.checkpoints.sent = Some(wall_clock());
        let base = self.checkpoints.chain.begin(self.checkpoints.epoch);
        runtime.checkpoint(self.checkpoints.epoch, base, Vec::new(), self)?;
        Ok(())
    }

    pub(super) fn checkpoint_figures(&self, restore: Option<(Duration, u64)>) -> CheckpointFigures {
        let c = &self.checkpoints;
        let mut durations = c.durations.clone();
        durations.sort_unstable();
        CheckpointFigures {
            committed: c.bytes.len() as u64,
            bytes_total: c.bytes.iter().sum(),
            bytes_max: c.bytes.iter().copied().max().unwrap_or(0),
            duration_p50: durations.get(durations.len() / 2).copied().unwrap_or_default(),
            duration_max: durations.last().copied().unwrap_or_default(),
            restore: restore.map(|r| r.0),
            restored_bytes: restore.map_or(0, |r| r.1),
            ..CheckpointFigures::default()
        }
    }
}

/// An [`Emit`] for the runtime a restore is timed on: it gets no input, so nothing comes.
#[derive(Default)]
pub(super) struct Nothing;

impl Emit for Nothing {
    fn result(&mut self, _operator: usize, _row: &Row, _after_barrier: bool) {}
    fn late(&mut self, _operator: usize, _input: usize, _row: &Row, _after_barrier: bool) {}
    // Counted by the operator hosts (`braid_operator_expired_total`); the bench writes no rows.
    fn expired(&mut self, _: usize, _: ExpiryReason, _: Option<usize>, _: &Row, _: bool) {}
    fn checkpointed(&mut self, _done: Completed) {}
}

impl Emit for Meter {
    fn checkpointed(&mut self, done: Completed) {
        let c = &mut self.checkpoints;
        let Some(dir) = &c.dir else { return };
        let chain_from = c.chain.chain_from(done.epoch);
        let manifest =
            Manifest { epoch: done.epoch, shards: c.shards, feeder: done.feeder, driver: done.driver, chain_from };
        if dir.commit(&manifest).is_ok() {
            c.chain.committed(done.epoch);
            if let Some(sent) = c.sent.take() {
                c.durations.push(wall_clock().saturating_duration_since(sent));
            }
            c.bytes.push(dir.epoch_bytes(done.epoch));
        }
    }

    fn result(&mut self, operator: usize, row: &Row, _after_barrier: bool) {
        let handed = self.trace[operator].traces(row).then(|| self.handed.get(&(row.key_hash, row.ts))).flatten();
        if let Some(&handed) = handed {
            let ns = self.now_ns().saturating_sub(handed);
            self.latency.saturating_record(ns.max(1));
            self.at_ingest += 1;
        } else if self.finishing {
            self.at_finish += 1;
        } else {
            self.at_tick += 1;
        }
    }

    fn late(&mut self, _operator: usize, _input: usize, _row: &Row, _after_barrier: bool) {}
    // Counted by the operator hosts (`braid_operator_expired_total`); the bench writes no rows.
    fn expired(&mut self, _: usize, _: ExpiryReason, _: Option<usize>, _: &Row, _: bool) {}
}

pub(super) use braid::time::cpu::{context_switches, process as process_cpu_time};

/// /proc/self/status, read into a buffer kept across reads: sampling after every batch must not
/// allocate (a growing read buffer made glibc consolidate its whole heap each time).
pub(super) struct ProcStatus {
    text: String,
}

impl ProcStatus {
    pub(super) fn new() -> ProcStatus {
        ProcStatus { text: String::with_capacity(16 * 1024) }
    }

    /// Reads the file again; empty where there is none.
    pub(super) fn read(&mut self) -> &Self {
        self.text.clear();
        let read = std::fs::File::open("/proc/self/status").and_then(|mut f| f.read_to_string(&mut self.text));
        if read.is_err() {
            self.text.clear();
        }
        self
    }

    /// A `kB` field (`RssAnon`, `VmRSS`) of the last read, `None` where there is none.
    pub(super) fn kib(&self, field: &str) -> Option<u64> {
        self.text.lines().find_map(|line| {
            let rest = line.strip_prefix(field)?.strip_prefix(':')?;
            rest.trim().strip_suffix("kB")?.trim().parse().ok()
        })
    }
}
