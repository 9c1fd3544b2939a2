//! QEMU-style coroutine synchronisation: a wait queue (`CoQueue`), a mutex (`CoMutex`) and a
//! reader-writer lock (`CoRwlock`). They block the coroutine, never the loop thread.
//!
//! All of them live on one loop and are used from its coroutines only; waking records
//! the coroutine's identity, so a stale entry (a coroutine that is gone, or whose slot was
//! reused) never wakes the wrong coroutine.

use std::cell::{Cell, RefCell, UnsafeCell};
use std::collections::VecDeque;
use std::ops::{Deref, DerefMut};

use crate::co::Co;
use crate::task::{Park, TaskId};

/// Coroutines waiting for something, woken in FIFO order.
#[derive(Default)]
pub struct WaitQueue {
    waiters: RefCell<VecDeque<(usize, TaskId)>>,
}

impl WaitQueue {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// Suspends the calling coroutine until another one wakes it through this queue.
    /// Wakeups are not remembered: check your condition in a loop around `wait`.
    #[inline]
    pub fn wait(&self, co: &Co<'_>) {
        self.waiters.borrow_mut().push_back((co.key(), co.id()));
        co.park(Park::Wait);
    }

    /// Makes the longest-waiting coroutine ready; returns whether there was one.
    pub fn wake_one(&self, co: &Co<'_>) -> bool {
        loop {
            let Some((key, id)) = self.waiters.borrow_mut().pop_front() else {
                return false;
            };
            if co.inner.wake(key, id) {
                return true;
            }
        }
    }

    /// Makes every waiting coroutine ready; returns how many.
    pub fn wake_all(&self, co: &Co<'_>) -> usize {
        let mut woken = 0;
        while self.wake_one(co) {
            woken += 1;
        }
        woken
    }

    /// Whether no coroutine waits here.
    pub fn is_empty(&self) -> bool {
        self.waiters.borrow().is_empty()
    }
}

/// A mutex for coroutines of one loop: `lock` suspends while another coroutine holds it.
/// Unlocking hands the lock straight to the longest waiter (FIFO, no barging).
pub struct CoMutex<T> {
    locked: Cell<bool>,
    queue: WaitQueue,
    value: UnsafeCell<T>,
}

impl<T> CoMutex<T> {
    /// An unlocked mutex holding `value`.
    pub fn new(value: T) -> Self {
        CoMutex {
            locked: Cell::new(false),
            queue: WaitQueue::new(),
            value: UnsafeCell::new(value),
        }
    }

    /// Takes the lock, suspending while another coroutine holds it.
    pub fn lock<'a>(&'a self, co: &'a Co<'a>) -> CoMutexGuard<'a, T> {
        if self.locked.replace(true) {
            // The unlocker keeps `locked` set and hands the lock to us.
            self.queue.wait(co);
        }
        CoMutexGuard { mutex: self, co }
    }

    /// Whether some coroutine holds the lock.
    pub fn is_locked(&self) -> bool {
        self.locked.get()
    }
}

/// Access to a [`CoMutex`]'s value; unlocks on drop.
pub struct CoMutexGuard<'a, T> {
    mutex: &'a CoMutex<T>,
    co: &'a Co<'a>,
}

impl<T> Deref for CoMutexGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard exists only while its coroutine holds the lock, and the loop is
        // single-threaded, so no other reference to the value is live.
        unsafe { &*self.mutex.value.get() }
    }
}

impl<T> DerefMut for CoMutexGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`; `&mut self` makes this borrow unique.
        unsafe { &mut *self.mutex.value.get() }
    }
}

impl<T> Drop for CoMutexGuard<'_, T> {
    fn drop(&mut self) {
        if !self.mutex.queue.wake_one(self.co) {
            self.mutex.locked.set(false);
        }
    }
}

/// A reader-writer lock for coroutines, writer-preferring: once a writer waits, new readers
/// wait behind it. The export holds it shared for I/O and exclusive for a resize.
pub struct CoRwLock<T> {
    readers: Cell<usize>,
    writer: Cell<bool>,
    writers_waiting: Cell<usize>,
    queue: WaitQueue,
    value: UnsafeCell<T>,
}

impl<T> CoRwLock<T> {
    /// An unlocked lock holding `value`.
    pub fn new(value: T) -> Self {
        CoRwLock {
            readers: Cell::new(0),
            writer: Cell::new(false),
            writers_waiting: Cell::new(0),
            queue: WaitQueue::new(),
            value: UnsafeCell::new(value),
        }
    }

    /// Shared access; suspends while a writer holds or waits for the lock.
    pub fn read<'a>(&'a self, co: &'a Co<'a>) -> CoReadGuard<'a, T> {
        while self.writer.get() || self.writers_waiting.get() > 0 {
            self.queue.wait(co);
        }
        self.readers.set(self.readers.get() + 1);
        CoReadGuard { lock: self, co }
    }

    /// Exclusive access; suspends while anyone else holds the lock.
    pub fn write<'a>(&'a self, co: &'a Co<'a>) -> CoWriteGuard<'a, T> {
        self.writers_waiting.set(self.writers_waiting.get() + 1);
        while self.writer.get() || self.readers.get() > 0 {
            self.queue.wait(co);
        }
        self.writers_waiting.set(self.writers_waiting.get() - 1);
        self.writer.set(true);
        CoWriteGuard { lock: self, co }
    }
}

/// Shared access to a [`CoRwLock`]'s value.
pub struct CoReadGuard<'a, T> {
    lock: &'a CoRwLock<T>,
    co: &'a Co<'a>,
}

impl<T> Deref for CoReadGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: readers exclude a writer, so only shared references to the value exist.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> Drop for CoReadGuard<'_, T> {
    fn drop(&mut self) {
        let readers = self.lock.readers.get() - 1;
        self.lock.readers.set(readers);
        if readers == 0 {
            self.lock.queue.wake_all(self.co);
        }
    }
}

/// Exclusive access to a [`CoRwLock`]'s value.
pub struct CoWriteGuard<'a, T> {
    lock: &'a CoRwLock<T>,
    co: &'a Co<'a>,
}

impl<T> Deref for CoWriteGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the writer excludes every other holder.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for CoWriteGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`; `&mut self` makes this borrow unique.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for CoWriteGuard<'_, T> {
    fn drop(&mut self) {
        self.lock.writer.set(false);
        self.lock.queue.wake_all(self.co);
    }
}
