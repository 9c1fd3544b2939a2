//! Spawning: a spawn queues its closure in the job queue, and in the run queue an entry that
//! starts an idle worker ([`START`]): a pooled one, or one made now (so a failure to map a
//! stack is the spawn's error). When the loop reaches that entry it resumes the worker, which
//! takes the job queue's oldest job; when a worker's job returns and the next entry of the
//! turn starts another worker, the finished worker takes that job itself and puts the other
//! worker back among the idle (`chain_job`): the same order, without two switches.
//!
//! It is apart from the loop because it is the workers' side of the contract (see `worker`):
//! what a spawn queues and how a worker takes it.

use std::io;
use std::ptr::NonNull;
use std::rc::Rc;

use corosensei::stack::Stack;

use crate::co::Co;
use crate::colored_stack::ColoredStack;
use crate::executor::Inner;
use crate::job::Job;
use crate::join::{JoinHandle, JoinState};
use crate::task::{Slot, State, TaskId};
use crate::worker::{worker, START};

impl Inner {
    /// Queues `f`, and the start of an idle worker for it (a pooled one, or a new one on a
    /// pooled or fresh stack).
    #[inline]
    pub(crate) fn spawn<F>(self: &Rc<Self>, name: &'static str, f: F) -> io::Result<TaskId>
    where
        F: FnOnce(&Co<'_>) + 'static,
    {
        if self.closing.get() {
            return Err(io::Error::from_raw_os_error(libc::ECANCELED));
        }
        let key = match self.stacks.with(|pool| pool.pop_idle()) {
            Some(key) => key,
            None => self.new_worker()?,
        };
        // Ids count the spawns from 1.
        let id = TaskId(self.counters.started());
        if self.jobs.with(|jobs| jobs.push(id, name, f)) {
            self.counters.jobs_boxed.bump();
        }
        self.sched.with(|s| s.ready.push_back((key, START)));
        Ok(id)
    }

    /// A new worker at a free key, for the job being spawned.
    #[cold]
    #[inline(never)]
    fn new_worker(self: &Rc<Self>) -> io::Result<usize> {
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
        Ok(key)
    }

    /// The job queue's oldest job, for the worker at `key` (which the loop started, or which
    /// chained the job); books it as that key's coroutine.
    #[inline(always)]
    pub(crate) fn take_job(&self, key: usize) -> (NonNull<Job>, TaskId) {
        let job = self.jobs.with(|jobs| jobs.pop());
        let job = job.expect("every worker start has its job");
        // SAFETY: the slot was just released and nothing touches it before the worker
        // runs it (see `JobQueue`).
        let (id, name) = unsafe { Job::identity(job.as_ptr()) };
        self.sched.with(|s| {
            debug_assert!(key < s.tasks.len());
            // SAFETY: every key comes from `Sched::new_key`, which makes its slot; slots
            // are never removed.
            *unsafe { s.tasks.get_unchecked_mut(key) } = Slot {
                state: State::Ready,
                id,
                name,
            }
        });
        (job, id)
    }

    /// Called by a worker whose job returned: whether the next entry of this turn starts a
    /// worker on a job, which it then takes from the run queue to run that job itself (the
    /// worker it was for goes back among the idle).
    #[inline(always)]
    pub(crate) fn chain_job(&self) -> bool {
        let next = self
            .sched
            .with(|s| s.ready.pop_in_turn_if(|(_, value)| value == START));
        match next {
            Some((unused, _)) => {
                self.stacks.with(|pool| pool.park_idle(unused));
                self.counters.chained.bump();
                true
            }
            None => false,
        }
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
