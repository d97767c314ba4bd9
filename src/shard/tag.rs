//! Where an activation stands in the single-threaded order, so that shards can reproduce it.
//!
//! The order (CONTRACT.md "Exact replay semantics", made exact where the contract leaves it
//! open) in which every operator instance sees its inputs: events (a row, a tick, processing
//! time, the end) one after the other; within an event, phases (one operator's activation at a
//! tick, over all its instances) in turn; within a phase, breadth first from the root activation:
//! everything one hop away, then two hops, each hop in the order its parents were delivered, then
//! by reading operator, then by emission. A root activation that runs on every shard (a
//! watermark, processing time, the end, a broadcast row) ranks its results by the key they came
//! from ([`origin_rank`](crate::operator::host::origin_rank)), so their order does not depend on
//! how keys fall on shards; any other activation runs on one instance and keeps its emission
//! order. A [`Tag`] spells that position out — event, phase, depth, the root step with its rank,
//! and the path of (operator, input, shard, emission index) steps after it — and the derived
//! `Ord` compares tags in exactly that order. Order-sensitive operators (threshold's latest
//! limit, reconcile's and temporal join's ties, first/last) then see their inputs in one order
//! whatever the shard count (tests/it/runtime.rs checks it against an independent oracle).
//!
//! # Layout, and the limits it implies
//!
//! A tag is `3 + 3 + MAX_CHAIN_DEPTH` little-endian u64 words ([`TAG_BYTES`] = 112, a multiple of
//! 16 so a row archive after it in a frame stays aligned):
//!
//! ```text
//! seq | phase | depth | root: reader, rank, place | path: MAX_CHAIN_DEPTH steps (the last unused)
//! reader = operator << 8 | input                 (operator: 16 bits in a step, input: 8 bits)
//! place  = shard << 32 | emission index          (shard: 8 bits, index: 32 bits)
//! step   = reader << 40 | place                  (24 + 8 + 32 = 64 bits)
//! ```
//!
//! The root activation's results get depth 1 (their step is `root`), each further hop one path
//! word, so a chain of `MAX_CHAIN_DEPTH` operators uses `MAX_CHAIN_DEPTH - 1` path words. The
//! plan's limits ([`crate::plan`]: shards, operators, inputs, chain depth) are what these bit
//! fields hold; the `const` assertions below prove it, so raising a limit without widening the
//! layout does not compile. The emission index is cut to 32 bits: one activation emitting more
//! than 2³² rows would misorder them (not checked; no operator comes near).

use crate::plan::{MAX_CHAIN_DEPTH, MAX_INPUTS, MAX_OPERATORS, MAX_SHARDS};

/// Bits of a step naming the reading operator's input.
const INPUT_BITS: u32 = 8;
/// Bits of a step naming the reading operator.
const OPERATOR_BITS: u32 = 16;
/// Bits of a place naming the shard.
const SHARD_BITS: u32 = 8;
/// Bits of a place counting the emissions of one activation.
const INDEX_BITS: u32 = 32;
/// Words of the path: one per hop after the root, plus one that keeps [`TAG_BYTES`] a multiple
/// of 16.
const PATH_WORDS: usize = MAX_CHAIN_DEPTH;

const _: () = {
    assert!(INPUT_BITS + OPERATOR_BITS + SHARD_BITS + INDEX_BITS == u64::BITS);
    assert!(MAX_INPUTS <= 1 << INPUT_BITS);
    assert!(MAX_OPERATORS <= 1 << OPERATOR_BITS);
    assert!(MAX_SHARDS <= 1 << SHARD_BITS);
    assert!(MAX_CHAIN_DEPTH >= 1 && PATH_WORDS >= MAX_CHAIN_DEPTH - 1);
    assert!(TAG_BYTES.is_multiple_of(16));
};

/// A position in the single-threaded order; compared field by field.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Tag {
    pub seq: u64,
    pub phase: u64,
    pub depth: u64,
    /// The root step: (reading operator, input), rank, (shard, emission index).
    pub root: [u64; 3],
    /// The steps after the root, one word each (the last word is never used: it keeps the
    /// encoded tag a multiple of 16 bytes).
    pub path: [u64; PATH_WORDS],
}

/// Encoded size of a tag: a multiple of 16.
pub const TAG_BYTES: usize = 8 * (3 + 3 + PATH_WORDS);

