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
//!   stays in state once seen, absent or not, until the end of input: its return must emit
//!   `present`.

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
use super::{OperatorSpec, Output, ResultKind};

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

/// One key's state; keys are numbered in the order this instance first saw them.
#[derive(Clone, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
struct KeyState {
    key: Key,
    key_hash: u64,
    /// The ts of the last row taken.
    last: Option<i64>,
    absent: bool,
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
        }
    }

    pub fn on_row(&mut self, input: usize, row: Row, out: &mut Output) {
        if self.watermark.is_past(row.ts) {
            out.late.push((input, row));
            return;
        }
        self.take(RowView::Heap(&row));
    }

    /// [`on_row`](Self::on_row) for a row read in place from a ring frame: only a key seen for
    /// the first time is copied out.
    pub fn on_frame(&mut self, input: usize, row: &ArchivedRow, out: &mut Output) {
        if self.watermark.is_past(row.ts.to_native()) {
            out.late.push((input, to_row(row)));
            return;
        }
        self.take(RowView::Archived(row));
    }

    fn take(&mut self, row: RowView<'_>) {
        let (key, key_hash) = (row.key(), row.key_hash());
        let numbers = self.numbers.entry(key_hash).or_default();
        let number = match numbers.iter().copied().find(|&n| self.keys[n].key.key_ref() == key) {
            Some(n) => n,
            None => {
                let n = self.keys.len();
                numbers.push(n);
                let key = key.to_key();
                self.key_bytes += key_heap_bytes(&key);
                self.keys.push(KeyState { key, key_hash, last: None, absent: false });
                n
            }
        };
        self.seq += 1;
        self.pending.push(Reverse((row.ts(), self.seq, number)));
    }

    pub fn on_watermark(&mut self, watermark: Time, out: &mut Output) {
        self.watermark = watermark;
        let timeout = self.spec.timeout;
        while self.pending.peek().is_some_and(|Reverse((ts, _, _))| watermark.is_past(*ts)) {
            let Some(Reverse((ts, _, n))) = self.pending.pop() else { break };
            let state = &mut self.keys[n];
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
        for (ts, n, kind) in self.batch.drain(..) {
            let state = &self.keys[n];
            // Beyond int64 only when a row's ts is within `timeout` of the end of time.
            let ts = ts.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64;
            let ids = self.ids.begin().str(&self.spec.name).str(kind.as_str()).key(state.key.key_ref());
            let id = ids.value(&Value::Int(ts)).finish();
            let values: Box<[Value]> =
                state.key.key_ref().parts().map(KeyRef::to_value).chain([Value::Str(kind.as_str().into())]).collect();
            let (key, key_hash) = result_key(state.key.key_ref(), state.key_hash, &values, self.spec.rekey.as_deref());
            out.results.push((kind, Row { ts, key, key_hash, id, values }));
        }
        if watermark == Time::POS_INF {
            // Every key is absent and nothing can arrive any more.
            self.keys.clear();
            self.key_bytes = 0;
            self.numbers.clear();
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

    /// Pending rows plus one per key seen.
    pub fn state_rows(&self) -> usize {
        self.pending.len() + self.keys.len()
    }

    /// O(1): the keys' heap bytes are a running count.
    pub fn state_bytes(&self) -> usize {
        let key_bytes = self.key_bytes;
        self.pending.len() * std::mem::size_of::<(i64, u64, usize)>()
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
}

impl Absence {
    /// Everything this instance's output depends on: every key seen (in the order first seen,
    /// which orders results), its last row's ts and whether it is absent, the rows waiting for
    /// the watermark, the deadlines, the watermark.
    pub fn snapshot(&self) -> Result<Vec<u8>, SnapshotError> {
        snapshot::encode(&AbsenceState {
            watermark: self.watermark,
            keys: self.keys.clone(),
            pending: self.pending.iter().map(|Reverse((ts, seq, n))| (*ts, *seq, *n as u64)).collect(),
            deadlines: self.deadlines.iter().map(|&(deadline, n)| (deadline, n as u64)).collect(),
            seq: self.seq,
        })
    }

    /// Takes up a [`snapshot`](Self::snapshot); `self` is freshly built from the same spec.
    pub fn restore(&mut self, bytes: &[u8]) -> Result<(), SnapshotError> {
        let saved: AbsenceState = snapshot::decode(bytes)?;
        let keys = saved.keys.len() as u64;
        let numbers = saved.pending.iter().map(|p| p.2).chain(saved.deadlines.iter().map(|d| d.1));
        if let Some(n) = numbers.into_iter().find(|&n| n >= keys) {
            return Err(SnapshotError::Decode(format!("key number {n} of {keys} keys")));
        }
        self.numbers.clear();
        for (n, state) in saved.keys.iter().enumerate() {
            self.numbers.entry(state.key_hash).or_default().push(n);
        }
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
}
