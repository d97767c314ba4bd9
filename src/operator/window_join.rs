//! window_join: every pair per key per window, inner or outer (`join`: a left, right or full
//! join emits a row in no pair of its window alone, as `left_only` / `right_only`, when the
//! window fires; `_id` = H(operator, kind, row id, start, end), sessions without the bounds; no
//! `allowed_lateness` then, as a re-fire could not retract such a row); an optional `where` condition on a pair
//! (DESIGN.md "Operators", CONTRACT.md rules 5, 7–10). Windows, lateness, firing and eviction
//! are [`super::window`]'s.
//!
//! - A window keeps its rows of both inputs; when it fires, every (left, right) pair of it
//!   (passing `where`) is a `match` with `_ts = end − 1`, the window bounds and `_version`.
//! - `_id` = H(operator, "match", left id, right id, start, end) for fixed windows, so a pair in
//!   two sliding windows has two ids; for sessions the bounds are left out, so a pair keeps its
//!   `_id` when sessions merge, and the merged session continues the highest `_version` of its
//!   parts (rule 10). A re-fire within allowed lateness re-emits every pair of the window with
//!   the same `_id`s and `_version` + 1: a consumer upserts by `_id`.
//! - A row is stored once (shared by the windows of a sliding row) and freed with its last window.
//! - Join quality ([`Quality`]): a row is **matched** when its window (a sliding row's last
//!   window) holds at least one row of the other input when it is freed, whether or not a pair
//!   passes `where`; unmatched otherwise; counted once, then ([`super::window`] "Join quality").
//! - `ttl` and `evict_oldest`: a key's open windows are per-key state; they expire `ttl` after a
//!   row last went into one of them. A dropped window whose results are not out yet puts them
//!   in `OPERATOR.expired` (`input` None) as its next firing would have made them — its pairs and,
//!   for an outer join, its rows alone, which then are never emitted as `left_only` /
//!   `right_only`; its rows count as expired, not matched or unmatched ([`super::window`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::config::operators::{Builder, Built, join_type, output_schema, pair_condition, select};
use crate::config::walk::{Errors, Table};
use crate::record::id::IdHasher;
use crate::record::schema::Field;
use crate::record::view::RowView;
use crate::record::{FieldType, Row};
use crate::state::snapshot::{self, SnapshotError};
use crate::time::Time;

use super::expr::Expr;
use super::interval_join::{JoinType, LEFT, RIGHT};
use super::projection::result_key;
use super::window::{Contents, Fire, OnMerge, RowRef, Window, WindowSpec, Windows, WindowsState, check_spec};
use super::{OperatorSpec, Output, Projection, Quality, ResultKind};

/// Checks `[operators.NAME]` of this kind.
pub(crate) fn check(b: &mut Builder<'_, '_, '_>, name: &str, t: Table<'_, '_>, errors: &mut Errors) -> Option<Built> {
    let inputs = b.two_inputs(t, false, errors);
    let window = check_spec(t, errors);
    let inputs = inputs?;
    let condition = pair_condition(t, &inputs, errors);
    let join = join_type(t, &["inner", "left", "right", "full"], errors)?;
    if join != JoinType::Inner && window.is_some_and(|w| w.allowed_lateness > 0) {
        let message = "an outer window join takes no allowed_lateness: a late row could turn a row emitted alone into a pair, and a consumer upserting by _id cannot retract the row emitted alone";
        t.error("allowed_lateness", errors, message.to_owned());
    }
    let missing = [join.keeps_unmatched(RIGHT), join.keeps_unmatched(LEFT)];
    let (columns, mut fields) = select(t, &inputs, missing, errors)?;
    let meta = [("_window_start", FieldType::Int), ("_window_end", FieldType::Int), ("_version", FieldType::Int)];
    fields.extend(meta.map(|(name, ty)| Field { name: name.into(), ty, nullable: false }));
    let (output, rekey) = output_schema(t, fields, inputs[LEFT].key_fields().len(), errors)?;
    // A bad window is reported already (the plan will not run); the output stays referable.
    let window = window.unwrap_or(WindowSpec::UNUSED);
    let projection = Projection { columns, rekey };
    let spec = WindowJoinSpec { name: name.to_owned(), window, join, condition, projection };
    Some(Built { inputs: inputs.map(|i| i.node).to_vec(), output, spec: OperatorSpec::WindowJoin(spec) })
}

