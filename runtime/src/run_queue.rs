//! The run queue: ready coroutines as `(key, resume value)`, FIFO, in a power-of-two ring.
//!
//! `VecDeque` does the same for any capacity, and pays for it on every push and pop (about
//! 20 instructions for the pair, measured with callgrind in `spawn_pooled`); here the
//! wrap-around is a mask, and indexing skips the bounds check the mask makes redundant.

pub(crate) struct RunQueue {
    slots: Vec<(usize, i32)>,
    head: usize,
    len: usize,
}

impl RunQueue {
    pub(crate) fn new() -> Self {
        RunQueue {
            slots: vec![(0, 0); 64],
            head: 0,
            len: 0,
        }
    }

    #[inline(always)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    #[inline(always)]
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[inline(always)]
    pub(crate) fn push_back(&mut self, entry: (usize, i32)) {
        if self.len == self.slots.len() {
            self.grow();
        }
        let tail = (self.head + self.len) & (self.slots.len() - 1);
        // SAFETY: masked by `len - 1` of a non-empty power-of-two ring: inside `slots`.
        unsafe { *self.slots.get_unchecked_mut(tail) = entry };
        self.len += 1;
    }

    #[inline(always)]
    pub(crate) fn pop_front(&mut self) -> Option<(usize, i32)> {
        if self.len == 0 {
            return None;
        }
        // SAFETY: `head` is always masked into the ring (see `push_back`).
        let entry = unsafe { *self.slots.get_unchecked(self.head) };
        self.head = (self.head + 1) & (self.slots.len() - 1);
        self.len -= 1;
        Some(entry)
    }

    /// Pops the oldest entry if `want` holds for it; returns whether it did.
    #[inline(always)]
    pub(crate) fn pop_front_if(&mut self, want: impl FnOnce((usize, i32)) -> bool) -> bool {
        // SAFETY: `head` is always masked into the ring (see `push_back`).
        let take = self.len > 0 && want(unsafe { *self.slots.get_unchecked(self.head) });
        if take {
            self.head = (self.head + 1) & (self.slots.len() - 1);
            self.len -= 1;
        }
        take
    }

    pub(crate) fn clear(&mut self) {
        self.head = 0;
        self.len = 0;
    }

    /// Doubles the ring, oldest entry first.
    #[cold]
    #[inline(never)]
    fn grow(&mut self) {
        let cap = self.slots.len();
        let mut slots = Vec::with_capacity(cap * 2);
        slots.extend((0..self.len).map(|i| self.slots[(self.head + i) & (cap - 1)]));
        slots.resize(cap * 2, (0, 0));
        self.slots = slots;
        self.head = 0;
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
}
