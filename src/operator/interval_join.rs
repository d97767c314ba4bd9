//! Interval join: `l.ts + lower′ ≤ r.ts ≤ l.ts + upper′` on equal keys; inner, left, right or
//! full outer (DESIGN.md "Operators", CONTRACT.md rules 5, 7–10).
//!
//! - A row is late when `ts < watermark` (the operator's, as of the last tick); late rows go to
//!   the late side output and nowhere else.
//! - An on-time row meets every stored row of the other side with its key; each pair is emitted
//!   once, by whichever of its two rows arrives second.
//! - `where` (optional): a pair within the bounds joins only when the condition holds on it; a
//!   row in no such pair is unmatched (an outer join emits it alone), as a condition in SQL's ON.
//! - Eviction (rule 8, no silent loss): a left row can still meet right rows up to
//!   `ts + upper′` and a right row left rows down to `ts − lower′`, so a row is kept while
//!   `watermark ≤ last chance` and dropped once the watermark is strictly past it. A right row
//!   with `ts == watermark == l.ts + upper′` is on time and still finds `l`. Rows are evicted by
//!   the operator's watermark (the minimum over its inputs), never by one input's alone.
//! - An outer join emits a stored row that never matched when it is evicted; a row whose last
//!   chance is already behind the watermark on arrival (negative bounds) is decided at once.
//! - Join quality ([`Quality`]): a row is **matched** when it was in at least one pair, whichever
//!   of the two rows arrived second, and **unmatched** otherwise. It is counted once, when it
//!   leaves the join: at its last chance (evicted, or on arrival when its last chance is already
//!   behind the watermark), inner joins too; a late row is neither (it is counted late). The
//!   matched flag is the one the store keeps for outer joins, so counting costs an add at eviction.
//! - Output watermark: `watermark − max(0, upper′, −lower′)` bounds every `_ts` still to come (a
//!   pair's `_ts` is its later row's ts, an unmatched row's its own), so no result is late
//!   downstream.

use crate::config::operators::{Builder, Built, Input, join_type, output_schema, pair_condition, select};
use crate::config::walk::{Errors, Table};
use crate::record::frame::to_row;
use crate::record::id::{IdHasher, PairIds};
use crate::record::view::RowView;
use crate::record::{ArchivedRow, Row};
use crate::state::snapshot::{self, SavedStore, SnapshotError, StoreDelta, StoreDeltaView, StoreView};
use crate::state::ttl::{Due, StoredRow};
use crate::state::{KeyedStore, MemoryStore, RowHandle};
use crate::time::Time;
use crate::time::due::DueQueue;

use super::expr::Expr;
use super::{Expired, ExpiryReason, OperatorSpec, Output, Projection, Quality, ResultKind};

pub const LEFT: usize = 0;
pub const RIGHT: usize = 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JoinType {
    Inner,
    Left,
    Right,
    Full,
}

impl JoinType {
    pub fn parse(name: &str) -> Option<JoinType> {
        Some(match name {
            "inner" => JoinType::Inner,
            "left" => JoinType::Left,
            "right" => JoinType::Right,
            "full" => JoinType::Full,
            _ => return None,
        })
    }

    /// Whether an unmatched row of `input` is emitted (as `left_only` / `right_only`).
    pub fn keeps_unmatched(self, input: usize) -> bool {
        match self {
            JoinType::Inner => false,
            JoinType::Left => input == LEFT,
            JoinType::Right => input == RIGHT,
            JoinType::Full => true,
        }
    }
}

#[derive(Clone, Debug)]
pub struct IntervalJoinSpec {
    pub name: String,
    /// lower′: `lower`, +1 ms when `lower_exclusive`.
    pub lower: i64,
    /// upper′: `upper`, −1 ms when `upper_exclusive`. Validation ensures lower′ ≤ upper′.
    pub upper: i64,
    pub join: JoinType,
    /// `where`: a pair within the bounds joins only when it holds (an outer row whose every pair
    /// fails it is emitted alone, as SQL's ON condition).
    pub condition: Option<Expr>,
    pub projection: Projection,
}

impl IntervalJoinSpec {
    /// How far results may lie behind the operator's watermark: max(0, upper′, −lower′).
    pub fn hold_back(&self) -> i128 {
        0.max(i128::from(self.upper)).max(-i128::from(self.lower))
    }

    fn pairs(&self, left_ts: i64, right_ts: i64) -> bool {
        // `l + lower′ ≤ r ≤ l + upper′` is `lower′ ≤ r − l ≤ upper′`: in i64 when the difference
        // fits (event times in milliseconds always do), else exactly in i128.
        match right_ts.checked_sub(left_ts) {
            Some(d) => self.lower <= d && d <= self.upper,
            None => {
                let (l, r) = (i128::from(left_ts), i128::from(right_ts));
                l + i128::from(self.lower) <= r && r <= l + i128::from(self.upper)
            }
        }
    }

    /// The watermark a row of `input` with event time `ts` is kept up to (rule 8).
    pub fn last_chance(&self, input: usize, ts: i64) -> Time {
        let bound = if input == LEFT { i128::from(self.upper) } else { -i128::from(self.lower) };
        Time::ms(ts).plus(bound)
    }
}

/// Checks `[operators.NAME]` of kind `interval_join`.
pub(crate) fn check(b: &mut Builder<'_, '_, '_>, name: &str, t: Table<'_, '_>, errors: &mut Errors) -> Option<Built> {
    let inputs = b.two_inputs(t, false, errors);
    let required = |key: &str, errors: &mut Errors| {
        if t.get(key).is_none() {
            t.missing(key, errors, "a duration such as \"-3s\" or \"500ms\"");
        }
        t.duration(key, errors)
    };
    let lower = required("lower", errors);
    let upper = required("upper", errors);
    let lower_exclusive = t.bool("lower_exclusive", false, errors);
    let upper_exclusive = t.bool("upper_exclusive", false, errors);
    let join = join_type(t, &["inner", "left", "right", "full"], errors);
    let (lower, upper) = (lower? + i64::from(lower_exclusive), upper? - i64::from(upper_exclusive));
    if lower > upper {
        let message =
            format!("the bounds leave no room: lower' = {lower} ms > upper' = {upper} ms (after the exclusive flags)");
        t.error("lower", errors, message);
    }
    let inputs = inputs?;
    warn_about_disorder(b, t, &inputs, upper - lower, errors);
    let join = join?;
    let condition = pair_condition(t, &inputs, errors);
    let missing = [join.keeps_unmatched(RIGHT), join.keeps_unmatched(LEFT)];
    let (columns, fields) = select(t, &inputs, missing, errors)?;
    let (output, rekey) = output_schema(t, fields, inputs[LEFT].key_fields().len(), errors)?;
    let projection = Projection { columns, rekey };
    let spec = IntervalJoinSpec { name: name.to_owned(), lower, upper, join, condition, projection };
    Some(Built { inputs: inputs.map(|i| i.node).to_vec(), output, spec: OperatorSpec::IntervalJoin(spec) })
}

