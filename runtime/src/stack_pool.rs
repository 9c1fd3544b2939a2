//! A bounded pool of coroutine stacks, so that steady state maps nothing.
//!
//! Each stack is a corosensei [`DefaultStack`]: an anonymous mapping with a guard page below
//! it, so an overflow faults instead of corrupting memory. A finished coroutine gives its
//! stack back; the pool keeps at most `max_free` of them and unmaps the rest.

use std::io;

use corosensei::stack::DefaultStack;

use crate::counters::Counters;

pub(crate) struct StackPool {
    free: Vec<DefaultStack>,
    stack_size: usize,
    max_free: usize,
}

impl StackPool {
    pub(crate) fn new(stack_size: usize, max_free: usize) -> Self {
        StackPool {
            free: Vec::new(),
            stack_size,
            max_free,
        }
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

    /// Returns a stack whose coroutine has finished.
    pub(crate) fn give(&mut self, stack: DefaultStack) {
        if self.free.len() < self.max_free {
            self.free.push(stack);
        }
    }

    pub(crate) fn free_len(&self) -> usize {
        self.free.len()
    }
}
