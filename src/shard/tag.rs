//! Where a row stands in the single-threaded order, so that shards can reproduce it.
//!
//! The sans-IO [`Engine`](crate::engine::Engine) defines the order in which every operator
//! instance sees its inputs: events (a row, a tick, processing time, the end) one after the other;
//! within an event, phases (one operator instance's activation at a tick, say) in turn; within a
//! phase, breadth first from the root activation: everything one hop away, then two hops, each
//! hop in the order its parents were delivered, then by reading operator, then by emission. A
//! [`Tag`] spells that position out — event, phase, depth, and the path of (operator, input,
//! shard, emission index) from the root — and the derived `Ord` compares tags in exactly that
//! order. Order-sensitive operators (threshold's latest limit, reconcile's and temporal join's
//! ties, first/last) then see their inputs as the single-threaded engine feeds them, whatever the
//! shard count.

/// How many operators a chain may hold: the longest path from a root activation.
pub const MAX_DEPTH: usize = 8;

/// A position in the single-threaded order; compared field by field.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Tag {
    pub seq: u64,
    pub phase: u64,
    pub depth: u64,
    pub path: [u64; MAX_DEPTH],
}

/// Encoded size of a tag.
pub const TAG_BYTES: usize = 8 * (3 + MAX_DEPTH);

impl Tag {
    /// Before everything.
    pub const MIN: Tag = Tag { seq: 0, phase: 0, depth: 0, path: [0; MAX_DEPTH] };
    /// After everything: the frontier of a finished source.
    pub const MAX: Tag = Tag { seq: u64::MAX, phase: u64::MAX, depth: u64::MAX, path: [u64::MAX; MAX_DEPTH] };

    /// The first position of event `seq`.
    pub fn event(seq: u64) -> Tag {
        Tag { seq, ..Tag::MIN }
    }

    /// The root of a phase of event `seq`.
    pub fn phase(seq: u64, phase: u64) -> Tag {
        Tag { seq, phase, ..Tag::MIN }
    }

    /// The tag of the `index`-th row emitted while processing the row tagged `self`, by `op`
    /// on `input`, on `shard`. `None` past [`MAX_DEPTH`] (the plan is checked against it).
    pub fn child(&self, op: usize, input: usize, shard: usize, index: usize) -> Option<Tag> {
        let depth = usize::try_from(self.depth).ok().filter(|&d| d < MAX_DEPTH)?;
        let mut child = *self;
        child.path[depth] = path_step(op, input, shard, index);
        child.depth += 1;
        Some(child)
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        for word in [self.seq, self.phase, self.depth].iter().chain(&self.path) {
            out.extend_from_slice(&word.to_le_bytes());
        }
    }

    /// `bytes` holds at least [`TAG_BYTES`].
    pub fn decode(bytes: &[u8]) -> Tag {
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&bytes[i * 8..i * 8 + 8]);
            u64::from_le_bytes(w)
        };
        let mut path = [0; MAX_DEPTH];
        for (i, p) in path.iter_mut().enumerate() {
            *p = word(3 + i);
        }
        Tag { seq: word(0), phase: word(1), depth: word(2), path }
    }
}

/// One step of a path: reading operator, then its input, then the shard, then emission order.
fn path_step(op: usize, input: usize, shard: usize, index: usize) -> u64 {
    ((op as u64 & 0xffff) << 48)
        | ((input as u64 & 0xff) << 40)
        | ((shard as u64 & 0xff) << 32)
        | (index as u64 & 0xffff_ffff)
}

/// Phases of a tick event: processing time first (stage 0), then watermarks (stage 1), each
/// operator upstream first, each shard in turn.
pub fn tick_phase(stage: u64, op: usize, shard: usize) -> u64 {
    (stage << 48) | ((op as u64) << 16) | shard as u64
}

/// Phases of the end of input: operator by operator, processing time (stage 0) before the
/// watermark (stage 1), each shard in turn.
pub fn finish_phase(op: usize, stage: u64, shard: usize) -> u64 {
    ((op as u64) << 32) | (stage << 16) | shard as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn breadth_first_order() {
        let root = Tag::event(7);
        let a = root.child(1, 0, 0, 0).unwrap();
        let b = root.child(1, 0, 0, 1).unwrap();
        let a1 = a.child(2, 0, 1, 0).unwrap();
        let b0 = b.child(2, 0, 0, 0).unwrap();
        // One hop before two hops; two hops in the order of their parents.
        assert!(root < a && a < b && b < a1 && a1 < b0);
        assert!(b0 < Tag::event(8));
        let mut bytes = Vec::new();
        b0.encode(&mut bytes);
        assert_eq!(bytes.len(), TAG_BYTES);
        assert_eq!(Tag::decode(&bytes), b0);
    }

    #[test]
    fn depth_is_bounded() {
        let mut tag = Tag::event(1);
        for _ in 0..MAX_DEPTH {
            tag = tag.child(0, 0, 0, 0).unwrap();
        }
        assert_eq!(tag.child(0, 0, 0, 0), None);
    }
}
