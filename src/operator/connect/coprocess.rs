//! The [`CoProcess`] trait: custom logic for a `connect` operator, and what it works with —
//! keyed state ([`KeyedState`]), timers ([`TimerService`]) and an [`Emitter`] for results and
//! the late side output, bundled in a [`Context`].
//!
//! Design (Flink's `KeyedCoProcessFunction`, read with braid's time rules):
//!
//! - **Lateness is not the function's business.** The operator routes a row with
//!   `ts < watermark` to `NAME.late` before any handler sees it (CONTRACT.md rule 7), so
//!   `on_left` / `on_right` only ever see on-time rows.
//! - **Keyed state** lives in the operator's [`KeyedStore`]s (numbered slots, one store each), not
//!   in the function's own fields, so that the mmap backend and recovery will restore it
//!   without the function doing anything. Rows are stored under the key they carry; a
//!   broadcast row (key `"*"`) under [`Key::Broadcast`], the same in every shard.
//! - **Event-time timers** fire once the watermark is strictly past their time (rule 8: a row
//!   with `ts == at` is on time and still seen first), in order of (time, order of setting).
//! - **Processing-time timers** fire when processing time reaches their time (during replay:
//!   the arrival of the line being processed, CONTRACT.md "Replay"), before the watermark tick
//!   of that instant; at the end of input every pending one fires, each with its own time.
//! - **Holds** (rule 5): the operator's output watermark is `min(watermark, smallest hold of a
//!   pending timer)`. A result emitted by a handler of an input row must have `_ts` ≥ the
//!   watermark (the row's own ts always is); one emitted by a timer must have `_ts` ≥ the
//!   timer's hold — an event timer holds at its own time unless told otherwise
//!   ([`Timer::holding`]), a processing-time timer holds nothing unless told. Then no result of
//!   the function is late downstream.
//! - A timer is identified by its domain, time, key and tag: setting it again changes nothing
//!   but its hold; deleting it releases its hold.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::operator::{Output, Projection, ResultKind};
use crate::record::id::IdHasher;
use crate::record::{Key, Row};
use crate::state::arena::{ArenaConfig, ArenaStore};
use crate::state::snapshot::{self, SavedStore, SnapshotError};
use crate::state::{KeyedStore, MemoryStore, RowHandle};
use crate::time::Time;

