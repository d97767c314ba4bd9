//! absence: a key seen and then silent for `timeout` of event time emits `absent`, and
//! `present` when it returns (DESIGN.md "Operators", CONTRACT.md rules 5, 7–11).
//!
//! - A row is late when `ts < watermark`; late rows go to the late side output and nowhere else.
//! - A key's rows are taken in (ts, arrival) order once the watermark passes them (`ts <
//!   watermark`): from then on no on-time row can come before them. `last` is the ts of the last
//!   row taken.
//! - A taken row more than `timeout` after `last` closes a gap: `absent` with `_ts` = last +
//!   timeout (unless the key is already absent), then `present` with the row's ts. A key whose
//!   `last + timeout < watermark` is absent at `last + timeout` (rule 8: a gap of exactly
//!   `timeout` is not an absence). `present` is emitted only after an `absent`.
//! - Results: {key field, `_kind`} with `_ts` as above and `_id` = H(operator, kind, key, `_ts`).
//!   One watermark's results are emitted in (`_ts`, key first seen, absent before present) order.
//! - Output watermark: `min(watermark, smallest pending row ts, smallest last + timeout of a key
//!   not absent)` (rule 5): every result still to come has a `_ts` at or after one of them.
//! - State: rows waiting for the watermark, and per key `last` and whether it is absent. A key
//!   stays in state once seen, absent or not, until the end of input (its return must emit
//!   `present`), unless `ttl` or the state budget takes it out early.
//! - `ttl` (per-key state, CONTRACT.md "Extensions under way"): a key expires `ttl` after its
//!   last row that was not late arrived. It leaves as at the end of input, into
//!   `OPERATOR.expired` (`input` None) instead of the output: its rows still waiting are taken in
//!   order, then the key is absent at `last + timeout` — the results it would have emitted had
//!   it stayed silent (an open deadline's `absent`, and the `absent`/`present` pairs of gaps among
//!   its waiting rows). A key already absent with no row waiting would emit nothing more but
//!   `present` on its return, which is what is lost: its `absent` result goes there once more
//!   (same `_id`), so that no key leaves without a line. A later row of the key starts it fresh,
//!   as a key never seen: it emits no `present`. `evict_oldest` takes keys by (newest ts seen,
//!   key hash) the same way (`_reason` budget). `braid validate` warns when `ttl < timeout`.
//! - An expired key's slot is reused by the next new key; its rows still in the waiting heap
//!   are recognised as stale (their arrival number is below the slot's `since`) and skipped,
//!   and once stale entries are half the heap they are dropped in one pass.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};

use crate::config::operators::{Builder, Built, broadcast_refused, output_schema};
use crate::config::walk::{Errors, Table};
use crate::record::frame::to_row;
use crate::record::id::IdHasher;
use crate::record::schema::Field;
use crate::record::view::{KeyRef, RowView};
use crate::record::{ArchivedRow, FieldType, Key, Row, Value};
use crate::state::ByKeyHash;
use crate::state::snapshot::{self, SnapshotError};
use crate::time::Time;

use super::projection::result_key;
use super::{Expired, ExpiryReason, OperatorSpec, Output, ResultKind};

/// Checks `[operators.NAME]` of this kind.
pub(crate) fn check(b: &mut Builder<'_, '_, '_>, name: &str, t: Table<'_, '_>, errors: &mut Errors) -> Option<Built> {
    let input = b.named_input(t, "input", errors);
    let mut timeout = None;
    if t.get("timeout").is_none() {
        t.missing("timeout", errors, "a duration such as \"30s\"");
    } else {
        timeout = t.duration("timeout", errors);
        if timeout.is_some_and(|ms| ms <= 0) {
            t.error("timeout", errors, "must be positive");
        }
    }
    let input = input?;
    if input.is_broadcast() {
        t.error("input", errors, broadcast_refused(&input.name));
        return None;
    }
    let mut fields: Vec<Field> = input.key_fields().cloned().collect();
    fields.push(Field { name: "_kind".into(), ty: FieldType::String, nullable: false });
    let (output, rekey) = output_schema(t, fields, input.key_fields().len(), errors)?;
    // A bad timeout is already an error (nothing runs); the spec stays, so that the kind is not
    // also reported as unavailable.
    let timeout = i128::from(timeout.unwrap_or(1).max(1));
    let spec = AbsenceSpec { name: name.to_owned(), timeout, rekey };
    Some(Built { inputs: vec![input.node], output, spec: OperatorSpec::Absence(spec) })
}