/// How far above the join span an input's out-of-orderness may be before matches get unlikely.
const DISORDER_PER_SPAN: i64 = 10;

/// Warns when an input's rows may be out of order by far more than the join span: event times
/// that jitter by seconds rarely land within a span of milliseconds (DESIGN.md "Beyond Flink").
fn warn_about_disorder(b: &Builder<'_, '_, '_>, t: Table<'_, '_>, inputs: &[Input; 2], span: i64, errors: &mut Errors) {
    // A self-join reads one stream twice: one warning.
    let distinct = if inputs[0].node == inputs[1].node { &inputs[..1] } else { &inputs[..] };
    for input in distinct {
        if let Some(ooo) = b.out_of_orderness(input.node)
            && ooo > DISORDER_PER_SPAN * span.max(1)
        {
            let message = format!(
                "{} may be out of order by {ooo} ms, far more than the join span of {span} ms: rows this far apart \
                 in event time rarely fall within the bounds (widen the bounds or check the devices' clocks)",
                input.name
            );
            errors.warn(t.span, t.path, message);
        }
    }
}

/// Row `row` of `input` leaves the join, counted: an outer join reports it if it never matched.
fn finish(
    spec: &IntervalJoinSpec,
    ids: &mut IdHasher,
    quality: &mut Quality,
    input: usize,
    row: RowView<'_>,
    matched: bool,
    out: &mut Output,
) {
    quality.count(input, matched, 1);
    if matched || !spec.join.keeps_unmatched(input) {
        return;
    }
    let kind = if input == LEFT { ResultKind::LeftOnly } else { ResultKind::RightOnly };
    let id = ids.begin().str(&spec.name).str(kind.as_str()).u64(row.id()).finish();
    let rows = if input == LEFT { [Some(row), None] } else { [None, Some(row)] };
    spec.projection.archive(&mut out.archived, row.ts(), id, row.key(), row.key_hash(), rows, kind);
}

/// A stored row's eviction time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
struct Timer {
    last_chance: Time,
    seq: u64,
    input: usize,
    key_hash: u64,
    handle: RowHandle,
}

pub struct IntervalJoin {
    spec: IntervalJoinSpec,
    watermark: Time,
    /// Rows of each input waiting for partners: in memory, or in a shard's arenas.
    state: [Box<dyn KeyedStore>; 2],
    /// Stored rows' last chances, one lane per input (time/due.rs).
    timers: DueQueue<Timer, 2>,
    /// Timers whose row left before its last chance (`ttl` or the state budget): a no-op when
    /// they fire, dropped in one pass once they are half the heap.
    stale_timers: usize,
    seq: u64,
    ids: IdHasher,
    /// Pair ids (`match` results), the operator's part of them written once.
    pair_ids: PairIds,
    quality: Quality,
    /// The timers armed since the last snapshot, which name the rows stored since: what a delta
    /// snapshot copies (state/snapshot.rs, "Deltas"). `None` until a snapshot is taken, and once
    /// they outgrow `armed_bound` (snapshots stopped coming): the next snapshot is a whole one.
    armed_since: Option<Vec<Timer>>,
    armed_bound: usize,
}

/// [`IntervalJoinState`] as a snapshot writes it: the stored rows serialized from the stores.
pub(crate) struct IntervalJoinStateView<'a> {
    watermark: Time,
    rows: Vec<StoreView<'a>>,
    timers: Vec<Timer>,
    seq: u64,
    quality: Quality,
}

impl rkyv::Archive for IntervalJoinStateView<'_> {
    type Archived = ArchivedIntervalJoinState;
    type Resolver = IntervalJoinStateResolver;

    fn resolve(&self, resolver: Self::Resolver, out: rkyv::Place<ArchivedIntervalJoinState>) {
        rkyv::munge::munge!(let ArchivedIntervalJoinState { watermark, rows, timers, seq, quality } = out);
        self.watermark.resolve(resolver.watermark, watermark);
        self.rows.resolve(resolver.rows, rows);
        self.timers.resolve(resolver.timers, timers);
        self.seq.resolve((), seq);
        self.quality.resolve(resolver.quality, quality);
    }
}

impl<S> rkyv::Serialize<S> for IntervalJoinStateView<'_>
where
    S: rkyv::rancor::Fallible + rkyv::ser::Writer + rkyv::ser::Allocator + ?Sized,
    S::Error: rkyv::rancor::Source,
{
    fn serialize(&self, serializer: &mut S) -> Result<Self::Resolver, S::Error> {
        Ok(IntervalJoinStateResolver {
            watermark: self.watermark.serialize(serializer)?,
            rows: self.rows.serialize(serializer)?,
            timers: self.timers.serialize(serializer)?,
            seq: self.seq.serialize(serializer)?,
            quality: self.quality.serialize(serializer)?,
        })
    }
}

impl IntervalJoin {
    pub fn new(spec: IntervalJoinSpec) -> IntervalJoin {
        IntervalJoin::with_state(spec, [Box::new(MemoryStore::default()), Box::new(MemoryStore::default())])
    }

    /// A join keeping its left and right rows in these stores.
    pub fn with_state(spec: IntervalJoinSpec, state: [Box<dyn KeyedStore>; 2]) -> IntervalJoin {
        IntervalJoin {
            pair_ids: PairIds::new(&spec.name),
            spec,
            watermark: Time::NEG_INF,
            state,
            timers: DueQueue::new(),
            stale_timers: 0,
            seq: 0,
            ids: IdHasher::default(),
            quality: Quality::default(),
            armed_since: None,
            armed_bound: 0,
        }
    }

