//! Serving with worker threads (`--dispatch threads:N`): the libfuse model, for comparison.
//!
//! The workers block in `read(2)` on their own cloned /dev/fuse fds; this thread waits for
//! signals (SIGUSR1: stats; SIGINT/SIGTERM: stop) and for the workers to leave by
//! themselves (the file system was unmounted), then flushes.

use std::os::fd::{AsFd, AsRawFd};

use backend::Ctx;
use runtime::CounterSnapshot;
use transport::blocking::Workers;
use transport::FileSystem;

use crate::mount::{Served, Serving};
use crate::signals::SignalFd;

pub fn serve<F: FileSystem>(serving: &Serving<F>, threads: usize) -> Served {
    let started = Workers::start(
        &serving.session,
        &serving.export,
        serving.max_write,
        threads,
        serving.accounting(),
    );
    let workers = match started {
        Ok(workers) => workers,
        Err(e) => return Served::failed(format!("starting {threads} worker threads: {e}")),
    };
    while !workers.all_finished() {
        if workers.failed() {
            log::error!("a worker's request stream failed: stopping the others, then unmounting");
            break;
        }
        match wait_signal(&serving.signals, 100) {
            Some(libc::SIGUSR1) => {
                let (queue, ops) = workers.snapshot();
                serving.write_stats(CounterSnapshot::default(), queue, &ops, &[]);
            }
            Some(signo) => {
                log::info!("signal {signo}: finishing the requests in flight, then unmounting");
                break;
            }
            None => {}
        }
    }
    let (queue, accounting) = workers.stop();
    Served {
        result: serving.flush(&Ctx::Blocking),
        runtime: CounterSnapshot::default(),
        queue,
        ops: accounting.report(),
        per_queue: Vec::new(),
    }
}

/// The next signal, or `None` after `timeout_ms` without one.
pub(crate) fn wait_signal(signals: &SignalFd, timeout_ms: i32) -> Option<i32> {
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
