//! [`EventFd`]: a wake-up another thread can send to a loop. The loop waits for it like
//! for any I/O ([`Ctx::poll`](crate::Ctx::poll) on it: the ring in a coroutine, poll(2) off
//! the loop); the sender only writes. Non-blocking, so neither side ever blocks on it.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// A non-blocking eventfd(2).
#[derive(Debug)]
pub struct EventFd(OwnedFd);

impl EventFd {
    /// A new eventfd, count 0, non-blocking and close-on-exec.
    pub fn new() -> io::Result<EventFd> {
        // SAFETY: eventfd(2) with valid flags; it returns a new descriptor or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor that nothing else owns.
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Adds one to the count, which makes the descriptor readable: the wake-up. Callable
    /// from any thread; the count cannot overflow in practice (2^64 - 2 wake-ups).
    pub fn signal(&self) -> io::Result<()> {
        signal_raw(self.0.as_raw_fd())
    }

    /// Reads the count back to 0 (nothing if it already was).
    pub fn drain(&self) {
        let mut count = [0u8; 8];
        // SAFETY: reads at most 8 bytes into a live 8-byte buffer from our eventfd;
        // EAGAIN (already 0) is harmless.
        unsafe { libc::read(self.0.as_raw_fd(), count.as_mut_ptr().cast(), 8) };
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
        self.0.as_fd()
    }
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.0.as_raw_fd()
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