/// Custom logic of a `connect` operator: per-input handlers with shared keyed state and timers.
///
/// One instance runs per shard and sees that shard's keys (and every broadcast row). Keep state
/// in [`Context::state`] rather than in fields of the function: the store is what checkpoints
/// and recovery restore.
///
/// # Example
///
/// A count of each key's left rows, reported one second of processing time after the key's
/// first row; the count lives in keyed state as a one-value row, the report carries the key and
/// the count (`select = ["left.n"]`-like output: key, count, `_kind`).
///
/// ```
/// use braid::operator::connect::{CoProcess, Connect, ConnectSpec, Context, Fired, Timer};
/// use braid::operator::projection::{Column, Projection};
/// use braid::operator::{Output, ResultKind};
/// use braid::record::{Key, Row, Value};
/// use braid::time::Time;
///
/// struct CountPerKey;
///
/// const COUNTS: usize = 0;
///
/// impl CoProcess for CountPerKey {
///     fn on_left(&mut self, row: Row, ctx: &mut Context<'_>) {
///         let (mut count, ts) = (0, row.ts);
///         if let Some(old) = ctx.state.take_first(COUNTS, &row.key, row.key_hash) {
///             count = if let Value::Int(n) = old.values[0] { n } else { 0 };
///         } else {
///             // The key's first row: report in a second, holding the output watermark at its ts.
///             let report = Timer::processing(ctx.processing_time() + 1000, 0).holding(Time::ms(ts));
///             ctx.timers.set(&row.key, row.key_hash, report);
///         }
///         let values = Box::new([Value::Int(count + 1)]);
///         ctx.state.insert(COUNTS, Row { ts, values, id: 0, ..row });
///     }
///
///     fn on_right(&mut self, _row: Row, _ctx: &mut Context<'_>) {}
///
///     fn on_timer(&mut self, fired: Fired, ctx: &mut Context<'_>) {
///         let Some(counted) = ctx.state.take_first(COUNTS, &fired.key, fired.key_hash) else { return };
///         let id = ctx.out.id(ResultKind::Match).u64(counted.ts as u64).finish();
///         let values = Box::new([fired.key.to_value(), counted.values[0].clone(), Value::Str("match".into())]);
///         let row = Row { ts: counted.ts, key: fired.key, key_hash: fired.key_hash, id, values };
///         ctx.out.emit_row(ResultKind::Match, row);
///     }
/// }
///
/// let projection = Projection { columns: vec![Column::Key(0), Column::Field { input: 0, pos: 0 }, Column::Kind], rekey: None };
/// let mut op = Connect::new(ConnectSpec::custom("counts", projection, || Box::new(CountPerKey)));
/// let mut out = Output::default();
/// let row = |ts| Row { ts, key: Key::Str("d1".into()), key_hash: 7, id: ts as u64, values: Box::new([]) };
/// op.on_processing_time(10_000, &mut out);
/// op.on_row(0, row(5), &mut out);
/// op.on_row(0, row(6), &mut out);
/// assert_eq!(op.next_processing_timer(), Some(11_000));
/// op.on_watermark(Time::ms(100), &mut out);
/// assert_eq!(op.output_watermark(), Time::ms(5), "the pending report holds the output watermark");
/// op.on_processing_time(11_000, &mut out);
/// assert_eq!(out.results[0].1.values[1], Value::Int(2));
/// assert_eq!(op.output_watermark(), Time::ms(100));
/// ```
pub trait CoProcess: Send {
    /// An on-time row of the left input.
    fn on_left(&mut self, row: Row, ctx: &mut Context<'_>);

    /// An on-time row of the right input.
    fn on_right(&mut self, row: Row, ctx: &mut Context<'_>);

    /// A timer this function set is due.
    fn on_timer(&mut self, fired: Fired, ctx: &mut Context<'_>) {
        let _ = (fired, ctx);
    }
}

/// What a handler works with. The fields are separate borrows: a row found in `state` can be
/// passed to `out` while it is still borrowed.
pub struct Context<'a> {
    pub state: &'a mut KeyedState,
    pub timers: &'a mut TimerService,
    pub out: Emitter<'a>,
    watermark: Time,
    now: i128,
}

impl<'a> Context<'a> {
    pub(crate) fn new(
        state: &'a mut KeyedState,
        timers: &'a mut TimerService,
        out: Emitter<'a>,
        watermark: Time,
        now: i128,
    ) -> Context<'a> {
        Context { state, timers, out, watermark, now }
    }

    /// The operator's watermark (as of the last tick).
    pub fn watermark(&self) -> Time {
        self.watermark
    }

    /// Processing time, ms (during replay: the arrival of the line being processed).
    pub fn processing_time(&self) -> i128 {
        self.now
    }
}

// ------------------------------------------------------------------------------ keyed state ---

/// Keyed state: rows in numbered slots, each a [`KeyedStore`]: in memory, or (on a shard) an
/// mmap arena per slot, opened when the slot is first used.
pub struct KeyedState {
    slots: Vec<Box<dyn KeyedStore>>,
    open: Box<dyn FnMut(usize) -> Box<dyn KeyedStore> + Send>,
}

impl Default for KeyedState {
    fn default() -> Self {
        KeyedState { slots: Vec::new(), open: Box::new(|_| Box::new(MemoryStore::default())) }
    }
}

impl KeyedState {
    /// Slot `n` in the scratch arena `dir/NAME.slotN`. A slot whose arena cannot be opened
    /// (a full disk, no permission) keeps its rows in memory, with a warning: nothing is lost
    /// (a restart's state comes from a checkpoint either way).
    pub fn in_arenas(dir: &std::path::Path, name: &str) -> KeyedState {
        let (dir, name) = (dir.to_owned(), name.to_owned());
        let open = move |slot: usize| -> Box<dyn KeyedStore> {
            let path = dir.join(format!("{name}.slot{slot}"));
            match ArenaStore::open_with(&path, ArenaConfig::scratch()) {
                Ok(arena) => Box::new(arena),
                Err(error) => {
                    tracing::warn!(path = %path.display(), %error, "connect state kept in memory");
                    Box::new(MemoryStore::default())
                }
            }
        };
        KeyedState { slots: Vec::new(), open: Box::new(open) }
    }