impl Tag {
    /// Before everything.
    pub const MIN: Tag = Tag { seq: 0, phase: 0, depth: 0, root: [0; 3], path: [0; PATH_WORDS] };
    /// After everything: the frontier of a finished source.
    pub const MAX: Tag =
        Tag { seq: u64::MAX, phase: u64::MAX, depth: u64::MAX, root: [u64::MAX; 3], path: [u64::MAX; PATH_WORDS] };

    /// The first position of event `seq`.
    pub fn event(seq: u64) -> Tag {
        Tag { seq, ..Tag::MIN }
    }

    /// The root of a phase of event `seq`.
    pub fn phase(seq: u64, phase: u64) -> Tag {
        Tag { seq, phase, ..Tag::MIN }
    }

    /// The tag of the `index`-th row emitted while processing the row (or root) tagged `self`,
    /// by `op` on `input`, on `shard`; `rank` orders the results of a root that runs on every
    /// shard. `None` past [`MAX_CHAIN_DEPTH`] (the plan is checked against it).
    pub fn child(&self, op: usize, input: usize, shard: usize, index: usize, rank: Option<u64>) -> Option<Tag> {
        let mut child = *self;
        let reader = ((op as u64) << INPUT_BITS) | (input as u64 & ((1 << INPUT_BITS) - 1));
        let place = ((shard as u64) << INDEX_BITS) | (index as u64 & ((1 << INDEX_BITS) - 1));
        match usize::try_from(self.depth).ok()? {
            0 => child.root = [reader, rank.unwrap_or(0), place],
            depth if depth < MAX_CHAIN_DEPTH => child.path[depth - 1] = (reader << (SHARD_BITS + INDEX_BITS)) | place,
            _ => return None,
        }
        child.depth += 1;
        Some(child)
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        for word in [self.seq, self.phase, self.depth].iter().chain(&self.root).chain(&self.path) {
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
        let mut tag = Tag { seq: word(0), phase: word(1), depth: word(2), ..Tag::MIN };
        for (i, r) in tag.root.iter_mut().enumerate() {
            *r = word(3 + i);
        }
        for (i, p) in tag.path.iter_mut().enumerate() {
            *p = word(6 + i);
        }
        tag
    }
}

/// Phases of a tick event: processing time first (stage 0), then watermarks (stage 1), each
/// operator upstream first.
pub fn tick_phase(stage: u64, op: usize) -> u64 {
    (stage << 32) | op as u64
}

/// Phases of the end of input: operator by operator, processing time (stage 0) before the
/// watermark (stage 1).
pub fn finish_phase(op: usize, stage: u64) -> u64 {
    ((op as u64) << 32) | stage
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn breadth_first_order() {
        let root = Tag::event(7);
        let a = root.child(1, 0, 0, 0, None).unwrap();
        let b = root.child(1, 0, 0, 1, None).unwrap();
        let a1 = a.child(2, 0, 1, 0, None).unwrap();
        let b0 = b.child(2, 0, 0, 0, None).unwrap();
        // One hop before two hops; two hops in the order of their parents.
        assert!(root < a && a < b && b < a1 && a1 < b0);
        assert!(b0 < Tag::event(8));
        let mut bytes = Vec::new();
        b0.encode(&mut bytes);
        assert_eq!(bytes.len(), TAG_BYTES);
        assert_eq!(TAG_BYTES % 16, 0);
        assert_eq!(Tag::decode(&bytes), b0);
    }

    #[test]
    fn ranked_roots_order_by_rank_then_shard_and_emission() {
        let root = Tag::phase(3, tick_phase(1, 2));
        let low_on_shard_1 = root.child(2, 0, 1, 0, Some(5)).unwrap();
        let high_on_shard_0 = root.child(2, 0, 0, 0, Some(9)).unwrap();
        let low_later = root.child(2, 0, 1, 3, Some(5)).unwrap();
        assert!(low_on_shard_1 < low_later && low_later < high_on_shard_0);
    }

    #[test]
    fn depth_is_bounded() {
        let mut tag = Tag::event(1);
        for _ in 0..MAX_CHAIN_DEPTH {
            tag = tag.child(0, 0, 0, 0, None).unwrap();
        }
        assert_eq!(tag.child(0, 0, 0, 0, None), None);
    }
}