    pub fn on_row(&mut self, input: usize, row: Row, out: &mut Output) {
        if self.watermark.is_past(row.ts) {
            out.late.push((input, row));
            return;
        }
        let matched = self.match_stored(input, RowView::Heap(&row), out);
        let last_chance = self.spec.last_chance(input, row.ts);
        if last_chance < self.watermark {
            // Negative bounds: nothing on time can still meet it.
            self.finish(input, RowView::Heap(&row), matched, out);
            return;
        }
        let key_hash = row.key_hash;
        let handle = self.state[input].insert(row, matched);
        self.arm(input, last_chance, key_hash, handle, out);
    }

    /// [`on_row`](Self::on_row) for a row read in place from a ring frame (`bytes`: its
    /// archive): it is matched and stored without being copied out (an arena store copies the
    /// archive as it is); only a late or immediately finished row is.
    pub fn on_frame(&mut self, input: usize, row: &ArchivedRow, bytes: &[u8], out: &mut Output) {
        let ts = row.ts.to_native();
        if self.watermark.is_past(ts) {
            out.late.push((input, to_row(row)));
            return;
        }
        let matched = self.match_stored(input, RowView::Archived(row), out);
        let last_chance = self.spec.last_chance(input, ts);
        if last_chance < self.watermark {
            self.finish(input, RowView::Archived(row), matched, out);
            return;
        }
        let key_hash = row.key_hash.to_native();
        let handle = self.state[input].insert_archived(row, bytes, matched);
        self.arm(input, last_chance, key_hash, handle, out);
    }

    /// The stored row's last chance; the host hears it was stored (its `ttl` clock). Inlined,
    /// with the timer's push, into the two ways a row is stored: once per row.
    #[inline(always)]
    fn arm(&mut self, input: usize, last_chance: Time, key_hash: u64, handle: RowHandle, out: &mut Output) {
        self.seq += 1;
        let timer = Timer { last_chance, seq: self.seq, input, key_hash, handle };
        self.timers.push(input, timer);
        if let Some(armed) = &mut self.armed_since {
            armed.push(timer);
            if armed.len() > self.armed_bound {
                self.armed_since = None;
            }
        }
        out.stored.push(StoredRow { input: input as u32, key_hash, handle });
    }

    /// `ttl` passed for a stored row (the host's clock says): it leaves, matched or not, to
    /// `OPERATOR.expired` — an unmatched outer row then is never `left_only`/`right_only`.
    pub fn expire(&mut self, due: Due, out: &mut Output) {
        let Due::Row(StoredRow { input, key_hash, handle }) = due else { return };
        let input = input as usize;
        let Some(row) = self.leave_early(input, key_hash, handle) else { return };
        out.expired.push(Expired { reason: ExpiryReason::Ttl, input: Some(input), row });
    }

    /// Emits `row` with every stored row of the other input it pairs with; true if any.
    fn match_stored(&mut self, input: usize, row: RowView<'_>, out: &mut Output) -> bool {
        let IntervalJoin { spec, state, pair_ids, .. } = self;
        let mut matched = false;
        // The incoming row's fields are read once, not at every stored row it meets.
        let (ts, id, key, key_hash) = (row.ts(), row.id(), row.key(), row.key_hash());
        state[1 - input].scan_key(key, key_hash, &mut |stored| {
            let stored_ts = stored.ts();
            let (left, right) = if input == LEFT { (row, stored) } else { (stored, row) };
            let (left_ts, right_ts) = if input == LEFT { (ts, stored_ts) } else { (stored_ts, ts) };
            if !spec.pairs(left_ts, right_ts) || spec.condition.as_ref().is_some_and(|c| !c.eval_views(left, right)) {
                return false;
            }
            matched = true;
            let (left_id, right_id) = if input == LEFT { (id, stored.id()) } else { (stored.id(), id) };
            let id = pair_ids.id(left_id, right_id);
            let ts = ts.max(stored_ts);
            // Projected from the two rows as they lie straight into the result's archive.
            let rows = [Some(left), Some(right)];
            spec.projection.archive(&mut out.archived, ts, id, key, key_hash, rows, ResultKind::Match);
            true
        });
        matched
    }

    pub fn on_watermark(&mut self, watermark: Time, out: &mut Output) {
        self.watermark = watermark;
        while let Some(timer) = self.timers.pop_if(|t| t.last_chance < watermark) {
            if !self.spec.join.keeps_unmatched(timer.input) {
                // Nothing to report for this side: the row goes without being copied out.
                if let Some(matched) = self.state[timer.input].discard(timer.key_hash, timer.handle) {
                    self.quality.count(timer.input, matched, 1);
                }
            } else {
                // Read where it lies (an unmatched one is projected from there), then dropped.
                let IntervalJoin { spec, state, ids, quality, .. } = self;
                state[timer.input].take(timer.key_hash, timer.handle, &mut |row, matched| {
                    finish(spec, ids, quality, timer.input, row, matched, out);
                });
            }
        }
        self.timers.release_spare_capacity();
        for store in &mut self.state {
            store.release_spare_capacity();
        }
    }

    /// A row leaves the join, counted: an outer join reports it if it never matched.
    fn finish(&mut self, input: usize, row: RowView<'_>, matched: bool, out: &mut Output) {
        finish(&self.spec, &mut self.ids, &mut self.quality, input, row, matched, out);
    }

    pub fn spec(&self) -> &IntervalJoinSpec {
        &self.spec
    }

    pub fn output_watermark(&self) -> Time {
        self.watermark.plus(-self.spec.hold_back())
    }

    pub fn is_quiescent(&self) -> bool {
        self.timers.is_empty()
    }

    /// Rows that left the join, matched or not (module doc).
    pub fn quality(&self) -> Quality {
        self.quality
    }

    pub fn state_rows(&self) -> usize {
        self.state.iter().map(|s| s.rows()).sum()
    }

    pub fn state_bytes(&self) -> usize {
        self.state.iter().map(|s| s.bytes()).sum()
    }

