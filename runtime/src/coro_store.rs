//! Coroutine handles at stable addresses, so the loop resumes each one in place.
//!
//! Moving a corosensei handle in and out of a queue on every switch costs more than the
//! switch (the moves stall on store forwarding). Here each live coroutine's handle sits in
//! a slot that never moves: slots come in heap chunks of [`CHUNK`], chunks are only added,
//! and the chunk list holds raw pointers so that growing it asserts nothing about the
//! chunks' contents. A coroutine running from its slot can therefore spawn others (which
//! may add chunks) without invalidating the slot the loop is resuming it from.

use std::ptr::NonNull;

use crate::task::Coro;

const CHUNK: usize = 64;

type Chunk = [Option<Coro>; CHUNK];

pub(crate) struct CoroStore {
    chunks: Vec<NonNull<Chunk>>,
}

impl CoroStore {
    pub(crate) fn new() -> Self {
        CoroStore { chunks: Vec::new() }
    }

    /// Stores the coroutine of slab key `key`, adding chunks up to it if needed.
    pub(crate) fn put(&mut self, key: usize, co: Coro) {
        while self.chunks.len() <= key / CHUNK {
            let chunk: Box<Chunk> = Box::new(std::array::from_fn(|_| None));
            self.chunks.push(NonNull::from(Box::leak(chunk)));
        }
        let slot = self.slot(key);
        // SAFETY: `slot` points into a live chunk (just ensured); the loop thread is the
        // only user and no reference to this slot is live (its coroutine is not running).
        unsafe { *slot.as_ptr() = Some(co) };
    }

    /// Takes the coroutine of `key` out (it finished, or the loop is shutting down).
    pub(crate) fn take(&mut self, key: usize) -> Option<Coro> {
        if key / CHUNK >= self.chunks.len() {
            return None;
        }
        // SAFETY: the chunk is live; the coroutine of `key` is not running, so nothing else
        // refers to its slot.
        unsafe { (*self.slot(key).as_ptr()).take() }
    }

    /// Where the coroutine of `key` lives. The pointer stays valid while the store lives,
    /// whatever is put or taken at other keys meanwhile.
    pub(crate) fn slot(&self, key: usize) -> NonNull<Option<Coro>> {
        let chunk = self.chunks[key / CHUNK];
        // SAFETY: `chunk` is a live allocation of CHUNK slots and `key % CHUNK < CHUNK`.
        unsafe { NonNull::new_unchecked(chunk.as_ptr().cast::<Option<Coro>>().add(key % CHUNK)) }
    }
}

impl Drop for CoroStore {
    fn drop(&mut self) {
        for chunk in self.chunks.drain(..) {
            // SAFETY: every chunk came from `Box::leak` in `put` and is freed only here.
            drop(unsafe { Box::from_raw(chunk.as_ptr()) });
        }
    }
}
