//! Windows shared by window_join and cogroup: tumbling, sliding and session windows over event
//! time, `[start, end)`, epoch-aligned with an optional offset (DESIGN.md "Operators", CONTRACT.md
//! rules 5, 7, 8, 10).
//!
//! - Assignment: a fixed window (tumbling: `slide = size`) starts at every `offset + k·slide` and
//!   holds the rows with `start ≤ ts < start + size`; a row belongs to every window that contains
//!   it (none when `slide > size` leaves a gap there). A session row opens `[ts, ts + gap)`, and
//!   sessions of one key that overlap *or touch* (`end == start`) merge, over both inputs together.
//! - Firing: a window fires once the operator's watermark reaches `end − 1` (Flink), with `_ts =
//!   end − 1` and `_version` = how often it fired. Within one watermark advance windows fire in
//!   `(end, start, creation)` order; a merged session keeps the earliest creation of its parts.
//! - Lateness (rule 7): a row is late when every window of the row has `end − 1 +
//!   allowed_lateness ≤ watermark` — for a session, the window it would merge into. A row that is
//!   not late joins its windows that are not late; a window that already fired fires again at once
//!   with the updated contents (same `_id`, `_version` + 1).
//! - Eviction: a window is freed once `end − 1 + allowed_lateness ≤ watermark`; no row that is
//!   not late can reach it any more. Every live window therefore has `end − 1 + allowed_lateness >
//!   watermark`, so results still to come have `_ts > watermark − allowed_lateness`: that is the
//!   output watermark (rule 5).
//! - Session merges: window_join continues the highest `_version` of the parts (its pairs keep
//!   their `_id`s); cogroup results carry the window bounds in their `_id`, so a merged session is
//!   a new result that lists in `_supersedes` the `_id`s emitted for its parts and those they
//!   superseded (rule 10). A row that extends one session and merges no other (most rows that
//!   do not open a session) updates it in place, with the outcome of such a merge.
//!
//! - Join quality ([`Quality`], CONTRACT.md "Metrics"): a row leaves the state when the last
//!   window it belongs to is freed — its only window for tumbling and session windows (a merged
//!   session carries its parts' rows), the one starting latest for sliding windows (it ends
//!   last). It is **matched** when that window holds at least one row of the other input at
//!   that moment (for window_join whether or not a pair passes `where`), unmatched otherwise;
//!   counted once, then. For a sliding row this judges its last window only: a partner that
//!   shared only an earlier window of it does not count (a row's membership of several windows
//!   is not kept — cogroup keeps no rows at all). Each window counts the rows it owns that way,
//!   two integers, so the row path allocates nothing for it. The rows a window owns when `ttl`
//!   or the state budget drops it count as **expired** (with or without a would-be result),
//!   neither matched nor unmatched: `matched + unmatched + late + expired` stays every row.
//!
//! One [`Windows`] instance runs per shard and holds the windows of that shard's keys; all shards
//! get the same watermark, so what fires, and when, does not depend on the shard count.

use std::collections::{BTreeSet, HashMap};