    fn slot(&mut self, slot: usize) -> &mut dyn KeyedStore {
        while self.slots.len() <= slot {
            let next = (self.open)(self.slots.len());
            self.slots.push(next);
        }
        self.slots[slot].as_mut()
    }

    /// Stores `row` in `slot` under the key it carries; the handle names it until it is removed.
    pub fn insert(&mut self, slot: usize, row: Row) -> RowHandle {
        self.slot(slot).insert(row, false)
    }

    /// Visits the rows of `key` in `slot` in insertion order, until `visit` returns false.
    pub fn scan(&self, slot: usize, key: &Key, key_hash: u64, mut visit: impl FnMut(RowHandle, &Row) -> bool) {
        if let Some(store) = self.slots.get(slot) {
            store.scan_handles(key, key_hash, &mut visit);
        }
    }

    /// Removes the row `handle` of a key with hash `key_hash` from `slot`.
    pub fn remove(&mut self, slot: usize, key_hash: u64, handle: RowHandle) -> Option<Row> {
        self.slots.get_mut(slot)?.remove(key_hash, handle).map(|removed| removed.row)
    }

    /// Removes and returns the oldest row of `key` in `slot`.
    pub fn take_first(&mut self, slot: usize, key: &Key, key_hash: u64) -> Option<Row> {
        let mut first = None;
        self.scan(slot, key, key_hash, |handle, _| {
            first = Some(handle);
            false
        });
        self.remove(slot, key_hash, first?)
    }

    pub fn rows(&self) -> usize {
        self.slots.iter().map(|s| s.rows()).sum()
    }

    /// Visits every row of `slot`: its (ts, id), key hash and handle (state/budget.rs).
    pub(crate) fn visit_ages(&self, slot: usize, visit: &mut dyn FnMut(i64, u64, u64, RowHandle)) {
        if let Some(store) = self.slots.get(slot) {
            store.visit_ages(visit);
        }
    }

    /// Every slot's rows with their handles, for a snapshot (state/snapshot.rs).
    pub(crate) fn save(&self) -> Result<Vec<SavedStore>, SnapshotError> {
        self.slots.iter().map(|store| snapshot::save_store(store.as_ref())).collect()
    }

    /// Opens the slots `saved` has rows for and checks that they can take them (empty, handles
    /// distinct), changing nothing else.
    pub(crate) fn check(&mut self, saved: &[SavedStore]) -> Result<(), SnapshotError> {
        for (slot, rows) in saved.iter().enumerate() {
            snapshot::check_store(self.slot(slot), rows)?;
        }
        Ok(())
    }

    /// Imports what [`save`](Self::save) saved, once [`check`](Self::check)ed.
    pub(crate) fn load(&mut self, saved: &[SavedStore]) -> Result<(), SnapshotError> {
        for (slot, rows) in saved.iter().enumerate() {
            snapshot::load_store(self.slot(slot), rows)?;
        }
        Ok(())
    }

    pub fn bytes(&self) -> usize {
        self.slots.iter().map(|s| s.bytes()).sum()
    }

    /// What the slots cost the shard's state budget ([`KeyedStore::footprint`]).
    pub fn footprint(&self) -> usize {
        self.slots.iter().map(|s| s.footprint()).sum()
    }
}

// ----------------------------------------------------------------------------------- timers ---

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Domain {
    Event,
    Processing,
}

/// A timer of one key (the key is given when it is set).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timer {
    pub domain: Domain,
    /// Event time: fires once the watermark is strictly past it. Processing time: fires once
    /// processing time reaches it.
    pub at: Time,
    /// The function's own label: tells timers of one key and time apart.
    pub tag: u64,
    /// The smallest `_ts` this timer may emit; the output watermark stays at or below it while
    /// the timer is pending (+∞: no hold).
    pub hold: Time,
}

impl Timer {
    /// Fires once the watermark is strictly past `at`; holds the output watermark at `at`.
    pub fn event(at: Time, tag: u64) -> Timer {
        Timer { domain: Domain::Event, at, tag, hold: at }
    }

    /// Fires once processing time reaches `at` (ms); holds nothing.
    pub fn processing(at: i128, tag: u64) -> Timer {
        Timer { domain: Domain::Processing, at: Time::from_i128(at), tag, hold: Time::POS_INF }
    }

