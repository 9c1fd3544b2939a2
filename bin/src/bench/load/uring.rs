//! The io_uring engine: keeps `iodepth` reads or writes in flight on one ring, as fio's
//! `io_uring` engine does, with one buffer slot per request (the slot index is the
//! request's `user_data`).
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

pub fn run(file: &File, spec: &Spec, hist: &mut Histogram) -> io::Result<Totals> {
    let depth = spec.iodepth;
    let mut ring: IoUring = IoUring::builder()
        .setup_single_issuer()
        .build((depth as u32).next_power_of_two())?;
    let mut buf = AlignedBuf::new(depth, spec.bs as usize).map_err(io::Error::other)?;
    buf.fill_pattern();
    let mut job = Job {
        fd: types::Fd(file.as_raw_fd()),
        spec,
        offsets: Offsets::new(spec),
        started: vec![Instant::now(); depth],
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

struct Job<'a> {
    fd: types::Fd,
    spec: &'a Spec,
    offsets: Offsets,
    /// Submission time per slot (preallocated: nothing is allocated per I/O).
    started: Vec<Instant>,
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
            wait(ring)?;
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

    /// Queues the next I/O in `slot` (submitted by the next [`wait`]).
    fn push(&mut self, ring: &mut IoUring, buf: &mut AlignedBuf, slot: usize) -> io::Result<()> {
        let offset = self.offsets.next();
        let ptr = buf.slot_ptr(slot);
        let len = self.spec.bs as u32;
        let entry: squeue::Entry = if self.spec.rw.writes() {
            opcode::Write::new(self.fd, ptr, len).offset(offset).build()
        } else {
            opcode::Read::new(self.fd, ptr, len).offset(offset).build()
        };
        self.started[slot] = Instant::now();
        // SAFETY: the slot stays allocated until this request's completion is reaped
        // (see the module docs), and the file outlives the ring's use of its fd.
        unsafe { ring.submission().push(&entry.user_data(slot as u64)) }
            .map_err(|_| io::Error::other("submission queue full"))?;
        self.in_flight += 1;
        Ok(())
    }

    /// Waits for every request still in flight, ignoring their results.
    fn drain(&mut self, ring: &mut IoUring) -> io::Result<()> {
        while self.in_flight > 0 {
            wait(ring)?;
            self.in_flight -= ring.completion().count();
        }
        Ok(())
    }
}

/// Submits what is queued and waits for at least one completion, retrying on EINTR.
fn wait(ring: &IoUring) -> io::Result<()> {
    loop {
        match ring.submit_and_wait(1) {
            Ok(_) => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(e) => return Err(e),
        }
    }
}