#[derive(Clone, Debug)]
pub struct WindowJoinSpec {
    pub name: String,
    pub window: WindowSpec,
    /// inner, or which rows in no pair of their window are emitted alone (`left_only`,
    /// `right_only`) when it fires.
    pub join: JoinType,
    /// `where`: a pair is emitted only when it holds.
    pub condition: Option<Expr>,
    /// The key, the selected fields and `_kind`; the window bounds and `_version` follow.
    pub projection: Projection,
}

/// The rows of one window, per input, in arrival order.
#[derive(Clone, Default)]
pub struct Rows {
    sides: [Vec<(u64, Arc<Row>)>; 2],
    bytes: usize,
}

impl Contents for Rows {
    type Item = Arc<Row>;

    fn add(&mut self, input: usize, row: &Arc<Row>, seq: u64) {
        self.bytes += row.size_bytes();
        self.sides[input].push((seq, Arc::clone(row)));
    }

    fn absorb(&mut self, other: Rows) {
        self.bytes += other.bytes;
        for (mine, theirs) in self.sides.iter_mut().zip(other.sides) {
            mine.extend(theirs);
            mine.sort_by_key(|(seq, _)| *seq);
        }
    }

    fn rows(&self) -> usize {
        self.sides[LEFT].len() + self.sides[RIGHT].len()
    }

    fn bytes(&self) -> usize {
        self.bytes
    }

    fn has(&self, input: usize) -> bool {
        !self.sides[input].is_empty()
    }

    fn visit_rows(&self, visit: &mut dyn FnMut(i64, u64)) {
        self.sides.iter().flatten().for_each(|(_, row)| visit(row.ts, row.id));
    }
}

/// Emits the pairs of a firing window.
struct Pairs {
    spec: WindowJoinSpec,
    ids: IdHasher,
}

impl Fire<Rows> for Pairs {
    fn fire(&mut self, w: &Window<Rows>, out: &mut Output) -> Option<u64> {
        let Pairs { spec, ids } = self;
        let session = spec.window.is_session();
        let rights = &w.contents.sides[RIGHT];
        // Which right rows were in a pair (only an outer join keeping right rows looks).
        let mut right_paired = vec![false; if spec.join.keeps_unmatched(RIGHT) { rights.len() } else { 0 }];
        for (_, left) in &w.contents.sides[LEFT] {
            let mut paired = false;
            for (i, (_, right)) in rights.iter().enumerate() {
                if spec.condition.as_ref().is_some_and(|c| !c.eval(left, right)) {
                    continue;
                }
                paired = true;
                if let Some(flag) = right_paired.get_mut(i) {
                    *flag = true;
                }
                let id = ids.pair(&spec.name, left.id, right.id);
                if !session {
                    id.u64(w.start as u64).u64(w.end as u64);
                }
                let id = id.finish();
                emit(spec, w, [Some(left), Some(right)], ResultKind::Match, id, out);
            }
            if !paired && spec.join.keeps_unmatched(LEFT) {
                let id = alone_id(ids, spec, w, ResultKind::LeftOnly, left.id);
                emit(spec, w, [Some(left), None], ResultKind::LeftOnly, id, out);
            }
        }
        for (paired, (_, right)) in right_paired.iter().zip(rights) {
            if !paired {
                let id = alone_id(ids, spec, w, ResultKind::RightOnly, right.id);
                emit(spec, w, [None, Some(right)], ResultKind::RightOnly, id, out);
            }
        }
        None
    }
}

