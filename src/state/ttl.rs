//! `ttl`: the clock that bounds an operator's state by processing time (DESIGN.md "State",
//! CONTRACT.md "Extensions under way"), as Flink's StateTtlConfig does. One instance per
//! operator instance, owned by its host (operator/host.rs); operators only remove what it says
//! is due.
//!
//! - **Clock.** Processing time as the host hears of it (every row's arrival comes first as a
//!   processing-time step, ticks too: a `ttl` operator is clocked, plan.rs), less braid's own
//!   downtime: when the service starts (journaled, so replaying the journal gives the same
//!   clock) the gap since the last processing time does not count ([`TtlClock::skip_to`]). A
//!   resumed replay's processing time is its inputs' arrival: its clock goes on as if it never
//!   stopped.
//! - **What expires.** A stored row (a join's waiting row, named by its store handle) `ttl`
//!   after it was written; per-key state (a temporal join's versions) `ttl` after its key's
//!   last write. Lookups do not refresh. Due when clock ≥ written + `ttl`; checked at ticks
//!   ([`TtlClock::take_due`]), after the watermark had its chance to free the state.
//! - **Memory.** One entry (32 bytes) per row written within the last `ttl`, whether or not the
//!   watermark freed it since (an entry for a row gone is dropped when due); one per live key.
//! - **Checkpoints.** Everything above is in [`SavedTtl`], inside the host's snapshot: the ttl
//!   clock survives a restart.

use std::collections::{BTreeSet, HashMap, VecDeque};

use super::RowHandle;

/// A row an operator stored, as its store names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct StoredRow {
    pub input: u32,
    pub key_hash: u64,
    pub handle: RowHandle,
}

/// State whose `ttl` has passed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Due {
    Row(StoredRow),
    /// Every piece of state of input `input` kept for this key hash.
    Key {
        input: u32,
        key_hash: u64,
    },
}

/// The ttl clock of one operator instance.
#[derive(Debug)]
pub struct TtlClock {
    ttl: i128,
    /// Processing time without braid's downtime.
    clock: i128,
    /// The last processing time heard of; `None` before the first (or the first after a restart
    /// whose gap is downtime).
    last_now: Option<i128>,
    rows: VecDeque<(i128, StoredRow)>,
    keys: HashMap<(u32, u64), i128>,
    /// `keys` by last write: (written, input, key hash).
    key_order: BTreeSet<(i128, u32, u64)>,
}

/// What a checkpoint keeps of a [`TtlClock`].
#[derive(Clone, Debug, Default, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct SavedTtl {
    clock: i128,
    last_now: Option<i128>,
    rows: Vec<(i128, StoredRow)>,
    keys: Vec<(i128, u32, u64)>,
}

impl TtlClock {
    /// `ttl_ms`: positive (the config checks).
    pub fn new(ttl_ms: i64) -> TtlClock {
        TtlClock {
            ttl: i128::from(ttl_ms),
            clock: 0,
            last_now: None,
            rows: VecDeque::new(),
            keys: HashMap::new(),
            key_order: BTreeSet::new(),
        }
    }

    /// Processing time is `now` (it never goes back; a step back counts as none).
    pub fn now(&mut self, now: i128) {
        if let Some(last) = self.last_now {
            self.clock += (now - last).max(0);
        }
        self.last_now = Some(self.last_now.map_or(now, |last| last.max(now)));
    }

    /// Braid was down until `now`: processing time moves there without the clock.
    pub fn skip_to(&mut self, now: i128) {
        self.last_now = Some(self.last_now.map_or(now, |last| last.max(now)));
    }

    /// An operator stored `row` now.
    pub fn stored(&mut self, row: StoredRow) {
        self.rows.push_back((self.clock, row));
    }

    /// State of `input` for `key_hash` was written now: it lives `ttl` from now.
    pub fn touched(&mut self, input: u32, key_hash: u64) {
        if let Some(last) = self.keys.insert((input, key_hash), self.clock) {
            self.key_order.remove(&(last, input, key_hash));
        }
        self.key_order.insert((self.clock, input, key_hash));
    }

    /// Takes what is due now (written + ttl ≤ clock), oldest first, rows before keys.
    pub fn take_due(&mut self, mut visit: impl FnMut(Due)) {
        while let Some(&(written, row)) = self.rows.front() {
            if written + self.ttl > self.clock {
                break;
            }
            self.rows.pop_front();
            visit(Due::Row(row));
        }
        while let Some(&(written, input, key_hash)) = self.key_order.first() {
            if written + self.ttl > self.clock {
                break;
            }
            self.key_order.pop_first();
            self.keys.remove(&(input, key_hash));
            visit(Due::Key { input, key_hash });
        }
    }

    pub fn save(&self) -> SavedTtl {
        SavedTtl {
            clock: self.clock,
            last_now: self.last_now,
            rows: self.rows.iter().copied().collect(),
            keys: self.key_order.iter().copied().collect(),
        }
    }

    pub fn restore(&mut self, saved: SavedTtl) {
        self.clock = saved.clock;
        self.last_now = saved.last_now;
        self.rows = saved.rows.into();
        self.keys = saved.keys.iter().map(|&(written, input, key_hash)| ((input, key_hash), written)).collect();
        self.key_order = saved.keys.into_iter().collect();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(handle: RowHandle) -> StoredRow {
        StoredRow { input: 0, key_hash: 7, handle }
    }

    fn due(clock: &mut TtlClock) -> Vec<Due> {
        let mut all = Vec::new();
        clock.take_due(|d| all.push(d));
        all
    }

    #[test]
    fn a_row_is_due_at_exactly_ttl_after_it_was_written() {
        let mut clock = TtlClock::new(1_000);
        clock.now(5_000);
        clock.stored(row(1));
        clock.now(5_999);
        assert!(due(&mut clock).is_empty());
        clock.now(6_000);
        assert_eq!(due(&mut clock), [Due::Row(row(1))]);
    }

    #[test]
    fn a_key_written_again_lives_ttl_from_its_last_write_and_lookups_do_not_count() {
        let mut clock = TtlClock::new(1_000);
        clock.now(0);
        clock.touched(1, 9);
        clock.now(999);
        clock.touched(1, 9);
        clock.now(1_000);
        assert!(due(&mut clock).is_empty(), "refreshed just before");
        clock.now(1_999);
        assert_eq!(due(&mut clock), [Due::Key { input: 1, key_hash: 9 }]);
        clock.now(5_000);
        assert!(due(&mut clock).is_empty(), "due once");
    }

    #[test]
    fn downtime_does_not_count_and_the_clock_survives_a_checkpoint() {
        let mut clock = TtlClock::new(1_000);
        clock.now(0);
        clock.stored(row(1));
        clock.now(600);
        let mut restarted = TtlClock::new(1_000);
        restarted.restore(clock.save());
        restarted.skip_to(3_600_000); // an hour down
        restarted.now(3_600_000);
        assert!(due(&mut restarted).is_empty(), "the hour down does not count");
        restarted.now(3_600_400);
        assert_eq!(due(&mut restarted), [Due::Row(row(1))]);
        // Without downtime (a resumed replay) the gap counts.
        let mut resumed = TtlClock::new(1_000);
        resumed.restore(clock.save());
        resumed.now(1_000);
        assert_eq!(due(&mut resumed), [Due::Row(row(1))]);
    }
}
