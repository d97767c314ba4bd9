//! Temporal join: for each left row, the right row with the same key and the greatest ts ≤
//! left.ts (Flink SQL `FOR SYSTEM_TIME AS OF`); emitted once the watermark passes left.ts
//! (DESIGN.md "Operators", CONTRACT.md rules 5, 7–11).
//!
//! - A row of either input is late when `ts < watermark` (the operator's, as of the last tick);
//!   late rows go to the late side output and nowhere else.
//! - A left row waits until `watermark > l.ts` (rule 8): from then on no on-time right row can
//!   have `ts ≤ l.ts`, so its version is decided. It then meets the right row of its key (any
//!   row of a broadcast right stream) with the greatest `ts ≤ l.ts`, ties going to the later
//!   arrival (rule 11): `match`, `_id` = H(operator, "match", l.id, r.id); with none, a left join
//!   emits `left_only`, `_id` = H(operator, "left_only", l.id), and an inner join nothing.
//!   `_ts` = l.ts. The left rows a watermark releases are emitted in (ts, arrival) order.
//! - `where` (optional): the version found joins only when the condition holds on the pair;
//!   otherwise the left row counts as having found none (`left_only` for a left join).
//! - Versions (eviction): once a version's ts is below the watermark, every older version of
//!   its key is dead — pending left rows and on-time left rows to come all have ts ≥ the
//!   watermark, and the newer version is at least as good for them. So each key keeps the latest
//!   version below the watermark plus the versions at or above it; at +∞ nothing is kept.
//!   Eviction runs after the left rows of the same watermark are emitted.
//! - Join quality ([`Quality`]), each row counted once when it leaves the join, inner joins too:
//!   a left row leaves when the watermark passes it and is **matched** when it found a version
//!   (whether a left join emits it as `left_only` or an inner join drops it, it is unmatched
//!   otherwise). A right version leaves when it is dead (a newer version of its key fell below
//!   the watermark) or at +∞, and is **matched** when at least one left row was joined with it —
//!   the store's matched flag, set by the scan that picks it. A version that was the best for no
//!   left row is unmatched, even if it was valid for a while: the measure is "did this version
//!   ever serve". A broadcast right stream's versions live on every shard; each instance flags
//!   the versions its own left rows used, and the host counts the right input by shard 0's
//!   instance alone (as its rows), so with several shards a broadcast version used only by the
//!   keys of other shards is counted unmatched.
//! - Output watermark: `min(watermark, smallest pending l.ts)` (rule 5): a result's `_ts` is its
//!   left row's ts.
//! - `ttl` (state/ttl.rs): a waiting left row is a stored row, due `ttl` after it was written;
//!   a key's versions are per-key state, all due together `ttl` after the key's last version
//!   arrived (a left row looking them up does not refresh them). What is due leaves to
//!   `OPERATOR.expired`, counted as expired and never as matched or unmatched: a left row that
//!   expires is never emitted (not even as `left_only`); once a key's versions expired, a left
//!   row of that key finds none until a new version comes (`left_only` for a left join, nothing
//!   for an inner one). The state budget's `evict_oldest` takes left rows and versions one by
//!   one, oldest (ts, id) first, the same way; a broadcast stream's versions are not evicted
//!   (every shard holds them).
//!
//! Arrival order is the order this instance received rows: store handles are handed out in
//! insertion order, so they double as arrival sequence numbers within each input.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use crate::config::operators::{Builder, Built, join_type, output_schema, pair_condition, select};
use crate::config::walk::{Errors, Table};
use crate::operator::interval_join::{JoinType, LEFT, RIGHT};
use crate::record::frame::to_row;
use crate::record::id::IdHasher;
use crate::record::view::{KeyRef, RowView};
use crate::record::{ArchivedRow, Key, Row};
use crate::state::snapshot::{self, SavedStore, SnapshotError};
use crate::state::ttl::{Due, StoredRow};
use crate::state::{KeyedStore, MemoryStore, RowHandle};
use crate::time::Time;

use super::expr::Expr;
use super::{Expired, ExpiryReason, OperatorSpec, Output, Projection, Quality, ResultKind};