/// `_id` of a row emitted alone: H(operator, kind, row id[, start, end]) (sessions without the
/// bounds, as pairs).
fn alone_id(ids: &mut IdHasher, spec: &WindowJoinSpec, w: &Window<Rows>, kind: ResultKind, row_id: u64) -> u64 {
    let id = ids.begin().str(&spec.name).str(kind.as_str()).u64(row_id);
    if !spec.window.is_session() {
        id.u64(w.start as u64).u64(w.end as u64);
    }
    id.finish()
}

/// Emits one result of window `w`: `_ts = end − 1`, the window bounds and `_version`.
fn emit(
    spec: &WindowJoinSpec,
    w: &Window<Rows>,
    rows: [Option<&Arc<Row>>; 2],
    kind: ResultKind,
    id: u64,
    out: &mut Output,
) {
    let columns = &spec.projection.columns;
    let mut values = Vec::with_capacity(columns.len() + 3);
    let views = rows.map(|r| r.map(|r| RowView::Heap(r)));
    values.extend(columns.iter().map(|column| column.value(w.key.key_ref(), views, kind)));
    values.extend(w.meta());
    let (key, key_hash) = result_key(w.key.key_ref(), w.key_hash, &values, spec.projection.rekey.as_deref());
    let row = Row { ts: w.end - 1, key, key_hash, id, values: values.into() };
    out.results.push((kind, row));
}

pub struct WindowJoin {
    windows: Windows<Rows>,
    pairs: Pairs,
}

impl WindowJoin {
    pub fn new(spec: WindowJoinSpec) -> WindowJoin {
        let windows = Windows::new(spec.window, OnMerge::ContinueVersions, Rows::default());
        WindowJoin { windows, pairs: Pairs { spec, ids: IdHasher::default() } }
    }

    pub fn on_row(&mut self, input: usize, row: Row, out: &mut Output) {
        let row = Arc::new(row);
        let at = RowRef { input, ts: row.ts, key: &row.key, key_hash: row.key_hash };
        if !self.windows.on_row(at, &row, &mut self.pairs, out) {
            // Not stored anywhere: the only reference.
            out.late.push((input, Arc::unwrap_or_clone(row)));
        }
    }

    pub fn on_watermark(&mut self, watermark: Time, out: &mut Output) {
        self.windows.on_watermark(watermark, &mut self.pairs, out);
    }

    /// Every open window, for `evict_oldest` (state/budget.rs), by its `_ts` (end − 1).
    pub fn visit_evictable(&self, visit: &mut dyn FnMut(usize, i64, u64, u64, u64)) {
        self.windows.visit_evictable(visit);
    }

    /// `evict_oldest` takes window `handle`: its would-be results, if not out yet, to
    /// `out.expired` (reason budget). False when it is gone already.
    pub fn evict(&mut self, handle: u64, out: &mut Output) -> bool {
        self.windows.evict(handle, &mut self.pairs, out)
    }

    /// `ttl` passed since a row last went into a window of the key: its open windows go
    /// ([`Windows::expire_key`]), each with the pairs (and rows alone) it would have emitted.
    pub fn expire(&mut self, due: crate::state::ttl::Due, out: &mut Output) {
        if let crate::state::ttl::Due::Key { key_hash, .. } = due {
            self.windows.expire_key(key_hash, super::ExpiryReason::Ttl, &mut self.pairs, out);
        }
    }

    pub fn output_watermark(&self) -> Time {
        self.windows.output_watermark()
    }

    pub fn is_quiescent(&self) -> bool {
        self.windows.is_quiescent()
    }

    /// Rows that left with their last window, matched or not (module doc).
    pub fn quality(&self) -> Quality {
        self.windows.quality()
    }

    /// Rows held, counted once per window that holds them.
    pub fn state_rows(&self) -> usize {
        self.windows.state_rows()
    }

    pub fn state_bytes(&self) -> usize {
        self.windows.state_bytes()
    }
}

