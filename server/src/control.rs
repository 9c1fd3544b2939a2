//! [`ServeHandle`]: how another thread reaches a running [`Server`](crate::Server): stop it,
//! or take a snapshot of its statistics, as a daemon does on SIGTERM and SIGUSR1.
//!
//! Commands go into a queue and an eventfd wakes the thread that serves (the supervisor,
//! which also runs the loop placement's trials), so it sleeps in `poll(2)` between
//! commands and trials instead of spinning.

use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use runtime::EventFd;

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
    kick: EventFd,
    queue: Mutex<Vec<Command>>,
    finished: AtomicBool,
}

impl Commands {
    pub(crate) fn new() -> io::Result<Commands> {
        Ok(Commands {
            kick: EventFd::new()?,
            queue: Mutex::new(Vec::new()),
            finished: AtomicBool::new(false),
        })
    }

    fn send(&self, command: Command) {
        self.queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(command);
        if let Err(e) = self.kick.signal() {
            log::warn!("waking the serving thread: {e}");
        }
    }

    /// Wakes the serving thread without a command (a loop's part of the session ended).
    pub(crate) fn wake(&self) {
        if let Err(e) = self.kick.signal() {
            log::warn!("waking the serving thread: {e}");
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
            self.kick.drain();
        }
        std::mem::take(&mut *self.queue.lock().unwrap_or_else(|e| e.into_inner()))
    }

    pub(crate) fn set_finished(&self) {
        self.finished.store(true, Ordering::SeqCst);
    }
}

/// A handle on a running [`Server`](crate::Server), for any thread (cheap to clone).
#[derive(Clone)]
pub struct ServeHandle {
    pub(crate) commands: Arc<Commands>,
    /// The file system's [`abort`](transport::FileSystem::abort).
    pub(crate) abort: Arc<dyn Fn() + Send + Sync>,
}

impl ServeHandle {
    /// Gives up on the requests in flight that wait for something outside the process
    /// (an NBD server): they fail with `EIO` now, so that a [`stop`](Self::stop) asked
    /// for before ends even if that server never answers.
    pub fn abort(&self) {
        (self.abort)();
    }

    /// Asks the server to stop: no new request is taken, those in flight finish, then
    /// [`Server::serve`](crate::Server::serve) flushes, unmounts and returns.
    pub fn stop(&self) {
        self.commands.send(Command::Stop);
    }

    /// The statistics so far, merged over every loop; `None` once serving has ended or
    /// if no answer comes within `timeout`.
    pub fn snapshot(&self, timeout: Duration) -> Option<Report> {
        if self.is_finished() {
            return None;
        }
        let (tx, rx) = mpsc::channel();
        self.commands.send(Command::Snapshot(tx));
        rx.recv_timeout(timeout).ok()
    }

    /// Whether serving has ended (stopped, or unmounted from outside) and the mount is gone.
    pub fn is_finished(&self) -> bool {
        self.commands.finished.load(Ordering::SeqCst)
    }
}