#[derive(Clone, Debug)]
pub struct AbsenceSpec {
    pub name: String,
    /// ms, > 0.
    pub timeout: i128,
    /// `key = "FIELD"` or a list: the output positions whose values key the result.
    pub rekey: Option<Vec<usize>>,
}

/// One key's state; keys are numbered in the order this instance first saw them (a slot an
/// expired key left is taken by the next new key).
#[derive(Clone, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
struct KeyState {
    key: Key,
    key_hash: u64,
    /// The ts of the last row taken.
    last: Option<i64>,
    absent: bool,
    /// The ts of its rows still waiting for the watermark, in no order (what an expiry takes).
    waiting: Vec<i64>,
    /// The largest ts of its rows so far, taken or waiting (`evict_oldest` takes keys by it).
    newest: i64,
    /// The arrival number of its first row: waiting-heap entries of the slot below it belong to
    /// a key that expired.
    since: u64,
    /// The slot is free: its key expired.
    gone: bool,
}

pub struct Absence {
    spec: AbsenceSpec,
    watermark: Time,
    keys: Vec<KeyState>,
    /// Key hash → the numbers of the keys with that hash.
    numbers: ByKeyHash<Vec<usize>>,
    /// Rows not yet behind the watermark: (ts, arrival, key number).
    pending: BinaryHeap<Reverse<(i64, u64, usize)>>,
    /// Heap bytes of the keys' values, kept as keys come (`state_bytes` is read every round).
    key_bytes: usize,
    /// `last + timeout` of every key that is not absent: (deadline, key number).
    deadlines: BTreeSet<(i128, usize)>,
    seq: u64,
    ids: IdHasher,
    /// Results of one watermark before sorting: (`_ts`, key number, kind).
    batch: Vec<(i128, usize, ResultKind)>,
    /// Slots of expired keys, for the next new keys.
    free: Vec<usize>,
    /// Entries of `pending` whose key expired (skipped when popped).
    stale: usize,
}

impl Absence {
    pub fn new(spec: AbsenceSpec) -> Absence {
        Absence {
            spec,
            watermark: Time::NEG_INF,
            keys: Vec::new(),
            numbers: ByKeyHash::default(),
            pending: BinaryHeap::new(),
            key_bytes: 0,
            deadlines: BTreeSet::new(),
            seq: 0,
            ids: IdHasher::default(),
            batch: Vec::new(),
            free: Vec::new(),
            stale: 0,
        }
    }

    pub fn on_row(&mut self, input: usize, row: Row, out: &mut Output) {
        if self.watermark.is_past(row.ts) {
            out.late.push((input, row));
            return;
        }
        self.take(RowView::Heap(&row), out);
    }

    /// [`on_row`](Self::on_row) for a row read in place from a ring frame: only a key seen for
    /// the first time is copied out.
    pub fn on_frame(&mut self, input: usize, row: &ArchivedRow, out: &mut Output) {
        if self.watermark.is_past(row.ts.to_native()) {
            out.late.push((input, to_row(row)));
            return;
        }
        self.take(RowView::Archived(row), out);
    }