use crate::config::walk::{Errors, Table};
use crate::operator::{Expired, ExpiryReason, Output, Quality};
use crate::record::{Key, Value};
use crate::state::snapshot::{self, SnapshotError};
use crate::time::Time;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WindowKind {
    /// Windows of `size` starting every `slide` at `offset` modulo `slide` (tumbling: slide = size).
    Fixed {
        size: i64,
        slide: i64,
        offset: i64,
    },
    Session {
        gap: i64,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowSpec {
    pub kind: WindowKind,
    /// ms (≥ 0) a fired window stays open for rows behind the watermark.
    pub allowed_lateness: i64,
}

/// Checks a `window = { kind = ..., ... }` table and `allowed_lateness`.
pub fn check_spec(t: Table<'_, '_>, errors: &mut Errors) -> Option<WindowSpec> {
    let before = errors.count();
    let allowed_lateness = t.duration_or("allowed_lateness", 0, errors);
    let Some((span, table)) = t.table("window", errors) else {
        if t.get("window").is_none() {
            t.missing("window", errors, "e.g. { kind = \"tumbling\", size = \"5m\" }");
        }
        return None;
    };
    let path = t.child_path("window");
    let w = Table { path: &path, span: &span, table };
    w.check_keys(&["kind", "size", "slide", "gap", "offset"], errors);
    let (kind, needs): (&str, &[&str]) = match w.required_str("kind", errors, "tumbling, sliding or session") {
        Some(("tumbling", _)) => ("tumbling", &["size"]),
        Some(("sliding", _)) => ("sliding", &["size", "slide"]),
        Some(("session", _)) => ("session", &["gap"]),
        Some((_, span)) => {
            errors.at(&span, &w.child_path("kind"), "must be tumbling, sliding or session");
            return None;
        }
        None => return None,
    };
    let mut value = |key: &str| -> Option<i64> {
        let wanted = needs.contains(&key) || (key == "offset" && kind != "session");
        match (wanted, w.get(key).is_some()) {
            (true, false) if key != "offset" => {
                w.missing(key, errors, "a positive duration");
                None
            }
            (false, true) => {
                w.error(key, errors, format!("this window kind takes {}", needs.join(", ")));
                None
            }
            (true, true) => match w.duration(key, errors) {
                Some(ms) if ms <= 0 && key != "offset" => {
                    w.error(key, errors, "must be positive");
                    None
                }
                ms => ms,
            },
            _ => None,
        }
    };
    let [size, slide, gap, offset] = ["size", "slide", "gap", "offset"].map(&mut value);
    let kind = match kind {
        "session" => WindowKind::Session { gap: gap? },
        "sliding" => WindowKind::Fixed { size: size?, slide: slide?, offset: offset.unwrap_or(0) },
        _ => WindowKind::Fixed { size: size?, slide: size?, offset: offset.unwrap_or(0) },
    };
    (errors.count() == before).then_some(WindowSpec { kind, allowed_lateness })
}

impl WindowSpec {
    /// Stands in for a window whose configuration has errors: the plan is refused anyway, and
    /// the operator's output schema stays known so the operators reading it are checked too.
    pub const UNUSED: WindowSpec =
        WindowSpec { kind: WindowKind::Fixed { size: 1, slide: 1, offset: 0 }, allowed_lateness: 0 };

    pub fn is_session(&self) -> bool {
        matches!(self.kind, WindowKind::Session { .. })
    }

    /// The fixed windows holding `ts`, latest first (empty for sessions or in a gap between
    /// sliding windows).
    pub fn assign(&self, ts: i64) -> impl Iterator<Item = (i64, i64)> + use<> {
        let (size, slide, offset) = match self.kind {
            WindowKind::Fixed { size, slide, offset } => (i128::from(size), i128::from(slide), i128::from(offset)),
            WindowKind::Session { .. } => (0, 1, 0),
        };
        let ts = i128::from(ts);
        let last = ts - (ts - offset).rem_euclid(slide);
        let mut start = last;
        std::iter::from_fn(move || {
            (start > ts - size).then(|| {
                let window = (saturate(start), saturate(start + size));
                start -= slide;
                window
            })
        })
    }

    /// What a `ttl` shorter than this may cut short (`braid validate` warns): a window's span
    /// in event time — its size (a session's gap, the least it lasts) — plus allowed_lateness.
    pub fn ttl_floor(&self) -> i64 {
        let span = match self.kind {
            WindowKind::Fixed { size, .. } => size,
            WindowKind::Session { gap } => gap,
        };
        span.saturating_add(self.allowed_lateness)
    }

    /// A window with this end takes no more rows: `end − 1 + allowed_lateness ≤ watermark`.
    fn closed(&self, end: i64, watermark: Time) -> bool {
        Time::ms(end).plus(i128::from(self.allowed_lateness) - 1) <= watermark
    }
}

/// Drops `handle` from the list at `at`, and the list once empty.
fn unlink<K: std::hash::Hash + Eq, S: std::hash::BuildHasher>(
    index: &mut HashMap<K, Vec<Handle>, S>,
    at: K,
    handle: Handle,
) {
    if let Some(list) = index.get_mut(&at) {
        list.retain(|&h| h != handle);
        if list.is_empty() {
            index.remove(&at);
        }
    }
}

/// Window bounds live in int64 like event times; a window past its ends is cut there.
fn saturate(ms: i128) -> i64 {
    ms.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
}

/// Whether a window with this end has fired by `watermark`: `end − 1 ≤ watermark`.
fn due(end: i64, watermark: Time) -> bool {
    Time::ms(end).plus(-1) <= watermark
}

/// What a window holds: the rows of a window join, the aggregates of a cogroup.
pub trait Contents: Clone {
    /// What a row is stored as (shared between the windows of a sliding row).
    type Item;
    /// `seq`: the row's arrival order at this operator instance (first/last break ts ties by it).
    fn add(&mut self, input: usize, item: &Self::Item, seq: u64);
    /// Takes in the contents of a session merged into this one.
    fn absorb(&mut self, other: Self);
    fn rows(&self) -> usize;
    fn bytes(&self) -> usize;
    /// The window holds at least one row of `input`.
    fn has(&self, input: usize) -> bool;
    /// Visits the (ts, id) of every row it keeps (window_join; cogroup keeps none).
    fn visit_rows(&self, _visit: &mut dyn FnMut(i64, u64)) {}
}

/// Turns a firing window into results.
pub trait Fire<C> {
    /// Emits the results of `w` at `w.version`; returns the `_id` it emitted under, if it
    /// emitted a result that a merged session would supersede (cogroup).
    fn fire(&mut self, w: &Window<C>, out: &mut Output) -> Option<u64>;
}

/// What happens to earlier results when sessions merge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnMerge {
    /// window_join: results keep their `_id`s; the merged session continues the highest version.
    ContinueVersions,
    /// cogroup: the merged session is a new result that supersedes the parts' results.
    Supersede,
}

pub struct Window<C> {
    pub key: Key,
    pub key_hash: u64,
    pub start: i64,
    pub end: i64,
    /// How often it fired: the `_version` of the last firing.
    pub version: i64,
    /// cogroup sessions: `_id`s emitted for the sessions merged into this one (and those they
    /// superseded), sorted.
    pub supersedes: Vec<u64>,
    pub contents: C,
    /// Creation order (firing ties); a merged session keeps its parts' earliest.
    created: u64,
    /// The `_id` it emitted under, if it ever emitted (cogroup).
    emitted: Option<u64>,
    /// Per input: rows whose last window this is (they leave the state with it).
    owned: [u64; 2],
}

impl<C> Window<C> {
    /// `_window_start`, `_window_end`, `_version`: the values every window result ends with.
    pub fn meta(&self) -> [Value; 3] {
        [Value::Int(self.start), Value::Int(self.end), Value::Int(self.version)]
    }
}

/// What the windows need to know of a row besides what is stored (`Contents::Item`).
#[derive(Clone, Copy, Debug)]
pub struct RowRef<'a> {
    /// The index of the input it came on.
    pub input: usize,
    pub ts: i64,
    pub key: &'a Key,
    pub key_hash: u64,
}