/// Checks `[operators.NAME]` of this kind.
pub(crate) fn check(b: &mut Builder<'_, '_, '_>, name: &str, t: Table<'_, '_>, errors: &mut Errors) -> Option<Built> {
    let inputs = b.two_inputs(t, true, errors);
    let join = join_type(t, &["inner", "left"], errors)?;
    let condition = pair_condition(t, inputs.as_ref()?, errors);
    let (columns, fields) = select(t, inputs.as_ref()?, [false, join == JoinType::Left], errors)?;
    let (output, rekey) = output_schema(t, fields, inputs.as_ref()?[LEFT].key_fields().len(), errors)?;
    let inputs = inputs?;
    let spec = TemporalJoinSpec {
        name: name.to_owned(),
        left_join: join == JoinType::Left,
        condition,
        broadcast_right: inputs[RIGHT].is_broadcast(),
        projection: Projection { columns, rekey },
    };
    Some(Built { inputs: inputs.map(|i| i.node).to_vec(), output, spec: OperatorSpec::TemporalJoin(spec) })
}

#[derive(Clone, Debug)]
pub struct TemporalJoinSpec {
    pub name: String,
    /// `join = "left"`: a left row without a version is emitted as `left_only`.
    pub left_join: bool,
    /// The right input is a broadcast stream (key `"*"`): its versions apply to every key.
    pub broadcast_right: bool,
    /// `where`: the version found joins only when the condition holds on the pair; otherwise the
    /// left row has no version (Flink's temporal join applies its ON condition the same way).
    pub condition: Option<Expr>,
    pub projection: Projection,
}

/// A stored row in (ts, arrival) order.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
struct Waiting {
    ts: i64,
    handle: RowHandle,
    key_hash: u64,
}

/// A right version that is not yet below the watermark.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
struct Version {
    ts: i64,
    handle: RowHandle,
    key: Key,
    key_hash: u64,
}

pub struct TemporalJoin {
    spec: TemporalJoinSpec,
    watermark: Time,
    /// Left rows waiting for the watermark to pass them (in memory, or in a shard's arenas).
    left: Box<dyn KeyedStore>,
    pending: BinaryHeap<Reverse<Waiting>>,
    /// Right versions, with those not yet below the watermark in `fresh`, and per key the
    /// latest version below it in `floor`.
    right: Box<dyn KeyedStore>,
    fresh: BinaryHeap<Reverse<Version>>,
    /// Per key: the version's handle and key hash.
    floor: HashMap<Key, (RowHandle, u64)>,
    /// Per key hash, the handles of its versions still stored (in arrival order): how a key's
    /// `ttl` finds them. Rebuilt from `fresh` and `floor` on restore.
    versions: HashMap<u64, Vec<RowHandle>>,
    /// Entries of `pending` and `fresh` whose row left early (`ttl`, the budget): skipped when
    /// popped, dropped in one pass once they are half their heap.
    stale: [usize; 2],
    ids: IdHasher,
    quality: Quality,
}

impl TemporalJoin {
    pub fn new(spec: TemporalJoinSpec) -> TemporalJoin {
        TemporalJoin::with_state(spec, [Box::new(MemoryStore::default()), Box::new(MemoryStore::default())])
    }

    /// A join keeping its left rows and right versions in these stores.
    pub fn with_state(spec: TemporalJoinSpec, [left, right]: [Box<dyn KeyedStore>; 2]) -> TemporalJoin {
        TemporalJoin {
            spec,
            watermark: Time::NEG_INF,
            left,
            pending: BinaryHeap::new(),
            right,
            fresh: BinaryHeap::new(),
            floor: HashMap::new(),
            versions: HashMap::new(),
            stale: [0; 2],
            ids: IdHasher::default(),
            quality: Quality::default(),
        }
    }

    pub fn on_row(&mut self, input: usize, row: Row, out: &mut Output) {
        if self.watermark.is_past(row.ts) {
            out.late.push((input, row));
            return;
        }
        let (ts, key_hash) = (row.ts, row.key_hash);
        if input == LEFT {
            let handle = self.left.insert(row, false);
            self.wait(ts, handle, key_hash, out);
        } else {
            let key = row.key.clone();
            let handle = self.right.insert(row, false);
            self.add_version(Version { ts, handle, key, key_hash }, out);
        }
    }

