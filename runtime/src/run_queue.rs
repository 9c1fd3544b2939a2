//! The run queue: ready coroutines as `(key, resume value)`, FIFO, in a power-of-two ring,
//! the jobs of spawned coroutines waiting to start, and the boundary of the loop's current
//! turn.
//!
//! One queue for resumes and starts: a spawn pushes a start entry ([`START`], no key: any
//! idle worker may take it) and writes its [`Job`] into the job slot at the same index, so
//! starts and resumes keep one FIFO order with one head and one tail. Job slots are
//! uninitialised except under queued start entries; a start entry's job is taken out as
//! the entry is popped (by the loop, for the worker it resumes, or by a worker chaining it).
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
//!
//! # Contract
//! A popped start entry's job stays in its slot, untouched, until the next push: the worker
//! that takes it ([`RunQueue::started_job`], [`RunQueue::pop_start_in_turn`]) reads it out
//! ([`Job::run`]) before anything can spawn.

use std::mem::MaybeUninit;
use std::ptr::NonNull;

use crate::co::Co;
use crate::job::{Job, PendingJob};
use crate::task::TaskId;
use crate::worker::START;

pub(crate) struct RunQueue {
    slots: Vec<(usize, i32)>,
    /// The job of each queued start entry, at its entry's index (see the module's contract).
    jobs: Box<[MaybeUninit<Job>]>,
    /// `slots.len() - 1` (a power of two less one), kept rather than recomputed.
    mask: usize,
    head: usize,
    tail: usize,
    turn_end: usize,
    /// `head + mask`: the ring is full when `tail` passes it. Kept beside the head (one
    /// more increment per pop), so that a push tests one load against the tail instead of
    /// computing the length (three fewer instructions per push).
    full_at: usize,
}

