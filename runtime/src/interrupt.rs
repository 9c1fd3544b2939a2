//! [`Interrupter`]: ending a blocking system call that an idle loop thread sleeps in.
//!
//! A loop with nothing to do but wait for one descriptor may wait in a blocking call on
//! it instead of the ring ([`Co::block_while_idle`](crate::Co::block_while_idle)): a
//! blocked `read(2)` of /dev/fuse is an exclusive waiter, woken alone and directly, where
//! a ring poll is woken through task work beside every other poller. But then the loop
//! does not see its own wake-ups (an [`EventFd`](crate::EventFd) it waits on in the
//! background): whoever signals one must end the blocked call. That takes a signal
//! without `SA_RESTART` (the call fails with `EINTR`) sent to the thread, and a signal is
//! racy: sent just before the thread enters the call, it is handled and gone, and the
//! call blocks. So the thread publishes its phase, and the sender signals only a thread
//! that is *blocked*, then sends again until the thread says it left.
//!
//! Phases, one atomic word: `RUNNING` → `BLOCKED` (the owner, just before the call) →
//! `SIGNALLING` (a sender, while it sends) → `SIGNALLED` → `RUNNING` (the owner, after the
//! call). Beside the phase, a `PENDING` bit that every interrupt sets: the owner does not
//! block while it is set, and only the owner clears it, when it declines to block (it then
//! waits through the ring, where the wake-up is seen). A signal is never sent outside
//! `SIGNALLING`, and the owner does not leave the call's phase while one is being sent:
//! it waits for `SIGNALLED`, then takes the signal with a system call of no effect, so no
//! later call of the thread sees a stray `EINTR`.

use std::io;
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};
use std::sync::{Once, OnceLock};
use std::time::Duration;

const RUNNING: u32 = 0;
const BLOCKED: u32 = 1;
const SIGNALLING: u32 = 2;
const SIGNALLED: u32 = 3;
const PHASE: u32 = 3;
/// An interrupt came that the owner has not seen yet.
const PENDING: u32 = 4;

/// How long a sender waits for the owner to leave the call before it signals again (the
/// first signal may have come just before the call).
const RESEND: Duration = Duration::from_micros(200);

/// The signal that ends a blocked call: the first real-time signal glibc leaves to
/// applications, with a handler that does nothing, installed without `SA_RESTART`.
fn interrupt_signal() -> libc::c_int {
    libc::SIGRTMIN()
}

extern "C" fn on_interrupt(_: libc::c_int) {}

/// Installs the do-nothing handler once per process.
fn install_handler() -> io::Result<()> {
    static INSTALL: Once = Once::new();
    static FAILED: AtomicI32 = AtomicI32::new(0);
    INSTALL.call_once(|| {
        // SAFETY: sigaction is plain data; zeroed means no flags (no SA_RESTART) and an
        // empty mask. The handler is async-signal-safe (it does nothing).
        let rc = unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_interrupt as extern "C" fn(libc::c_int) as usize;
            libc::sigaction(interrupt_signal(), &action, std::ptr::null_mut())
        };
        if rc != 0 {
            let errno = io::Error::last_os_error().raw_os_error();
            FAILED.store(errno.unwrap_or(libc::EINVAL), Ordering::SeqCst);
        }
    });
    match FAILED.load(Ordering::SeqCst) {
        0 => Ok(()),
        errno => Err(io::Error::from_raw_os_error(errno)),
    }
}

/// Lets the calling thread receive the interrupt signal (a thread may inherit a mask
/// that blocks it).
fn unblock_on_this_thread() -> io::Result<()> {
    // SAFETY: sigset_t is plain data, filled by sigemptyset/sigaddset before use.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t; the signal number is valid.
    let rc = unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, interrupt_signal());
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut())
    };
    match rc {
        0 => Ok(()),
        errno => Err(io::Error::from_raw_os_error(errno)),
    }
}

/// Ends the blocking call its owner thread sleeps in, from any thread; see the module.
#[derive(Debug)]
pub(crate) struct Interrupter {
    state: AtomicU32,
    /// The owner thread.
    tid: libc::pid_t,
    pid: libc::pid_t,
}

