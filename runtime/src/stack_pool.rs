//! A bounded pool of spare coroutine capacity, so that steady state maps nothing: idle
//! workers (whole coroutines, ready for their next job) and bare stacks.
//!
//! Each stack is a corosensei [`DefaultStack`]: an anonymous mapping with a guard page below
//! it, so an overflow faults instead of corrupting memory. A worker that finished its job
//! stays initialised and waits as an idle worker; a worker that panicked gives back only its
//! stack. Idle workers and bare stacks together stay within `max_free`; beyond it a worker is
//! ended and its stack unmapped.
//!
//! A spawn promises itself an idle worker (or makes one and promises it), so that a failure
//! to map a stack is the spawn's error; the promise is a count, not a key taken out: the
//! loop claims an idle worker only when it reaches the start entry, and a job that a
//! finished worker runs in place (chained) just drops its promise, the promised worker
//! never leaving the pool. Promised workers are not spare: they do not count against the
//! bound, and are never ended to trim the pool.

use std::io;

use corosensei::stack::DefaultStack;

use crate::counters::Counters;

pub(crate) struct StackPool {
    free: Vec<DefaultStack>,
    /// Keys of idle workers, most recently idle last (its stack is the warmest).
    idle: Vec<usize>,
    /// Idle workers not promised to a queued start entry (at most `idle.len()`): what a
    /// spawn checks and takes, one counter instead of a promised count compared with
    /// `idle.len()`. Zero for good once the pool is closed, which is how a spawn learns
    /// that the loop is shutting down without a check of its own (see `close`).
    spare: usize,
    stack_size: usize,
    max_free: usize,
    #[cfg(debug_assertions)]
    closed: bool,
}

impl StackPool {
    pub(crate) fn new(stack_size: usize, max_free: usize) -> Self {
        StackPool {
            free: Vec::new(),
            idle: Vec::new(),
            spare: 0,
            stack_size,
            max_free,
            #[cfg(debug_assertions)]
            closed: false,
        }
    }

    /// Promises an idle worker to a spawn, if one is spare: a pooled spawn. Never once the
    /// pool is closed.
    #[inline(always)]
    pub(crate) fn promise(&mut self) -> bool {
        // Decremented first, and put back on the rare path where none was spare: the
        // pooled spawn is then one decrement in place and a branch on its borrow.
        let (left, none) = self.spare.overflowing_sub(1);
        self.spare = left;
        if none {
            self.spare = 0;
        }
        !none
    }

    /// The key of a promised idle worker, for the start entry the loop has reached.
    #[inline(always)]
    pub(crate) fn claim(&mut self) -> usize {
        debug_assert!(self.idle.len() > self.spare);
        self.idle.pop().expect("a promised worker is idle")
    }

    /// Drops a promise: a finished worker ran the job in place, and the promised one stays
    /// idle, spare again.
    #[inline(always)]
    pub(crate) fn kept(&mut self) {
        debug_assert!(self.idle.len() > self.spare);
        self.spare += 1;
    }

    /// Puts the worker of `key` back among the idle ones, spare (its job returned).
    #[inline(always)]
    pub(crate) fn park_idle(&mut self, key: usize) {
        #[cfg(debug_assertions)]
        debug_assert!(!self.closed, "nothing parks after shutdown");
        self.idle.push(key);
        self.spare += 1;
    }

    /// Puts the worker of `key`, just made, among the idle ones, promised to the spawn
    /// that made it.
    pub(crate) fn park_promised(&mut self, key: usize) {
        self.idle.push(key);
    }

    /// Idle workers promised to queued start entries: one per queued start.
    pub(crate) fn promised(&self) -> usize {
        self.idle.len() - self.spare
    }

    /// Whether idle workers should be ended: the pool is over its bound.
    #[inline(always)]
    pub(crate) fn over_bound(&self) -> bool {
        self.len() > self.max_free
    }

    /// A spare idle worker to end while the pool is over its bound (never a promised one).
    pub(crate) fn pop_over_bound(&mut self) -> Option<usize> {
        if !self.over_bound() || self.spare == 0 {
            return None;
        }
        self.spare -= 1;
        self.idle.pop()
    }

    /// Closes the pool (shutdown): no spare worker ever again, so that every later spawn
    /// takes the slow path, which refuses it.
    pub(crate) fn close(&mut self) {
        #[cfg(debug_assertions)]
        {
            self.closed = true;
        }
        self.spare = 0;
    }

    /// Every idle worker's key, promised or not, to be ended; leaves none (shutdown).
    pub(crate) fn take_idle(&mut self) -> Vec<usize> {
        debug_assert_eq!(self.spare, 0, "closed first");
        std::mem::take(&mut self.idle)
    }

    /// A stack from the pool, or a freshly mapped one when the pool is empty.
    pub(crate) fn take(&mut self, counters: &Counters) -> io::Result<DefaultStack> {
        if let Some(stack) = self.free.pop() {
            counters.stacks_reused.bump();
            return Ok(stack);
        }
        let stack = DefaultStack::new(self.stack_size)?;
        counters.stacks_allocated.bump();
        Ok(stack)
    }

    /// Returns the stack of a worker that ended.
    pub(crate) fn give(&mut self, stack: DefaultStack) {
        if self.len() < self.max_free {
            self.free.push(stack);
        }
    }

    /// Spare idle workers (not promised), plus bare stacks.
    pub(crate) fn len(&self) -> usize {
        self.free.len() + self.spare
    }
}

#[cfg(test)]
mod tests {
    use super::StackPool;

    #[test]
    fn promised_workers_are_neither_spare_nor_trimmed() {
        let mut pool = StackPool::new(16 * 1024, 1);
        assert!(!pool.promise(), "no idle worker to promise");
        for key in 0..3 {
            pool.park_idle(key);
        }
        pool.park_promised(9);
        assert_eq!(pool.len(), 3, "a worker made for a spawn is not spare");
        assert!(pool.promise() && pool.promise());
        assert_eq!(pool.len(), 1, "one idle worker is spare");
        assert_eq!(pool.pop_over_bound(), None, "at the bound");
        pool.park_idle(3);
        // Over the bound by one: one unpromised worker ends, never a promised one.
        assert!(pool.pop_over_bound().is_some());
        assert_eq!(pool.pop_over_bound(), None);
        assert!(pool.promise(), "the last spare worker");
        assert!(!pool.promise());
        pool.kept();
        let claimed = [pool.claim(), pool.claim(), pool.claim()];
        assert_eq!((claimed.len(), pool.len()), (3, 1));
        pool.close();
        assert_eq!(pool.take_idle().len(), 1);
        assert_eq!(pool.len(), 0);
        assert!(!pool.promise(), "a closed pool promises nothing");
    }
}
