//! Event time and processing time (CONTRACT.md "Exact replay semantics", rules 2–8).
//!
//! Watermarks are [`Time`]s: milliseconds widened to i128 with explicit −∞ and +∞, so that
//! `ts + upper`, `max_ts − max_out_of_orderness − 1` and idle advancing never overflow however
//! close an event time lies to the ends of int64, and +∞ at the end of input stays above every
//! last chance. Nothing here reads a clock: processing time is always passed in.

pub mod clock;
pub mod cpu;
pub mod due;
pub mod rfc3339;
pub mod ticks;

pub use clock::{OperatorClock, StreamClock};
pub use ticks::{Tick, TickPlanner};

/// Watermark ticks happen at every processing time that is a multiple of this (rule 3).
pub const TICK_MS: i128 = 200;

/// A point in event or processing time, in ms, or −∞ / +∞.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize,
)]
pub struct Time(i128);

impl Time {
    pub const NEG_INF: Time = Time(i128::MIN);
    pub const POS_INF: Time = Time(i128::MAX);

    pub const fn ms(ms: i64) -> Time {
        Time(ms as i128)
    }

    pub const fn from_i128(ms: i128) -> Time {
        Time(ms)
    }

    pub fn is_finite(self) -> bool {
        self != Time::NEG_INF && self != Time::POS_INF
    }

    /// `self + delta`; infinities stay infinite.
    pub fn plus(self, delta: i128) -> Time {
        if self.is_finite() { Time(self.0 + delta) } else { self }
    }

    /// Whether a row with event time `ts` is behind this watermark (late): `ts < watermark`.
    pub fn is_past(self, ts: i64) -> bool {
        Time::ms(ts) < self
    }

    /// The value for metrics and logs: finite values as they are, infinities clamped to int64.
    pub fn as_i64_saturating(self) -> i64 {
        self.0.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
    }

    pub fn raw(self) -> i128 {
        self.0
    }
}

/// The first tick strictly after processing time `now`.
pub fn next_tick(now: i128) -> i128 {
    // Asked once per input line: an i64 division by a constant is a multiply and a shift, where
    // an i128 one is a library call of about a hundred instructions. Processing times are ms
    // since the epoch, so the i128 path is for the far ends only.
    match i64::try_from(now) {
        Ok(now) if now < i64::MAX - 2 * TICK_MS as i64 => {
            i128::from((now.div_euclid(TICK_MS as i64) + 1) * TICK_MS as i64)
        }
        _ => (now.div_euclid(TICK_MS) + 1) * TICK_MS,
    }
}

/// The first tick at or after processing time `t`.
pub fn tick_at_or_after(t: i128) -> i128 {
    -((-t).div_euclid(TICK_MS)) * TICK_MS
}

/// The last tick at or before processing time `t`.
pub fn tick_at_or_before(t: i128) -> i128 {
    t.div_euclid(TICK_MS) * TICK_MS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_tick_is_the_same_on_the_i64_path() {
        let tick = TICK_MS as i64;
        let edges = [0, 1, -1, tick - 1, tick, tick + 1, -tick, 1_700_000_000_123, i64::MIN, i64::MIN + 1];
        let far = [i64::MAX - 2 * tick - 1, i64::MAX - 2 * tick, i64::MAX - tick, i64::MAX];
        for now in edges.into_iter().chain(far).map(i128::from).chain([i128::from(i64::MAX) + 1, -(1i128 << 100)]) {
            assert_eq!(next_tick(now), (now.div_euclid(TICK_MS) + 1) * TICK_MS, "{now}");
        }
    }

    #[test]
    fn infinities_absorb_arithmetic() {
        assert_eq!(Time::NEG_INF.plus(5), Time::NEG_INF);
        assert_eq!(Time::POS_INF.plus(-5), Time::POS_INF);
        assert!(Time::POS_INF.is_past(i64::MAX));
        assert!(!Time::ms(10).is_past(10));
        assert!(Time::ms(10).is_past(9));
        assert_eq!(Time::ms(i64::MAX).plus(1).raw(), i128::from(i64::MAX) + 1);
    }

    #[test]
    fn tick_rounding() {
        assert_eq!(next_tick(0), 200);
        assert_eq!(next_tick(199), 200);
        assert_eq!(next_tick(200), 400);
        assert_eq!(next_tick(-1), 0);
        assert_eq!(tick_at_or_after(201), 400);
        assert_eq!(tick_at_or_after(200), 200);
        assert_eq!(tick_at_or_after(-199), 0);
        assert_eq!(tick_at_or_before(399), 200);
        assert_eq!(tick_at_or_before(-1), -200);
    }
}
