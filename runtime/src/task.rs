//! What the loop knows about one coroutine: its handle, its state and its identity.

use std::fmt;

use corosensei::Coroutine;

use crate::colored_stack::ColoredStack;

/// Why a coroutine handed control back to the loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Park {
    /// It has one SQE in flight; its CQE resumes it.
    Io,
    /// It wants to run again after the other ready coroutines.
    Yield,
    /// It sits on a wait queue; whoever wakes the queue resumes it.
    Wait,
    /// Its job returned; the worker is idle, ready for the next job.
    Done,
}

/// A worker coroutine as the loop holds it: resumed with a CQE result (or 0), yields a
/// [`Park`] (see `worker`).
pub(crate) type Coro = Coroutine<i32, Park, (), ColoredStack>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum State {
    /// No coroutine has this key (its worker, if any, is idle).
    Free,
    /// In the run queue, or running.
    Ready,
    Io,
    Waiting,
}

/// The loop's record of one key (a live coroutine's SQEs' `user_data`). The worker that
/// runs it lives in the `CoroStore` at the same key.
#[derive(Clone, Copy)]
pub(crate) struct Slot {
    pub(crate) state: State,
    pub(crate) id: TaskId,
    pub(crate) name: &'static str,
}

/// Identity of a coroutine, unique for the life of its runtime (keys are reused; these are
/// not). Shown as `co#N` in logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskId(pub u64);

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "co#{}", self.0)
    }
}