    /// [`on_row`](Self::on_row) for a row read in place from a ring frame (`bytes`: its
    /// archive), stored as it is (an arena copies the archive; the in-memory store the row).
    pub fn on_frame(&mut self, input: usize, row: &ArchivedRow, bytes: &[u8], out: &mut Output) {
        let (ts, key_hash) = (row.ts.to_native(), row.key_hash.to_native());
        if self.watermark.is_past(ts) {
            out.late.push((input, to_row(row)));
            return;
        }
        if input == LEFT {
            let handle = self.left.insert_archived(row, bytes, false);
            self.wait(ts, handle, key_hash, out);
        } else {
            let key = KeyRef::archived(&row.key).to_key();
            let handle = self.right.insert_archived(row, bytes, false);
            self.add_version(Version { ts, handle, key, key_hash }, out);
        }
    }

    /// A left row waits for the watermark; the host hears it was stored (its `ttl` clock).
    fn wait(&mut self, ts: i64, handle: RowHandle, key_hash: u64, out: &mut Output) {
        self.pending.push(Reverse(Waiting { ts, handle, key_hash }));
        out.stored.push(StoredRow { input: LEFT as u32, key_hash, handle });
    }

    /// A new version: a write of its key (the host's `ttl` clock restarts the key's ttl).
    fn add_version(&mut self, version: Version, out: &mut Output) {
        self.versions.entry(version.key_hash).or_default().push(version.handle);
        out.touched.push((RIGHT as u32, version.key_hash));
        self.fresh.push(Reverse(version));
    }

    /// A version dead by the watermark leaves: whether it served a left row, if still stored.
    fn drop_version(&mut self, key_hash: u64, handle: RowHandle) -> Option<bool> {
        self.unindex(key_hash, handle);
        self.right.discard(key_hash, handle)
    }

    fn unindex(&mut self, key_hash: u64, handle: RowHandle) {
        if let Some(handles) = self.versions.get_mut(&key_hash) {
            handles.retain(|&h| h != handle);
            if handles.is_empty() {
                self.versions.remove(&key_hash);
            }
        }
    }

    /// `ttl` passed (the host's clock says): a waiting left row, or every version of a key,
    /// leaves to `OPERATOR.expired` (module doc).
    pub fn expire(&mut self, due: Due, out: &mut Output) {
        match due {
            Due::Row(StoredRow { input, key_hash, handle }) => {
                if let Some(row) = self.evict(input as usize, key_hash, handle) {
                    out.expired.push(Expired { reason: ExpiryReason::Ttl, input: Some(input as usize), row });
                }
            }
            Due::Key { input, key_hash } if input as usize == RIGHT => {
                for handle in self.versions.get(&key_hash).cloned().unwrap_or_default() {
                    if let Some(row) = self.evict(RIGHT, key_hash, handle) {
                        out.expired.push(Expired { reason: ExpiryReason::Ttl, input: Some(RIGHT), row });
                    }
                }
            }
            Due::Key { .. } => {}
        }
    }

    /// Every waiting left row and stored version: input, (ts, id), key hash and handle
    /// (state/budget.rs, eviction). A broadcast stream's versions are left out: every shard
    /// holds each of them, and shards evict on their own budgets.
    pub fn visit_evictable(&self, visit: &mut dyn FnMut(usize, i64, u64, u64, u64)) {
        self.left.visit_ages(&mut |ts, id, key_hash, handle| visit(LEFT, ts, id, key_hash, handle));
        if !self.spec.broadcast_right {
            self.right.visit_ages(&mut |ts, id, key_hash, handle| visit(RIGHT, ts, id, key_hash, handle));
        }
    }

    /// Takes a waiting left row or a version out before the watermark frees it (`ttl`, the
    /// budget's `evict_oldest`): the caller sends it to `OPERATOR.expired` and counts it as
    /// expired, never as matched or unmatched. Its heap entry stays and is skipped when popped.
    pub fn evict(&mut self, input: usize, key_hash: u64, handle: RowHandle) -> Option<Row> {
        let row = if input == LEFT {
            self.left.remove(key_hash, handle)?.row
        } else {
            let row = self.right.remove(key_hash, handle)?.row;
            self.unindex(key_hash, handle);
            if self.floor.get(&row.key).is_some_and(|&(floor, _)| floor == handle) {
                self.floor.remove(&row.key);
            }
            row
        };
        let side = usize::from(input != LEFT);
        self.stale[side] += 1;
        let heap_len = if input == LEFT { self.pending.len() } else { self.fresh.len() };
        if self.stale[side] * 2 > heap_len {
            let TemporalJoin { left, right, pending, fresh, .. } = self;
            if input == LEFT {
                pending.retain(|Reverse(w)| left.contains(w.key_hash, w.handle));
            } else {
                fresh.retain(|Reverse(v)| right.contains(v.key_hash, v.handle));
            }
            self.stale[side] = 0;
        }
        Some(row)
    }

