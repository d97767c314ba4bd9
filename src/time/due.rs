//! A min-queue of timers that mostly arrive in the order they fall due.
//!
//! An operator's timers (a stored row's last chance, a window's end) are pushed as rows arrive:
//! within one input, nearly always in due order, since rows arrive nearly in event-time order and
//! a timer is the row's time plus that input's constant. A binary heap pays a sift of log n
//! comparisons per pop for an order that was there already; the profile of the interval join
//! over ring frames put a fifth of its time in `BinaryHeap::pop`.
//!
//! So each *lane* (an operator's input) keeps a queue of the timers that came in order, and a
//! heap takes only those that did not (a row out of order). The first due is the least of the
//! lanes' fronts and the heap's top: pops come in exactly the order one heap would give, so
//! whatever an operator emits at a watermark keeps its order, and in-order timers cost O(1).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use crate::state::spare_capacity_released;

pub struct DueQueue<T, const LANES: usize> {
    /// Per lane, timers in due order (each pushed no earlier than the one before it). An array,
    /// not a `Vec`: the look at every lane's front on each pop is unrolled, with no bounds to load.
    lanes: [VecDeque<T>; LANES],
    /// Timers that arrived before one already queued in their lane.
    out_of_order: BinaryHeap<Reverse<T>>,
}

/// Where the first due timer waits.
#[derive(Clone, Copy)]
enum Place {
    Lane(usize),
    OutOfOrder,
}

impl<T: Ord, const LANES: usize> Default for DueQueue<T, LANES> {
    fn default() -> Self {
        DueQueue::new()
    }
}

impl<T: Ord, const LANES: usize> DueQueue<T, LANES> {
    pub fn new() -> DueQueue<T, LANES> {
        DueQueue { lanes: std::array::from_fn(|_| VecDeque::new()), out_of_order: BinaryHeap::new() }
    }

    /// Queues `timer` in `lane` (< `LANES`). Inlined: an operator pushes a timer for every row
    /// it stores, and the call cost a quarter of the push.
    #[inline(always)]
    pub fn push(&mut self, lane: usize, timer: T) {
        let queue = &mut self.lanes[lane];
        if queue.back().is_none_or(|last| *last <= timer) {
            queue.push_back(timer);
        } else {
            self.out_of_order.push(Reverse(timer));
        }
    }

    /// The first timer to fall due.
    pub fn peek(&self) -> Option<&T> {
        self.first().map(|(_, timer)| timer)
    }

    pub fn pop(&mut self) -> Option<T> {
        self.pop_if(|_| true)
    }

    /// Pops the first timer if `due` says it is (one look for the first, where `peek` then `pop`
    /// would take two). Inlined: an operator pops in a loop, one more call per watermark than
    /// timers due, and the call cost as much as the look.
    #[inline]
    pub fn pop_if(&mut self, due: impl FnOnce(&T) -> bool) -> Option<T> {
        let (place, first) = self.first()?;
        if !due(first) {
            return None;
        }
        match place {
            Place::Lane(lane) => self.lanes[lane].pop_front(),
            Place::OutOfOrder => self.out_of_order.pop().map(|Reverse(timer)| timer),
        }
    }

    // A plain loop: it runs once per pop and per peek (an iterator chain took 9 % of the join).
    fn first(&self) -> Option<(Place, &T)> {
        let mut first = self.out_of_order.peek().map(|Reverse(t)| (Place::OutOfOrder, t));
        for (i, lane) in self.lanes.iter().enumerate() {
            if let Some(t) = lane.front()
                && first.is_none_or(|(_, f)| t < f)
            {
                first = Some((Place::Lane(i), t));
            }
        }
        first
    }

    pub fn len(&self) -> usize {
        self.lanes.iter().map(VecDeque::len).sum::<usize>() + self.out_of_order.len()
    }

