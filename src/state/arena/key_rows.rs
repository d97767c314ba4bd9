//! The index entries of one key, oldest first: the first [`INLINE`] in the index's hash-map slot
//! itself, the rest in a deque on the heap.
//!
//! Why: a key of the gateway holds one to four rows per side, and every row looks its key up
//! three times (the other side's scan, its own store, its leaving). With all of a key's entries
//! in a deque of their own, each lookup waited for two cache lines that had gone cold in the
//! seconds of event time since the key was last seen: the map slot, then the deque's block. With
//! the first entries in the slot, a key holding at most [`INLINE`] rows is one line (or two
//! neighbours), and the row leaving — almost always the oldest — is found there too.
//!
//! Invariant: the inline entries are `inline[..n]` with `n` the number held inline, and `spilled`
//! is empty unless all [`INLINE`] are taken; so the order is `inline[..n]`, then `spilled`.
//! Removing the first entry shifts the inline ones (two moves of 24 bytes) and refills the last
//! from the front of the deque: O(1), so a hot key's n rows still leave in O(n).

use std::collections::VecDeque;

use super::{ENTRY_BYTES, Entry};
use crate::state::IndexShape;
use crate::state::RowHandle;

/// Entries a key keeps in its map slot.
pub const INLINE: usize = 2;

/// [`index_bytes_of`](crate::state::index_bytes_of) for this index: a hash-map slot (and its
/// control byte) per key, its first [`INLINE`] entries in it.
pub fn index_bytes(keys: usize, rows: usize) -> usize {
    let shape = IndexShape {
        key_bytes: std::mem::size_of::<(u64, KeyRows)>() + 1,
        entries_per_key: INLINE,
        entry_bytes: ENTRY_BYTES,
    };
    crate::state::index_bytes_of(keys, rows, shape)
}

#[derive(Default)]
pub struct KeyRows {
    inline: [Option<Entry>; INLINE],
    spilled: VecDeque<Entry>,
}

impl KeyRows {
    pub fn is_empty(&self) -> bool {
        self.inline[0].is_none()
    }

    /// Entries the heap deque has room for (0 once it empties: [`remove`](Self::remove)).
    #[cfg(test)]
    pub fn spilled_capacity(&self) -> usize {
        self.spilled.capacity()
    }

    pub fn push_back(&mut self, entry: Entry) {
        match self.inline.iter_mut().find(|e| e.is_none()) {
            Some(free) => *free = Some(entry),
            None => self.spilled.push_back(entry),
        }
    }

    /// Takes out the entry at `at` (in the order of [`iter`](Self::iter)).
    pub fn remove(&mut self, at: usize) -> Option<Entry> {
        let entry = if at >= INLINE {
            self.spilled.remove(at - INLINE)?
        } else {
            let entry = self.inline[at].take()?;
            // Close the gap: the later inline entries move up, the deque's first takes the last place.
            self.inline[at..].rotate_left(1);
            self.inline[INLINE - 1] = self.spilled.pop_front();
            entry
        };
        if self.spilled.is_empty() && self.spilled.capacity() != 0 {
            self.let_spilled_go();
        }
        Some(entry)
    }

    /// The key is back to its inline entries: its deque's heap block goes. Kept, every key that
    /// ever held more than [`INLINE`] rows at once would keep one while it has rows, and a
    /// long-running service meets more such keys as it goes: the index grew by about 2.4 KB/s at
    /// 10 k devices. The next burst allocates again (a small block, from the allocator's cache).
    #[cold]
    fn let_spilled_go(&mut self) {
        self.spilled = VecDeque::new();
    }

    /// Where the entry with `handle` is, in the order of [`iter`](Self::iter). Looks at the
    /// inline slots one by one before the deque: the row leaving is nearly always the first,
    /// and the iterator chain cost more than the lookup.
    pub fn position(&self, handle: RowHandle) -> Option<usize> {
        // Past the first empty inline slot the rest are empty too (module doc), so none matches.
        if let Some(at) = self.inline.iter().position(|e| e.as_ref().is_some_and(|e| e.handle == handle)) {
            return Some(at);
        }
        self.spilled.iter().position(|e| e.handle == handle).map(|at| at + INLINE)
    }

