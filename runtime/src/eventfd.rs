//! [`EventFd`]: a wake-up another thread can send to a loop. The loop waits for it like
//! for any I/O ([`Ctx::poll`](crate::Ctx::poll) on it: the ring in a coroutine, poll(2) off
//! the loop); the sender only writes. Non-blocking, so neither side ever blocks on it.
//! A loop that waits on one *in the background* ([`EventFd::wait_in_background`]) may
//! block in a system call meanwhile ([`Co::block_while_idle`]); the sender then also ends
//! that call.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::{Arc, OnceLock};

use crate::interrupt::InterruptSlot;
use crate::Co;

/// A non-blocking eventfd(2).
#[derive(Debug)]
pub struct EventFd {
    fd: OwnedFd,
    /// What ends the blocking call of the loop that waits on it in the background, once
    /// one did.
    waiter: OnceLock<Arc<InterruptSlot>>,
}

impl EventFd {
    /// A new eventfd, count 0, non-blocking and close-on-exec.
    pub fn new() -> io::Result<EventFd> {
        // SAFETY: eventfd(2) with valid flags; it returns a new descriptor or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(EventFd {
            fd,
            waiter: OnceLock::new(),
        })
    }

    /// Adds one to the count, which makes the descriptor readable: the wake-up; and ends
    /// the blocking call of the loop that waits on it in the background, if it sleeps in
    /// one. Callable from any thread; the count cannot overflow in practice (2^64 - 2
    /// wake-ups).
    pub fn signal(&self) -> io::Result<()> {
        signal_raw(self.fd.as_raw_fd())?;
        if let Some(waiter) = self.waiter.get() {
            waiter.interrupt();
        }
        Ok(())
    }

    /// Waits, in a coroutine, until the count is not 0 (a poll on the ring), as a
    /// background wait of the loop ([`Co::wait_in_background`]): the loop may block
    /// meanwhile, and [`EventFd::signal`] ends that. One loop only should wait on an
    /// eventfd this way (the first one is the one signalled). Returns the poll's result
    /// (`ECANCELED` if the wait was cancelled).
    pub fn wait_in_background(&self, co: &Co<'_>) -> io::Result<i16> {
        self.waiter.get_or_init(|| Arc::clone(&co.inner.interrupt));
        co.wait_in_background(|| co.ctx().poll(self, libc::POLLIN))
    }

    /// Reads the count back to 0 (nothing if it already was).
    pub fn drain(&self) {
        let mut count = [0u8; 8];
        // SAFETY: reads at most 8 bytes into a live 8-byte buffer from our eventfd;
        // EAGAIN (already 0) is harmless.
        unsafe { libc::read(self.fd.as_raw_fd(), count.as_mut_ptr().cast(), 8) };
    }
}

/// [`EventFd::signal`] through a raw descriptor, for a sender that holds no borrow of the
/// [`EventFd`] (its owner keeps it open until it has seen the wake-up).
pub fn signal_raw(fd: std::os::fd::RawFd) -> io::Result<()> {
    let one = 1u64.to_ne_bytes();
    // SAFETY: writes 8 bytes from a live buffer; a descriptor that is not an open eventfd
    // makes the call fail, nothing else.
    let n = unsafe { libc::write(fd, one.as_ptr().cast(), 8) };
    match n {
        8 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

impl AsFd for EventFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signal_makes_it_readable_until_drained() {
        let e = EventFd::new().unwrap();
        let readable = |e: &EventFd| {
            let mut fds = [libc::pollfd {
                fd: e.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            }];
            // SAFETY: one valid pollfd, no wait.
            let ready = unsafe { libc::poll(fds.as_mut_ptr(), 1, 0) };
            ready == 1
        };
        assert!(!readable(&e));
        e.signal().unwrap();
        e.signal().unwrap();
        assert!(readable(&e));
        e.drain();
        assert!(!readable(&e));
        e.drain(); // already 0: nothing
        signal_raw(e.as_raw_fd()).unwrap();
        assert!(readable(&e));
    }
}