/// What a checkpoint keeps of a window join (state/snapshot.rs): the windows, every stored row
/// once (a sliding row is shared by its windows) with its arrival number, and per window the
/// arrival numbers of its rows per input.
#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
struct WindowJoinState {
    windows: WindowsState,
    rows: Vec<(u64, Row)>,
    contents: Vec<[Vec<u64>; 2]>,
}

impl WindowJoin {
    /// Everything this instance's output depends on: the open windows with their rows,
    /// versions and firing state, the watermark, the arrival counter, the join quality so far.
    pub fn snapshot(&self) -> Result<Vec<u8>, SnapshotError> {
        let (windows, contents) = self.windows.snapshot();
        let mut rows = BTreeMap::new();
        let contents = contents
            .into_iter()
            .map(|c| {
                c.sides.clone().map(|side| {
                    side.into_iter()
                        .map(|(seq, row)| {
                            rows.entry(seq).or_insert(row);
                            seq
                        })
                        .collect()
                })
            })
            .collect();
        let rows = rows.into_iter().map(|(seq, row)| (seq, Row::clone(&row))).collect();
        snapshot::encode(&WindowJoinState { windows, rows, contents })
    }

    /// Takes up a [`snapshot`](Self::snapshot); `self` is freshly built from the same spec.
    pub fn restore(&mut self, bytes: &[u8]) -> Result<(), SnapshotError> {
        let saved: WindowJoinState = snapshot::decode(bytes)?;
        let rows: HashMap<u64, Arc<Row>> = saved.rows.into_iter().map(|(seq, row)| (seq, Arc::new(row))).collect();
        let mut contents = Vec::with_capacity(saved.contents.len());
        for sides in saved.contents {
            let mut window = Rows::default();
            for (input, side) in sides.into_iter().enumerate() {
                for seq in side {
                    let row = rows.get(&seq).ok_or_else(|| SnapshotError::Decode(format!("no row {seq}")))?;
                    window.add(input, row, seq);
                }
            }
            contents.push(window);
        }
        self.windows.restore(saved.windows, contents)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::window::WindowKind;
    use crate::record::{Key, Value};

    fn join(kind: WindowKind, allowed_lateness: i64) -> WindowJoin {
        let window = WindowSpec { kind, allowed_lateness };
        let projection = Projection::key_and_first_values();
        WindowJoin::new(WindowJoinSpec { name: "w".into(), window, join: JoinType::Inner, condition: None, projection })
    }

    fn row(ts: i64, tag: i64) -> Row {
        Row { ts, key: Key::Str("d".into()), key_hash: 1, id: tag as u64, values: Box::new([Value::Int(tag)]) }
    }

    /// (left tag, right tag, start, end, version, _ts, id) of each result.
    fn pairs(out: &mut Output) -> Vec<(i64, i64, i64, i64, i64, i64, u64)> {
        let int = |v: &Value| if let Value::Int(i) = v { *i } else { -1 };
        let results = out.results.drain(..);
        results
            .map(|(_, r)| {
                (
                    int(&r.values[1]),
                    int(&r.values[2]),
                    int(&r.values[4]),
                    int(&r.values[5]),
                    int(&r.values[6]),
                    r.ts,
                    r.id,
                )
            })
            .collect()
    }

    /// Golden-style: a row counts as its last window is freed, matched when that window holds a
    /// row of the other input; a sliding row is judged by its last window alone.
    #[test]
    fn quality_counts_rows_by_their_last_window() {
        let mut j = join(WindowKind::Fixed { size: 10, slide: 10, offset: 0 }, 0);
        let mut out = Output::default();
        j.on_row(LEFT, row(1, 1), &mut out);
        j.on_row(RIGHT, row(3, 2), &mut out);
        j.on_row(LEFT, row(12, 3), &mut out); // [10, 20) has no right row
        j.on_watermark(Time::ms(9), &mut out);
        assert_eq!(
            j.quality(),
            Quality { matched: [1, 1], unmatched: [0, 0], ..Quality::default() },
            "[0, 10) freed at 9"
        );
        j.on_row(LEFT, row(5, 4), &mut out); // late: not counted here
        j.on_watermark(Time::POS_INF, &mut out);
        assert_eq!(j.quality(), Quality { matched: [1, 1], unmatched: [1, 0], ..Quality::default() });
        assert_eq!((pairs(&mut out).len(), out.late.len()), (1, 1));

        let mut j = join(WindowKind::Fixed { size: 10, slide: 5, offset: 0 }, 0);
        j.on_row(LEFT, row(7, 1), &mut out); // [5, 15) (its last) and [0, 10)
        j.on_row(RIGHT, row(2, 2), &mut out); // [0, 10) (its last) and [-5, 5)
        j.on_watermark(Time::POS_INF, &mut out);
        assert_eq!(pairs(&mut out).len(), 1, "they pair in [0, 10)");
        assert_eq!(
            j.quality(),
            Quality { matched: [0, 1], unmatched: [1, 0], ..Quality::default() },
            "left 7's last window has no right row"
        );
    }

    #[test]
    fn tumbling_pairs_fire_at_end_minus_one() {
        let mut j = join(WindowKind::Fixed { size: 10, slide: 10, offset: 0 }, 0);
        let mut out = Output::default();
        j.on_row(LEFT, row(9, 1), &mut out);
        j.on_row(RIGHT, row(0, 2), &mut out);
        j.on_row(RIGHT, row(10, 3), &mut out);
        j.on_watermark(Time::ms(8), &mut out);
        assert!(out.is_empty());
        j.on_watermark(Time::ms(9), &mut out);
        let got = pairs(&mut out);
        assert_eq!(got.iter().map(|p| (p.0, p.1, p.2, p.3, p.4, p.5)).collect::<Vec<_>>(), [(1, 2, 0, 10, 1, 9)]);
        j.on_row(LEFT, row(5, 4), &mut out);
        assert_eq!(out.late.len(), 1, "its only window fired and is gone");
        assert_eq!(j.state_rows(), 1);
        assert_eq!(j.output_watermark(), Time::ms(9));
    }

    #[test]
    fn where_filters_pairs_and_a_bad_condition_is_a_config_error() {
        let field =
            |name: &str| crate::record::schema::Field { name: name.into(), ty: FieldType::Int, nullable: false };
        let schema = crate::record::Schema::new(vec![field("v")], None, crate::record::TimeSpec::Ingest);
        let mut j = join(WindowKind::Fixed { size: 10, slide: 10, offset: 0 }, 0);
        j.pairs.spec.condition = Some(Expr::parse("left.v < right.v", &schema, &schema).unwrap());
        let mut out = Output::default();
        j.on_row(LEFT, row(1, 5), &mut out);
        j.on_row(RIGHT, row(2, 4), &mut out);
        j.on_row(RIGHT, row(3, 6), &mut out);
        j.on_watermark(Time::POS_INF, &mut out);
        assert_eq!(pairs(&mut out).iter().map(|p| (p.0, p.1)).collect::<Vec<_>>(), [(5, 6)]);

        let text = "[streams.a]\nkey = \"k\"\nfields = { k = \"string\", v = \"int\" }\n\
                    [operators.w]\nkind = \"window_join\"\nleft = \"a\"\nright = \"a\"\nselect = [\"left.v\"]\n\
                    window = { kind = \"tumbling\", size = \"1s\" }\nwhere = \"left.nope > 1\"\n";
        let err = crate::config::parse("w.toml", text).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("w.toml:10:1: operators.w.where: bad condition"), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }

    #[test]
    fn sliding_pair_has_one_id_per_window() {
        let mut j = join(WindowKind::Fixed { size: 10, slide: 5, offset: 0 }, 0);
        let mut out = Output::default();
        j.on_row(LEFT, row(6, 1), &mut out);
        j.on_row(RIGHT, row(8, 2), &mut out);
        j.on_watermark(Time::POS_INF, &mut out);
        let got = pairs(&mut out);
        assert_eq!(got.iter().map(|p| (p.2, p.3)).collect::<Vec<_>>(), [(0, 10), (5, 15)]);
        assert_ne!(got[0].6, got[1].6);
        assert_eq!((j.state_rows(), j.state_bytes()), (0, 0));
    }

    #[test]
    fn late_rows_refire_with_the_same_ids_and_merged_sessions_keep_them() {
        let mut j = join(WindowKind::Session { gap: 10 }, 100);
        let mut out = Output::default();
        j.on_row(LEFT, row(0, 1), &mut out);
        j.on_row(RIGHT, row(5, 2), &mut out);
        j.on_watermark(Time::ms(20), &mut out);
        let first = pairs(&mut out);
        assert_eq!(first.iter().map(|p| (p.2, p.3, p.4)).collect::<Vec<_>>(), [(0, 15, 1)]);
        // Within allowed lateness: [12, 22) overlaps [0, 15) → [0, 22), not due yet (21 > 20).
        j.on_row(RIGHT, row(12, 3), &mut out);
        assert!(out.results.is_empty());
        j.on_watermark(Time::ms(21), &mut out);
        let second = pairs(&mut out);
        assert_eq!(second.iter().map(|p| (p.1, p.2, p.3, p.4)).collect::<Vec<_>>(), [(2, 0, 22, 2), (3, 0, 22, 2)]);
        assert_eq!(second[0].6, first[0].6, "the pair keeps its id");
        assert_eq!(j.output_watermark(), Time::ms(-79));
        assert!(j.is_quiescent());
    }

    /// `ttl` drops a key's open window: its pairs and (outer join) rows alone go to `expired`
    /// with input None, never to the results; `evict_oldest` does the same by window.
    #[test]
    fn an_expired_or_evicted_window_puts_its_would_be_results_in_expired() {
        use crate::operator::ExpiryReason;
        use crate::state::ttl::Due;
        let mut j = join(WindowKind::Fixed { size: 10, slide: 10, offset: 0 }, 0);
        j.pairs.spec.join = JoinType::Full;
        let mut out = Output::default();
        j.on_row(LEFT, row(1, 1), &mut out);
        j.on_row(RIGHT, row(2, 2), &mut out);
        j.on_row(LEFT, row(12, 3), &mut out);
        assert_eq!(out.touched, [(0, 1)], "one key, touched once per run of its rows");
        let mut candidates = Vec::new();
        j.visit_evictable(&mut |input, ts, _, key_hash, handle| candidates.push((ts, input, key_hash, handle)));
        candidates.sort_unstable();
        assert_eq!(candidates.iter().map(|c| c.0).collect::<Vec<_>>(), [9, 19]);
        assert!(j.evict(candidates[1].3, &mut out));
        assert!(!j.evict(candidates[1].3, &mut out), "gone already");
        let kinds = |out: &Output| {
            out.expired.iter().map(|e| (e.reason, e.input, e.row.ts, e.row.values[3].clone())).collect::<Vec<_>>()
        };
        let left_only = Value::Str("left_only".into());
        assert_eq!(kinds(&out), [(ExpiryReason::Budget, None, 19, left_only)]);
        out.expired.clear();
        j.expire(Due::Key { input: 0, key_hash: 1 }, &mut out);
        assert_eq!(kinds(&out), [(ExpiryReason::Ttl, None, 9, Value::Str("match".into()))]);
        let left = [(ExpiryReason::Budget, 1, 3), (ExpiryReason::Ttl, 1, 1), (ExpiryReason::Ttl, 1, 2)];
        assert_eq!(out.left_early, left, "the rows that left with them, for explain");
        j.on_watermark(Time::POS_INF, &mut out);
        assert!(out.results.is_empty(), "expired windows never fire");
        assert_eq!(j.quality(), Quality { expired: [2, 1], ..Quality::default() }, "rows count as expired");
        assert_eq!((j.state_rows(), j.state_bytes()), (0, 0));
    }
}
