//! The operator host: one shard's instance of an operator with everything around it that is not
//! the operator's own semantics — its watermark clock, its counters, the late rule for broadcast
//! rows and the rank of what it emits. Every path (replay, `braid run`, `braid bench`) runs
//! operators through a host on a shard thread; nothing else advances an operator's watermark.
//!
//! - **Watermark** (rule 5): at every tick the host's [`OperatorClock`] takes
//!   `max(previous, min over non-idle inputs)` — or moves on with processing time when every
//!   input is idle and `idle_advance` is on — and the operator hears of it only when it moved.
//!   At the end of input it goes to +∞, after the last processing-time timers fired.
//! - **Broadcast rows** reach every shard's instance and every instance judges them against the
//!   same operator watermark, so they agree on lateness: the row is counted, and a late one
//!   reported, by shard 0 alone.
//! - **Rank**: what all instances of an operator emit at once (at a watermark, on processing
//!   time, at the end, for a broadcast row) reaches downstream operators ranked by
//!   [`origin_rank`], the stable hash of the key each result came from. All of one key's results
//!   come from one instance, so ranking (stably) keeps each key's own order and makes the order
//!   across keys independent of how keys fall on shards.
//! - **Expiry** (`ttl`, state/ttl.rs): the host keeps the operator's [`TtlClock`] — it hears of
//!   processing time before every row (a `ttl` operator is clocked) and of every row the
//!   operator stored ([`Output::stored`]) — and at each tick, after the watermark moved, hands
//!   the operator what is due ([`Operator::expire`]); the operator sends it to
//!   `OPERATOR.expired`. The clock is in the host's snapshot, so it survives a restart.
//! - **Trace** (`braid explain`): with a [`Trace`] attached, the host notes what it already knows
//!   about the rows of the traced keys — the watermark each met on arrival, whether it was late —
//!   and every move of its watermark. Without one the row path pays a single branch.

use super::KindStateView;
use super::connect::END_OF_INPUT;
use super::{ExpiryReason, Operator, Output, Quality, ResultKind};
use crate::record::{ArchivedRow, Row};
use crate::state::snapshot::{self, InBuffer, Nest, NestResolver, SnapshotBuffer, SnapshotError, SnapshotSerializer};
use crate::state::ttl::{SavedTtl, TtlClock};
use crate::time::clock::InputTime;
use crate::time::{OperatorClock, Time};
use rkyv::rancor;

/// What `braid explain` follows: the rows of a few keys (by key hash) through every operator.
/// Hosts on every shard note into it; the notes are read once the run is over.
#[derive(Debug, Default)]
pub struct Trace {
    keys: Vec<u64>,
    notes: std::sync::Mutex<Vec<TraceNote>>,
}

/// One note of a [`Trace`].
#[derive(Clone, Debug, PartialEq)]
pub enum TraceNote {
    Arrival(Arrival),
    /// The watermark of operator `op` moved to `watermark` at the tick at processing time `tick`
    /// ([`END_OF_INPUT`] at the end). Noted by shard 0 only: every shard's instance agrees.
    Watermark {
        op: usize,
        tick: i128,
        watermark: Time,
    },
    /// A row of a traced key (`id`) left operator `op`'s state to `OPERATOR.expired`.
    Expired {
        op: usize,
        key_hash: u64,
        id: u64,
        reason: ExpiryReason,
    },
}

impl Trace {
    pub fn new(keys: Vec<u64>) -> Trace {
        Trace { keys, notes: std::sync::Mutex::default() }
    }

    fn follows(&self, key_hash: u64) -> bool {
        self.keys.contains(&key_hash)
    }

    fn note(&self, note: TraceNote) {
        // A poisoned lock only means another shard panicked; its notes are still sound.
        self.notes.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(note);
    }