impl Interrupter {
    /// One for the calling thread, its owner: installs the signal's handler if no
    /// interrupter did yet, and unblocks the signal on this thread.
    pub(crate) fn for_this_thread() -> io::Result<Interrupter> {
        install_handler()?;
        unblock_on_this_thread()?;
        Ok(Interrupter {
            state: AtomicU32::new(RUNNING),
            // SAFETY: gettid has no preconditions.
            tid: unsafe { libc::gettid() },
            pid: std::process::id() as libc::pid_t,
        })
    }

    /// Makes the owner's blocking call end now if it sleeps in one, or its next attempt
    /// to block decline (the owner then waits through its ring). Call it after making the
    /// wake-up visible (the eventfd written). May wait a little while the owner leaves
    /// the call (a few hundred microseconds at worst).
    pub(crate) fn interrupt(&self) {
        let before = self.state.fetch_or(PENDING, Ordering::SeqCst);
        if before & PHASE == RUNNING {
            return;
        }
        let mut sent = false;
        loop {
            let now = self.state.load(Ordering::SeqCst);
            match (now & PHASE, sent) {
                (BLOCKED, false) => {}
                // Sent, and the owner is still in the call: the signal may have come just
                // before it. Wait, then send again if nothing changed.
                (SIGNALLED, true) => {
                    std::thread::sleep(RESEND);
                    if self.state.load(Ordering::SeqCst) != now {
                        continue;
                    }
                }
                // It left (and may block again, which declines once: `PENDING`), or
                // another sender is at it.
                _ => return,
            }
            let sending = (now & !PHASE) | SIGNALLING;
            if self
                .state
                .compare_exchange(now, sending, Ordering::SeqCst, Ordering::SeqCst)
                .is_err()
            {
                continue;
            }
            // SAFETY: tgkill with our own process and thread ids and a valid signal; the
            // owner thread is alive (it does not leave `SIGNALLING` before we do).
            let rc =
                unsafe { libc::syscall(libc::SYS_tgkill, self.pid, self.tid, interrupt_signal()) };
            if rc != 0 {
                let e = io::Error::last_os_error();
                log::warn!("interrupting loop thread {}: {e}", self.tid);
            }
            // SIGNALLING to SIGNALLED; only this sender changes the phase now.
            self.state
                .fetch_xor(SIGNALLING ^ SIGNALLED, Ordering::SeqCst);
            sent = true;
        }
    }

    /// On the owner thread: runs `call` (a blocking system call) unless an interrupt is
    /// pending, in which case it clears it and returns `None`. The call fails with
    /// `EINTR` if an interrupt comes while it blocks.
    pub(crate) fn block<T>(&self, call: impl FnOnce() -> T) -> Option<T> {
        if let Err(now) =
            self.state
                .compare_exchange(RUNNING, BLOCKED, Ordering::SeqCst, Ordering::SeqCst)
        {
            debug_assert_eq!(now, PENDING, "only the owner blocks");
            self.state.store(RUNNING, Ordering::SeqCst);
            return None;
        }
        let got = call();
        self.leave();
        Some(got)
    }

    /// The owner leaves the call's phase, keeping `PENDING` if set; if a signal was or is
    /// being sent, takes it first.
    fn leave(&self) {
        let mut now = self.state.load(Ordering::SeqCst);
        loop {
            match now & PHASE {
                SIGNALLING => {
                    std::hint::spin_loop();
                    now = self.state.load(Ordering::SeqCst);
                    continue;
                }
                SIGNALLED => {
                    // The signal is pending on this thread, or was handled: a system call
                    // returning to user space delivers it, here and not in a later call.
                    // SAFETY: getppid has no preconditions and no effect.
                    unsafe { libc::syscall(libc::SYS_getppid) };
                }
                _ => {}
            }
            let running = now & !PHASE;
            match self
                .state
                .compare_exchange(now, running, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => return,
                Err(changed) => now = changed,
            }
        }
    }
}

/// A loop's [`Interrupter`], made on the loop's thread the first time the loop blocks, and
/// shared with the eventfds it waits on in the background: a loop that never blocks
/// (`--idle-wait ring`) installs no signal and its wake-ups cost one load more.
#[derive(Debug, Default)]
pub(crate) struct InterruptSlot(OnceLock<Option<Interrupter>>);

