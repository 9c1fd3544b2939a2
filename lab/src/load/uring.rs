//! The io_uring engine: keeps `iodepth` reads or writes in flight on one ring per job,
//! with one buffer slot per request (the slot index is the request's `user_data`).
//!
//! # Why it submits and reaps in batches
//! The load must never be what limits the daemon (issue 8). The first version called
//! `submit_and_wait(1)` on a plain ring: every reply the daemon wrote woke the sleeping
//! load through task work with an IPI, the load woke to find one or two completions,
//! resubmitted them and slept again. The daemon paid for a wakeup per reply, and saw the
//! next requests trickle in one or two at a time. fio does one `io_uring_enter` per I/O
//! without ever waiting (it nearly always finds completions in the ring), which keeps
//! the queue full at the price of a syscall per I/O. This engine does better than both:
//! - the ring is `SINGLE_ISSUER | DEFER_TASKRUN`, so a completion costs the daemon a
//!   list insertion, and the load is woken only once [`Spec::reap_min`] completions are
//!   ready (the kernel counts them for the waiter);
//! - one `io_uring_enter` submits everything reaped since the last one and waits for
//!   the next batch: with `reap_min` = iodepth / 4 (the default) the daemon always has
//!   three quarters of the depth queued while the load sleeps;
//! - the file and the buffers are registered (`READ_FIXED` / `WRITE_FIXED`), so a
//!   request neither looks up the fd nor pins its pages (the buffers stay pinned);
//! - two clock reads per batch, not per I/O: the I/Os of a batch are stamped with the
//!   time of the `io_uring_enter` that submits them and completed at the time it
//!   returns, as fio stamps them.
//!
//! Where a kernel refuses `DEFER_TASKRUN` (before 6.1) or a registration, the engine
//! falls back to a plain ring, the fd and unregistered buffers, and says so on stderr.
//!
//! # Buffer lifetime
//! The kernel writes into (or reads from) a slot until that request's completion is
//! reaped. Every exit path therefore drains the ring first; if draining itself fails,
//! the buffers are leaked rather than freed under the kernel.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::time::Instant;

use io_uring::{opcode, squeue, types, IoUring};

use super::{AlignedBuf, Offsets, Spec, Totals};
use runtime::histogram::Histogram;

pub fn run(file: &File, spec: &Spec, job: usize, hist: &mut Histogram) -> io::Result<Totals> {
    let depth = spec.iodepth;
    let mut ring = build(depth)?;
    let mut buf = AlignedBuf::new(depth, spec.bs as usize).map_err(io::Error::other)?;
    buf.fill_pattern();
    let registered = spec.registered && register(&ring, file, &mut buf);
    let mut job = Job {
        fd: file.as_raw_fd(),
        registered,
        spec,
        offsets: Offsets::new(spec, job),
        started: vec![Instant::now(); depth],
        fresh: Vec::with_capacity(depth),
        in_flight: 0,
        totals: Totals::default(),
    };
    let result = job.run(&mut ring, &mut buf, hist);
    if job.in_flight > 0 && job.drain(&mut ring).is_err() {
        // SAFETY-relevant: requests may still use `buf`; never free it under them.
        std::mem::forget(buf);
    }
    result.map(|()| job.totals)
}

/// A ring of at least `depth` entries: deferred task work where the kernel has it.
fn build(depth: usize) -> io::Result<IoUring> {
    let entries = (depth as u32).next_power_of_two();
    match IoUring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .build(entries)
    {
        Ok(ring) => Ok(ring),
        Err(e) => {
            eprintln!("load: no DEFER_TASKRUN ({e}); using a plain ring");
            IoUring::builder().build(entries)
        }
    }
}

/// Registers the file (index 0) and all slots as one buffer (index 0); false if the
/// kernel refused either (nothing stays registered then).
fn register(ring: &IoUring, file: &File, buf: &mut AlignedBuf) -> bool {
    let submitter = ring.submitter();
    if let Err(e) = submitter.register_files(&[file.as_raw_fd()]) {
        eprintln!("load: cannot register the file ({e}); using its fd");
        return false;
    }
    let all = buf.as_mut_slice();
    let iov = libc::iovec {
        iov_base: all.as_mut_ptr().cast(),
        iov_len: all.len(),
    };
    // SAFETY: the buffer outlives the ring: `run` drops (or leaks) it only after the
    // ring has no request in flight, and the ring is dropped first on every path.
    if let Err(e) = unsafe { submitter.register_buffers(&[iov]) } {
        eprintln!("load: cannot register the buffers ({e}); using plain reads and writes");
        let _ = submitter.unregister_files();
        return false;
    }
    true
}