    /// Every note so far, in no particular order across shards.
    pub fn notes(&self) -> Vec<TraceNote> {
        self.notes.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}

/// A row of a traced key reached operator `op` on input `input` on shard `shard`, after the tick
/// at processing time `tick`, when the operator's watermark was `watermark`.
#[derive(Clone, Debug, PartialEq)]
pub struct Arrival {
    pub op: usize,
    pub input: usize,
    pub shard: usize,
    pub key_hash: u64,
    pub id: u64,
    pub ts: i64,
    pub tick: i128,
    pub watermark: Time,
    pub late: bool,
    /// A window aggregate's `where` dropped it.
    pub filtered: bool,
}

/// The trace a host notes into, and where it is.
struct Tracing {
    trace: std::sync::Arc<Trace>,
    op: usize,
    shard: usize,
    /// Processing time of the last tick the host saw.
    tick: i128,
}

/// The rank of a result among everything its operator's instances emit at once: the stable hash
/// of the key of the row it came from (at `origin`, the plan's origin key position; its own key
/// when there is none).
pub fn origin_rank(row: &Row, origin: &[usize]) -> u64 {
    use crate::record::view::KeyRef;
    match origin {
        // One key field: hashed in place (no allocation per result).
        [pos] => {
            row.values.get(*pos).and_then(KeyRef::from_value).map_or(row.key_hash, crate::record::id::key_ref_hash)
        }
        _ => crate::record::Key::from_values(&row.values, origin)
            .map_or(row.key_hash, |key| crate::record::id::key_hash(&key)),
    }
}

/// Counters of one operator (CONTRACT.md "Metrics").
#[derive(Clone, Debug, Default, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct OperatorCounters {
    pub rows_in: Vec<u64>,
    pub late: Vec<u64>,
    /// Join kinds only ([`OperatorKind::is_join`](super::OperatorKind::is_join)), per input: rows
    /// that left the state matched / unmatched ([`Quality`]); zero for the other kinds.
    pub matched: Vec<u64>,
    pub unmatched: Vec<u64>,
    /// Per input: rows that left the state by `ttl` or the state budget, as themselves (counted
    /// here) or inside an expired window's would-be result (the operator's [`Quality`]). Join
    /// kinds complete the identity matched + unmatched + late + expired = rows with it.
    pub expired_rows: Vec<u64>,
    /// By [`ResultKind`] in `ResultKind::ALL` order.
    pub results: [u64; ResultKind::ALL.len()],
    /// Lines sent to `OPERATOR.expired` — rows, and would-be results of open windows and absence
    /// keys — by [`ExpiryReason`] in `ExpiryReason::ALL` order.
    pub expired: [u64; ExpiryReason::ALL.len()],
}

impl OperatorCounters {
    pub fn new(inputs: usize) -> OperatorCounters {
        OperatorCounters {
            rows_in: vec![0; inputs],
            late: vec![0; inputs],
            matched: vec![0; inputs],
            unmatched: vec![0; inputs],
            expired_rows: vec![0; inputs],
            results: [0; ResultKind::ALL.len()],
            expired: [0; ExpiryReason::ALL.len()],
        }
    }

    pub fn add(&mut self, other: &OperatorCounters) {
        for (a, b) in self.rows_in.iter_mut().zip(&other.rows_in) {
            *a += b;
        }
        for (a, b) in self.late.iter_mut().zip(&other.late) {
            *a += b;
        }
        for (a, b) in self.matched.iter_mut().zip(&other.matched) {
            *a += b;
        }
        for (a, b) in self.unmatched.iter_mut().zip(&other.unmatched) {
            *a += b;
        }
        for (a, b) in self.expired_rows.iter_mut().zip(&other.expired_rows) {
            *a += b;
        }
        for (a, b) in self.results.iter_mut().zip(&other.results) {
            *a += b;
        }
        for (a, b) in self.expired.iter_mut().zip(&other.expired) {
            *a += b;
        }
    }

    /// Counts what one activation produced (the whole of `out`, drained after each).
    fn count(&mut self, out: &Output) {
        for (input, _) in &out.late {
            self.late[*input] += 1;
        }
        for (kind, _) in &out.results {
            self.results[*kind as usize] += 1;
        }
        for kind in out.archived.kinds() {
            self.results[*kind as usize] += 1;
        }
        for expired in &out.expired {
            self.expired[expired.reason as usize] += 1;
            if let Some(rows) = expired.input.and_then(|input| self.expired_rows.get_mut(input)) {
                *rows += 1;
            }
        }
    }
}