    /// A row that is not late: it waits for the watermark, and its key's `ttl` starts again.
    fn take(&mut self, row: RowView<'_>, out: &mut Output) {
        let (key, key_hash, ts) = (row.key(), row.key_hash(), row.ts());
        self.seq += 1;
        let numbers = self.numbers.entry(key_hash).or_default();
        let number = match numbers.iter().copied().find(|&n| self.keys[n].key.key_ref() == key) {
            Some(n) => n,
            None => {
                let key = key.to_key();
                self.key_bytes += key_heap_bytes(&key);
                let state = KeyState {
                    key,
                    key_hash,
                    last: None,
                    absent: false,
                    waiting: Vec::new(),
                    newest: ts,
                    since: self.seq,
                    gone: false,
                };
                let n = match self.free.pop() {
                    Some(n) => {
                        self.keys[n] = state;
                        n
                    }
                    None => {
                        self.keys.push(state);
                        self.keys.len() - 1
                    }
                };
                numbers.push(n);
                n
            }
        };
        let state = &mut self.keys[number];
        state.waiting.push(ts);
        state.newest = state.newest.max(ts);
        self.pending.push(Reverse((ts, self.seq, number)));
        if out.touched.last() != Some(&(0, key_hash)) {
            out.touched.push((0, key_hash));
        }
    }

    pub fn on_watermark(&mut self, watermark: Time, out: &mut Output) {
        self.watermark = watermark;
        let timeout = self.spec.timeout;
        while self.pending.peek().is_some_and(|Reverse((ts, _, _))| watermark.is_past(*ts)) {
            let Some(Reverse((ts, seq, n))) = self.pending.pop() else { break };
            let state = &mut self.keys[n];
            if state.gone || seq < state.since {
                // A row of a key that expired since.
                self.stale = self.stale.saturating_sub(1);
                continue;
            }
            if let Some(at) = state.waiting.iter().position(|&w| w == ts) {
                state.waiting.swap_remove(at);
            }
            if let Some(last) = state.last
                && !state.absent
            {
                self.deadlines.remove(&(i128::from(last) + timeout, n));
                if i128::from(ts) - i128::from(last) > timeout {
                    self.batch.push((i128::from(last) + timeout, n, ResultKind::Absent));
                    state.absent = true;
                }
            }
            if state.absent {
                self.batch.push((i128::from(ts), n, ResultKind::Present));
                state.absent = false;
            }
            state.last = Some(ts);
            self.deadlines.insert((i128::from(ts) + timeout, n));
        }
        while let Some(&(deadline, n)) = self.deadlines.first() {
            if Time::from_i128(deadline) >= watermark {
                break;
            }
            self.deadlines.pop_first();
            self.keys[n].absent = true;
            self.batch.push((deadline, n, ResultKind::Absent));
        }
        self.batch.sort_unstable();
        // Taken out while `result` borrows `self`, and put back: the buffer is reused.
        let mut batch = std::mem::take(&mut self.batch);
        for (ts, n, kind) in batch.drain(..) {
            let row = self.result(n, ts, kind);
            out.results.push((kind, row));
        }
        self.batch = batch;
        if watermark == Time::POS_INF {
            // Every key is absent and nothing can arrive any more.
            self.keys.clear();
            self.key_bytes = 0;
            self.numbers.clear();
            self.free.clear();
            self.stale = 0;
        }
    }

    /// The result of kind `kind` of key number `n` at `ts`.
    fn result(&mut self, n: usize, ts: i128, kind: ResultKind) -> Row {
        let state = &self.keys[n];
        // Beyond int64 only when a row's ts is within `timeout` of the end of time.
        let ts = ts.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64;
        let ids = self.ids.begin().str(&self.spec.name).str(kind.as_str()).key(state.key.key_ref());
        let id = ids.value(&Value::Int(ts)).finish();
        let values: Box<[Value]> =
            state.key.key_ref().parts().map(KeyRef::to_value).chain([Value::Str(kind.as_str().into())]).collect();
        let (key, key_hash) = result_key(state.key.key_ref(), state.key_hash, &values, self.spec.rekey.as_deref());
        Row { ts, key, key_hash, id, values }
    }

