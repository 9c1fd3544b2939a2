//! Worker coroutines and their job slots at stable addresses, so the loop resumes each one
//! in place and each worker finds its next job without a lookup.
//!
//! Moving a corosensei handle in and out of a queue on every switch costs more than the
//! switch (the moves stall on store forwarding). Here each key's worker handle and job slot
//! sit in an entry that never moves: entries come in heap chunks of [`CHUNK`], chunks are only
//! added, and the chunk list holds raw pointers so that growing it asserts nothing about the
//! chunks' contents. A coroutine running from its entry can therefore spawn others (which
//! may add chunks) without invalidating the entry the loop is resuming it from.
//!
//! The handle and the job slot are separate fields reached through raw pointers: the loop
//! holds `&mut` to a running worker's handle while that worker reads its own job slot.

use std::ptr::NonNull;

use crate::co::Co;
use crate::job::Job;
use crate::task::{Coro, TaskId};

const CHUNK: usize = 64;

struct Entry {
    co: Option<Coro>,
    job: Job,
}

type Chunk = [Entry; CHUNK];

pub(crate) struct CoroStore {
    chunks: Vec<NonNull<Chunk>>,
}

impl CoroStore {
    pub(crate) fn new() -> Self {
        CoroStore { chunks: Vec::new() }
    }

    /// Adds chunks up to the one holding `key`; returns where `key`'s job goes, an address
    /// that stays valid while the store lives.
    pub(crate) fn reserve(&mut self, key: usize) -> NonNull<Job> {
        while self.chunks.len() <= key / CHUNK {
            let chunk: Box<Chunk> = Box::new(std::array::from_fn(|_| Entry {
                co: None,
                job: Job::empty(),
            }));
            self.chunks.push(NonNull::from(Box::leak(chunk)));
        }
        // SAFETY: the entry is in a live chunk (just ensured); no reference is made.
        unsafe { NonNull::new_unchecked(&raw mut (*self.entry(key)).job) }
    }

    /// Stores the worker of `key` (reserved before).
    pub(crate) fn put(&mut self, key: usize, co: Coro) {
        // SAFETY: the entry is live; the loop thread is the only user and no reference to
        // this handle is live (its coroutine is not running).
        unsafe { (*self.entry(key)).co = Some(co) };
    }

    /// Takes the worker of `key` out (it ended, or the loop is shutting down).
    pub(crate) fn take(&mut self, key: usize) -> Option<Coro> {
        if key / CHUNK >= self.chunks.len() {
            return None;
        }
        // SAFETY: the entry is live; the worker of `key` is not running, so nothing else
        // refers to its handle.
        unsafe { (*self.entry(key)).co.take() }
    }

    /// Where the worker of `key` lives. The pointer stays valid while the store lives,
    /// whatever is put or taken at other keys meanwhile.
    #[inline(always)]
    pub(crate) fn slot(&self, key: usize) -> NonNull<Option<Coro>> {
        // SAFETY: the entry is live; no reference is made.
        unsafe { NonNull::new_unchecked(&raw mut (*self.entry(key)).co) }
    }

    /// Gives the idle worker of `key` its next job; returns whether the job had to be boxed.
    #[inline(always)]
    pub(crate) fn put_job<F>(&mut self, key: usize, id: TaskId, f: F) -> bool
    where
        F: FnOnce(&Co<'_>) + 'static,
    {
        // SAFETY: the entry is live; the worker of `key` is idle, so it does not touch its
        // job slot until it is resumed.
        unsafe { (*self.entry(key)).job.put(id, f) }
    }

    /// Takes out the job waiting at `key`, if its worker has not started it (shutdown).
    pub(crate) fn take_job(&mut self, key: usize) -> Option<Job> {
        if key / CHUNK >= self.chunks.len() {
            return None;
        }
        // SAFETY: the entry is live and its worker is not running.
        let job = unsafe { &mut (*self.entry(key)).job };
        // SAFETY: `job` is a live local reference for the duration of the call.
        unsafe { Job::pending(job) }?;
        Some(std::mem::replace(job, Job::empty()))
    }

    #[inline(always)]
    fn entry(&self, key: usize) -> *mut Entry {
        let chunk = self.chunks[key / CHUNK];
        // SAFETY: `chunk` is a live allocation of CHUNK entries and `key % CHUNK < CHUNK`.
        unsafe { chunk.as_ptr().cast::<Entry>().add(key % CHUNK) }
    }
}

impl Drop for CoroStore {
    fn drop(&mut self) {
        for chunk in self.chunks.drain(..) {
            // SAFETY: every chunk came from `Box::leak` in `reserve` and is freed only here.
            drop(unsafe { Box::from_raw(chunk.as_ptr()) });
        }
    }
}