/// What a checkpoint keeps of an [`OperatorHost`]: its own state and its operator's snapshot.
#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
struct HostState {
    clock: OperatorClock,
    counters: OperatorCounters,
    broadcast_inputs: u64,
    ttl: Option<SavedTtl>,
    operator: Vec<u8>,
}

/// [`HostState`] as a snapshot writes it: the operator's snapshot nested in place.
struct HostStateView<'a> {
    clock: OperatorClock,
    counters: OperatorCounters,
    broadcast_inputs: u64,
    ttl: Option<SavedTtl>,
    operator: Nest<KindStateView<'a>>,
}

type HostStateViewResolver = (
    <OperatorClock as rkyv::Archive>::Resolver,
    <OperatorCounters as rkyv::Archive>::Resolver,
    <Option<SavedTtl> as rkyv::Archive>::Resolver,
    NestResolver,
);

impl rkyv::Archive for HostStateView<'_> {
    type Archived = ArchivedHostState;
    type Resolver = HostStateViewResolver;

    fn resolve(&self, (clock, counters, ttl, operator): Self::Resolver, out: rkyv::Place<ArchivedHostState>) {
        rkyv::munge::munge!(let ArchivedHostState {
            clock: out_clock, counters: out_counters, broadcast_inputs, ttl: out_ttl, operator: out_operator
        } = out);
        self.clock.resolve(clock, out_clock);
        self.counters.resolve(counters, out_counters);
        self.broadcast_inputs.resolve((), broadcast_inputs);
        self.ttl.resolve(ttl, out_ttl);
        operator.resolve(out_operator);
    }
}

impl<'a> rkyv::Serialize<SnapshotSerializer<'a>> for HostStateView<'_> {
    fn serialize(&self, serializer: &mut SnapshotSerializer<'a>) -> Result<HostStateViewResolver, rancor::Error> {
        Ok((
            self.clock.serialize(serializer)?,
            self.counters.serialize(serializer)?,
            self.ttl.serialize(serializer)?,
            self.operator.serialize(serializer)?,
        ))
    }
}

/// One shard's instance of an operator, hosted. Every activation takes an empty [`Output`] and
/// leaves in it what the operator produced, counted; the caller drains it.
pub struct OperatorHost {
    operator: Operator,
    clock: OperatorClock,
    counters: OperatorCounters,
    /// Where its results carry the key they came from ([`origin_rank`]).
    origin: Vec<usize>,
    /// This instance counts and reports broadcast rows for all (shard 0's).
    speaks_for_broadcast: bool,
    /// Per input (bit i): a broadcast row came on it, so it is a broadcast input.
    broadcast_inputs: u64,
    /// The operator's `ttl` clock, when it has one.
    ttl: Option<Box<TtlClock>>,
    tracing: Option<Box<Tracing>>,
}

impl OperatorHost {
    pub fn new(
        operator: Operator,
        inputs: usize,
        origin: impl IntoIterator<Item = usize>,
        shard: usize,
    ) -> OperatorHost {
        OperatorHost {
            operator,
            clock: OperatorClock::default(),
            counters: OperatorCounters::new(inputs),
            origin: origin.into_iter().collect(),
            speaks_for_broadcast: shard == 0,
            broadcast_inputs: 0,
            ttl: None,
            tracing: None,
        }
    }

    /// The operator's state expires `ttl_ms` of processing time after it was written.
    pub fn with_ttl(mut self, ttl_ms: Option<i64>) -> OperatorHost {
        self.ttl = ttl_ms.map(|ms| Box::new(TtlClock::new(ms)));
        self
    }

    /// Braid was down until processing time `now`: the gap does not count toward `ttl`.
    pub fn downtime_ends(&mut self, now: i128) {
        if let Some(ttl) = &mut self.ttl {
            ttl.skip_to(now);
        }
    }

