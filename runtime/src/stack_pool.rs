//! A bounded pool of spare coroutine capacity, so that steady state maps nothing: idle
//! workers (whole coroutines, ready for their next job) and bare stacks.
//!
//! Each stack is a corosensei [`DefaultStack`]: an anonymous mapping with a guard page below
//! it, so an overflow faults instead of corrupting memory. A worker that finished its job
//! stays initialised and waits as an idle worker; a worker that panicked gives back only its
//! stack. Idle workers and bare stacks together stay within `max_free`; beyond it a worker is
//! ended and its stack unmapped.
//!
//! A spawn takes its worker out of the pool (or makes one), so that a failure to map a
//! stack is the spawn's error; a worker whose job another worker ran instead (chained)
//! comes back without having run.

use std::io;

use corosensei::stack::DefaultStack;

use crate::counters::Counters;

pub(crate) struct StackPool {
    free: Vec<DefaultStack>,
    /// Keys of idle workers, most recently idle last (its stack is the warmest).
    idle: Vec<usize>,
    stack_size: usize,
    max_free: usize,
}

impl StackPool {
    pub(crate) fn new(stack_size: usize, max_free: usize) -> Self {
        StackPool {
            free: Vec::new(),
            idle: Vec::new(),
            stack_size,
            max_free,
        }
    }

    /// The key of an idle worker, if there is one: a pooled spawn.
    #[inline(always)]
    pub(crate) fn pop_idle(&mut self) -> Option<usize> {
        self.idle.pop()
    }

    /// Puts the worker of `key` back among the idle ones (its job returned, or another
    /// worker ran the job it was for).
    #[inline(always)]
    pub(crate) fn park_idle(&mut self, key: usize) {
        self.idle.push(key);
    }

    /// Whether idle workers should be ended: the pool is over its bound.
    #[inline(always)]
    pub(crate) fn over_bound(&self) -> bool {
        self.len() > self.max_free
    }

    /// Every idle worker's key; leaves none (shutdown).
    pub(crate) fn drain_idle(&mut self) -> Vec<usize> {
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