type Handle = u64;

/// The windows of one operator instance.
pub struct Windows<C> {
    spec: WindowSpec,
    on_merge: OnMerge,
    /// What a new window starts with.
    empty: C,
    watermark: Time,
    windows: HashMap<Handle, Window<C>>,
    /// Fixed windows by (key hash, start); keys are compared by value.
    fixed: HashMap<(u64, i64), Vec<Handle>>,
    /// Sessions by key hash; keys are compared by value.
    sessions: crate::state::ByKeyHash<Vec<Handle>>,
    /// Fixed windows by key hash alone, for `ttl` ([`Self::expire_key`]); sessions have `sessions`.
    fixed_by_key: crate::state::ByKeyHash<Vec<Handle>>,
    /// Windows not fired at their current contents and bounds, in firing order.
    pending: BTreeSet<(i64, i64, u64, Handle)>,
    /// Every window by end, for eviction.
    expiry: BTreeSet<(i64, Handle)>,
    next_handle: Handle,
    next_created: u64,
    seq: u64,
    rows: usize,
    bytes: usize,
    parts: Vec<Handle>,
    quality: Quality,
}

impl<C: Contents> Windows<C> {
    pub fn new(spec: WindowSpec, on_merge: OnMerge, empty: C) -> Windows<C> {
        Windows {
            spec,
            on_merge,
            empty,
            watermark: Time::NEG_INF,
            windows: HashMap::new(),
            fixed: HashMap::new(),
            sessions: Default::default(),
            fixed_by_key: Default::default(),
            pending: BTreeSet::new(),
            expiry: BTreeSet::new(),
            next_handle: 0,
            next_created: 0,
            seq: 0,
            rows: 0,
            bytes: 0,
            parts: Vec::new(),
            quality: Quality::default(),
        }
    }

