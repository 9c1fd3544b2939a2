//! The `threads:N` transport: N worker threads, each with its own cloned /dev/fuse fd,
//! reading requests with blocking `read(2)` and serving them with blocking syscalls
//! ([`Ctx::Blocking`]) — the model of libfuse's multithreaded loop.
//!
//! Stopping: [`Workers::stop`] sets a flag and kicks every worker with `SIGUSR2`, whose
//! handler does nothing but is installed without `SA_RESTART`, so a worker blocked in
//! `read(2)` returns `EINTR` and sees the flag. The kick repeats until every worker has
//! left, which covers a worker that checked the flag just before the first kick.

use std::io;
use std::os::unix::thread::JoinHandleExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use runtime::Ctx;

use crate::accounting::{Accounting, OpReport, Sample};
use crate::buffers::RequestBuf;
use crate::dispatch::{serve_request, whole_request, QueueStats, Served};
use crate::FileSystem;
use fuse::decode::header_of;
use fuse::dev::{FuseDev, Received};

/// Worker threads serving one session.
pub struct Workers {
    stop: Arc<AtomicBool>,
    /// Set by a worker whose request stream failed (see [`Workers::failed`]).
    failed: Arc<AtomicBool>,
    threads: Vec<JoinHandle<(QueueStats, Accounting)>>,
    /// With accounting on, every request is recorded here too, so that statistics can be
    /// read while the workers run (one uncontended lock per request).
    shared: Option<Arc<Mutex<Totals>>>,
}

/// Statistics summed over workers.
#[derive(Default)]
pub struct Totals {
    /// Counts of requests and replies.
    pub stats: QueueStats,
    /// Per-opcode accounting.
    pub accounting: Accounting,
}

impl Workers {
    /// Starts `n` workers, each on a blocking clone of `session`; with `account`, each
    /// times its requests (there is no coroutine to count switches or I/O waits of).
    pub fn start<F: FileSystem>(
        session: &FuseDev,
        fs: &Arc<F>,
        max_write: u32,
        n: usize,
        account: bool,
    ) -> io::Result<Workers> {
        install_kick_handler()?;
        let stop = Arc::new(AtomicBool::new(false));
        let failed = Arc::new(AtomicBool::new(false));
        let shared = account.then(|| Arc::new(Mutex::new(Totals::default())));
        let mut threads = Vec::with_capacity(n);
        for i in 0..n {
            let dev = session.clone_queue(false)?;
            let (fs, shared) = (Arc::clone(fs), shared.clone());
            let flags = Flags {
                stop: Arc::clone(&stop),
                failed: Arc::clone(&failed),
            };
            let thread = std::thread::Builder::new()
                .name(format!("fuse-worker-{i}"))
                .spawn(move || work(&dev, &*fs, max_write, &flags, shared.as_deref()))?;
            threads.push(thread);
        }
        Ok(Workers {
            stop,
            failed,
            threads,
            shared,
        })
    }

    /// The statistics so far, while the workers run (with accounting on; zeros otherwise).
    pub fn snapshot(&self) -> (QueueStats, std::collections::BTreeMap<String, OpReport>) {
        match &self.shared {
            Some(shared) => {
                let totals = shared.lock().unwrap_or_else(|e| e.into_inner());
                (totals.stats, totals.accounting.report())
            }
            None => Default::default(),
        }
    }

    /// Whether a worker's request stream failed (a read error other than the unmount, or a
    /// read shorter than a request header): that worker left, and the caller should stop
    /// the others, unmount and exit with an error.
    pub fn failed(&self) -> bool {
        self.failed.load(Ordering::SeqCst)
    }

    /// Whether every worker has left (the file system was unmounted, or they were stopped).
    pub fn all_finished(&self) -> bool {
        self.threads.iter().all(JoinHandle::is_finished)
    }

    /// Stops the workers (requests being served finish first) and sums their statistics.
    pub fn stop(self) -> (QueueStats, Accounting) {
        self.stop.store(true, Ordering::SeqCst);
        while !self.all_finished() {
            for thread in self.threads.iter().filter(|t| !t.is_finished()) {
                // SAFETY: the pthread_t belongs to a thread we started and have not joined
                // (a finished but unjoined thread's id stays valid); SIGUSR2's handler is
                // installed and does nothing.
                unsafe { libc::pthread_kill(thread.as_pthread_t(), libc::SIGUSR2) };
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let (mut total, mut accounting) = (QueueStats::default(), Accounting::default());
        for thread in self.threads {
            match thread.join() {
                Ok((stats, acc)) => {
                    total.add(&stats);
                    accounting.merge(&acc);
                }
                Err(_) => log::error!("a FUSE worker thread panicked"),
            }
        }
        (total, accounting)
    }
}

/// What a worker watches and tells: the stop request, and its own stream's failure.
struct Flags {
    stop: Arc<AtomicBool>,
    failed: Arc<AtomicBool>,
}

/// One worker: read, serve, reply, until stopped or unmounted.
fn work<F: FileSystem>(
    dev: &FuseDev,
    fs: &F,
    max_write: u32,
    flags: &Flags,
    shared: Option<&Mutex<Totals>>,
) -> (QueueStats, Accounting) {
    let account = shared.is_some();
    let mut accounting = Accounting::default();
    let mut buf = RequestBuf::new(max_write);
    let mut stats = QueueStats {
        buffers_allocated: 1,
        ..QueueStats::default()
    };
    while !flags.stop.load(Ordering::SeqCst) {
        let read = dev.read(buf.read_area());
        let n = match read.and_then(|r| match r {
            Received::Request(n) => whole_request(n).map(Received::Request),
            other => Ok(other),
        }) {
            Ok(Received::Request(n)) => n,
            Ok(Received::Retry) => continue,
            Ok(Received::Unmounted) => break,
            Err(e) => {
                log::error!(
                    "reading /dev/fuse: {e}; the request stream is unusable, this worker stops"
                );
                stats.stream_errors += 1;
                flags.failed.store(true, Ordering::SeqCst);
                break;
            }
        };
        stats.requests += 1;
        if let Some(shared) = shared {
            // Counted before the reply, so that a snapshot taken once the client has its
            // answer includes the request.
            shared
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .stats
                .requests += 1;
        }
        let started = account.then(Instant::now);
        let opcode = header_of(buf.request(n)).map_or(0, |h| h.opcode);
        let (request, data) = buf.parts(n);
        let served = serve_request(fs, &Ctx::Blocking, request, &[], data, |reply| {
            dev.writev(&reply.io_slices())
        });
        stats.record(&served);
        if let (Some(started), Some(shared)) = (started, shared) {
            let sample = Sample {
                opcode,
                total: started.elapsed(),
                syscalls: 1 + u32::from(matches!(served, Served::Replied(_))),
                ..Sample::default()
            };
            accounting.record(&sample);
            let mut totals = shared.lock().unwrap_or_else(|e| e.into_inner());
            totals.stats.record(&served);
            totals.accounting.record(&sample);
        }
    }
    (stats, accounting)
}

extern "C" fn kick(_signal: libc::c_int) {}

/// Installs the do-nothing SIGUSR2 handler, without SA_RESTART, that interrupts `read(2)`.
fn install_kick_handler() -> io::Result<()> {
    // SAFETY: a zeroed sigaction is a valid starting point; the fields are set below.
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = kick as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: `action.sa_mask` is a valid sigset_t to initialise.
    unsafe { libc::sigemptyset(&mut action.sa_mask) };
    // SAFETY: `action` is fully initialised; a null old-action pointer is allowed.
    let rc = unsafe { libc::sigaction(libc::SIGUSR2, &action, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
