//! `--daemonize` as qsd does it: the parent waits on a pipe and exits 0 only once the
//! child says every export is live, or 1 if the child fails first (the child has printed
//! why). The child starts a session of its own and, once started, points stdin, stdout
//! and stderr at /dev/null.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// The child's end of the pipe to the waiting parent.
pub struct Parent(OwnedFd);

/// Forks; returns in the child only. Call before any thread starts.
pub fn fork() -> io::Result<Parent> {
    let mut fds = [0; 2];
    // SAFETY: `fds` is a writable array of two ints for pipe2(2).
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 returned two fresh descriptors that nothing else owns.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: the process has one thread here (the caller's contract), so the child may
    // run any code after fork(2).
    match unsafe { libc::fork() } {
        -1 => Err(io::Error::last_os_error()),
        0 => {
            drop(read);
            // SAFETY: setsid(2) takes no arguments; failure (already a leader) is harmless.
            unsafe { libc::setsid() };
            Ok(Parent(write))
        }
        _ => {
            drop(write);
            let mut byte = [0u8; 1];
            // SAFETY: `byte` is a writable one-byte buffer for read(2).
            let n = unsafe { libc::read(read.as_raw_fd(), byte.as_mut_ptr().cast(), 1) };
            std::process::exit(if n == 1 && byte[0] == 0 { 0 } else { 1 });
        }
    }
}

impl Parent {
    /// Every export is live: the parent exits 0, and the standard streams go to /dev/null.
    pub fn started(self) {
        // SAFETY: a one-byte buffer for write(2) on the pipe we own.
        unsafe { libc::write(self.0.as_raw_fd(), [0u8].as_ptr().cast(), 1) };
        if let Ok(null) = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/null")
        {
            for fd in 0..3 {
                // SAFETY: dup2(2) onto the standard descriptors, from a file we hold open.
                unsafe { libc::dup2(null.as_raw_fd(), fd) };
            }
        }
    }
}
