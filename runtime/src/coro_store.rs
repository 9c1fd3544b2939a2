//! Worker coroutines at stable addresses, so the loop resumes each one in place.
//!
//! Moving a corosensei handle in and out of a queue on every switch costs more than the
//! switch (the moves stall on store forwarding). Here each key's worker handle sits in an
//! entry that never moves: entries come in heap chunks of [`CHUNK`], chunks are only added,
//! and the chunk list holds raw pointers so that growing it asserts nothing about the
//! chunks' contents. A coroutine running from its entry can therefore spawn others (which
//! may add chunks) without invalidating the entry the loop is resuming it from.

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

    /// Stores the worker of `key`, adding chunks up to the one holding `key`.
    pub(crate) fn put(&mut self, key: usize, co: Coro) {
        while self.chunks.len() <= key / CHUNK {
            let chunk: Box<Chunk> = Box::new(std::array::from_fn(|_| None));
            self.chunks.push(NonNull::from(Box::leak(chunk)));
        }
        // SAFETY: the entry is live; the loop thread is the only user and no reference to
        // this handle is live (its coroutine is not running).
        unsafe { *self.entry(key) = Some(co) };
    }

    /// Takes the worker of `key` out (it ended, or the loop is shutting down).
    pub(crate) fn take(&mut self, key: usize) -> Option<Coro> {
        if key / CHUNK >= self.chunks.len() {
            return None;
        }
        // SAFETY: the entry is live; the worker of `key` is not running, so nothing else
        // refers to its handle.
        unsafe { (*self.entry(key)).take() }
    }

    /// Where the worker of `key` lives. The pointer stays valid while the store lives,
    /// whatever is put or taken at other keys meanwhile.
    #[inline(always)]
    pub(crate) fn slot(&self, key: usize) -> NonNull<Option<Coro>> {
        // SAFETY: the entry is live; no reference is made.
        unsafe { NonNull::new_unchecked(self.entry(key)) }
    }

    #[inline(always)]
    fn entry(&self, key: usize) -> *mut Option<Coro> {
        let chunk = self.chunks[key / CHUNK];
        // SAFETY: `chunk` is a live allocation of CHUNK entries and `key % CHUNK < CHUNK`.
        unsafe { chunk.as_ptr().cast::<Option<Coro>>().add(key % CHUNK) }
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