    /// The same timer, holding the output watermark at `hold` instead.
    pub fn holding(self, hold: Time) -> Timer {
        Timer { hold, ..self }
    }
}

/// A timer that is due, with the key it was set for.
#[derive(Debug)]
pub struct Fired {
    pub timer: Timer,
    pub key: Key,
    pub key_hash: u64,
}

/// A pending timer as a snapshot keeps it.
#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
struct SavedTimer {
    processing: bool,
    at: Time,
    seq: u64,
    key: Key,
    key_hash: u64,
    tag: u64,
    hold: Time,
}

/// What a checkpoint keeps of a [`TimerService`]: the pending timers in firing order per domain
/// and the sequence counter (the index of identities and the holds are rebuilt from them).
#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub(crate) struct TimersState {
    timers: Vec<SavedTimer>,
    seq: u64,
}

struct Pending {
    key: Key,
    key_hash: u64,
    tag: u64,
    hold: Time,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct Ident {
    domain: Domain,
    at: Time,
    key_hash: u64,
    tag: u64,
}

/// Pending timers, per domain in firing order (time, then order of setting).
#[derive(Default)]
pub struct TimerService {
    queues: [BTreeMap<(Time, u64), Pending>; 2],
    /// Identity → sequence number, to find a timer again (set again, delete).
    index: HashMap<Ident, u64>,
    /// Timers whose identity the index already gives to another key's timer (same key hash):
    /// found by a scan. Empty unless two keys' hashes collide.
    collided: Vec<(Domain, Time, u64)>,
    /// (hold, sequence number) of every pending timer that holds.
    holds: BTreeSet<(Time, u64)>,
    seq: u64,
}

impl TimerService {
    /// Sets `timer` for `key` (a timer already set with the same identity only takes the new hold).
    pub fn set(&mut self, key: &Key, key_hash: u64, timer: Timer) {
        if !self.update(key, key_hash, timer) {
            self.insert(key.clone(), key_hash, timer);
        }
    }

    /// [`TimerService::set`] with the key moved in (saves a copy of a string key).
    pub fn set_owned(&mut self, key: Key, key_hash: u64, timer: Timer) {
        if !self.update(&key, key_hash, timer) {
            self.insert(key, key_hash, timer);
        }
    }

    /// Deletes the timer with `timer`'s identity for `key`; whether there was one.
    pub fn delete(&mut self, key: &Key, key_hash: u64, timer: Timer) -> bool {
        let Some(seq) = self.find(key, key_hash, &timer) else { return false };
        self.remove(timer.domain, timer.at, seq).is_some()
    }

    /// The earliest pending timer of `domain`.
    pub fn next(&self, domain: Domain) -> Option<Time> {
        self.queues[domain as usize].first_key_value().map(|((at, _), _)| *at)
    }

    /// The smallest hold of a pending timer (+∞ when none holds).
    pub fn min_hold(&self) -> Time {
        self.holds.first().map_or(Time::POS_INF, |(hold, _)| *hold)
    }

    pub fn is_empty(&self, domain: Domain) -> bool {
        self.queues[domain as usize].is_empty()
    }

    fn update(&mut self, key: &Key, key_hash: u64, timer: Timer) -> bool {
        let Some(seq) = self.find(key, key_hash, &timer) else { return false };
        if let Some(pending) = self.queues[timer.domain as usize].get_mut(&(timer.at, seq)) {
            self.holds.remove(&(pending.hold, seq));
            pending.hold = timer.hold;
            if timer.hold != Time::POS_INF {
                self.holds.insert((timer.hold, seq));
            }
        }
        true
    }

    fn insert(&mut self, key: Key, key_hash: u64, timer: Timer) {
        self.seq += 1;
        self.place(self.seq, key, key_hash, timer);
    }

    /// Puts timer number `seq` in the queue, the index and the holds.
    fn place(&mut self, seq: u64, key: Key, key_hash: u64, timer: Timer) {
        let Timer { domain, at, tag, hold } = timer;
        match self.index.entry(Ident { domain, at, key_hash, tag }) {
            Entry::Vacant(e) => {
                e.insert(seq);
            }
            Entry::Occupied(_) => self.collided.push((domain, at, seq)),
        }
        if hold != Time::POS_INF {
            self.holds.insert((hold, seq));
        }
        self.queues[domain as usize].insert((at, seq), Pending { key, key_hash, tag, hold });
    }