    /// A row reached the operator. Returns false, changing nothing, when the row is late (the
    /// caller sends it to the late output).
    pub fn on_row(&mut self, row: RowRef<'_>, item: &C::Item, fire: &mut impl Fire<C>, out: &mut Output) -> bool {
        self.seq += 1;
        let taken = match self.spec.kind {
            WindowKind::Fixed { .. } => self.fixed_row(row, item, fire, out),
            WindowKind::Session { gap } => self.session_row(row, gap, item, fire, out),
        };
        // The key's windows were written: their `ttl` starts again (the host's clock).
        if taken && out.touched.last() != Some(&(0, row.key_hash)) {
            out.touched.push((0, row.key_hash));
        }
        taken
    }

    /// `ttl`: no row went into a window of key hash `key_hash` for `ttl` (its host's clock says).
    /// Every open window of the key is dropped; one whose result is not out at its current
    /// contents (not fired yet, or changed since) puts the result it would have emitted in
    /// `out.expired` (`input` None), as the next firing would have made it (`_version` + 1). A
    /// window that fired and kept only for allowed lateness is dropped without one: its result
    /// is out already. Rows of the key that come later open fresh windows, as for a key never
    /// seen (Flink's StateTtlConfig: expired state reads as absent).
    pub fn expire_key(&mut self, key_hash: u64, reason: ExpiryReason, fire: &mut impl Fire<C>, out: &mut Output) {
        let index = match self.spec.kind {
            WindowKind::Fixed { .. } => &self.fixed_by_key,
            WindowKind::Session { .. } => &self.sessions,
        };
        let Some(handles) = index.get(&key_hash).cloned() else { return };
        for handle in handles {
            self.drop_window(handle, reason, fire, out);
        }
    }

    /// Every window, for `evict_oldest`: input 0, (`_ts` = end − 1, handle), key hash, handle.
    pub fn visit_evictable(&self, visit: &mut dyn FnMut(usize, i64, u64, u64, u64)) {
        for (&handle, w) in &self.windows {
            visit(0, w.end.saturating_sub(1), handle, w.key_hash, handle);
        }
    }

    /// `evict_oldest` takes window `handle` (as [`Self::expire_key`] does a key's): false when
    /// it is gone already.
    pub fn evict(&mut self, handle: Handle, fire: &mut impl Fire<C>, out: &mut Output) -> bool {
        let gone = !self.windows.contains_key(&handle);
        self.drop_window(handle, ExpiryReason::Budget, fire, out);
        !gone
    }

