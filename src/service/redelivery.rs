//! Recognising a broker's redelivery of a message the journal already holds (DESIGN.md "State":
//! the session redelivers unacknowledged messages first and in order).
//!
//! A message journaled but not yet acknowledged when braid dies, or when its connection breaks,
//! comes again, flagged DUP. Per source the intake keeps the fingerprints (topic and payload
//! hash) of the last [`RECENT`] messages it took, in order — in the checkpoint too, so a restart
//! knows the messages taken just before it. A DUP message whose fingerprint is found at or after
//! the cursor is such a redelivery: it is acknowledged and counted, not taken again, and the
//! cursor moves past it, so the redeliveries are matched in the order they were first taken. A
//! (re)connection puts the cursor back to the oldest fingerprint. A message without DUP is never
//! taken for a redelivery.

use std::collections::VecDeque;

/// Fingerprints kept per source: more than a broker keeps in flight (mosquitto: 20 by default).
pub const RECENT: usize = 1024;

#[derive(Default)]
pub struct Recent {
    fingerprints: VecDeque<u64>,
    /// Redeliveries are looked for from here.
    cursor: usize,
}

impl Recent {
    pub fn restored(fingerprints: Vec<u64>) -> Recent {
        Recent { fingerprints: fingerprints.into(), cursor: 0 }
    }

    pub fn fingerprints(&self) -> Vec<u64> {
        self.fingerprints.iter().copied().collect()
    }

    /// A message was taken.
    pub fn took(&mut self, topic: &str, payload: &[u8]) {
        if self.fingerprints.len() == RECENT {
            self.fingerprints.pop_front();
            self.cursor = self.cursor.saturating_sub(1);
        }
        self.fingerprints.push_back(fingerprint(topic, payload));
    }

    /// The source (re)connected: its redeliveries start over from the oldest.
    pub fn reconnected(&mut self) {
        self.cursor = 0;
    }

    /// Whether a DUP message is one already taken; if so, the next is looked for after it.
    pub fn is_repeat(&mut self, topic: &str, payload: &[u8]) -> bool {
        let wanted = fingerprint(topic, payload);
        match self.fingerprints.iter().skip(self.cursor).position(|&f| f == wanted) {
            Some(at) => {
                self.cursor += at + 1;
                true
            }
            None => false,
        }
    }
}

fn fingerprint(topic: &str, payload: &[u8]) -> u64 {
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    hasher.update(&(topic.len() as u64).to_le_bytes());
    hasher.update(topic.as_bytes());
    hasher.update(payload);
    hasher.digest()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redeliveries_match_in_order_and_only_once() {
        let mut recent = Recent::default();
        for p in [b"a", b"b", b"c", b"b"] {
            recent.took("t", p);
        }
        recent.reconnected();
        assert!(recent.is_repeat("t", b"b"));
        assert!(recent.is_repeat("t", b"c"));
        assert!(recent.is_repeat("t", b"b"), "the second b, after c");
        assert!(!recent.is_repeat("t", b"b"), "no third b was taken");
        assert!(!recent.is_repeat("t", b"a"), "a comes before the cursor: a new message");
        assert!(!recent.is_repeat("u", b"c"), "another topic");
    }

    #[test]
    fn only_the_last_messages_are_kept() {
        let mut recent = Recent::default();
        for i in 0..RECENT + 10 {
            recent.took("t", &i.to_le_bytes());
        }
        assert!(!recent.is_repeat("t", &0usize.to_le_bytes()));
        assert!(recent.is_repeat("t", &(RECENT + 9).to_le_bytes()));
        assert_eq!(Recent::restored(recent.fingerprints()).fingerprints().len(), RECENT);
    }
}
