//! Watermarks and idleness of streams and operators, at ticks (rules 3–5).

use super::{Time, tick_at_or_after};

/// One input stream's watermark and idleness.
///
/// At a tick the watermark becomes `max ts − max_out_of_orderness − 1` (−∞ before the first row).
/// A stream that received no row since the previous tick turns idle at the first tick `T` with
/// `T − last arrival ≥ idle_timeout`; a row makes it active again at the next tick.
#[derive(Clone, Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct StreamClock {
    max_out_of_orderness: i64,
    /// 0 turns idleness off.
    idle_timeout: i64,
    max_ts: Option<i64>,
    last_arrival: i128,
    rows_since_tick: bool,
    idle: bool,
    /// The service cannot see this stream's input (its source is disconnected): it does not
    /// turn idle meanwhile ([`suspend`](Self::suspend)).
    suspended: bool,
    watermark: Time,
}

impl StreamClock {
    /// This clock as restored from a checkpoint: `saved`'s progress with this clock's settings
    /// (a reload may have changed them).
    pub fn restored(&self, saved: StreamClock) -> StreamClock {
        StreamClock { max_out_of_orderness: self.max_out_of_orderness, idle_timeout: self.idle_timeout, ..saved }
    }

    /// This clock as a new stream's at processing time `now` (a reload added the stream).
    pub fn restarted_at(&self, now: i128) -> StreamClock {
        StreamClock::new(self.max_out_of_orderness, self.idle_timeout, now)
    }

    /// `start`: the arrival of the first line of all inputs; idleness before a stream's first row
    /// counts from there.
    pub fn new(max_out_of_orderness: i64, idle_timeout: i64, start: i128) -> StreamClock {
        StreamClock {
            max_out_of_orderness,
            idle_timeout,
            max_ts: None,
            last_arrival: start,
            rows_since_tick: false,
            idle: false,
            suspended: false,
            watermark: Time::NEG_INF,
        }
    }

    /// `braid run`: the stream's input cannot reach braid (its source is disconnected). Silence
    /// then says nothing about the devices, so the stream does not turn idle — its watermark
    /// holds the operators reading it back, and what the broker kept arrives in time.
    pub fn suspend(&mut self) {
        self.suspended = true;
    }

    /// The input can reach braid again at processing time `now` (the source reconnected, or the
    /// service started): idleness counts from `now`. An idle stream stays idle until a row.
    pub fn resume(&mut self, now: i128) {
        self.suspended = false;
        self.last_arrival = self.last_arrival.max(now);
    }

    pub fn on_row(&mut self, ts: i64, arrival: i128) {
        self.rows_since_tick = true;
        self.last_arrival = arrival;
        self.max_ts = Some(self.max_ts.map_or(ts, |m| m.max(ts)));
    }

    pub fn tick(&mut self, t: i128) {
        if self.rows_since_tick {
            self.idle = false;
            self.rows_since_tick = false;
        } else if !self.suspended && self.idle_timeout > 0 && t - self.last_arrival >= i128::from(self.idle_timeout) {
            self.idle = true;
        }
        if let Some(max_ts) = self.max_ts {
            self.watermark = Time::ms(max_ts).plus(-i128::from(self.max_out_of_orderness) - 1);
        }
    }

    pub fn watermark(&self) -> Time {
        self.watermark
    }

    pub fn is_idle(&self) -> bool {
        self.idle
    }

    /// Whether the next tick has rows to account for.
    pub fn has_new_rows(&self) -> bool {
        self.rows_since_tick
    }

    /// The first tick at which this stream would turn idle if nothing arrives (None: never, or
    /// already idle).
    pub fn idle_due(&self) -> Option<i128> {
        (!self.idle && !self.suspended && self.idle_timeout > 0)
            .then(|| tick_at_or_after(self.last_arrival + i128::from(self.idle_timeout)))
    }
}

/// An operator's watermark: `max(previous, min over non-idle inputs)`; when every input is idle
/// it stays put, or with `idle_advance` moves on with processing time from where it was when the
/// inputs all went idle (rule 5). Monotonic.
#[derive(Clone, Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct OperatorClock {
    watermark: Time,
    /// (tick at which every input was idle, watermark then).
    all_idle_since: Option<(i128, Time)>,
}

