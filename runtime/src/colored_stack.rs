//! Coroutine stacks whose tops are staggered ("coloured"), so that the hot frames of
//! different coroutines do not all sit at the same offset within a page.
//!
//! Every [`DefaultStack`] is a page-aligned mapping, so without this every coroutine's
//! topmost frames (its worker loop, its `Co`, the job's first frames) share their address
//! bits below 4 KiB. Those bits choose the L1 cache set, so a hundred coroutines resumed
//! in turn compete for the same few sets of a 12-way cache; and loads from one coroutine's
//! frame stall on stores to another's (4 KiB aliasing). Starting each stack [`STEP`]
//! bytes lower than the previous colour spreads them over [`COLORS`] sets, at the cost of
//! at most `COLORS * STEP` bytes of each stack, all on its top page (which the coroutine
//! touches anyway).

use corosensei::stack::{DefaultStack, Stack, StackPointer};

/// Distinct offsets.
const COLORS: usize = 32;
/// Bytes between two colours: one cache line (a multiple of the stack alignment).
const STEP: usize = 64;

/// A [`DefaultStack`] whose usable top is `color` bytes below the mapping's end.
pub(crate) struct ColoredStack {
    stack: DefaultStack,
    /// The coloured top (corosensei asks for it on every resume).
    base: StackPointer,
}

impl ColoredStack {
    /// `stack`, given the colour of worker `key` (less on a tiny stack: at most an eighth
    /// of it).
    pub(crate) fn new(stack: DefaultStack, key: usize) -> Self {
        let room = (stack.base().get() - stack.limit().get()) / 8;
        let color = ((key % COLORS) * STEP).min(room / STEP * STEP);
        let base = StackPointer::new(stack.base().get() - color).expect("inside the mapping");
        ColoredStack { stack, base }
    }

    /// The stack itself, for the pool.
    pub(crate) fn into_inner(self) -> DefaultStack {
        self.stack
    }
}

// SAFETY: `base` stays inside the mapping (the colour is at most an eighth of it) and keeps
// the alignment (a multiple of `STEP`, itself a multiple of `STACK_ALIGNMENT`); `limit`,
// with its guard page, is the mapping's own.
unsafe impl Stack for ColoredStack {
    #[inline]
    fn base(&self) -> StackPointer {
        const _: () = assert!(STEP % corosensei::stack::STACK_ALIGNMENT == 0);
        const _: () = assert!(COLORS * STEP < 4096);
        self.base
    }

    #[inline]
    fn limit(&self) -> StackPointer {
        self.stack.limit()
    }
}
