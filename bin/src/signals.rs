//! Signals as a file descriptor: SIGINT, SIGTERM, SIGHUP and SIGUSR1 are blocked on every
//! thread and read from a signalfd by one thread of their own ([`watch`]), so a signal
//! never interrupts an event loop: SIGINT, SIGTERM and SIGHUP stop the server (flush,
//! unmount, exit 0, as qemu-storage-daemon ends on each), SIGUSR1 writes `--stats`.
//! SIGHUP's default would kill the daemon with its mount left stale and its image
//! unflushed: a closed terminal or a session's end must not do that.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::time::Duration;

use server::ServeHandle;

use crate::foreground::StatsFile;

/// The signals the daemon handles.
pub const HANDLED: [i32; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGUSR1];

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

/// Until serving ends: SIGINT/SIGTERM/SIGHUP stop the server (the requests in flight finish; a
/// second one gives up on those waiting for an NBD server), SIGUSR1 writes a snapshot to
/// `--stats`.
pub fn watch(signals: &SignalFd, handle: &ServeHandle, stats: &StatsFile) {
    let mut stopping = false;
    while !handle.is_finished() {
        match wait_signal(signals, 100) {
            Some(libc::SIGUSR1) => {
                if let Some(report) = handle.snapshot(Duration::from_secs(2)) {
                    stats.write(&report);
                }
            }
            Some(signo) if !stopping => {
                log::info!(
                    "{}: finishing the requests in flight, then unmounting \
                     (again to give up on those waiting for a remote server)",
                    name(signo)
                );
                handle.stop();
                stopping = true;
            }
            Some(signo) => {
                log::warn!(
                    "{} again: the requests waiting for a remote server fail with EIO",
                    name(signo)
                );
                handle.abort();
            }
            None => {}
        }
    }
}

/// A handled signal's name, for the log.
fn name(signo: i32) -> &'static str {
    match signo {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        libc::SIGHUP => "SIGHUP",
        _ => "a signal",
    }
}

/// The next signal, or `None` after `timeout_ms` without one.
pub fn wait_signal(signals: &SignalFd, timeout_ms: i32) -> Option<i32> {
    let mut fds = [libc::pollfd {
        fd: signals.as_fd().as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    }];
    // SAFETY: `fds` is a valid array of one pollfd for the duration of the call.
    if unsafe { libc::poll(fds.as_mut_ptr(), 1, timeout_ms) } <= 0 {
        return None;
    }
    let mut info = [0u8; 128];
    // SAFETY: `info` is a writable 128-byte buffer, the size of a signalfd_siginfo.
    let n = unsafe {
        libc::read(
            signals.as_fd().as_raw_fd(),
            info.as_mut_ptr().cast(),
            info.len(),
        )
    };
    (n == 128).then(|| SignalFd::signo(&info))
}