    /// Gives back the room that a burst of timers left behind (state/mod.rs,
    /// [`spare_capacity_released`]).
    pub fn release_spare_capacity(&mut self) {
        for lane in &mut self.lanes {
            if let Some(capacity) = spare_capacity_released(lane.capacity(), lane.len()) {
                lane.shrink_to(capacity);
            }
        }
        if let Some(capacity) = spare_capacity_released(self.out_of_order.capacity(), self.out_of_order.len()) {
            self.out_of_order.shrink_to(capacity);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every queued timer, in no order.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.lanes.iter().flatten().chain(self.out_of_order.iter().map(|Reverse(t)| t))
    }

    /// Keeps the timers `keep` says yes to (dropping from a lane keeps it in order).
    pub fn retain(&mut self, mut keep: impl FnMut(&T) -> bool) {
        for lane in &mut self.lanes {
            lane.retain(&mut keep);
        }
        self.out_of_order.retain(|Reverse(t)| keep(t));
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Pops come in the order of one binary heap of all the timers, whatever the lanes and
        /// however out of order they were pushed, with pushes and pops interleaved.
        #[test]
        fn pops_in_the_order_of_one_heap(ops in prop::collection::vec((0usize..3, 0i64..40, any::<bool>()), 0..300)) {
            let mut queue: DueQueue<(i64, usize), 3> = DueQueue::new();
            let mut heap: BinaryHeap<Reverse<(i64, usize)>> = BinaryHeap::new();
            for (seq, (lane, due, pop)) in ops.into_iter().enumerate() {
                if pop {
                    let limit = (seq as i64) - 10;
                    let expected = heap.peek().filter(|Reverse(t)| t.0 < limit).map(|Reverse(t)| *t);
                    prop_assert_eq!(queue.pop_if(|t: &(i64, usize)| t.0 < limit), expected);
                    if expected.is_some() {
                        heap.pop();
                    } else {
                        prop_assert_eq!(queue.pop(), heap.pop().map(|Reverse(t)| t));
                    }
                } else {
                    // Mostly in order per lane: the due grows with seq, with some disorder.
                    let timer = (seq as i64 + due - 20, seq);
                    queue.push(lane, timer);
                    heap.push(Reverse(timer));
                }
                prop_assert_eq!(queue.len(), heap.len());
                prop_assert_eq!(queue.peek(), heap.peek().map(|Reverse(t)| t));
            }
            let mut rest = Vec::new();
            queue.retain(|t| t.1 % 2 == 0);
            while let Some(t) = queue.pop() {
                rest.push(t);
            }
            let mut expected: Vec<_> = heap.into_iter().map(|Reverse(t)| t).filter(|t| t.1 % 2 == 0).collect();
            expected.sort();
            prop_assert_eq!(rest, expected);
        }
    }

    #[test]
    fn in_order_timers_never_touch_the_heap() {
        let mut queue: DueQueue<_, 2> = DueQueue::new();
        for t in 0..100 {
            queue.push(t % 2, t);
        }
        assert!(queue.out_of_order.is_empty());
        queue.push(0, 5);
        assert_eq!(queue.out_of_order.len(), 1);
        let popped: Vec<_> = std::iter::from_fn(|| queue.pop()).take(8).collect();
        assert_eq!(popped, [0, 1, 2, 3, 4, 5, 5, 6]);
    }

    #[test]
    fn room_left_by_a_burst_is_given_back_and_order_kept() {
        let mut queue: DueQueue<_, 2> = DueQueue::new();
        for t in 0..100_000 {
            queue.push(t % 2, t);
        }
        queue.push(0, 7); // out of order
        let popped: Vec<_> = std::iter::from_fn(|| queue.pop_if(|&t| t < 99_990)).collect();
        assert_eq!(popped.len(), 99_991);
        queue.release_spare_capacity();
        assert!(queue.lanes.iter().all(|lane| lane.capacity() < 8192), "room for 5 kept, not for 50 000");
        let rest: Vec<_> = std::iter::from_fn(|| queue.pop()).collect();
        assert_eq!(rest, (99_990..100_000).collect::<Vec<_>>());
    }
}