    /// `ttl` passed since the last row of the key (its host's clock says): it leaves (module doc).
    pub fn expire(&mut self, due: crate::state::ttl::Due, out: &mut Output) {
        if let crate::state::ttl::Due::Key { key_hash, .. } = due {
            for n in self.numbers.get(&key_hash).cloned().unwrap_or_default() {
                self.drop_key(n, ExpiryReason::Ttl, out);
            }
        }
    }

    /// Every key, for `evict_oldest` (state/budget.rs): by (the newest ts it saw, key hash).
    pub fn visit_evictable(&self, visit: &mut dyn FnMut(usize, i64, u64, u64, u64)) {
        for (n, state) in self.keys.iter().enumerate().filter(|(_, s)| !s.gone) {
            visit(0, state.newest, state.key_hash, state.key_hash, n as u64);
        }
    }

    /// `evict_oldest` takes key number `handle`, as `ttl` does; false when it is gone already.
    pub fn evict(&mut self, key_hash: u64, handle: u64, out: &mut Output) -> bool {
        let n = usize::try_from(handle).unwrap_or(usize::MAX);
        if self.keys.get(n).is_none_or(|s| s.gone || s.key_hash != key_hash) {
            return false;
        }
        self.drop_key(n, ExpiryReason::Budget, out);
        true
    }

    /// Takes key number `n` out: what it would emit if it stayed silent goes to `out.expired`
    /// (module doc); its slot is freed.
    fn drop_key(&mut self, n: usize, reason: ExpiryReason, out: &mut Output) {
        let Some(state) = self.keys.get_mut(n).filter(|s| !s.gone) else { return };
        let timeout = self.spec.timeout;
        let (mut last, mut absent) = (state.last, state.absent);
        if let Some(last) = last
            && !absent
        {
            self.deadlines.remove(&(i128::from(last) + timeout, n));
        }
        let mut waiting = std::mem::take(&mut state.waiting);
        waiting.sort_unstable();
        self.stale += waiting.len();
        let mut would = Vec::new();
        for &ts in &waiting {
            if let Some(last) = last
                && !absent
                && i128::from(ts) - i128::from(last) > timeout
            {
                would.push((i128::from(last) + timeout, ResultKind::Absent));
                absent = true;
            }
            if absent {
                would.push((i128::from(ts), ResultKind::Present));
                absent = false;
            }
            last = Some(ts);
        }
        // Silent from now on: absent at last + timeout (again, if it was already: see the module
        // doc). A key always has a row, taken or waiting.
        if let Some(last) = last
            && (!absent || would.is_empty())
        {
            would.push((i128::from(last) + timeout, ResultKind::Absent));
        }
        for (ts, kind) in would {
            let row = self.result(n, ts, kind);
            out.expired.push(Expired { reason, input: None, row });
        }
        let state = &mut self.keys[n];
        state.gone = true;
        self.key_bytes -= key_heap_bytes(&state.key);
        state.key = Key::Broadcast;
        let key_hash = state.key_hash;
        if let Some(list) = self.numbers.get_mut(&key_hash) {
            list.retain(|&m| m != n);
            if list.is_empty() {
                self.numbers.remove(&key_hash);
            }
        }
        self.free.push(n);
        if self.stale * 2 > self.pending.len() {
            let keys = &self.keys;
            self.pending.retain(|Reverse((_, seq, m))| !keys[*m].gone && *seq >= keys[*m].since);
            self.stale = 0;
        }
    }

    pub fn output_watermark(&self) -> Time {
        let mut watermark = self.watermark;
        if let Some(Reverse((ts, _, _))) = self.pending.peek() {
            watermark = watermark.min(Time::ms(*ts));
        }
        if let Some(&(deadline, _)) = self.deadlines.first() {
            watermark = watermark.min(Time::from_i128(deadline));
        }
        watermark
    }

