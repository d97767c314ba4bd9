//! The byte budget of a shard's state: `runtime.state_budget` and `runtime.on_state_full`
//! (CONTRACT.md "Extensions under way"; README "Bounded state").
//!
//! # What is counted
//!
//! A shard's state bytes are the sum over its operator instances of
//! [`Operator::budget_bytes`](crate::operator::Operator::budget_bytes):
//!
//! - stored rows (interval and temporal joins' rows and versions, connect's keyed state — the
//!   threshold's limits, reconcile's sides): an arena counts the **segment files it maps** (in
//!   use and its spare: every one is RAM on the tmpfs scratch), not the records in them, plus its
//!   in-memory index (a slot per key holding its first rows' entries, 24 bytes per row beyond) and
//!   any row kept on the heap; a [`MemoryStore`](super::MemoryStore) its rows' bytes plus index;
//! - the windows of window joins, cogroups and window aggregates, absence's keys and pending
//!   rows, the joins' timers: each kind's `state_bytes` (plus 48 bytes per timer).
//!
//! Every figure is kept as a running count (the arena's mapped segments and index length, a
//! window set's bytes, absence's key bytes), so reading a shard's total after every round of its
//! loop costs a few loads per operator: nothing on the row path.
//!
//! The smallest budget a shard can run with is what its arenas map holding nothing: per store
//! the active segment and one spare ([`preallocated`]); a smaller `state_budget` is a
//! configuration error, naming the stores.
//!
//! # At the budget
//!
//! - **`backpressure`** (the default): a shard at or over its budget makes the intake take no
//!   more deliveries (`Runtime::state_full`): they wait in the intake channel, then the sources
//!   stop acknowledging and the brokers keep the rest. Nothing is dropped. Ticks go on while the
//!   intake waits, so the watermark can still move: streams with no rows turn idle after their
//!   `idle_timeout`, and with `idle_advance` an operator whose inputs are all idle advances with
//!   processing time, which evicts rows by the operator's own rule; the intake resumes once the
//!   shard is back under its budget. What the brokers held meanwhile may then be late (counted in
//!   `OPERATOR.late`), as after any idle advance. When nothing can free state — an
//!   `idle_timeout = "0ms"` stream, `idle_advance = false`, a window or key kept until the end of
//!   input — the intake waits for good: `/healthz` and `STATUS=` say so (`state budget full …
//!   nothing frees state while the intake waits`), the metric `braid_state_budget_full` is 1,
//!   and the fix is a larger budget, a `ttl`, or `evict_oldest`. The budget is checked between
//!   batches of the intake (256 deliveries): a shard can go past it by what its rings hold.
//! - **`evict_oldest`**: after a round of its loop, a shard over its budget evicts stored rows
//!   oldest first by (ts, id) across its operators until it is under [`low_mark`] (7/8 of the
//!   budget, so that one eviction pass frees room for many rows; between two ticks the shard can
//!   pass its budget by a tick's rows and the segment they open: 256 KiB, or a larger row's own); each evicted row goes to
//!   `OPERATOR.expired` with `_reason = "budget"` and is counted in
//!   `braid_operator_expired_total{operator,reason="budget"}`; an evicted row of an outer join is
//!   not emitted as `left_only`/`right_only`. Which rows go depends on how keys fall on shards:
//!   the one documented exception to shard independence (`--shards` changes the output only
//!   here). Windows and absence keys are evicted whole, by their own (ts, id) (the operator's
//!   `visit_evictable`), their would-be results to `OPERATOR.expired`; state braid cannot read (a
//!   connect's own `CoProcess`) is counted but not evicted: when it alone holds the budget, the
//!   shard applies backpressure instead (reported the same way).
//!
//! # Eviction order
//!
//! A pass visits every stored row's (ts, id) once ([`KeyedStore::visit_ages`]) and keeps the
//! oldest eighth of them ([`batch_for`]: at least 4 096, at most 64 Ki) in a bounded heap
//! ([`Oldest`]), then evicts them in order, re-checking the total after each, until under the low
//! mark (another pass if one was not enough): O(n log k) per pass, and a pass frees an eighth of
//! the budget, so the cost per evicted row is a few visits.
//!
//! [`KeyedStore::visit_ages`]: super::KeyedStore::visit_ages

use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::config::walk::{Errors, Table};
use crate::operator::OperatorSpec;
use crate::plan::Plan;

use super::arena::ArenaConfig;

/// Rows an eviction pass picks at least before it looks at the stores again.
pub const EVICT_BATCH: usize = 4096;

/// Rows a pass picks with `rows` stored: an eighth of them (what the low mark frees, with rows
/// of about equal size), so that one pass usually suffices; within [`EVICT_BATCH`] and 64 Ki.
pub fn batch_for(rows: usize) -> usize {
    (rows / 8 + 1).clamp(EVICT_BATCH, 1 << 16)
}

/// Bytes a join's timer costs (its heap entry), counted with its operator's state.
pub const TIMER_BYTES: usize = 48;

/// Arena stores one shard's instance of `spec` opens: two per join input pair, a connect's
/// function's slots (threshold: its limits; reconcile: two sides; a custom function: at least one).
pub fn arena_stores(spec: &OperatorSpec) -> usize {
    match spec {
        OperatorSpec::IntervalJoin(_) | OperatorSpec::TemporalJoin(_) => 2,
        OperatorSpec::Connect(spec) => match spec.function {
            crate::operator::connect::FunctionSpec::Threshold(_)
            | crate::operator::connect::FunctionSpec::Custom(_) => 1,
            crate::operator::connect::FunctionSpec::Reconcile(_) => 2,
        },
        OperatorSpec::Union(_)
        | OperatorSpec::WindowJoin(_)
        | OperatorSpec::CoGroup(_)
        | OperatorSpec::WindowAggregate(_)
        | OperatorSpec::Absence(_) => 0,
    }
}