    pub fn get(&self, at: usize) -> Option<&Entry> {
        match at.checked_sub(INLINE) {
            None => self.inline[at].as_ref(),
            Some(at) => self.spilled.get(at),
        }
    }

    pub fn get_mut(&mut self, at: usize) -> Option<&mut Entry> {
        match at.checked_sub(INLINE) {
            None => self.inline[at].as_mut(),
            Some(at) => self.spilled.get_mut(at),
        }
    }

    /// The entries, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = &Entry> {
        self.inline.iter().map_while(Option::as_ref).chain(&self.spilled)
    }

    /// Calls `f` on each entry, oldest first: a loop over each part, where a chained iterator
    /// asked which part it was in at every step of a scan.
    pub fn for_each_mut(&mut self, mut f: impl FnMut(&mut Entry)) {
        for entry in self.inline.iter_mut().map_while(Option::as_mut) {
            f(entry);
        }
        self.spilled.iter_mut().for_each(f);
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::Entry;
    use super::*;

    fn entry(handle: u64) -> Entry {
        Entry::in_arena(handle, false, 0, handle as usize, 32)
    }

    fn handles(rows: &KeyRows) -> Vec<u64> {
        rows.iter().map(|e| e.handle).collect()
    }

    #[test]
    fn a_slot_holds_its_first_entries_and_takes_no_heap_for_them() {
        let mut rows = KeyRows::default();
        assert!(rows.is_empty());
        for h in 0..INLINE as u64 {
            rows.push_back(entry(h));
        }
        assert_eq!(rows.spilled_capacity(), 0, "no heap block for {INLINE} entries");
        assert_eq!(handles(&rows), (0..INLINE as u64).collect::<Vec<_>>());
    }

    proptest! {
        /// Any sequence of appends and removals (the first, or any) keeps the entries a deque
        /// would hold, in its order, and `get` agrees with `iter`.
        #[test]
        fn behaves_as_a_deque(ops in proptest::collection::vec((0u8..3, 0usize..8), 0..200)) {
            let (mut rows, mut model) = (KeyRows::default(), VecDeque::new());
            let mut next = 0u64;
            for (op, at) in ops {
                match op {
                    0 => {
                        rows.push_back(entry(next));
                        model.push_back(next);
                        next += 1;
                    }
                    1 => prop_assert_eq!(rows.remove(0).map(|e| e.handle), model.pop_front()),
                    _ => prop_assert_eq!(rows.remove(at).map(|e| e.handle), model.remove(at)),
                }
                prop_assert_eq!(handles(&rows), model.iter().copied().collect::<Vec<_>>());
                prop_assert_eq!(rows.is_empty(), model.is_empty());
                // A heap block only while the key holds more than its slot does.
                prop_assert_eq!(rows.spilled_capacity() != 0, model.len() > INLINE);
                for h in 0..next + 1 {
                    prop_assert_eq!(rows.position(h), model.iter().position(|&m| m == h));
                }
                for i in 0..model.len() + 1 {
                    prop_assert_eq!(rows.get(i).map(|e| e.handle), model.get(i).copied());
                }
                if let Some(last) = model.len().checked_sub(1) {
                    rows.get_mut(last).unwrap().set_matched(true);
                    let mut seen = Vec::new();
                    rows.for_each_mut(|e| seen.push((e.handle, e.matched())));
                    prop_assert_eq!(seen.iter().map(|s| s.0).collect::<Vec<_>>(), handles(&rows));
                    prop_assert_eq!(seen.last().map(|s| s.1), Some(true));
                    rows.get_mut(last).unwrap().set_matched(false);
                }
            }
        }
    }
}