    pub fn on_watermark(&mut self, watermark: Time, out: &mut Output) {
        self.watermark = watermark;
        while self.pending.peek().is_some_and(|Reverse(w)| watermark.is_past(w.ts)) {
            let Some(Reverse(waiting)) = self.pending.pop() else { break };
            match self.left.remove(waiting.key_hash, waiting.handle) {
                Some(removed) => {
                    let matched = self.emit(&removed.row, out);
                    self.quality.count(LEFT, matched, 1);
                }
                // It left early (`ttl`, the budget).
                None => self.stale[0] = self.stale[0].saturating_sub(1),
            }
        }
        if watermark == Time::POS_INF {
            // Nothing can arrive any more: every version is dead.
            for Reverse(version) in std::mem::take(&mut self.fresh) {
                if let Some(matched) = self.drop_version(version.key_hash, version.handle) {
                    self.quality.count(RIGHT, matched, 1);
                }
            }
            for (_, (handle, key_hash)) in std::mem::take(&mut self.floor) {
                if let Some(matched) = self.drop_version(key_hash, handle) {
                    self.quality.count(RIGHT, matched, 1);
                }
            }
            self.stale = [0; 2];
            return;
        }
        // Popped in (ts, arrival) order: each version is newer than the floor it replaces.
        while self.fresh.peek().is_some_and(|Reverse(v)| watermark.is_past(v.ts)) {
            let Some(Reverse(version)) = self.fresh.pop() else { break };
            if !self.right.contains(version.key_hash, version.handle) {
                // It left early (`ttl`, the budget).
                self.stale[1] = self.stale[1].saturating_sub(1);
                continue;
            }
            if let Some((older, key_hash)) = self.floor.insert(version.key, (version.handle, version.key_hash))
                && let Some(matched) = self.drop_version(key_hash, older)
            {
                self.quality.count(RIGHT, matched, 1);
            }
        }
    }

    /// Emits left row `l` with its version, or alone (left join); whether it found a version.
    fn emit(&mut self, l: &Row, out: &mut Output) -> bool {
        let TemporalJoin { spec, right, ids, .. } = self;
        let (key, key_hash) = if spec.broadcast_right { (&Key::Broadcast, 0) } else { (&l.key, l.key_hash) };
        // The scan visits versions in arrival order: `>=` lets a later arrival win a tie in ts.
        let (mut best, mut best_ts, mut at) = (None, i64::MIN, 0usize);
        right.scan(key, key_hash, &mut |r| {
            let ts = r.ts();
            if ts <= l.ts && (best.is_none() || ts >= best_ts) {
                (best, best_ts) = (Some(at), ts);
            }
            at += 1;
            false
        });
        let mut joined = false;
        if let Some(best) = best {
            let mut at = 0usize;
            right.scan(key, key_hash, &mut |r| {
                let picked = at == best && spec.condition.as_ref().is_none_or(|c| c.eval_views(RowView::Heap(l), r));
                if picked {
                    joined = true;
                    let id = ids.pair(&spec.name, l.id, r.id()).finish();
                    // Projected from the version where it lies, straight into the archive.
                    let rows = [Some(RowView::Heap(l)), Some(r)];
                    let (key, kind) = (l.key.key_ref(), ResultKind::Match);
                    spec.projection.archive(&mut out.archived, l.ts, id, key, l.key_hash, rows, kind);
                }
                at += 1;
                // Marks the version matched: it served a left row.
                picked
            });
        }
        if !joined && spec.left_join {
            let id = ids.begin().str(&spec.name).str("left_only").u64(l.id).finish();
            let (rows, kind) = ([Some(RowView::Heap(l)), None], ResultKind::LeftOnly);
            spec.projection.archive(&mut out.archived, l.ts, id, l.key.key_ref(), l.key_hash, rows, kind);
        }
        joined
    }

    pub fn output_watermark(&self) -> Time {
        match self.pending.peek() {
            Some(Reverse(w)) => self.watermark.min(Time::ms(w.ts)),
            None => self.watermark,
        }
    }

    pub fn is_quiescent(&self) -> bool {
        self.pending.is_empty()
    }