    pub fn is_quiescent(&self) -> bool {
        self.pending.is_empty() && self.deadlines.is_empty()
    }

    /// Pending rows plus one per key held.
    pub fn state_rows(&self) -> usize {
        self.pending.len().saturating_sub(self.stale) + self.keys.len() - self.free.len()
    }

    /// O(1): the keys' heap bytes are a running count.
    pub fn state_bytes(&self) -> usize {
        let key_bytes = self.key_bytes;
        self.pending.len() * std::mem::size_of::<(i64, u64, usize)>()
            + self.pending.len() * std::mem::size_of::<i64>()
            + self.keys.len() * (2 * std::mem::size_of::<KeyState>() + std::mem::size_of::<(i128, usize)>())
            + 2 * key_bytes
    }
}

/// Bytes a key's value holds on the heap.
fn key_heap_bytes(key: &Key) -> usize {
    match key {
        Key::Str(s) => s.len(),
        Key::Composite(bytes) => bytes.len(),
        _ => 0,
    }
}

/// What a checkpoint keeps of an absence (state/snapshot.rs). Key numbers are positions in
/// `keys`; the index by key hash is rebuilt from it.
#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
struct AbsenceState {
    watermark: Time,
    keys: Vec<KeyState>,
    /// (ts, arrival, key number) of every pending row, in no order.
    pending: Vec<(i64, u64, u64)>,
    /// (deadline, key number).
    deadlines: Vec<(i128, u64)>,
    seq: u64,
    /// Slots of expired keys, in the order new keys take them (from the end).
    free: Vec<u64>,
}

impl Absence {
    /// Everything this instance's output depends on: every key seen (in the order first seen,
    /// which orders results; slots of expired keys marked free), its last row's ts, whether it is
    /// absent and its rows still waiting, the rows waiting for the watermark (stale ones left
    /// out), the deadlines, the watermark.
    pub fn snapshot(&self) -> Result<Vec<u8>, SnapshotError> {
        snapshot::encode(&AbsenceState {
            watermark: self.watermark,
            keys: self.keys.clone(),
            pending: self
                .pending
                .iter()
                .filter(|Reverse((_, seq, n))| !self.keys[*n].gone && *seq >= self.keys[*n].since)
                .map(|Reverse((ts, seq, n))| (*ts, *seq, *n as u64))
                .collect(),
            deadlines: self.deadlines.iter().map(|&(deadline, n)| (deadline, n as u64)).collect(),
            seq: self.seq,
            free: self.free.iter().map(|&n| n as u64).collect(),
        })
    }

