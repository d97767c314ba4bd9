//! `function = "reconcile"`: pair one left row with one right row of the same key within
//! `timeout` of event time; a row that finds no partner is emitted alone (CONTRACT.md rules 5,
//! 8, 11; DESIGN.md "Operators": match-or-timeout).
//!
//! - An on-time row takes the waiting row of the other side with `|Δts| ≤ timeout` of smallest
//!   (ts, arrival) — the first of smallest ts in the store's insertion order — and both leave:
//!   `_kind` "match", `_ts` the larger ts, `_id` H(operator, "match", left id, right id).
//! - Otherwise it waits (slot = its side) with an event timer at `ts + timeout` holding the
//!   output watermark at `ts`. Last chance strictly after (rule 8): a partner with
//!   `ts' ≤ ts + timeout` is on time while `watermark ≤ ts + timeout`, so the row is emitted as
//!   `left_only` / `right_only` (`_ts` its ts, `_id` H(operator, kind, its id)) and freed once the
//!   watermark is strictly past `ts + timeout`. Within one watermark advance they come out in
//!   order of (ts + timeout, arrival), as timers fire.
//! - Output watermark: min(watermark, smallest ts still waiting) — the holds of the pending
//!   timers; a match's `_ts` is at least the ts of the row that completes it, which is on time.
//! - `ttl` (CONTRACT.md "Extensions under way"): a waiting row is a stored row of the host's
//!   `ttl` clock; when it expires before its partner came or its last chance passed, it leaves
//!   with its timer to `OPERATOR.expired` as itself (`_reason` `ttl`), and is never emitted as
//!   `left_only` / `right_only`. `evict_oldest` takes waiting rows by (ts, id) the same way. A
//!   `ttl` shorter than `timeout` cuts waits short: `braid validate` warns.
//! - A timer is tagged with its row's side and store handle, so a match deletes exactly its
//!   partner's timer. One copy of the key per waiting row (the timer's) is the only allocation
//!   beyond the row itself and the result.

use crate::operator::ResultKind;
use crate::operator::interval_join::LEFT;
use crate::record::Row;
use crate::state::RowHandle;
use crate::time::Time;

use super::coprocess::{CoProcess, Context, Fired, KeyedState, Timer, TimerService};

#[derive(Clone, Copy, Debug)]
pub struct ReconcileSpec {
    /// ms, ≥ 0.
    pub timeout: i64,
}

pub struct Reconcile {
    timeout: i64,
}

impl Reconcile {
    pub fn new(spec: ReconcileSpec) -> Reconcile {
        Reconcile { timeout: spec.timeout }
    }

    /// The waiting row's timer: its side and handle in the tag.
    fn timer(&self, side: usize, ts: i64, handle: RowHandle) -> Timer {
        Timer::event(Time::ms(ts).plus(i128::from(self.timeout)), handle << 1 | side as u64).holding(Time::ms(ts))
    }

    fn on_row(&mut self, side: usize, row: Row, ctx: &mut Context<'_>) {
        let other = 1 - side;
        let timeout = i128::from(self.timeout);
        let mut best: Option<(i64, RowHandle)> = None;
        ctx.state.scan(other, &row.key, row.key_hash, |handle, waiting| {
            let near = (i128::from(waiting.ts) - i128::from(row.ts)).abs() <= timeout;
            if near && best.is_none_or(|(ts, _)| waiting.ts < ts) {
                best = Some((waiting.ts, handle));
            }
            true
        });
        if let Some((partner_ts, handle)) = best {
            ctx.timers.delete(&row.key, row.key_hash, self.timer(other, partner_ts, handle));
            if let Some(partner) = ctx.state.remove(other, row.key_hash, handle) {
                let (left, right) = if side == LEFT { (&row, &partner) } else { (&partner, &row) };
                let ts = left.ts.max(right.ts);
                ctx.out.emit(ResultKind::Match, ts, &row.key, row.key_hash, Some(left), Some(right));
                return;
            }
        }
        let (key, key_hash, ts) = (row.key.clone(), row.key_hash, row.ts);
        let handle = ctx.state.insert(side, row);
        ctx.out.stored(side, key_hash, handle);
        ctx.timers.set_owned(key, key_hash, self.timer(side, ts, handle));
    }

    /// The waiting row `handle` of side `side` leaves before its last chance (`ttl`, the state
    /// budget), its timer with it: it is never emitted alone, and its hold is released.
    pub(crate) fn give_up(
        &self,
        side: usize,
        key_hash: u64,
        handle: RowHandle,
        state: &mut KeyedState,
        timers: &mut TimerService,
    ) -> Option<Row> {
        let row = state.remove(side, key_hash, handle)?;
        timers.delete(&row.key, key_hash, self.timer(side, row.ts, handle));
        Some(row)
    }
}

impl CoProcess for Reconcile {
    fn on_left(&mut self, row: Row, ctx: &mut Context<'_>) {
        self.on_row(LEFT, row, ctx);
    }

    fn on_right(&mut self, row: Row, ctx: &mut Context<'_>) {
        self.on_row(1 - LEFT, row, ctx);
    }

    /// A waiting row's last chance has passed: it leaves alone.
    fn on_timer(&mut self, fired: Fired, ctx: &mut Context<'_>) {
        let side = (fired.timer.tag & 1) as usize;
        let Some(row) = ctx.state.remove(side, fired.key_hash, fired.timer.tag >> 1) else { return };
        let (kind, left, right) = if side == LEFT {
            (ResultKind::LeftOnly, Some(&row), None)
        } else {
            (ResultKind::RightOnly, None, Some(&row))
        };
        ctx.out.emit(kind, row.ts, &row.key, row.key_hash, left, right);
    }
}
