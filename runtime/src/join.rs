//! Awaiting a coroutine's result, and learning that it panicked instead.

use std::cell::{Cell, RefCell};
use std::fmt;
use std::rc::Rc;

use crate::co::Co;
use crate::sync::WaitQueue;
use crate::task::TaskId;

/// Why a joined coroutine produced no value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JoinError {
    /// It panicked; the loop logged the panic message and kept running.
    Panicked(TaskId),
    /// The runtime shut down before it finished.
    Cancelled(TaskId),
}

impl fmt::Display for JoinError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JoinError::Panicked(id) => write!(f, "coroutine {id} panicked"),
            JoinError::Cancelled(id) => write!(f, "coroutine {id} was cancelled at shutdown"),
        }
    }
}

impl std::error::Error for JoinError {}

pub(crate) struct JoinState<T> {
    result: RefCell<Option<Result<T, JoinError>>>,
    /// Whether `result` holds the outcome: what [`JoinHandle::is_finished`] reads, one load
    /// and no borrow (`block_on` asks it after every turn of the loop).
    has_result: Cell<bool>,
    waiters: WaitQueue,
}

impl<T> JoinState<T> {
    pub(crate) fn new() -> Self {
        JoinState {
            result: RefCell::new(None),
            has_result: Cell::new(false),
            waiters: WaitQueue::new(),
        }
    }

    /// Runs the coroutine body and records its outcome, even when it unwinds.
    pub(crate) fn run(&self, co: &Co<'_>, f: impl FnOnce(&Co<'_>) -> T) {
        let guard = Outcome { state: self, co };
        let value = f(co);
        *self.result.borrow_mut() = Some(Ok(value));
        drop(guard);
    }
}

/// Records a failure if the body unwinds, and wakes the joiners either way.
struct Outcome<'s, 'c, T> {
    state: &'s JoinState<T>,
    co: &'s Co<'c>,
}

impl<T> Drop for Outcome<'_, '_, T> {
    fn drop(&mut self) {
        let mut result = self.state.result.borrow_mut();
        if result.is_none() {
            let id = self.co.id();
            *result = Some(Err(if self.co.inner.is_closing() {
                JoinError::Cancelled(id)
            } else {
                JoinError::Panicked(id)
            }));
        }
        drop(result);
        self.state.has_result.set(true);
        self.state.waiters.wake_all(self.co);
    }
}

/// The result of a coroutine started with `spawn_joinable`.
pub struct JoinHandle<T> {
    state: Rc<JoinState<T>>,
    id: TaskId,
}

impl<T> JoinHandle<T> {
    pub(crate) fn new(state: Rc<JoinState<T>>, id: TaskId) -> Self {
        JoinHandle { state, id }
    }

    /// The coroutine's identity.
    pub fn id(&self) -> TaskId {
        self.id
    }

    /// Whether the coroutine has finished (returned or panicked).
    pub fn is_finished(&self) -> bool {
        self.state.has_result.get()
    }

    /// The outcome, if the coroutine has finished.
    pub fn try_take(&self) -> Option<Result<T, JoinError>> {
        let taken = self.state.result.borrow_mut().take();
        if taken.is_some() {
            self.state.has_result.set(false);
        }
        taken
    }

    /// Suspends the calling coroutine until the joined one finishes.
    pub fn join(self, co: &Co<'_>) -> Result<T, JoinError> {
        loop {
            if let Some(result) = self.try_take() {
                return result;
            }
            self.state.waiters.wait(co);
        }
    }
}