impl InterruptSlot {
    /// On the owner thread: its interrupter, made now if it was not yet; `None` if it
    /// cannot be made (logged once: the loop then never blocks). A new one starts with an
    /// interrupt pending: a wake-up sent before it existed ended no call, so the first
    /// attempt to block declines and the loop looks at its ring first.
    pub(crate) fn get_or_make(&self) -> Option<&Interrupter> {
        self.0
            .get_or_init(|| {
                let made = Interrupter::for_this_thread()
                    .inspect_err(|e| {
                        log::warn!("a loop that cannot be interrupted never blocks: {e}")
                    })
                    .ok()?;
                made.interrupt();
                Some(made)
            })
            .as_ref()
    }

    /// Whether the owner made its interrupter (tried to block).
    #[cfg(test)]
    pub(crate) fn is_made(&self) -> bool {
        self.0.get().is_some()
    }

    /// From any thread, after making a wake-up visible: ends the owner's blocking call, if
    /// it ever made an interrupter ([`Interrupter::interrupt`]).
    pub(crate) fn interrupt(&self) {
        if let Some(Some(interrupter)) = self.0.get() {
            interrupter.interrupt();
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::Arc;

    /// A pipe whose read end blocks: the call an owner sleeps in.
    pub(crate) fn pipe() -> (std::fs::File, std::fs::File) {
        let mut fds = [0; 2];
        // SAFETY: pipe2 fills two descriptors we then own.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        use std::os::fd::FromRawFd;
        // SAFETY: fresh descriptors nothing else owns.
        unsafe {
            (
                std::fs::File::from_raw_fd(fds[0]),
                std::fs::File::from_raw_fd(fds[1]),
            )
        }
    }

    #[test]
    fn a_pending_interrupt_makes_the_next_block_decline_once() {
        let i = Interrupter::for_this_thread().unwrap();
        i.interrupt();
        assert!(i.block(|| 1).is_none());
        assert_eq!(i.block(|| 2), Some(2));
    }

    #[test]
    fn an_interrupt_ends_a_blocked_read_with_eintr_every_time() {
        use std::io::Read;
        let (mut reader, _writer) = pipe();
        let (tx, rx) = std::sync::mpsc::channel();
        let owner = std::thread::spawn(move || {
            let i = Arc::new(Interrupter::for_this_thread().unwrap());
            tx.send(Arc::clone(&i)).unwrap();
            let mut ended = 0;
            while ended < 50 {
                let mut byte = [0u8; 1];
                match i.block(|| reader.read(&mut byte)) {
                    Some(Err(e)) if e.raw_os_error() == Some(libc::EINTR) => ended += 1,
                    Some(other) => panic!("the read returned {other:?}"),
                    None => {} // the interrupt came before the call
                }
            }
            ended
        });
        let i = rx.recv().unwrap();
        // Each interrupt comes at some point of the owner's loop; the owner only counts
        // calls that ended with EINTR, so every call it blocked in was ended.
        while !owner.is_finished() {
            i.interrupt();
            std::thread::yield_now();
        }
        assert_eq!(owner.join().unwrap(), 50);
    }

    #[test]
    fn signals_land_only_in_blocking_calls() {
        use std::io::{Read, Write};
        let (mut reader, mut writer) = pipe();
        let (tx, rx) = std::sync::mpsc::channel();
        let owner = std::thread::spawn(move || {
            let i = Arc::new(Interrupter::for_this_thread().unwrap());
            tx.send(Arc::clone(&i)).unwrap();
            let mut byte = [0u8; 1];
            let mut outcomes = [0; 3]; // data, EINTR, declined
            for _ in 0..200 {
                match i.block(|| reader.read(&mut byte)) {
                    Some(Ok(1)) => outcomes[0] += 1,
                    Some(Err(e)) if e.raw_os_error() == Some(libc::EINTR) => outcomes[1] += 1,
                    None => outcomes[2] += 1,
                    Some(other) => panic!("the read returned {other:?}"),
                }
                // Outside `block` no signal may come, however the senders race with it.
                assert_eq!(reader.read(&mut byte).expect("a plain blocking read"), 1);
            }
            outcomes
        });
        let i = rx.recv().unwrap();
        let feeder = std::thread::spawn(move || {
            for _ in 0..1000 {
                if writer.write_all(b"x").is_err() {
                    return; // the owner is done
                }
                std::thread::sleep(Duration::from_micros(20));
            }
        });
        while !owner.is_finished() {
            i.interrupt();
        }
        let outcomes = owner.join().unwrap();
        assert_eq!(outcomes.iter().sum::<i32>(), 200, "{outcomes:?}");
        feeder.join().unwrap();
    }
}