/// What an operator sees of one of its inputs at a tick.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct InputTime {
    pub watermark: Time,
    pub idle: bool,
}

impl Default for OperatorClock {
    fn default() -> Self {
        OperatorClock { watermark: Time::NEG_INF, all_idle_since: None }
    }
}

impl OperatorClock {
    /// Recomputes the watermark at tick `t`; returns it when it moved forward.
    pub fn tick(&mut self, t: i128, inputs: &[InputTime], idle_advance: bool) -> Option<Time> {
        let active_min = inputs.iter().filter(|i| !i.idle).map(|i| i.watermark).min();
        let candidate = match active_min {
            Some(min) => {
                self.all_idle_since = None;
                min
            }
            None if idle_advance => {
                let (since, base) = *self.all_idle_since.get_or_insert((t, self.watermark));
                base.plus(t - since)
            }
            None => return None,
        };
        self.advance_to(candidate)
    }

    /// Moves the watermark to `to` if that is forward (end of input: +∞).
    pub fn advance_to(&mut self, to: Time) -> Option<Time> {
        (to > self.watermark).then(|| {
            self.watermark = to;
            to
        })
    }

    pub fn watermark(&self) -> Time {
        self.watermark
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_watermark_and_idleness() {
        let mut s = StreamClock::new(500, 1000, 0);
        s.tick(200);
        assert_eq!((s.watermark(), s.is_idle()), (Time::NEG_INF, false));
        s.on_row(10_000, 300);
        assert_eq!(s.watermark(), Time::NEG_INF, "watermarks move at ticks only");
        s.tick(400);
        assert_eq!(s.watermark(), Time::ms(9_499));
        assert_eq!(s.idle_due(), Some(1_400));
        s.tick(1_200);
        assert!(!s.is_idle());
        s.tick(1_400);
        assert!(s.is_idle());
        s.on_row(9_000, 1_500);
        assert!(s.is_idle(), "a row makes the stream active at the next tick");
        s.tick(1_600);
        assert!(!s.is_idle());
        assert_eq!(s.watermark(), Time::ms(9_499), "max ts, not the last ts");
    }

    #[test]
    fn a_suspended_stream_never_turns_idle_and_counts_again_from_its_resumption() {
        let mut s = StreamClock::new(0, 1000, 0);
        s.on_row(100, 100);
        s.tick(200);
        s.suspend();
        assert_eq!(s.idle_due(), None, "no idleness is due while suspended");
        s.tick(60_000);
        assert!(!s.is_idle(), "a minute without input while suspended is not idleness");
        s.resume(60_000);
        assert_eq!(s.idle_due(), Some(61_000));
        s.tick(60_800);
        assert!(!s.is_idle());
        s.tick(61_000);
        assert!(s.is_idle(), "idle once idle_timeout passed after the resumption");
        s.suspend();
        s.resume(70_000);
        s.tick(80_000);
        assert!(s.is_idle(), "an idle stream stays idle until a row, resumed or not");
    }

    #[test]
    fn idle_timeout_zero_never_idles() {
        let mut s = StreamClock::new(0, 0, 0);
        s.tick(1_000_000);
        assert!(!s.is_idle());
        assert_eq!(s.idle_due(), None);
    }

    #[test]
    fn operator_min_over_active_inputs_and_idle_advance() {
        let active = |ms| InputTime { watermark: Time::ms(ms), idle: false };
        let idle = |ms| InputTime { watermark: Time::ms(ms), idle: true };
        let mut op = OperatorClock::default();
        assert_eq!(op.tick(200, &[active(100), active(50)], true), Some(Time::ms(50)));
        assert_eq!(op.tick(400, &[active(100), idle(50)], true), Some(Time::ms(100)));
        assert_eq!(op.tick(600, &[active(90), idle(50)], true), None, "monotonic");
        assert_eq!(op.tick(800, &[idle(100), idle(50)], true), None, "advancing starts at base");
        assert_eq!(op.tick(1_000, &[idle(100), idle(50)], true), Some(Time::ms(300)));
        let mut waits = OperatorClock::default();
        waits.tick(200, &[active(100)], false);
        assert_eq!(waits.tick(400, &[idle(100)], false), None);
        assert_eq!(waits.tick(10_000, &[idle(100)], false), None);
    }
}