    /// Left rows and right versions that left the join, matched or not (module doc).
    pub fn quality(&self) -> Quality {
        self.quality
    }

    pub fn state_rows(&self) -> usize {
        self.left.rows() + self.right.rows()
    }

    pub fn state_bytes(&self) -> usize {
        self.left.bytes() + self.right.bytes()
    }

    /// What this instance costs the shard's state budget (state/budget.rs): the stores, the
    /// heaps and the per-key floor of versions.
    pub fn budget_bytes(&self) -> usize {
        let timers = (self.pending.len() + self.fresh.len()) * crate::state::budget::TIMER_BYTES;
        let floor = self.floor.len() * (std::mem::size_of::<(Key, (RowHandle, u64))>() + 8);
        let index = self.versions.len() * (std::mem::size_of::<(u64, Vec<RowHandle>)>() + 8)
            + self.right.rows() * std::mem::size_of::<RowHandle>();
        self.left.footprint() + self.right.footprint() + timers + floor + index
    }
}

/// What a checkpoint keeps of a temporal join (state/snapshot.rs).
#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
struct TemporalJoinState {
    watermark: Time,
    left: SavedStore,
    right: SavedStore,
    /// The heaps' contents, in no order.
    pending: Vec<Waiting>,
    fresh: Vec<Version>,
    /// Per key: its floor version's handle and key hash.
    floor: Vec<(Key, RowHandle, u64)>,
    quality: Quality,
}

impl TemporalJoin {
    /// Everything this instance's output depends on: the waiting left rows and the right
    /// versions with their handles (which order arrivals) and matched flags, which versions are
    /// fresh and which is each key's floor, the watermark, the join quality so far.
    pub fn snapshot(&self) -> Result<Vec<u8>, SnapshotError> {
        snapshot::encode(&TemporalJoinState {
            watermark: self.watermark,
            left: snapshot::save_store(self.left.as_ref())?,
            right: snapshot::save_store(self.right.as_ref())?,
            pending: self.pending.iter().map(|Reverse(w)| *w).collect(),
            fresh: self.fresh.iter().map(|Reverse(v)| v.clone()).collect(),
            floor: self.floor.iter().map(|(key, &(handle, key_hash))| (key.clone(), handle, key_hash)).collect(),
            quality: self.quality,
        })
    }