    /// Takes window `handle` out early (`ttl`, byte budget): its would-be result, if it has one
    /// still to emit, goes to `out.expired` ([`Self::expire_key`]).
    fn drop_window(&mut self, handle: Handle, reason: ExpiryReason, fire: &mut impl Fire<C>, out: &mut Output) {
        let pending =
            self.windows.get(&handle).is_some_and(|w| self.pending.contains(&(w.end, w.start, w.created, handle)));
        let Some(mut w) = self.remove(handle) else { return };
        for input in 0..2 {
            self.quality.count_expired(input, w.owned[input]);
        }
        // The rows whose last window this is leave with it (`braid explain` tells them expired).
        let spec = self.spec;
        w.contents.visit_rows(&mut |ts, id| {
            if spec.is_session() || spec.assign(ts).next().is_some_and(|(start, _)| start == w.start) {
                out.left_early.push((reason, w.key_hash, id));
            }
        });
        if !pending {
            return;
        }
        w.version += 1;
        let results_before = out.results.len();
        fire.fire(&w, out);
        for (_, row) in out.results.drain(results_before..) {
            out.expired.push(Expired { reason, input: None, row });
        }
    }

    fn fixed_row(&mut self, row: RowRef<'_>, item: &C::Item, fire: &mut impl Fire<C>, out: &mut Output) -> bool {
        let RowRef { input, ts, key, key_hash } = row;
        // The latest window closes last: if it is closed, all are.
        let last = match self.spec.assign(ts).next() {
            Some((start, end)) if !self.spec.closed(end, self.watermark) => start,
            _ => return false,
        };
        for (start, end) in self.spec.assign(ts) {
            if self.spec.closed(end, self.watermark) {
                break;
            }
            let found = self
                .fixed
                .get(&(key_hash, start))
                .and_then(|slot| slot.iter().copied().find(|h| self.windows.get(h).is_some_and(|w| w.key == *key)));
            let handle = match found {
                Some(h) => h,
                None => {
                    let h = self.next_handle;
                    self.fixed.entry((key_hash, start)).or_default().push(h);
                    self.fixed_by_key.entry(key_hash).or_default().push(h);
                    self.create(h, key, key_hash, start, end, None);
                    h
                }
            };
            // A window that fired already fires again at once. The first window, the one
            // starting latest, is the row's last.
            if self.add(handle, input, item, start == last) {
                self.fire_now(handle, fire, out);
            }
        }
        true
    }

    fn session_row(
        &mut self,
        row: RowRef<'_>,
        gap: i64,
        item: &C::Item,
        fire: &mut impl Fire<C>,
        out: &mut Output,
    ) -> bool {
        let RowRef { input, ts, key, key_hash } = row;
        let (mut start, mut end) = (ts, saturate(i128::from(ts) + i128::from(gap)));
        self.parts.clear();
        if let Some(list) = self.sessions.get(&key_hash) {
            // Sessions of a key never overlap or touch, so one pass finds every part; loop anyway
            // until nothing more joins.
            loop {
                let before = self.parts.len();
                for h in list {
                    let Some(w) = self.windows.get(h) else { continue };
                    if w.key == *key && !self.parts.contains(h) && w.start <= end && w.end >= start {
                        self.parts.push(*h);
                        (start, end) = (start.min(w.start), end.max(w.end));
                    }
                }
                // None is left to join once all have (the common case: a key with one session).
                if self.parts.len() == before || self.parts.len() == list.len() {
                    break;
                }
            }
        }
        if self.spec.closed(end, self.watermark) {
            return false;
        }
        let handle = match *self.parts.as_slice() {
            [h] => {
                self.extend(h, start, end);
                h
            }
            _ => self.merge(key, key_hash, start, end),
        };
        if self.add(handle, input, item, true) {
            // A session always changed; one not yet due is pending already.
            self.fire_now(handle, fire, out);
        }
        true
    }