    /// Every stored row's input, (ts, id), key hash and handle (state/budget.rs, eviction).
    /// Broadcast rows are left out: every shard holds each of them, and shards evict on their
    /// own budgets.
    pub fn visit_evictable(&self, visit: &mut dyn FnMut(usize, i64, u64, u64, u64)) {
        let broadcast = crate::record::id::key_hash(&crate::record::Key::Broadcast);
        for (input, store) in self.state.iter().enumerate() {
            store.visit_ages(&mut |ts, id, key_hash, handle| {
                if key_hash != broadcast {
                    visit(input, ts, id, key_hash, handle);
                }
            });
        }
    }

    /// Takes a stored row out before its last chance (the state budget's `evict_oldest`); the
    /// caller sends it to `OPERATOR.expired`, so an outer join does not emit it as unmatched.
    pub fn evict(&mut self, input: usize, key_hash: u64, handle: RowHandle) -> Option<Row> {
        self.leave_early(input, key_hash, handle)
    }

    /// A stored row leaving before its last chance (`ttl`, the budget): counted as expired by
    /// the caller, never as matched or unmatched. Its timer stays in the heap and finds nothing
    /// when it fires; once such stale timers are half the heap they are dropped in one pass, so
    /// a stalled watermark or a flood does not grow the heap without bound.
    fn leave_early(&mut self, input: usize, key_hash: u64, handle: RowHandle) -> Option<Row> {
        let removed = self.state.get_mut(input)?.remove(key_hash, handle)?;
        self.stale_timers += 1;
        if self.stale_timers * 2 > self.timers.len() {
            let state = &self.state;
            self.timers.retain(|t| state[t.input].contains(t.key_hash, t.handle));
            self.stale_timers = 0;
        }
        Some(removed.row)
    }

    /// What this instance costs the shard's state budget (state/budget.rs).
    pub fn budget_bytes(&self) -> usize {
        self.state.iter().map(|s| s.footprint()).sum::<usize>() + self.timers.len() * crate::state::budget::TIMER_BYTES
    }
}

/// What a checkpoint keeps of an interval join (state/snapshot.rs).
#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub(crate) struct IntervalJoinState {
    watermark: Time,
    /// Per input, the stored rows with the handles the timers name them by.
    rows: Vec<SavedStore>,
    /// Every stored row's timer (the heap's contents, in no order).
    timers: Vec<Timer>,
    seq: u64,
    quality: Quality,
}

impl IntervalJoin {
    /// Everything this instance's output depends on: the stored rows with their handles and
    /// matched flags, their timers (ordered by last chance, then `seq`), the watermark, the
    /// join quality so far.
    pub fn snapshot(&self) -> Result<Vec<u8>, SnapshotError> {
        snapshot::encode(&self.snapshot_view()?)
    }

    /// What [`snapshot`](Self::snapshot) encodes, the stored rows read from the stores as it is
    /// serialized: nested in its host's snapshot, they are copied once (state/snapshot.rs,
    /// "Nesting without copies").
    pub(crate) fn snapshot_view(&self) -> Result<IntervalJoinStateView<'_>, SnapshotError> {
        let rows = self.state.iter().map(|store| StoreView::of(store.as_ref())).collect::<Result<_, _>>()?;
        let timers: Vec<Timer> = self.timers.iter().copied().collect();
        Ok(IntervalJoinStateView { watermark: self.watermark, rows, timers, seq: self.seq, quality: self.quality })
    }

    /// What changed since the last snapshot ([`note_snapshot`](Self::note_snapshot)): the
    /// stores' deltas and the timers of the rows stored since that are still there; `None` when
    /// that cannot be told (no snapshot yet, or the notes outgrew their bound) and the snapshot
    /// must be whole. The rows are copied from the stores as it is serialized.
    pub(crate) fn snapshot_delta(&self) -> Option<IntervalJoinDeltaView<'_>> {
        let armed = self.armed_since.as_ref()?;
        let rows = (0..self.state.len())
            .map(|input| {
                let added = armed.iter().filter(|t| t.input == input).map(|t| (t.key_hash, t.handle));
                StoreDeltaView::of(self.state[input].as_ref(), added)
            })
            .collect::<Option<Vec<_>>>()?;
        // The timers of the rows still stored: each input's are its armed timers' rows in the
        // same order, less those that left.
        let timers = {
            let mut still = [rows[LEFT].added().peekable(), rows[RIGHT].added().peekable()];
            armed.iter().filter(|t| still[t.input].next_if_eq(&t.handle).is_some()).copied().collect()
        };
        let (watermark, seq, quality) = (self.watermark, self.seq, self.quality);
        Some(IntervalJoinDeltaView { watermark, rows, timers, seq, quality })
    }

    /// A snapshot was taken (whole or delta): changes are noted from here for the next one.
    pub(crate) fn note_snapshot(&mut self) {
        for store in &mut self.state {
            store.note_changes();
        }
        self.armed_bound = (2 * self.state_rows()).max(crate::state::KEPT_CAPACITY);
        let armed = self.armed_since.get_or_insert_with(Vec::new);
        armed.clear();
    }

    /// Takes up a [`snapshot`](Self::snapshot); `self` is freshly built from the same spec.
    pub fn restore(&mut self, bytes: &[u8]) -> Result<(), SnapshotError> {
        self.restore_chain(bytes, &[])
    }

    /// Takes up a whole snapshot and the deltas after it, in order ([`snapshot_delta`]'s,
    /// each of the snapshot before it). Rows come back under their handles with their timers;
    /// a timer whose row had already left (`ttl`, the budget) is not kept: it would find
    /// nothing when it fired (a delta does not name them).
    pub fn restore_chain(&mut self, whole: &[u8], deltas: &[&[u8]]) -> Result<(), SnapshotError> {
        let mut saved: IntervalJoinState = snapshot::decode(whole)?;
        snapshot::expect_len("inputs", 2, saved.rows.len())?;
        let deltas =
            deltas.iter().map(|bytes| snapshot::decode::<IntervalJoinDelta>(bytes)).collect::<Result<Vec<_>, _>>()?;
        for delta in &deltas {
            snapshot::expect_len("inputs", 2, delta.rows.len())?;
            saved.timers.extend_from_slice(&delta.timers);
            (saved.watermark, saved.seq, saved.quality) = (delta.watermark, delta.seq, delta.quality);
        }
        if !deltas.is_empty() {
            let of_input = |input: usize| deltas.iter().map(|d| &d.rows[input]).collect::<Vec<_>>();
            saved.rows = (0..2).map(|input| snapshot::apply_deltas(&saved.rows[input], &of_input(input))).collect();
        }
        if let Some(timer) = saved.timers.iter().find(|t| t.input > RIGHT) {
            return Err(SnapshotError::Decode(format!("a timer of input {}", timer.input)));
        }
        for (store, rows) in self.state.iter().zip(&saved.rows) {
            snapshot::check_store(store.as_ref(), rows)?;
        }
        for (store, rows) in self.state.iter_mut().zip(&saved.rows) {
            snapshot::load_store(store.as_mut(), rows)?;
        }
        self.watermark = saved.watermark;
        let stored: std::collections::HashSet<(usize, RowHandle)> = saved
            .rows
            .iter()
            .enumerate()
            .flat_map(|(input, rows)| rows.rows.iter().map(move |r| (input, r.handle)))
            .collect();
        let mut timers = saved.timers;
        timers.retain(|t| stored.contains(&(t.input, t.handle)));
        timers.sort_unstable();
        for timer in timers {
            self.timers.push(timer.input, timer);
        }
        self.seq = saved.seq;
        self.quality = saved.quality;
        Ok(())
    }
}

