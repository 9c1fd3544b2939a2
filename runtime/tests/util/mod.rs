//! Helpers shared by the runtime's integration tests.

use std::cell::Cell;
use std::rc::Rc;

/// Sets its flag when dropped: shows that a coroutine's destructors ran.
pub struct SetOnDrop(pub Rc<Cell<bool>>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.set(true);
    }
}