    /// Replaces the sessions in `self.parts` (maybe none) by one new session `[start, end)`.
    fn merge(&mut self, key: &Key, key_hash: u64, start: i64, end: i64) -> Handle {
        let handle = self.next_handle;
        let created = self.parts.iter().filter_map(|h| self.windows.get(h)).map(|w| w.created).min();
        self.create(handle, key, key_hash, start, end, created);
        let list = self.sessions.entry(key_hash).or_default();
        list.retain(|h| !self.parts.contains(h));
        list.push(handle);
        for i in 0..self.parts.len() {
            let Some(part) = self.remove(self.parts[i]) else { continue };
            let Some(merged) = self.windows.get_mut(&handle) else { continue };
            let (rows, bytes) = (merged.contents.rows(), merged.contents.bytes());
            merged.contents.absorb(part.contents);
            merged.owned[0] += part.owned[0];
            merged.owned[1] += part.owned[1];
            match self.on_merge {
                OnMerge::ContinueVersions => merged.version = merged.version.max(part.version),
                OnMerge::Supersede => {
                    merged.supersedes.extend(part.supersedes);
                    merged.supersedes.extend(part.emitted);
                    merged.supersedes.sort_unstable();
                    merged.supersedes.dedup();
                }
            }
            self.rows = self.rows + merged.contents.rows() - rows;
            self.bytes = self.bytes + merged.contents.bytes() - bytes;
        }
        handle
    }

    /// Moves the bounds of session `handle`, the only part of a new row's session, to `[start,
    /// end)` in place (nothing to do when they stay). The outcome is what [`Self::merge`] makes of
    /// one part — same contents, version, `_supersedes`, firing order and place in the key's list
    /// — without building a new window and dropping the old one from every index.
    fn extend(&mut self, handle: Handle, start: i64, end: i64) {
        let Some(w) = self.windows.get_mut(&handle) else { return };
        if (w.start, w.end) == (start, end) {
            return;
        }
        // Live sessions have distinct `created`, so firing order does not depend on the handle.
        self.pending.remove(&(w.end, w.start, w.created, handle));
        self.pending.insert((end, start, w.created, handle));
        if w.end != end {
            self.expiry.remove(&(w.end, handle));
            self.expiry.insert((end, handle));
        }
        (w.start, w.end) = (start, end);
        let emitted = w.emitted.take();
        match self.on_merge {
            // The merged session's version is its one part's.
            OnMerge::ContinueVersions => {}
            // A new result: version 0 until it fires, superseding what this session emitted.
            OnMerge::Supersede => {
                w.version = 0;
                if let Some(id) = emitted
                    && let Err(at) = w.supersedes.binary_search(&id)
                {
                    w.supersedes.insert(at, id);
                }
            }
        }
        // `merge` puts the merged session last in the key's list, and the list's order is the
        // order in which a later merge absorbs its parts (min/max keep the first of equal values,
        // such as 0.0 and -0.0).
        if let Some(list) = self.sessions.get_mut(&w.key_hash)
            && let Some(at) = list.iter().position(|&h| h == handle)
        {
            let h = list.remove(at);
            list.push(h);
        }
    }

    fn create(&mut self, handle: Handle, key: &Key, key_hash: u64, start: i64, end: i64, created: Option<u64>) {
        self.next_handle += 1;
        self.next_created += 1;
        let created = created.unwrap_or(self.next_created);
        let window = Window {
            key: key.clone(),
            key_hash,
            start,
            end,
            version: 0,
            supersedes: Vec::new(),
            contents: self.empty.clone(),
            created,
            emitted: None,
            owned: [0; 2],
        };
        self.rows += window.contents.rows();
        self.bytes += window.contents.bytes();
        self.windows.insert(handle, window);
        self.pending.insert((end, start, created, handle));
        self.expiry.insert((end, handle));
    }