impl RunQueue {
    pub(crate) fn new() -> Self {
        RunQueue {
            slots: vec![(0, 0); 64],
            jobs: Box::new_uninit_slice(64),
            mask: 63,
            head: 0,
            tail: 0,
            turn_end: 0,
            full_at: 63,
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

    /// Whether the ring is full: `len() > mask`.
    #[inline(always)]
    fn full(&self) -> bool {
        debug_assert_eq!(self.full_at, self.head + self.mask);
        self.tail > self.full_at
    }

    /// Moves the head one entry on (a pop).
    #[inline(always)]
    fn advance(&mut self) {
        self.head += 1;
        self.full_at += 1;
    }

    #[inline(always)]
    pub(crate) fn push_back(&mut self, entry: (usize, i32)) {
        if self.full() {
            self.grow();
        }
        let at = self.tail & self.mask;
        // SAFETY: masked by `len - 1` of a non-empty power-of-two ring: inside `slots`.
        unsafe { *self.slots.get_unchecked_mut(at) = entry };
        self.tail += 1;
    }

    /// Queues the start of a job: `f`, as the job of coroutine `id` called `name`; returns
    /// whether `f` had to be boxed.
    #[inline(always)]
    pub(crate) fn push_start<F>(&mut self, id: TaskId, name: &'static str, f: F) -> bool
    where
        F: FnOnce(&Co<'_>) + 'static,
    {
        if self.full() {
            self.grow();
        }
        let at = self.tail & self.mask;
        // SAFETY: masked into both rings (see `push_back`); the job slot under an entry
        // that is not queued holds no job. A start's key is never read: only its value is
        // written.
        let boxed = unsafe {
            self.slots.get_unchecked_mut(at).1 = START;
            Job::write(self.jobs.get_unchecked_mut(at).as_mut_ptr(), id, name, f)
        };
        self.tail += 1;
        boxed
    }

    /// The job of the start entry the loop has just popped, for the worker it resumes.
    #[inline(always)]
    pub(crate) fn started_job(&mut self) -> NonNull<Job> {
        debug_assert!(self.head > 0 && self.at_raw(self.head - 1).1 == START);
        self.job_at(self.head - 1)
    }

    /// Pops the oldest entry if it belongs to the current turn and starts a job: that job,
    /// for the worker whose job just returned.
    #[inline(always)]
    pub(crate) fn pop_start_in_turn(&mut self) -> Option<NonNull<Job>> {
        if !self.in_turn() || self.front().1 != START {
            return None;
        }
        self.advance();
        Some(self.job_at(self.head - 1))
    }

    /// The job slot at `position` (that of a start entry, queued or just popped).
    #[inline(always)]
    fn job_at(&mut self, position: usize) -> NonNull<Job> {
        // SAFETY: masked into the ring; a pointer into the live boxed slice is not null.
        unsafe {
            let slot = self.jobs.get_unchecked_mut(position & self.mask);
            NonNull::new_unchecked(slot.as_mut_ptr())
        }
    }

    /// The entry at `position`, queued or not.
    #[inline(always)]
    fn at_raw(&self, position: usize) -> (usize, i32) {
        // SAFETY: masked into the ring (see `push_back`).
        unsafe { *self.slots.get_unchecked(position & self.mask) }
    }

    /// The entry at `position` (one of those queued).
    #[inline(always)]
    fn at(&self, position: usize) -> (usize, i32) {
        debug_assert!((self.head..self.tail).contains(&position));
        self.at_raw(position)
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
        self.advance();
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
        self.advance();
        Some(entry)
    }

    /// The key of the entry `distance` places behind the oldest, if there is one. A start
    /// entry's key is stale (whatever key that ring slot last held, or 0): a valid key,
    /// whose stack a prefetch warms for nothing, which costs less than telling starts
    /// apart on every resume of a long queue.
    #[inline(always)]
    pub(crate) fn key_ahead(&self, distance: usize) -> Option<usize> {
        if distance >= self.len() {
            return None;
        }
        Some(self.at(self.head + distance).0)
    }

    /// Empties the queue; returns the jobs of its start entries, oldest first, to be dropped
    /// unrun (shutdown).
    pub(crate) fn drain(&mut self) -> Vec<PendingJob> {
        let starts: Vec<usize> = (self.head..self.tail)
            .filter(|&i| self.at(i).1 == START)
            .collect();
        let jobs = starts
            .into_iter()
            // SAFETY: the slot of a queued start entry holds its job; the queue is emptied
            // below, so it is taken out once.
            .map(|i| unsafe { Job::take(self.job_at(i).as_ptr()) })
            .collect();
        self.head = 0;
        self.tail = 0;
        self.turn_end = 0;
        self.full_at = self.mask;
        jobs
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
        let mut jobs = Box::new_uninit_slice(cap * 2);
        for (to, from) in (self.head..self.tail).enumerate() {
            // SAFETY: both indices are inside their rings; a job is plain bytes (moving it
            // is sound), and an uninitialised slot copies as such.
            unsafe {
                let from = self.jobs.get_unchecked(from & (cap - 1)).as_ptr();
                std::ptr::copy_nonoverlapping(from, jobs.get_unchecked_mut(to).as_mut_ptr(), 1);
            }
        }
        self.slots = slots;
        self.jobs = jobs;
        self.mask = cap * 2 - 1;
        self.turn_end = self.turn_end.saturating_sub(self.head).min(len);
        self.head = 0;
        self.tail = len;
        self.full_at = self.mask;
    }
}

impl Drop for RunQueue {
    /// Drops the jobs still queued, unrun (shutdown has normally drained them already).
    fn drop(&mut self) {
        drop(self.drain());
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::rc::Rc;

    use super::{RunQueue, START};
    use crate::co::Co;
    use crate::job::Job;
    use crate::task::TaskId;

    /// Queues a start whose job records `n` when dropped unrun.
    fn start(q: &mut RunQueue, n: u64, dropped: &Rc<RefCell<Vec<u64>>>) {
        let witness = Dropped(n, dropped.clone());
        q.push_start(TaskId(n), "job", move |_: &Co<'_>| drop(witness));
    }

    struct Dropped(u64, Rc<RefCell<Vec<u64>>>);

    impl Drop for Dropped {
        fn drop(&mut self) {
            self.1.borrow_mut().push(self.0);
        }
    }

    #[test]
    fn starts_and_resumes_keep_one_order_across_wrap_around_and_growth() {
        let dropped = Rc::new(RefCell::new(Vec::new()));
        let mut q = RunQueue::new();
        let (mut next, mut expect) = (0u64, 0u64);
        // Push 3, pop 2: the ring wraps, then grows while wrapped; every third is a start.
        for _ in 0..100 {
            for _ in 0..3 {
                if next % 3 == 0 {
                    start(&mut q, next, &dropped);
                } else {
                    q.push_back((next as usize, 0));
                }
                next += 1;
            }
            q.start_turn();
            for _ in 0..2 {
                if expect % 3 == 0 {
                    let job = q.pop_start_in_turn().expect("a start is next");
                    // SAFETY: just popped, nothing pushed since; taken out once.
                    let job = unsafe { Job::take(job.as_ptr()) };
                    assert_eq!(job.identity().0, TaskId(expect));
                } else {
                    assert_eq!(q.pop_start_in_turn(), None, "a resume is next");
                    assert_eq!(q.pop_in_turn(), Some((expect as usize, 0)));
                }
                expect += 1;
            }
        }
        assert_eq!(
            *dropped.borrow(),
            (0..expect).step_by(3).collect::<Vec<_>>()
        );
        dropped.borrow_mut().clear();
        // The loop's pop of a start, then the worker's look at its job.
        while expect % 3 != 0 {
            q.pop_front();
            expect += 1;
        }
        q.start_turn();
        assert_eq!(q.pop_in_turn().map(|e| e.1), Some(START));
        // SAFETY: as above.
        let job = unsafe { Job::take(q.started_job().as_ptr()) };
        assert_eq!(job.identity().0, TaskId(expect));
        drop(job);
        // The rest is dropped unrun, oldest first, by `drain` and by dropping the queue.
        dropped.borrow_mut().clear();
        let left = q.drain();
        let first = expect + 3;
        assert_eq!(left.len(), (first..next).step_by(3).count());
        drop(left);
        assert_eq!(
            *dropped.borrow(),
            (first..next).step_by(3).collect::<Vec<_>>()
        );
        assert!(q.is_empty());
        start(&mut q, 7, &dropped);
        drop(q);
        assert_eq!(dropped.borrow().last(), Some(&7));
    }

    #[test]
    fn a_start_is_chained_only_in_the_current_turn() {
        let dropped = Rc::new(RefCell::new(Vec::new()));
        let mut q = RunQueue::new();
        start(&mut q, 1, &dropped);
        assert_eq!(q.pop_start_in_turn(), None, "the turn began before it");
        q.start_turn();
        assert!(q.pop_start_in_turn().is_some());
        // A popped start's job is the taker's: nothing drops it.
        drop(q);
        assert!(dropped.borrow().is_empty());
    }

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
