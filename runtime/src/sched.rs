//! The loop's bookkeeping of its coroutines: a slot per key (state, id, name), the free keys
//! without a worker, the run queue of `(key, resume value)` and each worker's stack top.
//!
//! It is apart from the loop so that how a key is made, booked, woken and freed reads in one
//! place; the loop, spawning, resuming and shutdown all go through these few methods.

use std::ptr::NonNull;

use crate::executor::Inner;
use crate::run_queue::RunQueue;
use crate::task::{Identity, Slot, State, TaskId};

/// The identity of a key that has no worker, or whose worker has not run yet.
const NOBODY: (TaskId, &str) = (TaskId(0), "idle");

/// Every key's slot, the free keys that have no worker, and the run queue of
/// `(key, resume value)`. Free keys with an idle worker are in the `StackPool`.
pub(crate) struct Sched {
    pub(crate) tasks: Vec<Slot>,
    pub(crate) no_worker: Vec<usize>,
    pub(crate) ready: RunQueue,
    /// Each key's worker's stack top, set when its worker is made (stale for a key whose
    /// worker ended: such a key is never queued): what `prefetch_ahead` warms.
    pub(crate) tops: Vec<usize>,
}

impl Sched {
    /// A free key for a new worker.
    pub(crate) fn new_key(&mut self) -> usize {
        self.no_worker.pop().unwrap_or_else(|| {
            self.tasks.push(Slot::FREE);
            self.tasks.len() - 1
        })
    }

    /// The slot of `key`, without a bounds check: the loop's hot paths book a state in it
    /// on every I/O wait and every completion.
    ///
    /// # Safety
    /// `key` was made by [`Sched::new_key`] (slots are never removed, so it is in bounds):
    /// the key of a coroutine the loop resumes, or a CQE's `user_data` other than
    /// `INTERNAL` (every SQE carries its coroutine's key, see `reactor`'s contract).
    #[inline(always)]
    pub(crate) unsafe fn slot_unchecked(&mut self, key: usize) -> &mut Slot {
        debug_assert!(key < self.tasks.len(), "key {key} was never made");
        // SAFETY: in bounds (the caller's contract).
        unsafe { self.tasks.get_unchecked_mut(key) }
    }

    /// Frees the slot of a worker that ended (its `Co` is gone); returns what it was.
    pub(crate) fn release(&mut self, key: usize) -> Slot {
        std::mem::replace(&mut self.tasks[key], Slot::FREE)
    }

    /// Registers the identity in the `Co` of the worker of `key`, which lives until that
    /// worker ends (then `release` forgets it).
    pub(crate) fn register(&mut self, key: usize, who: &Identity) {
        self.tasks[key].who = Some(NonNull::from(who));
    }

    /// The identity of the job the worker of `key` runs (or ran last).
    pub(crate) fn identity(&self, key: usize) -> (TaskId, &'static str) {
        identity(&self.tasks[key])
    }

    /// The keys of the live coroutines in a state `state` accepts, without allocating.
    pub(crate) fn live<'a>(
        &'a self,
        state: impl Fn(State) -> bool + 'a,
    ) -> impl Iterator<Item = usize> + 'a {
        let live = self.tasks.iter().enumerate();
        live.filter(move |(_, slot)| slot.state != State::Free && state(slot.state))
            .map(|(key, _)| key)
    }

    pub(crate) fn live_keys(&self, state: impl Fn(State) -> bool) -> Vec<usize> {
        self.live(state).collect()
    }
}

impl Inner {
    /// Makes a coroutine parked on a wait queue ready, if `key` still names that coroutine
    /// and it is still waiting. Returns whether it did.
    pub(crate) fn wake(&self, key: usize, id: TaskId) -> bool {
        if self.closing.get() {
            return false;
        }
        self.sched.with(|s| match s.tasks.get_mut(key) {
            Some(slot) if slot.state == State::Waiting && identity(slot).0 == id => {
                slot.state = State::Ready;
                s.ready.push_back((key, 0));
                true
            }
            _ => false,
        })
    }
}

/// The identity `slot`'s worker holds, read in place.
pub(crate) fn identity(slot: &Slot) -> (TaskId, &'static str) {
    match slot.who {
        // SAFETY: `who` points into the `Co` of the key's worker, which lives until the
        // worker ends; its slot is released (`who` cleared) when it ends, before the `Co` can
        // be reused, and shutdown reads identities before dropping any worker. The
        // identity is `Cell`s, read on the loop's thread while the worker is suspended.
        Some(who) => unsafe {
            let who = who.as_ref();
            (who.id.get(), who.name.get())
        },
        None => NOBODY,
    }
}