    /// Adds a row to a window; returns whether the window is due (has fired by the watermark),
    /// so it has to fire again now. `owner`: this is the row's last window.
    fn add(&mut self, handle: Handle, input: usize, item: &C::Item, owner: bool) -> bool {
        let Some(w) = self.windows.get_mut(&handle) else { return false };
        let (rows, bytes) = (w.contents.rows(), w.contents.bytes());
        w.contents.add(input, item, self.seq);
        w.owned[input] += u64::from(owner);
        self.rows = self.rows + w.contents.rows() - rows;
        self.bytes = self.bytes + w.contents.bytes() - bytes;
        due(w.end, self.watermark)
    }

    fn fire_now(&mut self, handle: Handle, fire: &mut impl Fire<C>, out: &mut Output) {
        let Some(w) = self.windows.get_mut(&handle) else { return };
        self.pending.remove(&(w.end, w.start, w.created, handle));
        w.version += 1;
        if let Some(id) = fire.fire(w, out) {
            w.emitted = Some(id);
        }
    }

    /// Takes a window out of every index.
    fn remove(&mut self, handle: Handle) -> Option<Window<C>> {
        let w = self.windows.remove(&handle)?;
        self.pending.remove(&(w.end, w.start, w.created, handle));
        self.expiry.remove(&(w.end, handle));
        match self.spec.kind {
            WindowKind::Fixed { .. } => {
                unlink(&mut self.fixed, (w.key_hash, w.start), handle);
                unlink(&mut self.fixed_by_key, w.key_hash, handle);
            }
            WindowKind::Session { .. } => unlink(&mut self.sessions, w.key_hash, handle),
        }
        self.rows -= w.contents.rows();
        self.bytes -= w.contents.bytes();
        Some(w)
    }

    /// The operator's watermark moved to `watermark`: fire what is due, free what is closed.
    pub fn on_watermark(&mut self, watermark: Time, fire: &mut impl Fire<C>, out: &mut Output) {
        self.watermark = watermark;
        while let Some(&(end, _, _, handle)) = self.pending.first()
            && due(end, watermark)
        {
            self.pending.pop_first();
            self.fire_now(handle, fire, out);
        }
        while let Some(&(end, handle)) = self.expiry.first()
            && self.spec.closed(end, watermark)
        {
            self.expiry.pop_first();
            if let Some(w) = self.remove(handle) {
                for input in 0..2 {
                    self.quality.count(input, w.contents.has(1 - input), w.owned[input]);
                }
            }
        }
    }

    /// A lower bound on the `_ts` of every result still to come: watermark − allowed_lateness.
    pub fn output_watermark(&self) -> Time {
        self.watermark.plus(-i128::from(self.spec.allowed_lateness))
    }

    /// No window waits to fire (windows kept for allowed lateness emit only when a row comes).
    pub fn is_quiescent(&self) -> bool {
        self.pending.is_empty()
    }

    /// Rows that left with their last window, matched, unmatched or expired (module doc).
    pub fn quality(&self) -> Quality {
        self.quality
    }

    pub fn windows(&self) -> usize {
        self.windows.len()
    }

    pub fn state_rows(&self) -> usize {
        self.rows
    }

    pub fn state_bytes(&self) -> usize {
        self.bytes + self.windows.len() * std::mem::size_of::<Window<C>>()
    }

