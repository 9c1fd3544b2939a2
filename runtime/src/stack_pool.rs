//! A bounded pool of spare coroutine capacity, so that steady state maps nothing: idle
//! workers (whole coroutines, ready for their next job) and bare stacks.
//!
//! Each stack is a corosensei [`DefaultStack`]: an anonymous mapping with a guard page below
//! it, so an overflow faults instead of corrupting memory. A worker that finished its job
//! stays initialised and waits as an idle worker; a worker that panicked gives back only its
//! stack. Idle workers and bare stacks together stay within `max_free`; beyond it a worker is
//! ended and its stack unmapped.
//!
//! Every queued job has an idle worker promised to it (`reserved`), made at spawn time if
//! need be, so that a failure to map a stack is the spawn's error and the loop never has to
//! create a worker. A job that a running worker takes instead (chained) frees its promise.

use std::io;

use corosensei::stack::DefaultStack;

use crate::counters::Counters;

pub(crate) struct StackPool {
    free: Vec<DefaultStack>,
    /// Keys of idle workers, most recently idle last (its stack is the warmest).
    idle: Vec<usize>,
    /// Idle workers promised to queued jobs: never more than `idle.len()`.
    reserved: usize,
    stack_size: usize,
    max_free: usize,
}

impl StackPool {
    pub(crate) fn new(stack_size: usize, max_free: usize) -> Self {
        StackPool {
            free: Vec::new(),
            idle: Vec::new(),
            reserved: 0,
            stack_size,
            max_free,
        }
    }

    /// Promises an idle worker to a job being queued; `false` if none is free (then the
    /// caller makes one and [`StackPool::reserve_new`]s it).
    #[inline(always)]
    pub(crate) fn reserve(&mut self) -> bool {
        if self.idle.len() > self.reserved {
            self.reserved += 1;
            true
        } else {
            false
        }
    }

    /// Adds the new worker of `key`, promised to a job being queued.
    pub(crate) fn reserve_new(&mut self, key: usize) {
        self.idle.push(key);
        self.reserved += 1;
    }

    /// The key of the promised idle worker a job marker just left the run queue for.
    #[inline(always)]
    pub(crate) fn pop_reserved(&mut self) -> usize {
        debug_assert!(self.reserved > 0, "a queued job has a worker promised");
        self.reserved -= 1;
        self.idle.pop().expect("a promised worker is idle")
    }

    /// Frees the promise of a job that a running worker took (chained).
    #[inline(always)]
    pub(crate) fn unreserve(&mut self) {
        self.reserved -= 1;
    }

    /// Puts the worker of `key`, whose job returned, back among the idle ones.
    #[inline(always)]
    pub(crate) fn park_idle(&mut self, key: usize) {
        self.idle.push(key);
    }

    /// Whether an idle worker that nothing is promised should be ended: the pool is over
    /// its bound.
    #[inline(always)]
    pub(crate) fn over_bound(&self) -> bool {
        self.len() > self.max_free && self.idle.len() > self.reserved
    }

    /// An idle worker's key to end (see [`StackPool::over_bound`]).
    pub(crate) fn pop_unreserved(&mut self) -> Option<usize> {
        if self.idle.len() > self.reserved {
            self.idle.pop()
        } else {
            None
        }
    }

    /// Every idle worker's key; leaves none (shutdown).
    pub(crate) fn drain_idle(&mut self) -> Vec<usize> {
        self.reserved = 0;
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

    /// Idle workers plus bare stacks.
    pub(crate) fn len(&self) -> usize {
        self.free.len() + self.idle.len()
    }
}
