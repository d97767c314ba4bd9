//! Rate limiting of repeated warnings (STYLE.md 14: log lines are rate limited).
//!
//! A failing `accept`, an unreachable notify socket or a broker refusing braid fails the same way
//! on every attempt; one
//! line per `every` (with how many were held back) says as much as thousands would, and keeps
//! the journal of a small gateway readable.

use std::time::{Duration, Instant};

/// Lets one occurrence of a repeated event through per `every`, counting the ones it holds back.
#[derive(Debug)]
pub(crate) struct Throttle {
    every: Duration,
    last: Option<Instant>,
    held_back: u64,
}

impl Throttle {
    pub(crate) const fn new(every: Duration) -> Throttle {
        Throttle { every, last: None, held_back: 0 }
    }

    /// `Some(n)` when the occurrence at `now` may be logged, `n` being how many were held back
    /// since the last one logged; `None` when it is held back.
    pub(crate) fn admit(&mut self, now: Instant) -> Option<u64> {
        let due = self.last.is_none_or(|last| now.saturating_duration_since(last) >= self.every);
        if !due {
            self.held_back += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.held_back))
    }
}

/// The clock for [`Throttle::admit`]. Control-plane code (ops, the MQTT clients) may read the
/// clock (clippy.toml bans it in operators and the runtime).
#[allow(clippy::disallowed_methods)]
pub(crate) fn now() -> Instant {
    Instant::now()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lets_one_through_per_period_and_counts_the_rest() {
        let start = now();
        let mut throttle = Throttle::new(Duration::from_secs(10));
        assert_eq!(throttle.admit(start), Some(0));
        assert_eq!(throttle.admit(start + Duration::from_secs(1)), None);
        assert_eq!(throttle.admit(start + Duration::from_secs(9)), None);
        assert_eq!(throttle.admit(start + Duration::from_secs(10)), Some(2));
        assert_eq!(throttle.admit(start + Duration::from_secs(11)), None);
        assert_eq!(throttle.admit(start + Duration::from_secs(30)), Some(1));
    }
}
