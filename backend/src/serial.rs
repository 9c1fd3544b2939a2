//! A lock that works in every [`Ctx`]: coroutines wait by yielding to their loop, threads by
//! sleeping on a condition variable.
//!
//! The file backend holds it around anything that changes the file size (see `file.rs`);
//! block ranges have their own locks (`range_lock.rs`). A std `Mutex` cannot be
//! used directly: its holder suspends on I/O while holding it, and another coroutine of the
//! same thread blocking on it would stop the loop for good.
//!
//! A waiting coroutine calls `yield_now` in a loop, so its loop keeps turning (and reaping
//! completions) until the holder lets go. That spins, but only while another request changes
//! the size, which a fixed-size export never does.

use std::sync::{Condvar, Mutex, MutexGuard};

use crate::Ctx;

/// The lock; not reentrant.
#[derive(Default)]
pub(crate) struct Serial {
    held: Mutex<bool>,
    freed: Condvar,
}

impl Serial {
    /// Waits until the lock is free, then takes it.
    pub(crate) fn lock(&self, cx: &Ctx<'_>) -> SerialGuard<'_> {
        match cx {
            Ctx::Coroutine(co) => {
                while !self.try_take() {
                    co.yield_now();
                }
            }
            Ctx::Blocking => {
                let held = self.flag();
                let mut held = self
                    .freed
                    .wait_while(held, |h| *h)
                    .unwrap_or_else(|e| e.into_inner());
                *held = true;
            }
        }
        SerialGuard(self)
    }

    fn try_take(&self) -> bool {
        !std::mem::replace(&mut *self.flag(), true)
    }

    fn flag(&self) -> MutexGuard<'_, bool> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Proof of holding a [`Serial`]; releases it on drop (also when a coroutine is unwound).
pub(crate) struct SerialGuard<'a>(&'a Serial);

impl Drop for SerialGuard<'_> {
    fn drop(&mut self) {
        *self.0.flag() = false;
        self.0.freed.notify_one();
    }
}
