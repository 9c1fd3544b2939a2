//! What the loop knows about one coroutine: its handle, its state and its identity.

use std::cell::Cell;
use std::fmt;
use std::ptr::NonNull;

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

/// A worker coroutine as the loop holds it: yields a [`Park`] (see `worker`). It is resumed
/// with `()`: the value it resumes with (a CQE's result, `START`, `END`) is handed over
/// beside the switch, in `Inner::resumed_with`. corosensei passes a `Result<i32, _>` input
/// through memory, by pointer, on every resume; a `()` input is one register, as in raw
/// corosensei, and a yield, which has no value to read, stores and loads nothing.
pub(crate) type Coro = Coroutine<(), Park, (), ColoredStack>;

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
    /// The identity in the `Co` of this key's worker (its current or last job's), from the
    /// worker's first run until it ends: read in place, never copied per job.
    pub(crate) who: Option<NonNull<Identity>>,
}

impl Slot {
    pub(crate) const FREE: Slot = Slot {
        state: State::Free,
        who: None,
    };
}

/// Who a worker's current job is: kept in the worker's `Co` (on its stack, at a stable
/// address for the worker's life), set for every job (`Co::begin`), and read in place by
/// the loop through the key's [`Slot`].
pub(crate) struct Identity {
    pub(crate) id: Cell<TaskId>,
    pub(crate) name: Cell<&'static str>,
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
