//! Interior mutability for state owned by the loop thread, without `RefCell`'s counting.
//!
//! The scheduler and the ring are touched on every switch; a `RefCell` borrow flag there
//! costs more instructions than the switch itself. A [`LoopCell`] gives `&mut` access inside
//! a closure instead. It is sound because:
//! - it is `!Sync` (it wraps an `UnsafeCell`), so one thread reaches it;
//! - every closure passed to [`LoopCell::with`] in this crate is short, never switches
//!   coroutines, never runs user code (no user destructors: values that may own user data,
//!   such as coroutines, are moved out and dropped after the closure), and never calls
//!   `with` on the same cell. Debug builds check the last rule at run time.

use std::cell::UnsafeCell;

pub(crate) struct LoopCell<T> {
    value: UnsafeCell<T>,
    #[cfg(debug_assertions)]
    busy: std::cell::Cell<bool>,
}

impl<T> LoopCell<T> {
    pub(crate) fn new(value: T) -> Self {
        LoopCell {
            value: UnsafeCell::new(value),
            #[cfg(debug_assertions)]
            busy: std::cell::Cell::new(false),
        }
    }

    /// Runs `f` with exclusive access to the value (see the module's rules for `f`).
    #[inline(always)]
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        #[cfg(debug_assertions)]
        assert!(!self.busy.replace(true), "LoopCell re-entered");
        // SAFETY: one thread only (`!Sync`), and `f` never re-enters this cell (module
        // rules), so this is the only live reference to the value while `f` runs.
        let result = f(unsafe { &mut *self.value.get() });
        #[cfg(debug_assertions)]
        self.busy.set(false);
        result
    }
}