    /// Notes the rows of `trace`'s keys and the watermark's moves; `op`: this operator's index,
    /// `shard`: this instance's.
    pub fn trace(&mut self, trace: std::sync::Arc<Trace>, op: usize, shard: usize) {
        self.tracing = Some(Box::new(Tracing { trace, op, shard, tick: i128::MIN }));
    }

    /// A row (`broadcast`: one every shard receives) reached input `input`.
    pub fn on_row(&mut self, input: usize, row: Row, broadcast: bool, out: &mut Output) {
        let seen = (row.key_hash, row.id, row.ts);
        self.take_row(input, broadcast, seen, out, |operator, out| operator.on_row(input, row, out));
    }

    /// A row read in place from a ring frame (`bytes`: its archive) reached input `input`.
    pub fn on_frame(&mut self, input: usize, row: &ArchivedRow, bytes: &[u8], broadcast: bool, out: &mut Output) {
        let seen = (row.key_hash.to_native(), row.id.to_native(), row.ts.to_native());
        self.take_row(input, broadcast, seen, out, |operator, out| operator.on_frame(input, row, bytes, out));
    }

    /// `seen`: the row's (key hash, id, ts), for a trace.
    fn take_row(
        &mut self,
        input: usize,
        broadcast: bool,
        seen: (u64, u64, i64),
        out: &mut Output,
        take: impl FnOnce(&mut Operator, &mut Output),
    ) {
        let watermark = self.clock.watermark();
        if broadcast {
            self.broadcast_inputs |= 1 << input.min(63);
        }
        let speaks = !broadcast || self.speaks_for_broadcast;
        if speaks {
            self.counters.rows_in[input] += 1;
        }
        let filtered_before = out.filtered;
        take(&mut self.operator, out);
        if !speaks {
            out.late.clear();
        }
        self.note_stored(out);
        self.settle_expired(out);
        self.counters.count(out);
        if let Some(tracing) = &self.tracing
            && speaks
            && tracing.trace.follows(seen.0)
        {
            let (key_hash, id, ts) = seen;
            let late = out.late.iter().any(|(i, row)| *i == input && row.id == id);
            let filtered = out.filtered > filtered_before;
            let Tracing { op, shard, tick, .. } = **tracing;
            let arrival = Arrival { op, input, shard, key_hash, id, ts, tick, watermark, late, filtered };
            tracing.trace.note(TraceNote::Arrival(arrival));
        }
    }

    /// Tick `t`: the watermark from what the inputs show; the operator hears of it if it moved.
    pub fn on_tick(&mut self, t: i128, inputs: &[InputTime], idle_advance: bool, out: &mut Output) {
        if let Some(tracing) = &mut self.tracing {
            tracing.tick = t;
        }
        if let Some(ttl) = &mut self.ttl {
            ttl.now(t);
        }
        if let Some(watermark) = self.clock.tick(t, inputs, idle_advance) {
            self.watermark_to(watermark, out);
        }
        self.expire(out);
    }

    /// Hands the operator what its `ttl` clock says is due (checked at ticks).
    fn expire(&mut self, out: &mut Output) {
        let Some(ttl) = &mut self.ttl else { return };
        let mut due = Vec::new();
        ttl.take_due(|d| due.push(d));
        if !due.is_empty() {
            self.activate(out, |operator, out| due.into_iter().for_each(|d| operator.expire(d, out)));
        }
    }

    /// The rows the operator stored start their `ttl`; the keys it wrote restart theirs.
    fn note_stored(&mut self, out: &mut Output) {
        match &mut self.ttl {
            Some(ttl) => {
                out.stored.drain(..).for_each(|row| ttl.stored(row));
                out.touched.drain(..).for_each(|(input, key_hash)| ttl.touched(input, key_hash));
            }
            None => {
                out.stored.clear();
                out.touched.clear();
            }
        }
    }

    /// Processing time reached `now`: timers due by then fire.
    pub fn on_processing_time(&mut self, now: i128, out: &mut Output) {
        if let Some(ttl) = &mut self.ttl {
            ttl.now(now);
        }
        self.activate(out, |operator, out| operator.on_processing_time(now, out));
    }

