//! Spawning: one queue, and a count of promised workers.
//!
//! A spawn promises itself an idle worker (one counter of spare workers in the
//! `StackPool`; a worker is made now if none is spare, so a failure to map a stack is the
//! spawn's error, and shutdown's refusal is checked there too: a closed pool has no spare) and pushes a
//! start entry ([`START`](crate::worker::START)) whose job is written in place in the run queue's job slot: one
//! push, no key chosen yet. When the loop reaches a start entry it claims an idle worker
//! and resumes it, and the worker runs the job of that entry. When a worker's job returns
//! and the next entry of the turn is a start, the worker pops it and runs its job itself
//! (`chain_job`): the order the loop would have run it in, without two switches, and the
//! promise is simply dropped (the promised worker never left the pool).
//!
//! The job's identity travels with the job into the worker's `Co` (`Co::begin`), where the
//! loop reads it when it needs it (`Sched::identity`): nothing is copied into the key's slot
//! per job, and a chained job does not touch the slot at all (its state stays `Ready`).
//!
//! It is apart from the loop because it is the workers' side of the contract (see `worker`):
//! what a spawn queues and how a worker takes it. [`Runtime`](crate::Runtime) and
//! [`Co`] are its two public entry points, each a call of [`Inner::spawn`] or
//! [`Inner::spawn_joinable`].

use std::io;
use std::ptr::NonNull;
use std::rc::Rc;

use corosensei::stack::Stack;

use crate::co::Co;
use crate::colored_stack::ColoredStack;
use crate::executor::Inner;
use crate::job::Job;
use crate::join::{JoinHandle, JoinState};
use crate::stack_pool::StackPool;
use crate::task::{State, TaskId};
use crate::worker::worker;

/// The name of a coroutine spawned without one.
pub(crate) const UNNAMED: &str = "task";

impl Inner {
    /// Queues the start of `f`, with a worker promised to it (a pooled one, or a new one on
    /// a pooled or fresh stack).
    #[inline]
    pub(crate) fn spawn<F>(self: &Rc<Self>, name: &'static str, f: F) -> io::Result<TaskId>
    where
        F: FnOnce(&Co<'_>) + 'static,
    {
        // A closed pool has no spare worker: shutdown's refusal is checked on the slow path.
        if !self.stacks.with(StackPool::promise) {
            self.new_worker()?;
        }
        // Ids count the spawns from 1.
        let id = TaskId(self.counters.started());
        if self.sched.with(|s| s.ready.push_start(id, name, f)) {
            self.counters.jobs_boxed.bump();
        }
        Ok(id)
    }

    /// A new idle worker at a free key, promised to the job being spawned; or `ECANCELED`
    /// once the loop is shutting down (its pool closed, every spawn comes here).
    #[cold]
    #[inline(never)]
    fn new_worker(self: &Rc<Self>) -> io::Result<()> {
        if self.closing.get() {
            return Err(io::Error::from_raw_os_error(libc::ECANCELED));
        }
        let stack = self.stacks.with(|pool| pool.take(&self.counters))?;
        let key = self.sched.with(|s| s.new_key());
        let stack = ColoredStack::new(stack, key);
        let top = stack.base().get();
        let co = worker(stack, Rc::clone(self), key);
        self.sched.with(|s| {
            if s.tops.len() <= key {
                s.tops.resize(key + 1, 0);
            }
            s.tops[key] = top;
        });
        self.coros.with(|coros| coros.put(key, co));
        self.stacks.with(|pool| pool.park_promised(key));
        Ok(())
    }

    /// The loop reached a start entry: claims a promised idle worker for it and books its
    /// key ready; the loop then resumes it with [`START`](crate::worker::START). Out of
    /// line: inlined into the turn, it costs the lone yielder's fast path two
    /// instructions per switch (registers the compiler rematerialises in its loop), more
    /// than the call costs a start that chains nothing.
    #[inline(never)]
    pub(crate) fn start_worker(&self) -> usize {
        self.counters.loop_starts.bump();
        let key = self.stacks.with(StackPool::claim);
        self.sched.with(|s| {
            debug_assert!(key < s.tasks.len());
            // SAFETY: every key comes from `Sched::new_key`, which makes its slot; slots
            // are never removed.
            unsafe { s.tasks.get_unchecked_mut(key) }.state = State::Ready;
        });
        key
    }

    /// The job of the start entry the loop just popped, for the worker it resumed.
    #[inline(always)]
    pub(crate) fn started_job(&self) -> NonNull<Job> {
        self.sched.with(|s| s.ready.started_job())
    }

    /// Called by a worker whose job returned: the job of the next entry of this turn, if
    /// that entry is a start, popped so that this worker runs it in place (the worker
    /// promised to it stays idle).
    #[inline(always)]
    pub(crate) fn chain_job(&self) -> Option<NonNull<Job>> {
        let job = self.sched.with(|s| s.ready.pop_start_in_turn())?;
        self.stacks.with(StackPool::kept);
        Some(job)
    }

    pub(crate) fn spawn_joinable<T, F>(
        self: &Rc<Self>,
        name: &'static str,
        f: F,
    ) -> io::Result<JoinHandle<T>>
    where
        T: 'static,
        F: FnOnce(&Co<'_>) -> T + 'static,
    {
        let state = Rc::new(JoinState::new());
        let theirs = Rc::clone(&state);
        let id = self.spawn(name, move |co| theirs.run(co, f))?;
        Ok(JoinHandle::new(state, id))
    }
}
