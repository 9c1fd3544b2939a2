//! Aligned bounce buffers for O_DIRECT, kept in a small pool.
//!
//! O_DIRECT needs the buffer address aligned too, so the bounce path cannot use the
//! caller's memory when it is not. Buffers are a fixed size (a multiple of the offset
//! alignment); a request larger than one buffer goes through it in chunks. The pool keeps
//! at most `max_idle` free buffers: in steady state (at most that many bounced requests in
//! flight at once) taking a buffer never allocates. Beyond that, a burst allocates extra
//! buffers and frees them afterwards rather than making requests wait.
//!
//! The buffers are [`AlignedBuf`]s (`aligned`).

use std::ops::{Deref, DerefMut};

use crate::aligned::AlignedBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// A bounded pool of equally sized aligned buffers, shared by all threads.
pub(crate) struct BouncePool {
    free: Mutex<Vec<AlignedBuf>>,
    buf_len: usize,
    align: usize,
    max_idle: usize,
    allocated: AtomicU64,
}

impl BouncePool {
    /// A pool of `buf_len`-byte buffers aligned to `align`, keeping at most `max_idle`.
    pub(crate) fn new(buf_len: usize, align: usize, max_idle: usize) -> BouncePool {
        let free = Mutex::new(Vec::with_capacity(max_idle));
        let allocated = AtomicU64::new(0);
        BouncePool {
            free,
            buf_len,
            align,
            max_idle,
            allocated,
        }
    }

    /// A free buffer, allocated only when none is idle. The lock is held for a pop, never
    /// across I/O, so this is safe to call from a coroutine.
    pub(crate) fn take(&self) -> Bounce<'_> {
        let idle = self.free.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let buf = idle.unwrap_or_else(|| {
            self.allocated.fetch_add(1, Ordering::Relaxed);
            AlignedBuf::new(self.buf_len, self.align)
        });
        Bounce {
            pool: self,
            buf: Some(buf),
        }
    }

    /// Buffers allocated since the pool was made (a steady state stops this growing).
    pub(crate) fn allocated(&self) -> u64 {
        self.allocated.load(Ordering::Relaxed)
    }

    fn put(&self, buf: AlignedBuf) {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        if free.len() < self.max_idle {
            free.push(buf);
        }
    }
}

/// A buffer on loan from a [`BouncePool`]; goes back on drop.
pub(crate) struct Bounce<'a> {
    pool: &'a BouncePool,
    buf: Option<AlignedBuf>,
}

impl Deref for Bounce<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.buf.as_deref().expect("present until drop")
    }
}

impl DerefMut for Bounce<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.buf.as_deref_mut().expect("present until drop")
    }
}

impl Drop for Bounce<'_> {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            self.pool.put(buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_aligned_and_reused() {
        let pool = BouncePool::new(8192, 4096, 1);
        let (a, b) = (pool.take(), pool.take());
        assert_eq!((a.as_ptr() as usize % 4096, a.len()), (0, 8192));
        drop((a, b)); // one is kept, one is freed
        let _c = pool.take();
        assert_eq!(pool.allocated(), 2);
    }
}