    /// Takes up a [`snapshot`](Self::snapshot); `self` is freshly built from the same spec.
    pub fn restore(&mut self, bytes: &[u8]) -> Result<(), SnapshotError> {
        let saved: AbsenceState = snapshot::decode(bytes)?;
        let keys = saved.keys.len() as u64;
        let numbers = saved
            .pending
            .iter()
            .map(|p| p.2)
            .chain(saved.deadlines.iter().map(|d| d.1))
            .chain(saved.free.iter().copied());
        if let Some(n) = numbers.into_iter().find(|&n| n >= keys) {
            return Err(SnapshotError::Decode(format!("key number {n} of {keys} keys")));
        }
        let gone = saved.keys.iter().filter(|k| k.gone).count();
        if saved.free.len() != gone || saved.free.iter().any(|&n| !saved.keys[n as usize].gone) {
            return Err(SnapshotError::Decode(format!("{} free key slots for {gone} expired keys", saved.free.len())));
        }
        self.numbers.clear();
        for (n, state) in saved.keys.iter().enumerate().filter(|(_, s)| !s.gone) {
            self.numbers.entry(state.key_hash).or_default().push(n);
        }
        self.free = saved.free.into_iter().map(|n| n as usize).collect();
        self.stale = 0;
        self.key_bytes = saved.keys.iter().map(|k| key_heap_bytes(&k.key)).sum();
        self.keys = saved.keys;
        self.watermark = saved.watermark;
        self.pending = saved.pending.into_iter().map(|(ts, seq, n)| Reverse((ts, seq, n as usize))).collect();
        self.deadlines = saved.deadlines.into_iter().map(|(deadline, n)| (deadline, n as usize)).collect();
        self.seq = saved.seq;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn absence(timeout: i128) -> Absence {
        Absence::new(AbsenceSpec { name: "a".into(), timeout, rekey: None })
    }

    fn row(key: &str, ts: i64) -> Row {
        Row { ts, key: Key::Str(key.into()), key_hash: 3, id: ts as u64, values: Box::new([Value::Str(key.into())]) }
    }

    /// (kind, _ts, key)
    fn results(out: &Output) -> Vec<(ResultKind, i64, Value)> {
        out.results.iter().map(|(k, r)| (*k, r.ts, r.values[0].clone())).collect()
    }

    fn r(kind: ResultKind, ts: i64, key: &str) -> (ResultKind, i64, Value) {
        (kind, ts, Value::Str(key.into()))
    }

    #[test]
    fn silence_longer_than_the_timeout_is_an_absence_then_a_presence() {
        let mut a = absence(100);
        let mut out = Output::default();
        a.on_row(0, row("d", 1000), &mut out);
        a.on_watermark(Time::ms(1001), &mut out);
        assert_eq!(a.output_watermark(), Time::ms(1001).min(Time::ms(1100)));
        a.on_watermark(Time::ms(1100), &mut out);
        assert!(out.is_empty(), "watermark == last + timeout: not yet");
        assert_eq!(a.output_watermark(), Time::ms(1100));
        a.on_watermark(Time::ms(1101), &mut out);
        assert_eq!(results(&out), [r(ResultKind::Absent, 1100, "d")]);
        assert!(a.is_quiescent());
        a.on_row(0, row("d", 1500), &mut out);
        assert_eq!(a.output_watermark(), Time::ms(1101));
        a.on_watermark(Time::ms(1600), &mut out);
        assert_eq!(results(&out)[1..], [r(ResultKind::Present, 1500, "d")]);
        a.on_watermark(Time::ms(1601), &mut out);
        assert_eq!(results(&out)[2..], [r(ResultKind::Absent, 1600, "d")], "silent again");
    }

    #[test]
    fn a_gap_of_exactly_the_timeout_is_no_absence() {
        let mut a = absence(100);
        let mut out = Output::default();
        a.on_row(0, row("d", 1100), &mut out);
        a.on_row(0, row("d", 1000), &mut out);
        a.on_row(0, row("d", 1201), &mut out);
        a.on_watermark(Time::ms(1150), &mut out);
        assert!(out.is_empty());
        a.on_watermark(Time::ms(1300), &mut out);
        assert_eq!(results(&out), [r(ResultKind::Absent, 1200, "d"), r(ResultKind::Present, 1201, "d")]);
    }

    #[test]
    fn rows_are_taken_in_ts_order_and_results_sorted() {
        let mut a = absence(10);
        let mut out = Output::default();
        a.on_row(0, row("y", 0), &mut out);
        a.on_row(0, row("x", 0), &mut out);
        a.on_row(0, row("x", 50), &mut out);
        a.on_row(0, row("x", 30), &mut out);
        a.on_watermark(Time::POS_INF, &mut out);
        assert_eq!(
            results(&out),
            [
                r(ResultKind::Absent, 10, "y"),
                r(ResultKind::Absent, 10, "x"),
                r(ResultKind::Present, 30, "x"),
                r(ResultKind::Absent, 40, "x"),
                r(ResultKind::Present, 50, "x"),
                r(ResultKind::Absent, 60, "x"),
            ]
        );
        assert_eq!(a.output_watermark(), Time::POS_INF);
        assert_eq!((a.state_rows(), a.state_bytes()), (0, 0));
        assert!(a.is_quiescent());
    }

    #[test]
    fn late_rows_and_ids() {
        let mut a = absence(10);
        let mut out = Output::default();
        a.on_row(0, row("d", 100), &mut out);
        a.on_watermark(Time::ms(200), &mut out);
        a.on_row(0, row("d", 199), &mut out);
        assert_eq!(out.late.len(), 1);
        a.on_row(0, row("d", 200), &mut out);
        a.on_watermark(Time::ms(201), &mut out);
        let ids: Vec<u64> = out.results.iter().map(|(_, r)| r.id).collect();
        let mut h = IdHasher::default();
        assert_eq!(ids[0], h.begin().str("a").str("absent").str("d").value(&Value::Int(110)).finish());
        assert_eq!(ids[1], h.begin().str("a").str("present").str("d").value(&Value::Int(200)).finish());
        assert_eq!(a.state_rows(), 1);
    }

    use crate::state::ttl::Due;

    /// (kind, _ts, key, input) of each expired row, with its reason.
    fn expired(out: &Output) -> Vec<(ResultKind, i64, Value, Option<usize>, ExpiryReason)> {
        let kind =
            |r: &Row| if r.values[1] == Value::Str("absent".into()) { ResultKind::Absent } else { ResultKind::Present };
        out.expired.iter().map(|e| (kind(&e.row), e.row.ts, e.row.values[0].clone(), e.input, e.reason)).collect()
    }

    fn due(key_hash: u64) -> Due {
        Due::Key { input: 0, key_hash }
    }

    fn keyed(key: &str, key_hash: u64, ts: i64) -> Row {
        Row { key_hash, ..row(key, ts) }
    }

    #[test]
    fn an_expired_key_puts_what_it_would_emit_in_expired_and_returns_fresh() {
        let mut a = absence(100);
        let mut out = Output::default();
        a.on_row(0, keyed("d", 3, 1000), &mut out);
        assert_eq!(out.touched, [(0, 3)], "a row restarts its key's ttl");
        a.on_row(0, keyed("e", 4, 1000), &mut out);
        a.on_watermark(Time::ms(1050), &mut out);
        a.expire(due(3), &mut out);
        let ttl = ExpiryReason::Ttl;
        let absent = ResultKind::Absent;
        assert_eq!(expired(&out), [(absent, 1100, Value::Str("d".into()), None, ttl)], "its open deadline");
        assert_eq!(
            out.expired[0].row.id,
            IdHasher::default().begin().str("a").str("absent").str("d").value(&Value::Int(1100)).finish()
        );
        a.expire(due(3), &mut out);
        assert_eq!(out.expired.len(), 1, "a key expires once");
        assert_eq!(a.state_rows(), 1, "e alone is held");
        // d returns: a fresh key (no present), reusing the slot.
        a.on_row(0, keyed("d", 3, 1500), &mut out);
        a.on_watermark(Time::POS_INF, &mut out);
        assert_eq!(results(&out), [r(absent, 1100, "e"), r(absent, 1600, "d")]);
    }

    #[test]
    fn waiting_rows_are_taken_in_order_when_their_key_expires() {
        let mut a = absence(10);
        let mut out = Output::default();
        // Already absent: its return (waiting) would be present, then absent again.
        a.on_row(0, keyed("x", 3, 0), &mut out);
        a.on_watermark(Time::ms(20), &mut out);
        assert_eq!(results(&out), [r(ResultKind::Absent, 10, "x")]);
        a.on_row(0, keyed("x", 3, 50), &mut out);
        a.on_row(0, keyed("x", 3, 30), &mut out);
        a.on_row(0, keyed("y", 5, 25), &mut out);
        a.expire(due(3), &mut out);
        let x = |kind, ts| (kind, ts, Value::Str("x".into()), None, ExpiryReason::Ttl);
        assert_eq!(
            expired(&out),
            [
                x(ResultKind::Present, 30),
                x(ResultKind::Absent, 40),
                x(ResultKind::Present, 50),
                x(ResultKind::Absent, 60)
            ]
        );
        assert_eq!(a.state_rows(), 2, "y and its row; x's two stale entries are not counted");
        a.on_watermark(Time::POS_INF, &mut out);
        assert_eq!(results(&out)[1..], [r(ResultKind::Absent, 35, "y")], "x's waiting rows are skipped");
    }

    #[test]
    fn an_absent_key_with_nothing_waiting_leaves_its_absence_once_more() {
        let mut a = absence(10);
        let mut out = Output::default();
        a.on_row(0, keyed("x", 3, 0), &mut out);
        a.on_watermark(Time::ms(20), &mut out);
        a.expire(due(3), &mut out);
        assert_eq!(out.expired.len(), 1);
        assert_eq!(out.expired[0].row, out.results[0].1, "the same absent row, same _id");
        a.on_row(0, keyed("x", 3, 30), &mut out);
        a.on_watermark(Time::ms(35), &mut out);
        assert_eq!(out.results.len(), 1, "no present: the key starts fresh");
    }

    #[test]
    fn evict_oldest_takes_keys_by_their_newest_ts() {
        let mut a = absence(10);
        let mut out = Output::default();
        a.on_row(0, keyed("x", 3, 50), &mut out);
        a.on_row(0, keyed("y", 5, 20), &mut out);
        a.on_row(0, keyed("x", 3, 10), &mut out);
        let mut seen = Vec::new();
        a.visit_evictable(&mut |input, ts, id, key_hash, handle| seen.push((ts, id, input, key_hash, handle)));
        seen.sort_unstable();
        assert_eq!(seen, [(20, 5, 0, 5, 1), (50, 3, 0, 3, 0)]);
        assert!(a.evict(5, 1, &mut out));
        assert!(!a.evict(5, 1, &mut out), "gone already");
        assert!(!a.evict(4, 0, &mut out), "another key's hash");
        let y = (ResultKind::Absent, 30, Value::Str("y".into()), None, ExpiryReason::Budget);
        assert_eq!(expired(&out), [y]);
        a.on_watermark(Time::POS_INF, &mut out);
        assert_eq!(
            results(&out),
            [r(ResultKind::Absent, 20, "x"), r(ResultKind::Present, 50, "x"), r(ResultKind::Absent, 60, "x")]
        );
    }

    /// A snapshot with a freed slot and stale waiting entries restores to the same output.
    #[test]
    fn snapshot_after_expiry_restores_to_the_same_output() {
        let run = |restore: bool| {
            let mut a = absence(10);
            let mut out = Output::default();
            a.on_row(0, keyed("x", 3, 5), &mut out);
            a.on_row(0, keyed("y", 5, 6), &mut out);
            a.on_row(0, keyed("z", 7, 7), &mut out);
            a.expire(due(3), &mut out);
            a.expire(due(7), &mut out);
            if restore {
                let bytes = a.snapshot().unwrap();
                a = absence(10);
                a.restore(&bytes).unwrap();
            }
            a.on_row(0, keyed("w", 9, 8), &mut out);
            a.on_row(0, keyed("x", 3, 40), &mut out);
            a.on_watermark(Time::POS_INF, &mut out);
            (results(&out), expired(&out), a.state_rows())
        };
        let plain = run(false);
        assert_eq!(
            plain.0,
            [r(ResultKind::Absent, 16, "y"), r(ResultKind::Absent, 18, "w"), r(ResultKind::Absent, 50, "x")]
        );
        assert_eq!(plain.1.len(), 2);
        assert_eq!(run(true), plain);
    }
}
