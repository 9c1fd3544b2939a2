//! Blocking calls run on helper threads while the request's coroutine waits on the ring:
//! for a source where metadata calls wait on another machine or process (a network or
//! FUSE file system), so that one slow call holds back only its own request. QEMU runs its
//! blocking calls the same way (`thread_pool_submit_co`).
//!
//! How: [`Offload::run`] puts the call (a closure on the coroutine's stack, never moved
//! or boxed) on a queue that a few helper threads, started once, take from; the
//! coroutine then waits for an eventfd (taken from a pool, so nothing is opened per call)
//! through the loop's ring (`IORING_OP_POLL_ADD`), and the helper writes it when the call
//! is done. The closure's result comes back through the same stack slot.
//!
//! Safety: the closure and its result live on the waiting coroutine's stack, which the
//! helper uses until it marks the call done. The coroutine does not return before it has
//! seen that mark, even if its wait ends otherwise (the runtime cancelling I/O at
//! shutdown): it then waits on the thread. So the stack outlives every use of it.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use runtime::{Ctx, EventFd};

/// Helper threads, and calls queued at most before they wait their turn (the queue's
/// room, reserved once).
const QUEUE_ROOM: usize = 1024;

/// The slot a call and then its result live in, on the waiting coroutine's stack.
type Slot<F, R> = (Option<F>, Option<std::thread::Result<R>>);

/// One queued call: where its slot is and how to run it, the mark it sets when done and
/// the eventfd it writes then.
struct Job {
    run: unsafe fn(*mut ()),
    slot: *mut (),
    done: *const AtomicBool,
    wake: RawFd,
}

// SAFETY: the pointers name a slot and a flag on a coroutine stack that stays alive and
// untouched by its owner until `done` is set (module doc); the helper is the only one to
// use them meanwhile.
unsafe impl Send for Job {}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    stopping: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    ready: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A few helper threads for blocking calls, and the eventfds their callers wait on.
pub struct Offload {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    wakers: Mutex<Vec<EventFd>>,
}

impl Offload {
    /// Starts `threads` helpers.
    pub fn new(threads: usize) -> io::Result<Offload> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                jobs: VecDeque::with_capacity(QUEUE_ROOM),
                stopping: false,
            }),
            ready: Condvar::new(),
        });
        let mut started = Vec::with_capacity(threads);
        for i in 0..threads.max(1) {
            let shared = Arc::clone(&shared);
            started.push(
                std::thread::Builder::new()
                    .name(format!("dir-offload-{i}"))
                    .spawn(move || help(&shared))?,
            );
        }
        Ok(Offload {
            shared,
            threads: started,
            wakers: Mutex::new(Vec::with_capacity(QUEUE_ROOM)),
        })
    }

    /// `call()`, on a helper thread while this coroutine waits on the ring; in blocking
    /// dispatch (`cx` is [`Ctx::Blocking`]), on this thread. A panic in `call` is raised
    /// again here.
    pub fn run<R: Send, F: FnOnce() -> R + Send>(&self, cx: &Ctx<'_>, call: F) -> R {
        let Ctx::Coroutine(co) = cx else {
            return call();
        };
        let waker = match self.take_waker() {
            Ok(waker) => waker,
            Err(e) => {
                log::warn!("no eventfd for an offloaded call ({e}): made on the loop");
                return call();
            }
        };
        let mut slot: Slot<F, R> = (Some(call), None);
        let done = AtomicBool::new(false);
        let job = Job {
            run: run_slot::<F, R>,
            slot: (&raw mut slot).cast(),
            done: &raw const done,
            wake: waker.as_raw_fd(),
        };
        {
            let mut queue = self.shared.lock();
            queue.jobs.push_back(job);
        }
        self.shared.ready.notify_one();
        while !done.load(Ordering::Acquire) {
            if co.ctx().poll(&waker, libc::POLLIN).is_err() {
                // The wait ended without the call (the runtime cancels its I/O at
                // shutdown): the helper still uses this stack; wait on the thread.
                while !done.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_micros(100));
                }
            }
            // A count a late helper left for this eventfd's last user wakes us once for
            // nothing: drained here, then the wait goes on.
            waker.drain();
        }
        self.wakers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(waker);
        match slot.1.take().expect("a done call left its result") {
            Ok(result) => result,
            Err(payload) => panic::resume_unwind(payload),
        }
    }

    fn take_waker(&self) -> io::Result<EventFd> {
        match self.wakers.lock().unwrap_or_else(|e| e.into_inner()).pop() {
            Some(waker) => Ok(waker),
            None => EventFd::new(),
        }
    }
}

impl Drop for Offload {
    fn drop(&mut self) {
        self.shared.lock().stopping = true;
        self.shared.ready.notify_all();
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// Runs the call in the slot at `slot` and leaves its result there.
///
/// # Safety
/// `slot` points to a live `Slot<F, R>` that nothing else uses during the call.
unsafe fn run_slot<F: FnOnce() -> R, R>(slot: *mut ()) {
    // SAFETY: the caller's promise.
    let slot = unsafe { &mut *slot.cast::<Slot<F, R>>() };
    let call = slot.0.take().expect("a call runs once");
    slot.1 = Some(panic::catch_unwind(AssertUnwindSafe(call)));
}

/// A helper thread: takes calls until the pool stops.
fn help(shared: &Shared) {
    loop {
        let job = {
            let mut queue = shared.lock();
            loop {
                if let Some(job) = queue.jobs.pop_front() {
                    break job;
                }
                if queue.stopping {
                    return;
                }
                queue = shared.ready.wait(queue).unwrap_or_else(|e| e.into_inner());
            }
        };
        // SAFETY: the job's slot is alive and ours until `done` is set (module doc).
        unsafe { (job.run)(job.slot) };
        // SAFETY: `done` lives as long as the slot; after this store its owner may go on,
        // so the job's pointers are not used again (`wake` is a descriptor the owner
        // keeps open until it has drained it).
        unsafe { (*job.done).store(true, Ordering::Release) };
        // The owner keeps the eventfd open until it has seen `done` and drained it.
        let _ = runtime::signal_raw(job.wake);
    }
}