    fn find(&self, key: &Key, key_hash: u64, timer: &Timer) -> Option<u64> {
        let queue = &self.queues[timer.domain as usize];
        let is_it = |seq: u64| {
            queue.get(&(timer.at, seq)).is_some_and(|p| p.key_hash == key_hash && p.tag == timer.tag && p.key == *key)
        };
        let ident = Ident { domain: timer.domain, at: timer.at, key_hash, tag: timer.tag };
        if let Some(&seq) = self.index.get(&ident)
            && is_it(seq)
        {
            return Some(seq);
        }
        self.collided.iter().filter(|(d, at, _)| *d == timer.domain && *at == timer.at).map(|c| c.2).find(|&s| is_it(s))
    }

    fn remove(&mut self, domain: Domain, at: Time, seq: u64) -> Option<Pending> {
        let pending = self.queues[domain as usize].remove(&(at, seq))?;
        self.holds.remove(&(pending.hold, seq));
        let ident = Ident { domain, at, key_hash: pending.key_hash, tag: pending.tag };
        if self.index.get(&ident) == Some(&seq) {
            self.index.remove(&ident);
        } else {
            self.collided.retain(|c| *c != (domain, at, seq));
        }
        Some(pending)
    }

    /// Removes and returns the first timer of `domain` if `due(its time)`.
    pub(crate) fn pop_due(&mut self, domain: Domain, due: impl Fn(Time) -> bool) -> Option<Fired> {
        let (&(at, seq), _) = self.queues[domain as usize].first_key_value().filter(|((at, _), _)| due(*at))?;
        self.pop(domain, at, seq)
    }

    fn pop(&mut self, domain: Domain, at: Time, seq: u64) -> Option<Fired> {
        let Pending { key, key_hash, tag, hold } = self.remove(domain, at, seq)?;
        Some(Fired { timer: Timer { domain, at, tag, hold }, key, key_hash })
    }

    /// The (time, sequence number) of every pending processing-time timer, in firing order.
    pub(crate) fn processing_snapshot(&self) -> Vec<(Time, u64)> {
        self.queues[Domain::Processing as usize].keys().copied().collect()
    }

    /// Removes and returns the processing-time timer `(at, seq)` if it is still pending.
    pub(crate) fn take_processing(&mut self, at: Time, seq: u64) -> Option<Fired> {
        self.pop(Domain::Processing, at, seq)
    }

    /// The pending timers, for a snapshot.
    pub(crate) fn save(&self) -> TimersState {
        let mut timers = Vec::new();
        for (domain, queue) in [Domain::Event, Domain::Processing].into_iter().zip(&self.queues) {
            for (&(at, seq), pending) in queue {
                let Pending { key, key_hash, tag, hold } = pending;
                let (key, key_hash, tag, hold) = (key.clone(), *key_hash, *tag, *hold);
                timers.push(SavedTimer { processing: domain == Domain::Processing, at, seq, key, key_hash, tag, hold });
            }
        }
        TimersState { timers, seq: self.seq }
    }

    /// Takes up what [`save`](Self::save) saved; `self` has no timers. Which of two timers
    /// whose identities share a key hash the index names and which one is found by a scan may
    /// differ from before: a timer is found either way.
    pub(crate) fn load(&mut self, saved: TimersState) -> Result<(), SnapshotError> {
        if let Some(timer) = saved.timers.iter().find(|t| t.seq == 0 || t.seq > saved.seq) {
            return Err(SnapshotError::Decode(format!("timer number {} after {}", timer.seq, saved.seq)));
        }
        let mut numbers = std::collections::HashSet::new();
        if let Some(timer) = saved.timers.iter().find(|t| !numbers.insert(t.seq)) {
            return Err(SnapshotError::Decode(format!("timer number {} repeated", timer.seq)));
        }
        for SavedTimer { processing, at, seq, key, key_hash, tag, hold } in saved.timers {
            let domain = if processing { Domain::Processing } else { Domain::Event };
            self.place(seq, key, key_hash, Timer { domain, at, tag, hold });
        }
        self.seq = saved.seq;
        Ok(())
    }

