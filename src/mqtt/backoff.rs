//! Reconnect backoff: exponential from `min` to `max`, each delay jittered into `[cur/2, cur)`.
//!
//! Jitter spreads the reconnects of many gateways after a broker restart, and it stays below the
//! cap (unlike `backon`, whose jitter can reach twice the maximum; research §5). The generator is
//! a seeded xorshift64, so tests get the same delays every run.

use std::time::Duration;

#[derive(Clone, Debug)]
pub struct Backoff {
    current: Duration,
    min: Duration,
    max: Duration,
    state: u64,
}

impl Backoff {
    /// `min` is the first delay's upper bound (a `max` below it is raised to it); `seed` picks
    /// the jitter sequence (any value, 0 included).
    pub fn new(min: Duration, max: Duration, seed: u64) -> Backoff {
        // xorshift never leaves 0, so force a set bit.
        Backoff { current: min, min, max: max.max(min), state: seed | 1 }
    }

    /// Start over from `min` (after a successful connection).
    pub fn reset(&mut self) {
        self.current = self.min;
    }

    /// The delay before the next attempt, in `[cur/2, cur)` where `cur` doubles up to `max`.
    // Not `Iterator::next`: the sequence never ends, and an `Option` would only add an unwrap at
    // every reconnect.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Duration {
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        let permille = (self.state % 1000) as u32;
        let delay = self.current / 2 + self.current * permille / 2000;
        self.current = self.current.saturating_mul(2).min(self.max);
        delay
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: Duration = Duration::from_millis(100);
    const MAX: Duration = Duration::from_secs(30);

    #[test]
    fn delays_stay_within_half_and_whole_of_the_doubling_cap() {
        let mut backoff = Backoff::new(MIN, MAX, 42);
        let mut cap = MIN;
        for _ in 0..40 {
            let delay = backoff.next();
            assert!(delay >= cap / 2 && delay < cap, "{delay:?} outside [{:?}, {cap:?})", cap / 2);
            cap = (cap * 2).min(MAX);
        }
    }

    #[test]
    fn never_exceeds_the_maximum_and_reset_starts_over() {
        let mut backoff = Backoff::new(MIN, MAX, 0);
        for _ in 0..100 {
            assert!(backoff.next() < MAX);
        }
        backoff.reset();
        assert!(backoff.next() < MIN);
    }

    #[test]
    fn same_seed_same_delays_and_jitter_varies() {
        let delays = |seed| {
            let mut backoff = Backoff::new(MAX, MAX, seed);
            (0..20).map(|_| backoff.next()).collect::<Vec<_>>()
        };
        assert_eq!(delays(7), delays(7));
        let mut distinct = delays(7);
        distinct.dedup();
        assert!(distinct.len() > 10, "jitter should vary: {distinct:?}");
    }

    #[test]
    fn a_maximum_below_the_minimum_is_raised_to_it() {
        let mut backoff = Backoff::new(MAX, MIN, 3);
        assert!(backoff.next() >= MAX / 2);
        assert!(backoff.next() < MAX);
    }
}