/// Bytes a shard's arenas map holding no row: per store its active segment and its spares.
pub fn preallocated(plan: &Plan) -> u64 {
    let config = ArenaConfig::default();
    let per_store = (config.segment_bytes * (1 + config.spare_segments)) as u64;
    plan.operators.iter().map(|o| arena_stores(&o.spec) as u64 * per_store).sum()
}

/// A `state_budget` below what the arenas preallocate is an error at the key.
pub(crate) fn check_budget(plan: &Plan, runtime: Table<'_, '_>, errors: &mut Errors) {
    let Some(budget) = plan.runtime.state_budget else { return };
    let minimum = preallocated(plan);
    if budget >= minimum {
        return;
    }
    let stores: Vec<String> = plan
        .operators
        .iter()
        .filter(|o| arena_stores(&o.spec) > 0)
        .map(|o| format!("{} ({})", o.name, arena_stores(&o.spec)))
        .collect();
    runtime.error(
        "state_budget",
        errors,
        format!(
            "{} is less than the {} a shard's arenas map holding nothing (an active and a spare {} segment per store; \
             stores: {}); give at least that, better a few times more",
            show_bytes(budget),
            show_bytes(minimum),
            show_bytes(ArenaConfig::default().segment_bytes as u64),
            stores.join(", ")
        ),
    );
}

/// `1MiB`, `512KiB`, `100B`: the largest unit that divides `bytes`.
pub fn show_bytes(bytes: u64) -> String {
    for (unit, scale) in [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
        if bytes >= scale && bytes.is_multiple_of(scale) {
            return format!("{}{unit}", bytes / scale);
        }
    }
    format!("{bytes}B")
}

/// What eviction brings a shard down to: 7/8 of its budget.
pub fn low_mark(budget: u64) -> u64 {
    budget - budget / 8
}

/// Every shard's state bytes as of its last round, shared by the shard threads (writers) and
/// the intake (reader). One word per shard, written with relaxed stores: the intake's check is a
/// soft bound anyway (module doc).
#[derive(Debug, Default)]
pub struct StateGauge {
    bytes: Vec<AtomicU64>,
    /// Per shard: 1 while it is at its budget with nothing it may evict.
    full: Vec<AtomicU64>,
}

impl StateGauge {
    pub fn new(shards: usize) -> StateGauge {
        StateGauge {
            bytes: (0..shards).map(|_| AtomicU64::new(0)).collect(),
            full: (0..shards).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Shard `shard` holds `bytes`; `full`: at its budget and the intake should wait.
    pub fn set(&self, shard: usize, bytes: u64, full: bool) {
        if let (Some(b), Some(f)) = (self.bytes.get(shard), self.full.get(shard)) {
            b.store(bytes, Ordering::Relaxed);
            f.store(u64::from(full), Ordering::Relaxed);
        }
    }

    /// Per shard: (bytes, full).
    pub fn shards(&self) -> Vec<(u64, bool)> {
        self.bytes
            .iter()
            .zip(&self.full)
            .map(|(b, f)| (b.load(Ordering::Relaxed), f.load(Ordering::Relaxed) == 1))
            .collect()
    }

    /// Some shard is full: the intake waits.
    pub fn any_full(&self) -> bool {
        self.full.iter().any(|f| f.load(Ordering::Relaxed) == 1)
    }
}

/// A stored row an eviction pass may take: its age, and where it is (operator, input, key
/// hash, handle).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Candidate {
    pub ts: i64,
    pub id: u64,
    pub op: usize,
    pub input: usize,
    pub key_hash: u64,
    pub handle: u64,
}

/// The `k` oldest candidates offered, by (ts, id): a max-heap of size `k`.
#[derive(Debug)]
pub struct Oldest {
    k: usize,
    heap: BinaryHeap<Candidate>,
}

impl Oldest {
    pub fn new(k: usize) -> Oldest {
        Oldest { k, heap: BinaryHeap::with_capacity(k + 1) }
    }

    pub fn offer(&mut self, candidate: Candidate) {
        if self.heap.len() < self.k {
            self.heap.push(candidate);
        } else if self.heap.peek().is_some_and(|newest| candidate < *newest) {
            self.heap.pop();
            self.heap.push(candidate);
        }
    }

    /// The kept candidates, oldest first.
    pub fn into_sorted(self) -> Vec<Candidate> {
        self.heap.into_sorted_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(ts: i64, id: u64) -> Candidate {
        Candidate { ts, id, op: 0, input: 0, key_hash: id, handle: id }
    }

    #[test]
    fn oldest_keeps_the_k_smallest_by_ts_then_id() {
        let mut oldest = Oldest::new(3);
        for (ts, id) in [(5, 1), (1, 9), (3, 2), (1, 4), (7, 0), (3, 1), (0, 100)] {
            oldest.offer(candidate(ts, id));
        }
        let got: Vec<(i64, u64)> = oldest.into_sorted().iter().map(|c| (c.ts, c.id)).collect();
        assert_eq!(got, [(0, 100), (1, 4), (1, 9)]);
    }

    #[test]
    fn low_mark_and_sizes() {
        assert_eq!(low_mark(8 << 20), 7 << 20);
        assert_eq!((batch_for(0), batch_for(80_000), batch_for(10_000_000)), (EVICT_BATCH, 10_001, 1 << 16));
        assert_eq!(show_bytes(4 << 20), "4MiB");
        assert_eq!(show_bytes(1536), "1536B");
        assert_eq!(show_bytes(3 << 10), "3KiB");
    }
}
