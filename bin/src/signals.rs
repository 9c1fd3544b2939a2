//! Signals as a file descriptor: SIGINT, SIGTERM and SIGUSR1 are blocked on every thread
//! and read from a signalfd by a coroutine, so a signal never interrupts the event loop.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};

/// The signals the daemon handles.
pub const HANDLED: [i32; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGUSR1];

/// A signalfd for [`HANDLED`]; creating it blocks them in the calling thread (call it before
/// starting any other thread, which then inherits the mask).
pub struct SignalFd(OwnedFd);

impl SignalFd {
    pub fn new() -> io::Result<SignalFd> {
        // SAFETY: sigset_t is plain data; sigemptyset initialises it before use.
        let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is a valid sigset_t for these libc calls.
        unsafe {
            libc::sigemptyset(&mut set);
            for sig in HANDLED {
                libc::sigaddset(&mut set, sig);
            }
        }
        // SAFETY: `set` is initialised; a null old-set pointer is allowed.
        let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        // SAFETY: `set` is initialised; -1 asks for a new descriptor.
        let fd = unsafe { libc::signalfd(-1, &set, libc::SFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: signalfd returned a fresh descriptor that nothing else owns.
        Ok(SignalFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// The signal number in a `signalfd_siginfo` read from the descriptor.
    pub fn signo(info: &[u8; 128]) -> i32 {
        u32::from_ne_bytes([info[0], info[1], info[2], info[3]]) as i32
    }
}

impl AsFd for SignalFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}