    /// End of input, first step: every pending processing-time timer fires.
    pub fn finish_timers(&mut self, out: &mut Output) {
        self.on_processing_time(END_OF_INPUT, out);
    }

    /// End of input, last step: the watermark goes to +∞ (rule 6).
    pub fn finish_watermark(&mut self, out: &mut Output) {
        if let Some(watermark) = self.clock.advance_to(Time::POS_INF) {
            self.watermark_to(watermark, out);
        }
    }

    fn watermark_to(&mut self, watermark: Time, out: &mut Output) {
        if let Some(tracing) = self.tracing.as_mut().filter(|t| t.shard == 0) {
            if watermark == Time::POS_INF {
                tracing.tick = END_OF_INPUT;
            }
            let note = TraceNote::Watermark { op: tracing.op, tick: tracing.tick, watermark };
            tracing.trace.note(note);
        }
        self.activate(out, |operator, out| operator.on_watermark(watermark, out));
    }

    fn activate(&mut self, out: &mut Output, call: impl FnOnce(&mut Operator, &mut Output)) {
        call(&mut self.operator, out);
        self.note_stored(out);
        self.settle_expired(out);
        self.counters.count(out);
    }

    /// Every instance holds every broadcast row, so every instance expires it: shard 0's alone
    /// reports it (as with late broadcast rows). A trace notes the expiries of its keys.
    fn settle_expired(&mut self, out: &mut Output) {
        if let Some(tracing) = &self.tracing {
            for &(reason, key_hash, id) in out.left_early.iter().filter(|r| tracing.trace.follows(r.1)) {
                tracing.trace.note(TraceNote::Expired { op: tracing.op, key_hash, id, reason });
            }
        }
        out.left_early.clear();
        if out.expired.is_empty() {
            return;
        }
        if !self.speaks_for_broadcast {
            out.expired.retain(|e| e.row.key != crate::record::Key::Broadcast);
        }
        if let Some(tracing) = &self.tracing {
            for e in out.expired.iter().filter(|e| e.input.is_some() && tracing.trace.follows(e.row.key_hash)) {
                let note =
                    TraceNote::Expired { op: tracing.op, key_hash: e.row.key_hash, id: e.row.id, reason: e.reason };
                tracing.trace.note(note);
            }
        }
    }

    /// The rank of one of this operator's results among what all its instances emit at once.
    pub fn rank(&self, row: &Row) -> u64 {
        origin_rank(row, &self.origin)
    }

    /// The operator's own watermark (the minimum over its inputs).
    pub fn watermark(&self) -> Time {
        self.clock.watermark()
    }

    /// A lower bound on the `_ts` of every result this instance may still emit.
    pub fn output_watermark(&self) -> Time {
        self.operator.output_watermark()
    }

    /// The counters so far, with the operator's join quality ([`Quality`]) read at this moment
    /// (the operator counts it into plain integers on its eviction path; this copies them once
    /// per report). Every instance holds every version of a broadcast input, so, like its rows,
    /// a broadcast input's matched and unmatched rows are counted by shard 0's instance alone.
    pub fn counters(&self) -> OperatorCounters {
        let mut counters = self.counters.clone();
        if let Some(Quality { matched, unmatched, expired }) = self.operator.quality() {
            for input in 0..counters.matched.len().min(2) {
                if self.broadcast_inputs & (1 << input) != 0 && !self.speaks_for_broadcast {
                    continue;
                }
                counters.matched[input] = matched[input];
                counters.unmatched[input] = unmatched[input];
                // Rows that left inside a window's would-be result; those that left as
                // themselves are counted already.
                counters.expired_rows[input] += expired[input];
            }
        }
        counters
    }

    /// Everything this instance's output depends on, for a checkpoint (state/snapshot.rs).
    pub fn snapshot(&self) -> Result<Vec<u8>, SnapshotError> {
        snapshot::encode_nesting(&self.snapshot_view(false)?)
    }

