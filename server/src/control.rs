//! [`ServeHandle`]: how another thread reaches a running [`Server`](crate::Server): stop it,
//! or take a snapshot of its statistics, as a daemon does on SIGTERM and SIGUSR1.
//!
//! Commands go into a queue and an eventfd wakes the thread that serves (the supervisor,
//! which also runs the loop placement's trials), so it sleeps in `poll(2)` between
//! commands and trials instead of spinning.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::Report;

/// What the serving thread is asked to do.
pub(crate) enum Command {
    /// Stop taking requests, let those in flight finish, unmount.
    Stop,
    /// Send the statistics so far.
    Snapshot(Sender<Report>),
}

/// The queue of commands and the eventfd that announces them.
pub(crate) struct Commands {
    kick: OwnedFd,
    queue: Mutex<Vec<Command>>,
    finished: AtomicBool,
}

impl Commands {
    pub(crate) fn new() -> io::Result<Commands> {
        // SAFETY: eventfd(2) with valid flags; it returns a new descriptor or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Commands {
            // SAFETY: a fresh descriptor that nothing else owns.
            kick: unsafe { OwnedFd::from_raw_fd(fd) },
            queue: Mutex::new(Vec::new()),
            finished: AtomicBool::new(false),
        })
    }

    fn send(&self, command: Command) {
        self.queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(command);
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live buffer to an eventfd we own.
        let n = unsafe { libc::write(self.kick.as_raw_fd(), one.as_ptr().cast(), 8) };
        if n != 8 {
            log::warn!("waking the serving thread: {}", io::Error::last_os_error());
        }
    }

    /// Waits up to `timeout` for commands and takes every one queued.
    pub(crate) fn wait(&self, timeout: Duration) -> Vec<Command> {
        let mut fds = [libc::pollfd {
            fd: self.kick.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: `fds` is a valid array of one pollfd for the duration of the call.
        if unsafe { libc::poll(fds.as_mut_ptr(), 1, ms) } > 0 {
            let mut count = [0u8; 8];
            // SAFETY: reads at most 8 bytes into a live 8-byte buffer from our eventfd;
            // EAGAIN (already drained) is harmless.
            unsafe { libc::read(self.kick.as_raw_fd(), count.as_mut_ptr().cast(), 8) };
        }
        std::mem::take(&mut *self.queue.lock().unwrap_or_else(|e| e.into_inner()))
    }

    pub(crate) fn set_finished(&self) {
        self.finished.store(true, Ordering::SeqCst);
    }
}

/// A handle on a running [`Server`](crate::Server), for any thread (cheap to clone).
#[derive(Clone)]
pub struct ServeHandle(pub(crate) Arc<Commands>);

impl ServeHandle {
    /// Asks the server to stop: no new request is taken, those in flight finish, then
    /// [`Server::serve`](crate::Server::serve) flushes, unmounts and returns.
    pub fn stop(&self) {
        self.0.send(Command::Stop);
    }

    /// The statistics so far, merged over every loop; `None` once serving has ended or
    /// if no answer comes within `timeout`.
    pub fn snapshot(&self, timeout: Duration) -> Option<Report> {
        if self.is_finished() {
            return None;
        }
        let (tx, rx) = mpsc::channel();
        self.0.send(Command::Snapshot(tx));
        rx.recv_timeout(timeout).ok()
    }

    /// Whether serving has ended (stopped, or unmounted from outside) and the mount is gone.
    pub fn is_finished(&self) -> bool {
        self.0.finished.load(Ordering::SeqCst)
    }
}
