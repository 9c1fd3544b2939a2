//! Request buffers, pooled per queue so that steady state allocates nothing.
//!
//! Each request is read into a small in-place [`Head`] (header, argument struct and up to
//! 4 KiB of WRITE data) plus a large [`Big`] buffer that takes the rest of a large WRITE.
//! A `Big` also receives READ data. A request keeps its `Big` only when it uses it; other
//! requests hand it straight back, so memory follows the number of large requests in
//! flight (QEMU's spill-over design), not the queue depth.

use std::cell::{Cell, RefCell};

use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout};

use crate::init::RECOMMENDED_HEAD_SIZE;

/// The in-place part: 8-byte aligned, as the decoder requires.
pub struct Head(Box<[u64]>);

impl Head {
    fn new() -> Head {
        Head(vec![0u64; RECOMMENDED_HEAD_SIZE.div_ceil(8)].into_boxed_slice())
    }

    /// The buffer as bytes.
    pub fn bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }

    /// The buffer as bytes, to read into.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        self.0.as_mut_bytes()
    }
}

/// One page, so that big buffers are page-aligned (O_DIRECT backends need no bounce).
#[derive(Clone, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C, align(4096))]
struct Page([u8; 4096]);

/// The spill-over / READ data part: page-aligned, `max_write` rounded up to pages.
pub struct Big(Box<[Page]>);

impl Big {
    fn new(bytes: usize) -> Big {
        Big(<[Page]>::new_box_zeroed_with_elems(bytes.div_ceil(4096)).expect("allocation"))
    }

    /// The buffer as bytes.
    pub fn bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }

    /// The buffer as bytes, to read into or fill with READ data.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        self.0.as_mut_bytes()
    }
}

/// A free list; grows to the high-water mark of buffers in use, then reuses them.
pub struct Pool<T> {
    free: RefCell<Vec<T>>,
    make: Box<dyn Fn() -> T>,
    allocated: Cell<u64>,
}

impl<T> Pool<T> {
    fn new(make: Box<dyn Fn() -> T>) -> Self {
        Pool {
            free: RefCell::new(Vec::new()),
            make,
            allocated: Cell::new(0),
        }
    }

    /// A free buffer, or a new one when none is free.
    pub fn take(&self) -> T {
        if let Some(buf) = self.free.borrow_mut().pop() {
            return buf;
        }
        self.allocated.set(self.allocated.get() + 1);
        (self.make)()
    }

    /// Returns a buffer for reuse.
    pub fn give(&self, buf: T) {
        self.free.borrow_mut().push(buf);
    }

    /// Buffers allocated so far (the high-water mark of buffers in use).
    pub fn allocated(&self) -> u64 {
        self.allocated.get()
    }
}

/// The two pools of one queue.
pub struct Buffers {
    /// In-place parts.
    pub heads: Pool<Head>,
    /// Spill-over and READ data parts.
    pub bigs: Pool<Big>,
}

impl Buffers {
    /// Pools for a queue whose requests carry at most `max_write` bytes of data.
    pub fn new(max_write: u32) -> Buffers {
        let big = (max_write as usize).max(4096);
        Buffers {
            heads: Pool::new(Box::new(Head::new)),
            bigs: Pool::new(Box::new(move || Big::new(big))),
        }
    }
}
