//! Spawned jobs waiting for a worker, FIFO, in a power-of-two ring of inline [`Job`] slots.
//!
//! A spawn writes its closure straight into the slot at the tail (no copy, no allocation
//! once the ring has grown to the high-water mark). The run queue carries one worker start
//! per queued job, in the same order, so a started worker's job is always this queue's
//! oldest, and jobs and resumes keep one FIFO order.
//!
//! # Contract
//! - [`JobQueue::pop`] hands out the address of the slot it just released. It stays valid,
//!   and its closure stays in place, until the next `push` or `drain`: the caller moves the
//!   closure out ([`Job::run`]) before anything can spawn.

use std::ptr::NonNull;

use crate::co::Co;
use crate::job::Job;
use crate::task::TaskId;

pub(crate) struct JobQueue {
    slots: Vec<Job>,
    /// `slots.len() - 1` (a power of two less one), kept rather than recomputed.
    mask: usize,
    head: usize,
    len: usize,
}

impl JobQueue {
    pub(crate) fn new() -> Self {
        JobQueue {
            slots: (0..64).map(|_| Job::empty()).collect(),
            mask: 63,
            head: 0,
            len: 0,
        }
    }

    /// Queues `f` as the job of coroutine `id`; returns whether it had to be boxed.
    #[inline(always)]
    pub(crate) fn push<F>(&mut self, id: TaskId, name: &'static str, f: F) -> bool
    where
        F: FnOnce(&Co<'_>) + 'static,
    {
        if self.len > self.mask {
            self.grow();
        }
        let tail = (self.head + self.len) & self.mask;
        self.len += 1;
        // SAFETY: masked by `len - 1` of a non-empty power-of-two ring: inside `slots`.
        unsafe { self.slots.get_unchecked_mut(tail) }.put(id, name, f)
    }

    /// The oldest job's slot, now released (see the module's contract).
    #[inline(always)]
    pub(crate) fn pop(&mut self) -> Option<NonNull<Job>> {
        if self.len == 0 {
            return None;
        }
        // SAFETY: `head` is always masked into the ring (see `push`).
        let job = NonNull::from(unsafe { self.slots.get_unchecked_mut(self.head) });
        self.head = (self.head + 1) & self.mask;
        self.len -= 1;
        Some(job)
    }

    /// Every queued job, oldest first; leaves the queue empty (shutdown drops them unrun).
    pub(crate) fn drain(&mut self) -> Vec<Job> {
        let cap = self.slots.len();
        let jobs = (0..self.len)
            .map(|i| std::mem::replace(&mut self.slots[(self.head + i) & (cap - 1)], Job::empty()))
            .collect();
        self.head = 0;
        self.len = 0;
        jobs
    }

    /// Doubles the ring, oldest job first. Jobs are plain values: moving them is sound.
    #[cold]
    #[inline(never)]
    fn grow(&mut self) {
        let cap = self.slots.len();
        let mut slots: Vec<Job> = (0..cap * 2).map(|_| Job::empty()).collect();
        for (i, slot) in slots.iter_mut().take(self.len).enumerate() {
            std::mem::swap(slot, &mut self.slots[(self.head + i) & (cap - 1)]);
        }
        self.slots = slots;
        self.mask = cap * 2 - 1;
        self.head = 0;
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::rc::Rc;

    use super::*;

    #[test]
    fn fifo_across_wrap_around_and_growth_and_drain_drops_unrun() {
        let ran = Rc::new(RefCell::new(Vec::new()));
        let mut q = JobQueue::new();
        let (mut next, mut expect) = (0u64, 0u64);
        for _ in 0..100 {
            for _ in 0..3 {
                let ran = ran.clone();
                let n = next;
                q.push(TaskId(n), "job", move |_: &Co<'_>| ran.borrow_mut().push(n));
                next += 1;
            }
            for _ in 0..2 {
                let job = q.pop().expect("queued");
                // SAFETY: the slot was just released and nothing pushed since; taking the
                // job out (and dropping it) empties the slot as running it would.
                let job = unsafe { std::ptr::replace(job.as_ptr(), Job::empty()) };
                // SAFETY: a local.
                assert_eq!(unsafe { Job::identity(&job) }.0, TaskId(expect));
                expect += 1;
            }
        }
        let left = q.drain();
        assert_eq!(left.len(), 100);
        assert!(left.iter().all(Job::is_pending));
        // SAFETY: a local.
        assert_eq!(unsafe { Job::identity(&left[0]) }.0, TaskId(expect));
        drop(left);
        assert!(q.pop().is_none());
        assert_eq!(Rc::strong_count(&ran), 1, "every closure was dropped");
        assert!(ran.borrow().is_empty(), "none ran");
    }
}
