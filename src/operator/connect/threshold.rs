//! `function = "threshold"`: a left row whose `value` exceeds the most recently processed `limit`
//! of its key (of any key when the right stream is broadcast) is emitted at once (CONTRACT.md
//! rule 11; DESIGN.md "Operators").
//!
//! - State: one limit row per key (slot [`LIMITS`]); a broadcast limit is stored under
//!   [`Key::Broadcast`], and the runtime hands a broadcast row to every shard, so every shard holds
//!   the same latest limit. "Most recently processed" is processing order, not event time: a
//!   limit with an older ts that arrives later still replaces the stored one.
//! - `ttl` (CONTRACT.md "Extensions under way"): a limit is the key's only state and each new
//!   one replaces it, so "`ttl` after the key's last write" is "`ttl` after the limit was
//!   written": the limit is a stored row of the host's `ttl` clock, and when it expires it goes
//!   to `OPERATOR.expired` as itself (a row of the right input, `_reason` `ttl`). Later left rows
//!   of the key find no limit (as before the first). A limit replaced before its `ttl` is no
//!   longer there when its time comes: nothing expires. `evict_oldest` takes limits by (ts, id)
//!   the same way (broadcast limits excepted: every shard holds them).
//! - A left row before any limit of its key produces nothing; nothing waits, so the output
//!   watermark is the watermark and no timer is set.
//! - `_kind` "match", `_ts` the left row's ts, `_id` H(operator, "match", left id, limit id).
//! - "Exceeds" is `>` as in the model: numbers (int, float, bool as 0/1) compare exactly by
//!   value, strings by code point; a null or a string against a number never exceeds.

use std::cmp::Ordering;

use crate::operator::ResultKind;
use crate::operator::interval_join::RIGHT;
use crate::record::id::key_hash;
use crate::record::{Key, Row, Value, cmp_int_float};
use crate::state::RowHandle;

use super::coprocess::{CoProcess, Context, KeyedState};

/// The keyed-state slot of the limits.
pub const LIMITS: usize = 0;

#[derive(Clone, Copy, Debug)]
pub struct ThresholdSpec {
    /// Position of `value` in the left rows.
    pub value: usize,
    /// Position of `limit` in the right rows.
    pub limit: usize,
    /// The right stream is broadcast (key `"*"`).
    pub broadcast: bool,
}

pub struct Threshold {
    spec: ThresholdSpec,
    broadcast_hash: u64,
}

impl Threshold {
    pub fn new(spec: ThresholdSpec) -> Threshold {
        Threshold { spec, broadcast_hash: key_hash(&Key::Broadcast) }
    }
}

impl CoProcess for Threshold {
    fn on_left(&mut self, row: Row, ctx: &mut Context<'_>) {
        let (key, hash) =
            if self.spec.broadcast { (&Key::Broadcast, self.broadcast_hash) } else { (&row.key, row.key_hash) };
        let Context { state, out, .. } = ctx;
        state.scan(LIMITS, key, hash, |_, limit| {
            if exceeds(&row.values[self.spec.value], &limit.values[self.spec.limit]) {
                out.emit(ResultKind::Match, row.ts, &row.key, row.key_hash, Some(&row), Some(limit));
            }
            false
        });
    }

    fn on_right(&mut self, row: Row, ctx: &mut Context<'_>) {
        let mut previous = None;
        ctx.state.scan(LIMITS, &row.key, row.key_hash, |handle, _| {
            previous = Some(handle);
            false
        });
        let key_hash = row.key_hash;
        // Insert first, then drop the old limit: the key's entry is never emptied and refilled.
        let handle = ctx.state.insert(LIMITS, row);
        ctx.out.stored(RIGHT, key_hash, handle);
        if let Some(handle) = previous {
            ctx.state.remove(LIMITS, key_hash, handle);
        }
    }
}

impl Threshold {
    /// The limit `handle` of input `input` leaves before a newer one replaced it (`ttl`, the
    /// state budget): later rows of its key find no limit. A handle already replaced is gone.
    pub(crate) fn give_up(input: usize, key_hash: u64, handle: RowHandle, state: &mut KeyedState) -> Option<Row> {
        if input != RIGHT {
            return None;
        }
        state.remove(LIMITS, key_hash, handle)
    }
}

/// `value > limit`, as the model (Python) compares: numbers exactly, strings by code point.
pub fn exceeds(value: &Value, limit: &Value) -> bool {
    compare(value, limit) == Some(Ordering::Greater)
}

fn compare(a: &Value, b: &Value) -> Option<Ordering> {
    use Value::{Bool, Float, Int, Str};
    match (a, b) {
        (Str(a), Str(b)) => Some(a.cmp(b)),
        (Float(a), Float(b)) => a.partial_cmp(b),
        (Int(a), Int(b)) => Some(a.cmp(b)),
        (Bool(a), _) => compare(&Int(i64::from(*a)), b),
        (_, Bool(b)) => compare(a, &Int(i64::from(*b))),
        (Int(a), Float(b)) => cmp_int_float(*a, *b),
        (Float(a), Int(b)) => cmp_int_float(*b, *a).map(Ordering::reverse),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exceeds_compares_like_the_model() {
        let (i, f, s) = (Value::Int, Value::Float, |x: &str| Value::Str(x.into()));
        assert!(exceeds(&f(30.5), &i(30)));
        assert!(!exceeds(&i(30), &f(30.0)));
        assert!(exceeds(&i(31), &f(30.9)));
        assert!(!exceeds(&i(-31), &f(-30.9)));
        assert!(exceeds(&i(-30), &f(-30.5)));
        assert!(exceeds(&i(i64::MAX), &f(9.223_372_036_854_775e18)), "no rounding of the int");
        assert!(!exceeds(&i(i64::MAX), &f(9_223_372_036_854_775_808.0)));
        assert!(exceeds(&s("b"), &s("a")) && !exceeds(&s("B"), &s("a")));
        assert!(exceeds(&Value::Bool(true), &f(0.5)));
        assert!(!exceeds(&s("9"), &i(1)) && !exceeds(&i(1), &Value::Null) && !exceeds(&Value::Null, &i(1)));
    }
}