    /// [`snapshot`](Self::snapshot) written into `buffer`, a shard's checkpoint file, with the
    /// operator's nested in place: the state is copied once, into the file's bytes
    /// (state/snapshot.rs, "Nesting without copies"). With `delta` the operator's part holds
    /// only what changed since this instance's last snapshot where it can tell ("Deltas");
    /// returns whether it does. The host's own part is always whole.
    pub fn snapshot_into(&self, buffer: &mut SnapshotBuffer, delta: bool) -> Result<(InBuffer, bool), SnapshotError> {
        let view = self.snapshot_view(delta)?;
        let wrote_delta = view.operator.0.is_delta();
        Ok((buffer.write(&view)?, wrote_delta))
    }

    /// A snapshot of this instance went into a checkpoint: changes are noted from here for the
    /// next one's delta.
    pub fn note_snapshot(&mut self) {
        self.operator.note_snapshot();
    }

    fn snapshot_view(&self, delta: bool) -> Result<HostStateView<'_>, SnapshotError> {
        Ok(HostStateView {
            clock: self.clock.clone(),
            counters: self.counters.clone(),
            broadcast_inputs: self.broadcast_inputs,
            ttl: self.ttl.as_ref().map(|t| t.save()),
            operator: Nest(self.operator.snapshot_view(delta)?),
        })
    }

    /// Takes up a [`snapshot`](Self::snapshot) of this operator; `self` is freshly built.
    pub fn restore(&mut self, bytes: &[u8]) -> Result<(), SnapshotError> {
        self.restore_chain(&[bytes])
    }

    /// Takes up a whole snapshot and the deltas after it, in order: the host's own state from
    /// the last, the operator's from all of them ([`Operator::restore_chain`]).
    pub fn restore_chain(&mut self, chain: &[&[u8]]) -> Result<(), SnapshotError> {
        let saved = chain.iter().map(|bytes| snapshot::decode::<HostState>(bytes)).collect::<Result<Vec<_>, _>>()?;
        let operator: Vec<&[u8]> = saved.iter().map(|s| s.operator.as_slice()).collect();
        let Some(saved) = saved.last() else {
            return Err(SnapshotError::Decode("an empty chain of snapshots".into()));
        };
        let inputs = self.counters.rows_in.len();
        if saved.counters.rows_in.len() != inputs {
            return Err(SnapshotError::Mismatch {
                expected: format!("an operator of {inputs} inputs"),
                found: format!("one of {}", saved.counters.rows_in.len()),
            });
        }
        self.operator.restore_chain(&operator)?;
        self.clock = saved.clock.clone();
        self.counters = saved.counters.clone();
        self.broadcast_inputs = saved.broadcast_inputs;
        // A ttl added since the checkpoint starts its clock now; one removed is dropped.
        if let (Some(ttl), Some(saved)) = (&mut self.ttl, &saved.ttl) {
            ttl.restore(saved.clone());
        }
        Ok(())
    }

    /// What this instance costs its shard's state budget (state/budget.rs).
    pub fn budget_bytes(&self) -> usize {
        self.operator.budget_bytes()
    }

    /// Offers every row this instance may evict to `oldest` (state/budget.rs).
    pub fn offer_evictable(&self, op: usize, oldest: &mut crate::state::budget::Oldest) {
        self.operator.visit_evictable(&mut |input, ts, id, key_hash, handle| {
            oldest.offer(crate::state::budget::Candidate { ts, id, op, input, key_hash, handle });
        });
    }

    /// Evicts one row `offer_evictable` named into `out.expired` (`_reason` `budget`), counted;
    /// false when the row had left meanwhile.
    pub fn evict(&mut self, candidate: &crate::state::budget::Candidate, out: &mut Output) -> bool {
        if !self.operator.evict(candidate.input, candidate.key_hash, candidate.handle, out) {
            return false;
        }
        self.settle_expired(out);
        self.counters.count(out);
        true
    }

    /// Live state of this instance: (rows, bytes).
    pub fn state(&self) -> (usize, usize) {
        (self.operator.state_rows(), self.operator.state_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Key, Value};

    /// A union of one stream. The host, not the operator, tells broadcast rows apart: a row
    /// handed over as broadcast is one every shard receives.
    fn union() -> Operator {
        let text = "[streams.rules]\nkey = \"k\"\ntime = { field = \"ts\", unit = \"ms\" }\n\
                    fields = { k = \"string\", ts = \"int\" }\n\
                    [operators.u]\nkind = \"union\"\ninputs = [\"rules\"]\n";
        let plan = crate::config::parse("test.toml", text).unwrap_or_else(|e| panic!("{e:?}"));
        plan.operators[0].spec.build()
    }

    fn broadcast_row(ts: i64) -> Row {
        Row {
            ts,
            key: Key::Broadcast,
            key_hash: 0,
            id: ts as u64,
            values: vec![Value::Str("r".into()), Value::Int(ts)].into(),
        }
    }

    fn tick(host: &mut OperatorHost, t: i128, watermark: i64) -> Output {
        let mut out = Output::default();
        host.on_tick(t, &[InputTime { watermark: Time::ms(watermark), idle: false }], false, &mut out);
        out
    }

    #[test]
    fn a_late_broadcast_row_is_counted_and_reported_by_shard_0_alone() {
        let mut hosts: Vec<OperatorHost> = (0..3).map(|shard| OperatorHost::new(union(), 1, None, shard)).collect();
        for host in &mut hosts {
            tick(host, 200, 1_000);
        }
        let late: Vec<usize> = hosts
            .iter_mut()
            .map(|host| {
                let mut out = Output::default();
                host.on_row(0, broadcast_row(500), true, &mut out);
                out.late.len()
            })
            .collect();
        assert_eq!(late, vec![1, 0, 0]);
        let counted: Vec<(u64, u64)> = hosts
            .iter()
            .map(|h| {
                let c = h.counters();
                (c.rows_in[0], c.late[0])
            })
            .collect();
        assert_eq!(counted, vec![(1, 1), (0, 0), (0, 0)]);
    }

    #[test]
    fn a_trace_notes_the_rows_of_its_keys_with_the_watermark_they_met_and_every_move() {
        let trace = std::sync::Arc::new(Trace::new(vec![7]));
        let mut host = OperatorHost::new(union(), 1, None, 0);
        host.trace(std::sync::Arc::clone(&trace), 3, 0);
        tick(&mut host, 200, 1_000);
        let keyed = |key_hash, ts| Row { key: Key::Str("k".into()), key_hash, id: ts as u64, ..broadcast_row(ts) };
        for (key_hash, ts) in [(7, 500), (8, 600), (7, 2_000)] {
            host.on_row(0, keyed(key_hash, ts), false, &mut Output::default());
        }
        host.finish_watermark(&mut Output::default());
        let arrival = |ts: i64, late| {
            TraceNote::Arrival(Arrival {
                op: 3,
                input: 0,
                shard: 0,
                key_hash: 7,
                id: ts as u64,
                ts,
                tick: 200,
                watermark: Time::ms(1_000),
                late,
                filtered: false,
            })
        };
        assert_eq!(
            trace.notes(),
            vec![
                TraceNote::Watermark { op: 3, tick: 200, watermark: Time::ms(1_000) },
                arrival(500, true),
                arrival(2_000, false),
                TraceNote::Watermark { op: 3, tick: END_OF_INPUT, watermark: Time::POS_INF },
            ]
        );
    }

    #[test]
    fn the_watermark_moves_only_forward_and_goes_to_infinity_at_the_end() {
        let mut host = OperatorHost::new(union(), 1, None, 1);
        tick(&mut host, 200, 1_000);
        tick(&mut host, 400, 800);
        assert_eq!(host.watermark(), Time::ms(1_000));
        let mut out = Output::default();
        host.on_row(0, broadcast_row(2_000), false, &mut out);
        assert_eq!(out.results.len(), 1, "a keyed row on time passes the union");
        assert_eq!(host.counters().results[ResultKind::Row as usize], 1);
        host.finish_watermark(&mut Output::default());
        assert_eq!(host.watermark(), Time::POS_INF);
    }
}
