//! The run queue: ready coroutines as `(key, resume value)`, FIFO, in a power-of-two ring,
//! and the boundary of the loop's current turn.
//!
//! `VecDeque` does the same for any capacity, and pays for it on every push and pop (about
//! 20 instructions for the pair, measured with callgrind in `spawn_pooled`); here the
//! wrap-around is a mask, and indexing skips the bounds check the mask makes redundant.
//!
//! Positions count every entry ever pushed or popped (they never wrap in practice: 2^64),
//! and are masked only to index the ring. A turn is the entries pushed before it began:
//! [`RunQueue::start_turn`] records the tail, and an entry is in the turn while the head is
//! below that mark. The loop and a worker that chains a job both pop against the same mark,
//! so the turn's end needs no counter kept in step.

pub(crate) struct RunQueue {
    slots: Vec<(usize, i32)>,
    /// `slots.len() - 1` (a power of two less one), kept rather than recomputed.
    mask: usize,
    head: usize,
    tail: usize,
    turn_end: usize,
}

impl RunQueue {
    pub(crate) fn new() -> Self {
        RunQueue {
            slots: vec![(0, 0); 64],
            mask: 63,
            head: 0,
            tail: 0,
            turn_end: 0,
        }
    }

    #[inline(always)]
    pub(crate) fn len(&self) -> usize {
        self.tail - self.head
    }

    #[inline(always)]
    pub(crate) fn is_empty(&self) -> bool {
        self.tail == self.head
    }

    #[inline(always)]
    pub(crate) fn push_back(&mut self, entry: (usize, i32)) {
        if self.len() > self.mask {
            self.grow();
        }
        let at = self.tail & self.mask;
        // SAFETY: masked by `len - 1` of a non-empty power-of-two ring: inside `slots`.
        unsafe { *self.slots.get_unchecked_mut(at) = entry };
        self.tail += 1;
    }

    /// The entry at `position` (one of those queued).
    #[inline(always)]
    fn at(&self, position: usize) -> (usize, i32) {
        debug_assert!((self.head..self.tail).contains(&position));
        // SAFETY: masked into the ring (see `push_back`).
        unsafe { *self.slots.get_unchecked(position & self.mask) }
    }

    /// The oldest entry (it must exist).
    #[inline(always)]
    fn front(&self) -> (usize, i32) {
        self.at(self.head)
    }

    #[cfg(test)]
    pub(crate) fn pop_front(&mut self) -> Option<(usize, i32)> {
        if self.is_empty() {
            return None;
        }
        let entry = self.front();
        self.head += 1;
        Some(entry)
    }

    /// Starts a turn: the entries queued now.
    #[inline(always)]
    pub(crate) fn start_turn(&mut self) {
        self.turn_end = self.tail;
    }

    /// Whether entries of the current turn are left.
    #[inline(always)]
    pub(crate) fn in_turn(&self) -> bool {
        self.head < self.turn_end
    }

    /// Pops the oldest entry if it belongs to the current turn.
    #[inline(always)]
    pub(crate) fn pop_in_turn(&mut self) -> Option<(usize, i32)> {
        self.pop_in_turn_if(|_| true)
    }

    /// Pops the oldest entry if it belongs to the current turn and `want` holds for it.
    #[inline(always)]
    pub(crate) fn pop_in_turn_if(
        &mut self,
        want: impl FnOnce((usize, i32)) -> bool,
    ) -> Option<(usize, i32)> {
        if !self.in_turn() {
            return None;
        }
        let entry = self.front();
        if !want(entry) {
            return None;
        }
        self.head += 1;
        Some(entry)
    }

    /// The key of the entry `distance` places behind the oldest, if there is one.
    #[inline(always)]
    pub(crate) fn key_ahead(&self, distance: usize) -> Option<usize> {
        if distance >= self.len() {
            return None;
        }
        Some(self.at(self.head + distance).0)
    }

    /// The keys of the queued entries whose resume value is `value`, oldest first.
    pub(crate) fn keys_with(&self, value: i32) -> Vec<usize> {
        let mask = self.mask;
        let entries = (self.head..self.tail).map(|i| self.slots[i & mask]);
        entries.filter(|e| e.1 == value).map(|e| e.0).collect()
    }

    pub(crate) fn clear(&mut self) {
        self.head = 0;
        self.tail = 0;
        self.turn_end = 0;
    }

    /// Doubles the ring, oldest entry first (positions restart at 0; the turn's mark moves
    /// with them).
    #[cold]
    #[inline(never)]
    fn grow(&mut self) {
        let cap = self.slots.len();
        let len = self.len();
        let mut slots = Vec::with_capacity(cap * 2);
        slots.extend((self.head..self.tail).map(|i| self.slots[i & (cap - 1)]));
        slots.resize(cap * 2, (0, 0));
        self.slots = slots;
        self.mask = cap * 2 - 1;
        self.turn_end = self.turn_end.saturating_sub(self.head).min(len);
        self.head = 0;
        self.tail = len;
    }
}

#[cfg(test)]
mod tests {
    use super::RunQueue;

    #[test]
    fn fifo_across_wrap_around_and_growth() {
        let mut q = RunQueue::new();
        let mut next = 0;
        let mut expect = 0;
        // Push 3, pop 2, so the ring wraps and then grows while wrapped.
        for _ in 0..200 {
            for _ in 0..3 {
                q.push_back((next, next as i32));
                next += 1;
            }
            for _ in 0..2 {
                assert_eq!(q.pop_front(), Some((expect, expect as i32)));
                expect += 1;
            }
        }
        assert_eq!(q.len(), 200);
        while let Some(e) = q.pop_front() {
            assert_eq!(e, (expect, expect as i32));
            expect += 1;
        }
        assert_eq!(expect, next);
        assert!(q.is_empty());
    }

    #[test]
    fn a_turn_is_the_entries_queued_when_it_started_even_across_growth() {
        let mut q = RunQueue::new();
        for i in 0..50 {
            q.push_back((i, 0));
        }
        for _ in 0..40 {
            q.pop_front();
        }
        q.start_turn();
        // Entries pushed during the turn, enough to grow the ring, are not in it.
        for i in 50..200 {
            q.push_back((i, 0));
        }
        let turn: Vec<usize> = std::iter::from_fn(|| q.pop_in_turn())
            .map(|e| e.0)
            .collect();
        assert_eq!(turn, (40..50).collect::<Vec<_>>());
        assert_eq!(q.pop_in_turn_if(|_| true), None);
        q.start_turn();
        assert_eq!(q.pop_in_turn_if(|(key, _)| key == 50), Some((50, 0)));
        assert_eq!(q.pop_in_turn_if(|(key, _)| key == 50), None);
        assert_eq!(q.len(), 149);
        q.push_back((7, -1));
        assert_eq!(q.keys_with(-1), [7]);
    }

    #[test]
    fn key_ahead_looks_past_the_oldest_across_wrap_around() {
        let mut q = RunQueue::new();
        for i in 0..60 {
            q.push_back((i, 0));
        }
        for _ in 0..50 {
            q.pop_front();
        }
        // 10 left at positions 50..60; push past the ring's end (64) without growing.
        for i in 60..100 {
            q.push_back((i, 0));
        }
        assert_eq!(q.key_ahead(0), Some(50));
        assert_eq!(q.key_ahead(20), Some(70));
        assert_eq!(q.key_ahead(49), Some(99));
        assert_eq!(q.key_ahead(50), None);
    }
}