    /// Takes up a [`snapshot`](Self::snapshot); `self` is freshly built from the same spec.
    pub fn restore(&mut self, bytes: &[u8]) -> Result<(), SnapshotError> {
        let saved: TemporalJoinState = snapshot::decode(bytes)?;
        snapshot::check_store(self.left.as_ref(), &saved.left)?;
        snapshot::check_store(self.right.as_ref(), &saved.right)?;
        snapshot::load_store(self.left.as_mut(), &saved.left)?;
        snapshot::load_store(self.right.as_mut(), &saved.right)?;
        self.watermark = saved.watermark;
        // Entries of rows that left early are not taken up; the index of versions is rebuilt.
        let (left, right) = (&self.left, &self.right);
        self.pending = saved.pending.into_iter().filter(|w| left.contains(w.key_hash, w.handle)).map(Reverse).collect();
        self.fresh = saved.fresh.into_iter().filter(|v| right.contains(v.key_hash, v.handle)).map(Reverse).collect();
        self.floor = saved.floor.into_iter().map(|(key, handle, key_hash)| (key, (handle, key_hash))).collect();
        self.versions.clear();
        let fresh = self.fresh.iter().map(|Reverse(v)| (v.key_hash, v.handle));
        for (key_hash, handle) in fresh.chain(self.floor.values().map(|&(handle, key_hash)| (key_hash, handle))) {
            self.versions.entry(key_hash).or_default().push(handle);
        }
        // Handles are handed out in arrival order.
        self.versions.values_mut().for_each(|handles| handles.sort_unstable());
        self.stale = [0; 2];
        self.quality = saved.quality;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Value;

    fn join(left_join: bool, broadcast_right: bool) -> TemporalJoin {
        let projection = Projection::key_and_first_values();
        TemporalJoin::new(TemporalJoinSpec {
            name: "t".into(),
            left_join,
            broadcast_right,
            condition: None,
            projection,
        })
    }

    fn keyed(key: &str, ts: i64, tag: i64) -> Row {
        Row {
            ts,
            key: Key::Str(key.into()),
            key_hash: key.len() as u64,
            id: tag as u64,
            values: Box::new([Value::Int(tag)]),
        }
    }

    fn row(ts: i64, tag: i64) -> Row {
        keyed("d", ts, tag)
    }

    /// (kind, _ts, left tag, right tag or null)
    fn results(out: &Output) -> Vec<(ResultKind, i64, Value, Value)> {
        out.result_rows().into_iter().map(|(k, r)| (k, r.ts, r.values[1].clone(), r.values[2].clone())).collect()
    }

    fn m(ts: i64, l: i64, r: i64) -> (ResultKind, i64, Value, Value) {
        (ResultKind::Match, ts, Value::Int(l), Value::Int(r))
    }

    #[test]
    fn picks_the_greatest_version_at_or_before_the_left_row() {
        let mut j = join(false, false);
        let mut out = Output::default();
        j.on_row(RIGHT, row(900, 1), &mut out);
        j.on_row(RIGHT, row(1000, 2), &mut out);
        j.on_row(RIGHT, row(1001, 3), &mut out);
        j.on_row(LEFT, row(1000, 10), &mut out);
        j.on_row(LEFT, keyed("other", 1000, 11), &mut out);
        assert!(out.is_empty(), "nothing is emitted before the watermark passes the left row");
        j.on_watermark(Time::ms(1000), &mut out);
        assert!(out.is_empty(), "watermark == l.ts: a version at l.ts may still come");
        j.on_watermark(Time::ms(1001), &mut out);
        assert_eq!(results(&out), [m(1000, 10, 2)]);
    }

    /// `where` is checked on the version found, not used to search further back: a failing
    /// version leaves the left row without one (left_only), and that version unmatched.
    #[test]
    fn where_filters_the_version_found() {
        use crate::record::schema::Field;
        use crate::record::{FieldType, Schema, TimeSpec};
        let field = Field { name: "tag".into(), ty: FieldType::Int, nullable: false };
        let schema = Schema::new(vec![field], None, TimeSpec::Ingest);
        let condition = Some(Expr::parse("left.tag + right.tag != 12", &schema, &schema).expect("a valid condition"));
        let projection = Projection::key_and_first_values();
        let spec =
            TemporalJoinSpec { name: "t".into(), left_join: true, broadcast_right: false, condition, projection };
        let mut j = TemporalJoin::new(spec);
        let mut out = Output::default();
        j.on_row(RIGHT, row(100, 1), &mut out);
        j.on_row(RIGHT, row(200, 2), &mut out);
        j.on_row(LEFT, row(250, 10), &mut out); // 10 + 2 == 12: version 1 (older) is not tried
        j.on_row(LEFT, row(260, 11), &mut out);
        j.on_row(LEFT, row(150, 12), &mut out); // 12 + 1: passes
        j.on_watermark(Time::POS_INF, &mut out);
        let left_only = (ResultKind::LeftOnly, 250, Value::Int(10), Value::Null);
        assert_eq!(results(&out), [m(150, 12, 1), left_only, m(260, 11, 2)]);
        assert_eq!(j.quality(), Quality { matched: [2, 2], unmatched: [1, 0], ..Quality::default() });
    }

    #[test]
    fn ties_in_ts_go_to_the_later_arrival() {
        let mut j = join(false, false);
        let mut out = Output::default();
        j.on_row(RIGHT, row(500, 1), &mut out);
        j.on_row(RIGHT, row(500, 2), &mut out);
        j.on_row(LEFT, row(600, 10), &mut out);
        j.on_watermark(Time::POS_INF, &mut out);
        assert_eq!(results(&out), [m(600, 10, 2)]);
        assert_eq!((j.state_rows(), j.state_bytes()), (0, 0));
    }

    #[test]
    fn a_version_arriving_after_the_left_row_is_used() {
        let mut j = join(true, false);
        let mut out = Output::default();
        j.on_row(LEFT, row(1000, 10), &mut out);
        j.on_row(RIGHT, row(1000, 1), &mut out);
        j.on_row(LEFT, row(700, 11), &mut out);
        j.on_watermark(Time::ms(2000), &mut out);
        assert_eq!(results(&out), [(ResultKind::LeftOnly, 700, Value::Int(11), Value::Null), m(1000, 10, 1)]);
        assert_eq!(out.result_rows()[0].1.values[0], Value::Str("d".into()), "the key is on outer rows too");
    }

    /// Golden-style: left rows count by whether they found a version, versions by whether they
    /// served a left row, each once as it leaves; late rows are not counted here.
    #[test]
    fn quality_counts_left_rows_and_versions_as_they_leave() {
        let mut j = join(false, false);
        let mut out = Output::default();
        j.on_row(RIGHT, row(100, 1), &mut out); // superseded by 200 before any left row: unmatched
        j.on_row(RIGHT, row(200, 2), &mut out); // serves left 250 and 260: matched
        j.on_row(LEFT, row(50, 10), &mut out); // no version ≤ 50: unmatched
        j.on_row(LEFT, row(250, 11), &mut out);
        j.on_row(LEFT, row(260, 12), &mut out);
        j.on_row(RIGHT, row(900, 3), &mut out); // never used: unmatched, at +∞
        j.on_watermark(Time::ms(300), &mut out);
        assert_eq!(
            j.quality(),
            Quality { matched: [2, 0], unmatched: [1, 1], ..Quality::default() },
            "100 died when 200 fell below"
        );
        j.on_row(LEFT, row(200, 13), &mut out); // late
        j.on_watermark(Time::POS_INF, &mut out);
        assert_eq!(j.quality(), Quality { matched: [2, 1], unmatched: [1, 2], ..Quality::default() });
        assert_eq!((out.result_count(), out.late.len()), (2, 1));
    }

    #[test]
    fn older_versions_are_freed_below_the_watermark() {
        let mut j = join(false, false);
        let mut out = Output::default();
        for (ts, tag) in [(100, 1), (200, 2), (300, 3), (400, 4)] {
            j.on_row(RIGHT, row(ts, tag), &mut out);
        }
        j.on_watermark(Time::ms(301), &mut out);
        assert_eq!(j.state_rows(), 2, "the latest version below the watermark (300) and 400");
        j.on_row(LEFT, row(350, 10), &mut out);
        j.on_row(LEFT, row(301, 11), &mut out);
        j.on_row(LEFT, row(300, 12), &mut out);
        assert_eq!(out.late.len(), 1);
        assert_eq!(j.output_watermark(), Time::ms(301));
        j.on_watermark(Time::ms(1000), &mut out);
        assert_eq!(results(&out), [m(301, 11, 3), m(350, 10, 3)]);
        assert_eq!(j.state_rows(), 1);
        assert!(j.is_quiescent());
    }

    #[test]
    fn output_watermark_waits_for_pending_left_rows() {
        let mut j = join(false, false);
        let mut out = Output::default();
        j.on_watermark(Time::ms(100), &mut out);
        j.on_row(LEFT, row(150, 1), &mut out);
        j.on_watermark(Time::ms(140), &mut out);
        j.on_watermark(Time::ms(150), &mut out);
        assert_eq!(j.output_watermark(), Time::ms(150));
        assert!(!j.is_quiescent());
        j.on_watermark(Time::ms(151), &mut out);
        assert!(out.is_empty(), "inner join, no version");
        assert_eq!(j.output_watermark(), Time::ms(151));
        assert_eq!(j.state_rows(), 0);
    }

    #[test]
    fn broadcast_versions_apply_to_every_key() {
        let mut j = join(false, true);
        let mut out = Output::default();
        let version =
            |ts, tag| Row { ts, key: Key::Broadcast, key_hash: 0, id: tag as u64, values: Box::new([Value::Int(tag)]) };
        j.on_row(RIGHT, version(100, 1), &mut out);
        j.on_row(LEFT, keyed("a", 150, 10), &mut out);
        j.on_row(LEFT, keyed("bb", 250, 11), &mut out);
        j.on_row(RIGHT, version(200, 2), &mut out);
        j.on_watermark(Time::POS_INF, &mut out);
        assert_eq!(results(&out), [m(150, 10, 1), m(250, 11, 2)]);
        assert_eq!(out.result_rows()[1].1.key, Key::Str("bb".into()), "a result keeps its left row's key");
    }

    /// `ttl`: a key's versions leave together to `.expired` (lookups do not keep them); a left
    /// row of that key then finds none; a waiting left row that expires is never emitted.
    #[test]
    fn expired_versions_are_no_longer_found_and_expired_left_rows_never_emitted() {
        let mut j = join(true, false);
        let mut out = Output::default();
        j.on_row(RIGHT, row(100, 1), &mut out);
        j.on_row(RIGHT, row(200, 2), &mut out);
        j.on_row(RIGHT, keyed("other", 100, 3), &mut out);
        assert_eq!(out.touched, [(RIGHT as u32, 1), (RIGHT as u32, 1), (RIGHT as u32, 5)]);
        j.on_watermark(Time::ms(201), &mut out); // version 1 dies, 2 is the floor
        j.on_row(LEFT, row(300, 10), &mut out);
        j.on_row(LEFT, row(400, 11), &mut out);
        let stored: Vec<StoredRow> = out.stored.drain(..).collect();
        assert_eq!(stored.len(), 2, "waiting left rows are announced to the host");
        j.on_watermark(Time::ms(301), &mut out);
        assert_eq!(results(&out), [m(300, 10, 2)]);
        out.take_results();
        j.expire(Due::Key { input: RIGHT as u32, key_hash: 1 }, &mut out);
        j.expire(Due::Key { input: RIGHT as u32, key_hash: 1 }, &mut out); // due twice: nothing
        let expired: Vec<(Option<usize>, u64)> = out.expired.iter().map(|e| (e.input, e.row.id)).collect();
        assert_eq!(expired, [(Some(RIGHT), 2)], "version 1 already left by the watermark");
        out.expired.clear();
        j.on_row(LEFT, row(500, 12), &mut out);
        j.expire(Due::Row(stored[1]), &mut out);
        assert_eq!(out.expired.iter().map(|e| (e.input, e.row.id)).collect::<Vec<_>>(), [(Some(LEFT), 11)]);
        j.on_watermark(Time::POS_INF, &mut out);
        let left_only = (ResultKind::LeftOnly, 500, Value::Int(12), Value::Null);
        assert_eq!(results(&out), [left_only], "11 expired (not left_only); 12 finds no version");
        assert_eq!(
            j.quality(),
            Quality { matched: [1, 0], unmatched: [1, 2], ..Quality::default() },
            "expired rows count in neither"
        );
        assert_eq!(j.state_rows(), 0);
        assert!(j.versions.is_empty());
    }

    /// `evict_oldest`: left rows and versions by (ts, id); an evicted version is no one's floor.
    #[test]
    fn evicted_rows_and_versions_leave_no_trace() {
        let mut j = join(true, false);
        let mut out = Output::default();
        j.on_row(RIGHT, row(100, 1), &mut out);
        j.on_row(LEFT, row(150, 10), &mut out);
        j.on_watermark(Time::ms(120), &mut out);
        let mut seen = Vec::new();
        j.visit_evictable(&mut |input, ts, id, key_hash, handle| seen.push((ts, id, input, key_hash, handle)));
        seen.sort_unstable();
        assert_eq!(seen.iter().map(|s| (s.0, s.2)).collect::<Vec<_>>(), [(100, RIGHT), (150, LEFT)]);
        let (_, _, input, key_hash, handle) = seen[0];
        assert_eq!(j.evict(input, key_hash, handle).map(|r| r.id), Some(1));
        assert!(j.evict(input, key_hash, handle).is_none(), "gone already");
        j.on_row(LEFT, row(160, 11), &mut out);
        let snapshot = j.snapshot().expect("snapshot");
        let mut restored = join(true, false);
        restored.restore(&snapshot).expect("restore");
        for j in [&mut j, &mut restored] {
            let mut out = Output::default();
            j.on_watermark(Time::POS_INF, &mut out);
            let only = |ts, tag| (ResultKind::LeftOnly, ts, Value::Int(tag), Value::Null);
            assert_eq!(results(&out), [only(150, 10), only(160, 11)]);
            assert_eq!(j.quality(), Quality { matched: [0, 0], unmatched: [2, 0], ..Quality::default() });
        }
    }

    #[test]
    fn ids_name_the_kind_and_the_rows() {
        let mut j = join(true, false);
        let mut out = Output::default();
        j.on_row(LEFT, row(10, 1), &mut out);
        j.on_row(RIGHT, row(20, 2), &mut out);
        j.on_row(LEFT, row(30, 3), &mut out);
        j.on_watermark(Time::POS_INF, &mut out);
        let mut ids = IdHasher::default();
        assert_eq!(out.result_rows()[0].1.id, ids.begin().str("t").str("left_only").u64(1).finish());
        assert_eq!(out.result_rows()[1].1.id, ids.begin().str("t").str("match").u64(3).u64(2).finish());
    }
}