    /// The windows' state for a snapshot and, in the same order, their contents (which each
    /// kind saves its own way). Windows come in the order of the index lists that hold them, so
    /// that [`restore`](Self::restore) rebuilds every list in its order (a session list's order
    /// is the order a later merge absorbs its parts in).
    pub fn snapshot(&self) -> (WindowsState, Vec<&C>) {
        let lists: Vec<&Vec<Handle>> = match self.spec.kind {
            WindowKind::Fixed { .. } => self.fixed.values().collect(),
            WindowKind::Session { .. } => self.sessions.values().collect(),
        };
        let mut windows = Vec::with_capacity(self.windows.len());
        let mut contents = Vec::with_capacity(self.windows.len());
        for &handle in lists.into_iter().flatten() {
            let Some(w) = self.windows.get(&handle) else { continue };
            windows.push(WindowState {
                handle,
                key: w.key.clone(),
                key_hash: w.key_hash,
                start: w.start,
                end: w.end,
                version: w.version,
                supersedes: w.supersedes.clone(),
                created: w.created,
                emitted: w.emitted,
                owned: w.owned,
                pending: self.pending.contains(&(w.end, w.start, w.created, handle)),
            });
            contents.push(&w.contents);
        }
        let state = WindowsState {
            session: self.spec.is_session(),
            watermark: self.watermark,
            windows,
            next_handle: self.next_handle,
            next_created: self.next_created,
            seq: self.seq,
            quality: self.quality,
        };
        (state, contents)
    }

    /// Takes up a [`snapshot`](Self::snapshot) with each window's contents restored by the kind;
    /// `self` is freshly built from the same spec.
    pub fn restore(&mut self, saved: WindowsState, contents: Vec<C>) -> Result<(), SnapshotError> {
        let session = self.spec.is_session();
        if saved.session != session {
            let kind = |session: bool| if session { "session windows" } else { "fixed windows" }.to_owned();
            return Err(SnapshotError::Mismatch { expected: kind(session), found: kind(saved.session) });
        }
        if !self.windows.is_empty() {
            let expected = "a freshly built instance (no windows)".to_owned();
            return Err(SnapshotError::Mismatch { expected, found: format!("{} windows", self.windows.len()) });
        }
        snapshot::expect_len("window contents", saved.windows.len(), contents.len())?;
        let mut handles = std::collections::HashSet::with_capacity(saved.windows.len());
        if let Some(w) = saved.windows.iter().find(|w| w.handle >= saved.next_handle || !handles.insert(w.handle)) {
            return Err(SnapshotError::Decode(format!("window number {} repeated or out of range", w.handle)));
        }
        for (w, contents) in saved.windows.into_iter().zip(contents) {
            let handle = w.handle;
            match self.spec.kind {
                WindowKind::Fixed { .. } => {
                    self.fixed.entry((w.key_hash, w.start)).or_default().push(handle);
                    self.fixed_by_key.entry(w.key_hash).or_default().push(handle);
                }
                WindowKind::Session { .. } => self.sessions.entry(w.key_hash).or_default().push(handle),
            }
            if w.pending {
                self.pending.insert((w.end, w.start, w.created, handle));
            }
            self.expiry.insert((w.end, handle));
            self.rows += contents.rows();
            self.bytes += contents.bytes();
            let WindowState { key, key_hash, start, end, version, supersedes, created, emitted, owned, .. } = w;
            let window = Window { key, key_hash, start, end, version, supersedes, contents, created, emitted, owned };
            self.windows.insert(handle, window);
        }
        self.watermark = saved.watermark;
        self.next_handle = saved.next_handle;
        self.next_created = saved.next_created;
        self.seq = saved.seq;
        self.quality = saved.quality;
        Ok(())
    }
}

/// A window as a snapshot keeps it, its contents apart ([`Windows::snapshot`]).
#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct WindowState {
    handle: Handle,
    key: Key,
    key_hash: u64,
    start: i64,
    end: i64,
    version: i64,
    supersedes: Vec<u64>,
    created: u64,
    emitted: Option<u64>,
    owned: [u64; 2],
    /// Not fired at its current contents and bounds.
    pending: bool,
}

/// What a checkpoint keeps of [`Windows`]: the windows in index order, the watermark, the
/// counters that number windows and rows, the join quality so far.
#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct WindowsState {
    session: bool,
    watermark: Time,
    windows: Vec<WindowState>,
    next_handle: Handle,
    next_created: u64,
    seq: u64,
    quality: Quality,
}

#[cfg(test)]
mod tests;