    /// Drops every pending processing-time timer (end of input, after the last sweep).
    pub(crate) fn clear_processing(&mut self) {
        for (at, seq) in self.processing_snapshot() {
            self.remove(Domain::Processing, at, seq);
        }
    }
}

// ---------------------------------------------------------------------------------- results ---

/// Emits results and late rows of one operator.
pub struct Emitter<'a> {
    name: &'a str,
    projection: &'a Projection,
    ids: &'a mut IdHasher,
    out: &'a mut Output,
}

impl<'a> Emitter<'a> {
    pub(crate) fn new(name: &'a str, projection: &'a Projection, ids: &'a mut IdHasher, out: &'a mut Output) -> Self {
        Emitter { name, projection, ids, out }
    }

    /// Emits a result built by the operator's `select` from `left` and/or `right` (a missing side
    /// reads as null), keyed by `key`, with `_ts` = `ts` and `_id` = H(operator, kind, id of
    /// each given row).
    pub fn emit(
        &mut self,
        kind: ResultKind,
        ts: i64,
        key: &Key,
        key_hash: u64,
        left: Option<&Row>,
        right: Option<&Row>,
    ) {
        let ids = self.ids.begin().str(self.name).str(kind.as_str());
        for row in [left, right].into_iter().flatten() {
            ids.u64(row.id);
        }
        let id = ids.finish();
        let (key, key_hash, values) = self.projection.project(key, key_hash, [left, right], kind);
        self.out.results.push((kind, Row { ts, key, key_hash, id, values }));
    }

    /// An id hasher already fed with the operator's name and `kind`: add parts, then `finish()`.
    pub fn id(&mut self, kind: ResultKind) -> &mut IdHasher {
        self.ids.begin().str(self.name).str(kind.as_str())
    }

    /// Emits a result the function built itself: values in the order of the operator's output
    /// schema (its `select`: key, selected fields, `_kind`).
    pub fn emit_row(&mut self, kind: ResultKind, row: Row) {
        self.out.results.push((kind, row));
    }

    /// Sends `row` to the late side output as a row of input `input`.
    pub fn late(&mut self, input: usize, row: Row) {
        self.out.late.push((input, row));
    }

    /// A built-in stored a row of input `input` under `handle`: the host's `ttl` clock starts
    /// (operator/host.rs). Custom functions do not call it: their state does not expire.
    pub(crate) fn stored(&mut self, input: usize, key_hash: u64, handle: RowHandle) {
        self.out.stored.push(crate::state::ttl::StoredRow { input: input as u32, key_hash, handle });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> Key {
        Key::Str(s.into())
    }

    #[test]
    fn timers_fire_in_time_then_setting_order_and_are_found_by_identity() {
        let mut timers = TimerService::default();
        timers.set(&key("b"), 2, Timer::event(Time::ms(10), 1));
        timers.set(&key("a"), 1, Timer::event(Time::ms(10), 1).holding(Time::ms(4)));
        timers.set(&key("a"), 1, Timer::event(Time::ms(5), 1));
        timers.set(&key("a"), 1, Timer::event(Time::ms(5), 1).holding(Time::ms(3)));
        assert_eq!(timers.min_hold(), Time::ms(3), "setting again replaces the hold");
        assert!(timers.delete(&key("a"), 1, Timer::event(Time::ms(5), 1)));
        assert!(!timers.delete(&key("a"), 1, Timer::event(Time::ms(5), 1)));
        assert_eq!(timers.min_hold(), Time::ms(4));
        let fired: Vec<_> =
            std::iter::from_fn(|| timers.pop_due(Domain::Event, |at| at < Time::ms(11))).map(|f| f.key).collect();
        assert_eq!(fired, [key("b"), key("a")]);
        assert_eq!(timers.min_hold(), Time::POS_INF);
    }

    #[test]
    fn keys_with_one_hash_keep_their_own_timers() {
        let mut timers = TimerService::default();
        let t = Timer::processing(100, 0);
        timers.set(&key("a"), 9, t);
        timers.set(&key("b"), 9, t);
        assert_eq!(timers.processing_snapshot().len(), 2);
        assert!(timers.delete(&key("a"), 9, t));
        timers.set(&key("b"), 9, t);
        assert_eq!(timers.processing_snapshot().len(), 1, "b's timer is found though the index lost it");
        assert!(timers.delete(&key("b"), 9, t));
        assert!(timers.is_empty(Domain::Processing));
        assert!(timers.index.is_empty() && timers.collided.is_empty());
    }
}