/// [`IntervalJoinDelta`] as a snapshot writes it: the rows stored since serialized from the
/// stores.
pub(crate) struct IntervalJoinDeltaView<'a> {
    watermark: Time,
    rows: Vec<StoreDeltaView<'a>>,
    timers: Vec<Timer>,
    seq: u64,
    quality: Quality,
}

impl rkyv::Archive for IntervalJoinDeltaView<'_> {
    type Archived = ArchivedIntervalJoinDelta;
    type Resolver = IntervalJoinDeltaResolver;

    fn resolve(&self, resolver: Self::Resolver, out: rkyv::Place<ArchivedIntervalJoinDelta>) {
        rkyv::munge::munge!(let ArchivedIntervalJoinDelta { watermark, rows, timers, seq, quality } = out);
        self.watermark.resolve(resolver.watermark, watermark);
        self.rows.resolve(resolver.rows, rows);
        self.timers.resolve(resolver.timers, timers);
        self.seq.resolve((), seq);
        self.quality.resolve(resolver.quality, quality);
    }
}

impl<S> rkyv::Serialize<S> for IntervalJoinDeltaView<'_>
where
    S: rkyv::rancor::Fallible + rkyv::ser::Writer + rkyv::ser::Allocator + ?Sized,
    S::Error: rkyv::rancor::Source,
{
    fn serialize(&self, serializer: &mut S) -> Result<Self::Resolver, S::Error> {
        Ok(IntervalJoinDeltaResolver {
            watermark: self.watermark.serialize(serializer)?,
            rows: self.rows.serialize(serializer)?,
            timers: self.timers.serialize(serializer)?,
            seq: self.seq.serialize(serializer)?,
            quality: self.quality.serialize(serializer)?,
        })
    }
}

