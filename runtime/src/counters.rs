//! Always-on counters of the event loop: plain integers owned by the loop thread.
//!
//! Each bump is a load, an add and a store on a `Cell<u64>`: no atomics, no branches, so
//! they stay on in release builds. [`Counters::snapshot`] copies them into a
//! [`CounterSnapshot`], which the `serde` feature makes `Serialize` and `Deserialize` (the
//! `--stats` document carries it).

use std::cell::Cell;

/// One counter; only the loop thread touches it.
#[derive(Default, Debug)]
pub(crate) struct Counter(Cell<u64>);

impl Counter {
    #[inline(always)]
    pub(crate) fn bump(&self) {
        self.add(1);
    }

    #[inline(always)]
    pub(crate) fn add(&self, n: u64) {
        self.0.set(self.0.get().wrapping_add(n));
    }

    #[inline(always)]
    pub(crate) fn get(&self) -> u64 {
        self.0.get()
    }
}

#[derive(Default, Debug)]
pub(crate) struct Counters {
    pub(crate) spawned: Counter,
    /// The peak of live coroutines plus the jobs that returned or panicked: the one counter
    /// a job's end bumps. Jobs finished are this less `peak_live` (the snapshot's
    /// `completed` is those less the panicked), and a spawn sets a new peak exactly when
    /// its `spawned` passes this (live, `spawned - finished`, passes `peak_live`): one
    /// compare, no subtraction and no store of the peak but when it rises.
    pub(crate) peak_plus_finished: Counter,
    pub(crate) panicked: Counter,
    pub(crate) stacks_allocated: Counter,
    /// Bare stacks taken from the pool (the snapshot's `stacks_reused` adds the spawns that
    /// took an idle worker: every spawn that made no worker).
    pub(crate) stacks_reused: Counter,
    pub(crate) jobs_boxed: Counter,
    /// Jobs the loop started by resuming an idle worker (the others are chained: the
    /// snapshot's `chained` is the jobs begun less these, so a chained start counts
    /// nothing).
    pub(crate) loop_starts: Counter,
    /// Jobs dropped unrun at shutdown (never begun, never finished: still `live`).
    pub(crate) dropped_unrun: Counter,
    pub(crate) resumes: Counter,
    pub(crate) suspends: Counter,
    pub(crate) sqes_submitted: Counter,
    pub(crate) enter_calls: Counter,
    pub(crate) cqes_reaped: Counter,
    pub(crate) peak_live: Counter,
    pub(crate) poll_hits: Counter,
    pub(crate) poll_misses: Counter,
}

/// A copy of the loop's counters at one moment.
///
/// `switches` counts every transfer of control between the loop and a coroutine: each
/// resume is one, and so is each return to the loop (a suspend, a completion or a panic).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct CounterSnapshot {
    /// Coroutines started with `spawn`.
    pub spawned: u64,
    /// Coroutines that returned normally.
    pub completed: u64,
    /// Coroutines that ended with a panic (contained by the loop).
    pub panicked: u64,
    /// Coroutines alive now (spawned and not yet finished).
    pub live: u64,
    /// Highest number of coroutines alive at once.
    pub peak_live: u64,
    /// Stacks mapped fresh because the pool was empty.
    pub stacks_allocated: u64,
    /// Spawns that reused pooled capacity: an idle worker or a bare stack.
    pub stacks_reused: u64,
    /// Spawns that took an idle worker, still initialised (the pointer-pop spawn).
    pub workers_reused: u64,
    /// Spawns whose closure was too large for a worker's inline job slot and was boxed
    /// (one allocation); a per-request path should keep this at zero.
    pub jobs_boxed: u64,
    /// Jobs that a worker whose job had just returned ran in place, without a switch,
    /// because they were next in the loop's turn.
    #[cfg_attr(feature = "serde", serde(default))]
    pub chained: u64,
    /// Times the loop switched into a coroutine.
    pub resumes: u64,
    /// Times a coroutine suspended itself (waiting for I/O, a queue, or yielding).
    pub suspends: u64,
    /// Transfers of control in either direction (resumes + suspends + finishes that
    /// returned to the loop: a chained job's start and its predecessor's end are none).
    pub switches: u64,
    /// SQEs handed to the kernel.
    pub sqes_submitted: u64,
    /// `io_uring_enter` system calls.
    pub enter_calls: u64,
    /// CQEs taken from the completion queue.
    pub cqes_reaped: u64,
    /// Idle waits that a completion ended while the loop was still spinning (`poll_ns`).
    pub poll_hits: u64,
    /// Idle waits where spinning found nothing and the loop slept in the kernel.
    pub poll_misses: u64,
}