struct Job<'a> {
    fd: i32,
    /// File index 0 and buffer index 0 are registered.
    registered: bool,
    spec: &'a Spec,
    offsets: Offsets,
    /// Submission time per slot (preallocated: nothing is allocated per I/O).
    started: Vec<Instant>,
    /// Slots queued since the last `io_uring_enter`, stamped when it submits them.
    fresh: Vec<usize>,
    in_flight: usize,
    totals: Totals,
}

impl Job<'_> {
    fn run(
        &mut self,
        ring: &mut IoUring,
        buf: &mut AlignedBuf,
        hist: &mut Histogram,
    ) -> io::Result<()> {
        let deadline = Instant::now() + self.spec.duration;
        for slot in 0..self.spec.iodepth {
            self.push(ring, buf, slot)?;
        }
        while self.in_flight > 0 {
            let want = self.spec.reap_min.min(self.in_flight);
            let submitted = Instant::now();
            for &slot in &self.fresh {
                self.started[slot] = submitted;
            }
            self.fresh.clear();
            enter(ring, want)?;
            let now = Instant::now();
            loop {
                // One CQE at a time: the queue's borrow must end before pushing again.
                let next = ring.completion().next();
                let Some(cqe) = next else { break };
                let slot = cqe.user_data() as usize;
                self.in_flight -= 1;
                let res = cqe.result();
                if res < 0 {
                    return Err(io::Error::from_raw_os_error(-res));
                }
                if res == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "0 bytes transferred",
                    ));
                }
                hist.record(now.duration_since(self.started[slot]).as_nanos() as u64);
                self.totals.ops += 1;
                self.totals.bytes += res as u64;
                if now < deadline {
                    self.push(ring, buf, slot)?;
                }
            }
        }
        Ok(())
    }

    /// Queues the next I/O in `slot` (submitted by the next [`enter`]).
    fn push(&mut self, ring: &mut IoUring, buf: &mut AlignedBuf, slot: usize) -> io::Result<()> {
        let offset = self.offsets.next();
        let ptr = buf.slot_ptr(slot);
        let len = self.spec.bs as u32;
        let writes = self.spec.rw.writes();
        let entry: squeue::Entry = match (self.registered, writes) {
            (true, true) => opcode::WriteFixed::new(types::Fixed(0), ptr, len, 0)
                .offset(offset)
                .build(),
            (true, false) => opcode::ReadFixed::new(types::Fixed(0), ptr, len, 0)
                .offset(offset)
                .build(),
            (false, true) => opcode::Write::new(types::Fd(self.fd), ptr, len)
                .offset(offset)
                .build(),
            (false, false) => opcode::Read::new(types::Fd(self.fd), ptr, len)
                .offset(offset)
                .build(),
        };
        // SAFETY: the slot stays allocated (and registered) until this request's
        // completion is reaped (see the module docs), and the file outlives the ring.
        unsafe { ring.submission().push(&entry.user_data(slot as u64)) }
            .map_err(|_| io::Error::other("submission queue full"))?;
        self.fresh.push(slot);
        self.in_flight += 1;
        Ok(())
    }

    /// Waits for every request still in flight, ignoring their results.
    fn drain(&mut self, ring: &mut IoUring) -> io::Result<()> {
        while self.in_flight > 0 {
            enter(ring, 1)?;
            self.in_flight -= ring.completion().count();
        }
        Ok(())
    }
}

/// `IORING_ENTER_GETEVENTS` (linux/io_uring.h): run deferred completions and wait.
const GETEVENTS: u32 = 1;

/// Submits what is queued, runs deferred completions and waits until at least `want`
/// are in the completion queue (0: do not wait), retrying on EINTR.
fn enter(ring: &mut IoUring, want: usize) -> io::Result<()> {
    loop {
        let to_submit = ring.submission().len() as u32;
        // SAFETY: no argument pointer is passed, and every queued entry is complete.
        let r = unsafe {
            ring.submitter()
                .enter::<libc::sigset_t>(to_submit, want as u32, GETEVENTS, None)
        };
        match r {
            Ok(_) => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(e) => return Err(e),
        }
    }
}