/// What a delta snapshot keeps of an interval join (state/snapshot.rs, "Deltas"): what
/// [`IntervalJoinState`] keeps, but of the stored rows and their timers only what changed since
/// the snapshot before.
#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub(crate) struct IntervalJoinDelta {
    watermark: Time,
    /// Per input.
    rows: Vec<StoreDelta>,
    /// The timers of the rows stored since (their `rows[..].added`).
    timers: Vec<Timer>,
    seq: u64,
    quality: Quality,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{FieldType, Key, Value};

    fn join(lower: i64, upper: i64, join: JoinType) -> IntervalJoin {
        let projection = Projection::key_and_first_values();
        IntervalJoin::new(IntervalJoinSpec { name: "j".into(), lower, upper, join, condition: None, projection })
    }

    fn row(ts: i64, tag: i64) -> Row {
        Row { ts, key: Key::Str("d".into()), key_hash: 1, id: tag as u64, values: Box::new([Value::Int(tag)]) }
    }

    fn kinds(out: &Output) -> Vec<(ResultKind, i64)> {
        out.archived.iter().map(|(k, r)| (k, r.ts.to_native())).collect()
    }

    #[test]
    fn an_expired_row_leaves_to_expired_and_is_never_emitted_as_outer() {
        let mut j = join(0, 10, JoinType::Full);
        let mut out = Output::default();
        j.on_row(LEFT, row(100, 1), &mut out);
        j.on_row(LEFT, row(200, 2), &mut out);
        j.on_row(RIGHT, row(205, 3), &mut out);
        assert_eq!(kinds(&out), [(ResultKind::Match, 205)]);
        let stored: Vec<StoredRow> = out.stored.drain(..).collect();
        assert_eq!(stored.len(), 3, "every stored row is announced to the host");
        out.archived.clear();
        // The unmatched left row 1 and the matched right row 3 expire; row 2 stays.
        for s in [stored[0], stored[2]] {
            j.expire(Due::Row(s), &mut out);
        }
        j.expire(Due::Row(stored[0]), &mut out); // due twice: gone already, nothing happens
        let expired: Vec<(Option<usize>, u64)> = out.expired.iter().map(|e| (e.input, e.row.id)).collect();
        assert_eq!(expired, [(Some(LEFT), 1), (Some(RIGHT), 3)]);
        assert!(out.expired.iter().all(|e| e.reason == ExpiryReason::Ttl));
        assert_eq!(j.state_rows(), 1);
        out.expired.clear();
        j.on_watermark(Time::POS_INF, &mut out);
        assert!(out.archived.is_empty(), "row 2 matched; rows 1 and 3 expired: no outer row");
        assert_eq!(j.quality(), Quality { matched: [1, 0], unmatched: [0, 0], ..Quality::default() });
        assert!(j.timers.is_empty());
    }

    #[test]
    fn stale_timers_are_dropped_once_they_are_half_the_heap() {
        let mut j = join(0, 10, JoinType::Left);
        let mut out = Output::default();
        for i in 0..10 {
            j.on_row(LEFT, row(100 + i, i), &mut out);
        }
        let stored: Vec<StoredRow> = out.stored.drain(..).collect();
        for &s in &stored[..6] {
            j.expire(Due::Row(s), &mut out);
        }
        assert_eq!(j.timers.len(), 4, "rebuilt without the expired rows' timers");
        assert_eq!(j.state_rows(), 4);
    }

    /// Computed select items: typed in the output schema, evaluated on every result, a missing
    /// side reading null; a bad item is a configuration error naming the item.
    #[test]
    fn computed_select_items() {
        let text = |select: &str| {
            format!(
                "[streams.a]\nkey = \"k\"\nfields = {{ k = \"string\", v = \"int\", x = \"float\" }}\n\
                 [operators.w]\nkind = \"interval_join\"\nleft = \"a\"\nright = \"a\"\nlower = \"-1s\"\nupper = \"1s\"\n\
                 join = \"left\"\nselect = [{select}]\n"
            )
        };
        let select = r#""left.v", "left.v * right.x AS value", "coalesce(right.v, -1) AS rv", "CASE WHEN right.v > left.v THEN 'up' ELSE 'flat' END as trend""#;
        let plan = crate::config::parse("w.toml", &text(select)).unwrap_or_else(|e| panic!("{e}"));
        let fields: Vec<(&str, FieldType, bool)> =
            plan.operators[0].output.fields.iter().map(|f| (f.name.as_str(), f.ty, f.nullable)).collect();
        use FieldType::{Float, Int, String};
        assert_eq!(
            fields,
            [
                ("k", String, false),
                ("v", Int, false),
                ("value", Float, true),
                ("rv", Int, true),
                ("trend", String, true),
                ("_kind", String, false)
            ]
        );
        let OperatorSpec::IntervalJoin(spec) = &plan.operators[0].spec else { panic!("an interval join") };
        let mut j = IntervalJoin::new(spec.clone());
        let row = |ts: i64, v: i64, x: f64| Row {
            ts,
            key: Key::Str("d".into()),
            key_hash: 1,
            id: ts as u64,
            values: Box::new([Value::Str("d".into()), Value::Int(v), Value::Float(x)]),
        };
        let mut out = Output::default();
        j.on_row(LEFT, row(1000, 2, 0.5), &mut out);
        j.on_row(RIGHT, row(1500, 3, 1.5), &mut out);
        j.on_row(LEFT, row(9000, 4, 0.0), &mut out);
        j.on_watermark(Time::POS_INF, &mut out);
        let values: Vec<Vec<Value>> = out.take_results().iter().map(|(_, r)| r.values[1..5].to_vec()).collect();
        let s = |t: &str| Value::Str(t.into());
        assert_eq!(
            values,
            [
                vec![Value::Int(2), Value::Float(3.0), Value::Int(3), s("up")],
                vec![Value::Int(4), Value::Null, Value::Int(-1), s("flat")]
            ]
        );

        let refused = |select: &str| crate::config::parse("w.toml", &text(select)).err().map(|e| e.to_string());
        let err = refused(r#""left.v + 1""#).unwrap_or_default();
        assert!(err.contains("bad item \"left.v + 1\": want"), "{err}");
        let err = refused(r#""left.v + 'a' AS y""#).unwrap_or_default();
        assert!(err.contains("bad item \"left.v + 'a' AS y\": cannot apply + to string 'a'"), "{err}");
        let err = refused(r#""left.v + 1 AS _ts""#).unwrap_or_default();
        assert!(err.contains("\"_ts\" is a name braid writes itself"), "{err}");
    }

    /// A row whose every pair fails `where` is emitted alone by an outer join; a bad condition
    /// is a configuration error on interval and temporal joins alike.
    #[test]
    fn where_decides_the_pairs_and_a_bad_condition_is_a_config_error() {
        use crate::record::schema::Field;
        use crate::record::{FieldType, Schema, TimeSpec};
        let schema =
            Schema::new(vec![Field { name: "v".into(), ty: FieldType::Int, nullable: false }], None, TimeSpec::Ingest);
        let mut j = join(-10, 10, JoinType::Full);
        j.spec.condition = Some(Expr::parse("left.v < right.v", &schema, &schema).expect("a valid condition"));
        let mut out = Output::default();
        j.on_row(LEFT, row(100, 5), &mut out);
        j.on_row(RIGHT, row(101, 4), &mut out); // fails: alone
        j.on_row(RIGHT, row(102, 6), &mut out); // joins 5
        j.on_watermark(Time::POS_INF, &mut out);
        let got: Vec<(ResultKind, Value, Value)> =
            out.take_results().iter().map(|(k, r)| (*k, r.values[1].clone(), r.values[2].clone())).collect();
        assert_eq!(
            got,
            [(ResultKind::Match, Value::Int(5), Value::Int(6)), (ResultKind::RightOnly, Value::Null, Value::Int(4))]
        );

        for kind in ["interval_join\"\nlower = \"-1s\"\nupper = \"1s", "temporal_join"] {
            let text = format!(
                "[streams.a]\nkey = \"k\"\nfields = {{ k = \"string\", v = \"int\" }}\n\
                 [operators.w]\nkind = \"{kind}\"\nleft = \"a\"\nright = \"a\"\nselect = [\"left.v\"]\n\
                 where = \"left.nope > 1\"\n"
            );
            let err = crate::config::parse("w.toml", &text).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(
                err.contains("operators.w.where: bad condition \"left.nope > 1\": unknown field left.nope"),
                "{err}"
            );
            assert_eq!(err.lines().count(), 1, "{err}");
        }
    }

    #[test]
    fn bounds_are_inclusive_and_pairs_emitted_once() {
        let mut j = join(-100, 200, JoinType::Inner);
        let mut out = Output::default();
        j.on_row(LEFT, row(1000, 1), &mut out);
        j.on_row(RIGHT, row(900, 2), &mut out);
        j.on_row(RIGHT, row(1200, 3), &mut out);
        j.on_row(RIGHT, row(899, 4), &mut out);
        j.on_row(RIGHT, row(1201, 5), &mut out);
        assert_eq!(kinds(&out), [(ResultKind::Match, 1000), (ResultKind::Match, 1200)]);
    }

    /// `pairs` is exact to the ends of i64, where `r − l` no longer fits one.
    #[test]
    fn the_bounds_hold_exactly_at_the_ends_of_the_time_range() {
        let spec = join(-100, 200, JoinType::Inner).spec;
        let (min, max) = (i64::MIN, i64::MAX);
        assert!(spec.pairs(max - 200, max) && !spec.pairs(max - 201, max));
        assert!(spec.pairs(min + 100, min) && !spec.pairs(min + 101, min));
        assert!(!spec.pairs(min, max) && !spec.pairs(max, min), "differences past i64");
        let wide = join(min, max, JoinType::Inner).spec;
        assert!(wide.pairs(0, max) && wide.pairs(-1, max - 1) && wide.pairs(0, min));
        assert!(!wide.pairs(min, max) && !wide.pairs(max, min));
    }

    #[test]
    fn last_chance_fires_strictly_after() {
        let mut j = join(0, 200, JoinType::Left);
        let mut out = Output::default();
        j.on_row(LEFT, row(1000, 1), &mut out);
        j.on_watermark(Time::ms(1200), &mut out);
        assert!(out.is_empty(), "watermark == ts + upper keeps the row");
        j.on_row(RIGHT, row(1200, 2), &mut out);
        assert_eq!(kinds(&out), [(ResultKind::Match, 1200)]);
        j.on_watermark(Time::ms(1201), &mut out);
        assert_eq!(out.archived.len(), 1, "matched rows are not reported as unmatched");
        assert_eq!(j.state_rows(), 0, "both rows are past their last chance");
    }

    #[test]
    fn unmatched_rows_of_an_outer_join_and_late_rows() {
        let mut j = join(0, 100, JoinType::Full);
        let mut out = Output::default();
        j.on_row(LEFT, row(1000, 1), &mut out);
        j.on_row(RIGHT, row(5000, 2), &mut out);
        j.on_watermark(Time::ms(1101), &mut out);
        assert_eq!(kinds(&out), [(ResultKind::LeftOnly, 1000)]);
        j.on_row(LEFT, row(1100, 3), &mut out);
        assert_eq!(out.late.len(), 1);
        j.on_watermark(Time::POS_INF, &mut out);
        assert_eq!(kinds(&out)[1..], [(ResultKind::RightOnly, 5000)]);
        assert_eq!((j.state_rows(), j.state_bytes()), (0, 0));
        assert_eq!(j.output_watermark(), Time::POS_INF);
    }

    /// The state budget's eviction: a row taken out early is not emitted as unmatched when its
    /// last chance passes, is counted as expired only, and stale timers do not pile up in the heap.
    #[test]
    fn evicted_rows_leave_no_left_only_and_no_timers_behind() {
        let mut j = join(0, 100, JoinType::Left);
        let mut out = Output::default();
        for ts in 0..10 {
            j.on_row(LEFT, row(1000 + ts, ts), &mut out);
        }
        let mut seen = Vec::new();
        j.visit_evictable(&mut |input, ts, id, key_hash, handle| seen.push((ts, id, input, key_hash, handle)));
        seen.sort_unstable();
        assert_eq!(seen.len(), 10);
        assert_eq!(seen[0].0, 1000);
        for &(ts, _, input, key_hash, handle) in &seen[..6] {
            assert_eq!(j.evict(input, key_hash, handle).map(|r| r.ts), Some(ts));
            assert!(j.evict(input, key_hash, handle).is_none(), "evicted once");
        }
        // Six of ten timers stale: the heap was purged when they passed half.
        assert!(j.timers.len() < 10, "{} timers", j.timers.len());
        assert_eq!(j.state_rows(), 4);
        j.on_watermark(Time::POS_INF, &mut out);
        assert_eq!(kinds(&out), [1006, 1007, 1008, 1009].map(|ts| (ResultKind::LeftOnly, ts)));
        assert_eq!(j.quality().unmatched[LEFT], 4, "evicted rows count as expired, not unmatched");
    }

    /// Golden-style: every on-time row is counted once when it leaves, late rows are not.
    #[test]
    fn quality_counts_each_row_once_when_it_leaves() {
        let mut j = join(0, 100, JoinType::Inner);
        let mut out = Output::default();
        j.on_row(LEFT, row(1000, 1), &mut out); // meets right 1050 and 1100: matched
        j.on_row(LEFT, row(1020, 2), &mut out); // meets them too
        j.on_row(LEFT, row(3000, 3), &mut out); // nothing near it: unmatched
        j.on_row(RIGHT, row(1050, 4), &mut out);
        j.on_row(RIGHT, row(1100, 5), &mut out);
        j.on_row(RIGHT, row(900, 6), &mut out); // before every left row: unmatched
        assert_eq!(out.archived.len(), 4);
        j.on_watermark(Time::ms(1101), &mut out);
        // Left 1000 (last chance 1100) left matched; the right rows' last chance is their ts.
        assert_eq!(j.quality(), Quality { matched: [1, 2], unmatched: [0, 1], ..Quality::default() });
        j.on_row(RIGHT, row(1000, 7), &mut out); // late: counted late, not here
        j.on_watermark(Time::POS_INF, &mut out);
        assert_eq!(j.quality(), Quality { matched: [2, 2], unmatched: [1, 1], ..Quality::default() });
        assert_eq!(out.late.len(), 1);
    }

    #[test]
    fn negative_bounds_decide_a_row_at_once_when_its_chance_is_gone() {
        let mut j = join(-300, -100, JoinType::Right);
        let mut out = Output::default();
        j.on_watermark(Time::ms(1000), &mut out);
        // A right row at 1050 could only meet left rows in [1150, 1350]... which are all on time,
        // so it is kept; one at 1000 can meet left rows in [1100, 1300]: kept too.
        j.on_row(RIGHT, row(1000, 1), &mut out);
        assert_eq!(j.state_rows(), 1);
        // A left row at 1000 meets right rows in [700, 900], all behind the watermark: decided now.
        j.on_row(LEFT, row(1000, 2), &mut out);
        assert_eq!(j.state_rows(), 1);
        assert_eq!(
            j.quality(),
            Quality { matched: [0, 0], unmatched: [1, 0], ..Quality::default() },
            "counted as it is decided"
        );
        assert_eq!(j.output_watermark(), Time::ms(700));
    }
}

/// A delta chain restores what a whole snapshot taken at its end restores: the same rows under
/// the same handles with the same matched flags, the same timers, and from there the same
/// output, whatever the rows, watermarks and early evictions before (state/snapshot.rs,
/// "Deltas").
#[cfg(test)]
mod delta_tests {
    use proptest::prelude::*;

    use super::*;
    use crate::record::{Key, Value};
    use crate::state::arena::ArenaStore;

    /// Row `id` of key `k` at `ts`.
    fn keyed_row(k: u8, ts: i64, id: u64) -> Row {
        let key = Key::Str(format!("k{k}").into());
        let key_hash = crate::record::id::key_hash(&key);
        Row { ts, key, key_hash, id, values: Box::new([Value::Int(id as i64)]) }
    }

    /// One step: a row (input, key, time offset), a watermark step, or an early eviction.
    #[derive(Clone, Debug)]
    enum Step {
        Row(usize, u8, i64),
        Watermark(i64),
        EvictOldest,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            7 => (0usize..2, 0u8..4, -4i64..12).prop_map(|(input, key, dt)| Step::Row(input, key, dt)),
            2 => (0i64..4).prop_map(Step::Watermark),
            1 => Just(Step::EvictOldest),
        ]
    }

    /// What the join emitted: results (kind, ts, id), late rows' ids, evicted rows' ids.
    type Emitted = Vec<(String, i64, u64)>;

    fn run(j: &mut IntervalJoin, steps: &[(usize, Step)], now: &mut i64) -> Emitted {
        let mut emitted = Vec::new();
        for (i, step) in steps {
            let mut out = Output::default();
            match *step {
                Step::Row(input, key, dt) => j.on_row(input, keyed_row(key, *now + dt, *i as u64), &mut out),
                Step::Watermark(dt) => {
                    *now += dt;
                    j.on_watermark(Time::ms(*now), &mut out);
                }
                Step::EvictOldest => {
                    let mut oldest = None::<(i64, u64, usize, u64, u64)>;
                    j.visit_evictable(&mut |input, ts, id, key_hash, handle| {
                        let this = (ts, id, input, key_hash, handle);
                        oldest = Some(oldest.map_or(this, |o| o.min(this)));
                    });
                    if let Some((_, _, input, key_hash, handle)) = oldest
                        && let Some(row) = j.evict(input, key_hash, handle)
                    {
                        emitted.push(("evicted".into(), row.ts, row.id));
                    }
                }
            }
            emitted
                .extend(out.archived.iter().map(|(k, r)| (k.as_str().to_owned(), r.ts.to_native(), r.id.to_native())));
            emitted.extend(out.late.iter().map(|(_, r)| ("late".to_owned(), r.ts, r.id)));
        }
        emitted
    }

    fn encoded<T: for<'a> rkyv::Serialize<snapshot::SnapshotSerializer<'a>>>(value: &T) -> Vec<u8> {
        snapshot::encode_nesting(value).unwrap()
    }

    /// Each input's rows as (handle, matched, archive), in handle order.
    fn stored(j: &IntervalJoin) -> Vec<Vec<(RowHandle, bool, Vec<u8>)>> {
        j.state
            .iter()
            .map(|store| {
                let mut rows = Vec::new();
                store.export(&mut |handle, matched, archive| rows.push((handle, matched, archive.to_vec()))).unwrap();
                rows.sort();
                rows
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
        #[test]
        fn a_chain_of_deltas_restores_what_a_whole_snapshot_does(
            steps in prop::collection::vec(step(), 1..160),
            cuts in prop::collection::vec(0.0f64..1.0, 2..6),
            lower in -20i64..=0,
            upper in 0i64..=20,
            kind in prop_oneof![Just(JoinType::Inner), Just(JoinType::Left), Just(JoinType::Full)],
        ) {
            let steps: Vec<(usize, Step)> = steps.into_iter().enumerate().collect();
            let mut cuts: Vec<usize> = cuts.iter().map(|c| (c * steps.len() as f64) as usize).collect();
            cuts.sort_unstable();
            let dir = tempfile::tempdir().unwrap();
            let mut arenas = (0..).map(|n| -> Box<dyn KeyedStore> {
                Box::new(ArenaStore::open(&dir.path().join(format!("s{n}"))).unwrap())
            });
            let spec = IntervalJoinSpec {
                name: "j".into(), lower, upper, join: kind, condition: None,
                projection: Projection::key_and_first_values(),
            };
            let mut live = IntervalJoin::with_state(spec.clone(), [arenas.next().unwrap(), arenas.next().unwrap()]);
            let mut now = 0;
            run(&mut live, &steps[..cuts[0]], &mut now);
            let whole = encoded(&live.snapshot_view().unwrap());
            live.note_snapshot();
            let mut deltas = Vec::new();
            for pair in cuts.windows(2) {
                run(&mut live, &steps[pair[0]..pair[1]], &mut now);
                deltas.push(encoded(&live.snapshot_delta().expect("notes are whole")));
                live.note_snapshot();
            }
            let at_end = encoded(&live.snapshot_view().unwrap());
            let deltas: Vec<&[u8]> = deltas.iter().map(Vec::as_slice).collect();

            let mut chained = IntervalJoin::with_state(spec.clone(), [arenas.next().unwrap(), arenas.next().unwrap()]);
            chained.restore_chain(&whole, &deltas).unwrap();
            let mut from_whole = IntervalJoin::new(spec);
            from_whole.restore(&at_end).unwrap();
            prop_assert_eq!(stored(&chained), stored(&from_whole));
            let timers = |j: &IntervalJoin| { let mut t: Vec<Timer> = j.timers.iter().copied().collect(); t.sort(); t };
            prop_assert_eq!(timers(&chained), timers(&from_whole));

            let rest = &steps[cuts[cuts.len() - 1]..];
            let (mut now_a, mut now_b, mut now_c) = (now, now, now);
            let expected = run(&mut live, rest, &mut now_a);
            prop_assert_eq!(&run(&mut chained, rest, &mut now_b), &expected);
            prop_assert_eq!(&run(&mut from_whole, rest, &mut now_c), &expected);
        }
    }
}
