//! The loop's bookkeeping of its coroutines: a slot per key (state, id, name), the free keys
//! without a worker, the run queue of `(key, resume value)` and each worker's stack top.
//!
//! It is apart from the loop so that how a key is made, booked, woken and freed reads in one
//! place; the loop, spawning, resuming and shutdown all go through these few methods.

use crate::executor::Inner;
use crate::run_queue::RunQueue;
use crate::task::{Slot, State, TaskId};

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
            self.tasks.push(Slot {
                state: State::Free,
                id: TaskId(0),
                name: "",
            });
            self.tasks.len() - 1
        })
    }

    /// Frees the slot of a coroutine that ended; returns what it was.
    pub(crate) fn release(&mut self, key: usize) -> Slot {
        let free = Slot {
            state: State::Free,
            id: TaskId(0),
            name: "",
        };
        std::mem::replace(&mut self.tasks[key], free)
    }

    pub(crate) fn live_keys(&self, state: impl Fn(State) -> bool) -> Vec<usize> {
        let live = self.tasks.iter().enumerate();
        live.filter(|(_, slot)| slot.state != State::Free && state(slot.state))
            .map(|(key, _)| key)
            .collect()
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
            Some(slot) if slot.id == id && slot.state == State::Waiting => {
                slot.state = State::Ready;
                s.ready.push_back((key, 0));
                true
            }
            _ => false,
        })
    }
}