impl Counters {
    /// A coroutine started: it is live, perhaps at a new peak. Returns how many have been
    /// spawned, this one included (its id). Only `spawned` is written (and the peak, when it
    /// rises): the live count is derived (`live`), so a finish writes one counter too.
    #[inline(always)]
    pub(crate) fn started(&self) -> u64 {
        let spawned = self.spawned.get() + 1;
        self.spawned.0.set(spawned);
        // Live (`spawned - finished`) passes the peak: one more than it, as a spawn adds one.
        if spawned > self.peak_plus_finished.get() {
            self.peak_live.bump();
            self.peak_plus_finished.bump();
        }
        spawned
    }

    /// Jobs that returned or panicked.
    #[inline(always)]
    fn finished_jobs(&self) -> u64 {
        self.peak_plus_finished
            .get()
            .wrapping_sub(self.peak_live.get())
    }

    /// Coroutines spawned and not finished (jobs dropped unrun at shutdown stay counted).
    #[inline(always)]
    pub(crate) fn live(&self) -> u64 {
        self.spawned.get().wrapping_sub(self.finished_jobs())
    }

    /// A coroutine's job returned (`panicked: false`) or panicked.
    #[inline(always)]
    pub(crate) fn finished(&self, panicked: bool) {
        if panicked {
            self.panicked.bump();
        }
        self.peak_plus_finished.bump();
    }

    /// A copy of the counters; `queued_starts` is how many spawned jobs wait to begin.
    pub(crate) fn snapshot(&self, queued_starts: usize) -> CounterSnapshot {
        let finished = self.finished_jobs();
        let unbegun = queued_starts as u64 + self.dropped_unrun.get();
        let chained = self.spawned.get() - unbegun - self.loop_starts.get();
        // Every spawn takes an idle worker or makes one, on a bare pooled or a fresh stack.
        let workers_made = self.stacks_reused.get() + self.stacks_allocated.get();
        let workers_reused = self.spawned.get() - workers_made;
        CounterSnapshot {
            spawned: self.spawned.get(),
            completed: finished - self.panicked.get(),
            panicked: self.panicked.get(),
            live: self.live(),
            peak_live: self.peak_live.get(),
            stacks_allocated: self.stacks_allocated.get(),
            stacks_reused: self.stacks_reused.get() + workers_reused,
            workers_reused,
            jobs_boxed: self.jobs_boxed.get(),
            chained,
            resumes: self.resumes.get(),
            suspends: self.suspends.get(),
            switches: self.resumes.get() + self.suspends.get() + finished - chained,
            sqes_submitted: self.sqes_submitted.get(),
            enter_calls: self.enter_calls.get(),
            cqes_reaped: self.cqes_reaped.get(),
            poll_hits: self.poll_hits.get(),
            poll_misses: self.poll_misses.get(),
        }
    }
}

impl CounterSnapshot {
    /// Counter-wise sum with another loop's counters (`peak_live` becomes the sum of the
    /// loops' peaks: an upper bound of the coroutines alive at once across them).
    pub fn add(&mut self, other: &CounterSnapshot) {
        self.spawned += other.spawned;
        self.completed += other.completed;
        self.panicked += other.panicked;
        self.live += other.live;
        self.peak_live += other.peak_live;
        self.stacks_allocated += other.stacks_allocated;
        self.stacks_reused += other.stacks_reused;
        self.workers_reused += other.workers_reused;
        self.jobs_boxed += other.jobs_boxed;
        self.chained += other.chained;
        self.resumes += other.resumes;
        self.suspends += other.suspends;
        self.switches += other.switches;
        self.sqes_submitted += other.sqes_submitted;
        self.enter_calls += other.enter_calls;
        self.cqes_reaped += other.cqes_reaped;
        self.poll_hits += other.poll_hits;
        self.poll_misses += other.poll_misses;
    }

    /// Counter-wise difference `self - earlier` (for `live` and `peak_live`, the later value).
    pub fn since(&self, earlier: &CounterSnapshot) -> CounterSnapshot {
        CounterSnapshot {
            spawned: self.spawned - earlier.spawned,
            completed: self.completed - earlier.completed,
            panicked: self.panicked - earlier.panicked,
            live: self.live,
            peak_live: self.peak_live,
            stacks_allocated: self.stacks_allocated - earlier.stacks_allocated,
            stacks_reused: self.stacks_reused - earlier.stacks_reused,
            workers_reused: self.workers_reused - earlier.workers_reused,
            jobs_boxed: self.jobs_boxed - earlier.jobs_boxed,
            chained: self.chained - earlier.chained,
            resumes: self.resumes - earlier.resumes,
            suspends: self.suspends - earlier.suspends,
            switches: self.switches - earlier.switches,
            sqes_submitted: self.sqes_submitted - earlier.sqes_submitted,
            enter_calls: self.enter_calls - earlier.enter_calls,
            cqes_reaped: self.cqes_reaped - earlier.cqes_reaped,
            poll_hits: self.poll_hits - earlier.poll_hits,
            poll_misses: self.poll_misses - earlier.poll_misses,
        }
    }
}
