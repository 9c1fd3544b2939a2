//! Per-request accounting, per opcode: where each request's time went and what it cost.
//!
//! For every request: the *wait* between the loop reaping its completion and its
//! coroutine starting to run; the *I/O* time its coroutine spent suspended on io_uring
//! (backend operations, and the reply when it goes through the ring); the *CPU* time, the
//! rest; and the *total* from the read completing to the reply written. Each goes into a
//! histogram of its opcode, beside sums of coroutine switches, SQEs and direct /dev/fuse
//! syscalls; each opcode's report names its family ([`fuse::OpKind::family`]). Recording
//! costs a few clock reads and histogram increments per request; the histograms of an
//! opcode are allocated the first time it is seen, never per request.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use runtime::{Co, CoStats};

use runtime::histogram::{Histogram, Summary};
use serde::Serialize;

use fuse::display::opcode_name;
use fuse::{Family, OpKind};

/// Opcodes get their own slot up to this number; higher ones share the last.
const SLOTS: usize = 64;

/// One request's measurements.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sample {
    /// The request's opcode.
    pub opcode: u32,
    /// From the completion of its read being reaped to its coroutine running.
    pub wait: Duration,
    /// Suspended on io_uring while serving it.
    pub io: Duration,
    /// From its read completing to its reply written (wait included).
    pub total: Duration,
    /// Transfers of control between the loop and its coroutine.
    pub switches: u32,
    /// SQEs submitted for it, the read that delivered it included.
    pub sqes: u32,
    /// Direct system calls on /dev/fuse for it (`read(2)`, `writev(2)`).
    pub syscalls: u32,
}

#[derive(Default)]
struct OpAccount {
    wait: Histogram,
    io: Histogram,
    cpu: Histogram,
    total: Histogram,
    switches: u64,
    sqes: u64,
    syscalls: u64,
}

/// The report of one opcode, as `--stats` writes it under `"ops"`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct OpReport {
    /// Requests of this opcode.
    pub count: u64,
    /// The family the opcode belongs to ([`fuse::OpKind::family`]), to sum over (absent
    /// in documents written before it was added).
    #[serde(default)]
    pub family: Option<Family>,
    /// Wait before running, ns.
    pub wait: Summary,
    /// Suspended on io_uring, ns.
    pub io: Summary,
    /// Running (total minus wait minus I/O), ns.
    pub cpu: Summary,
    /// From read to reply written, ns.
    pub total: Summary,
    /// Mean coroutine switches per request.
    pub switches_per_request: f64,
    /// Mean SQEs per request.
    pub sqes_per_request: f64,
    /// Mean direct /dev/fuse syscalls per request.
    pub syscalls_per_request: f64,
}

/// Histograms and sums per opcode.
#[derive(Default)]
pub struct Accounting {
    ops: Vec<Option<Box<OpAccount>>>,
}

impl Accounting {
    /// Records one request.
    pub fn record(&mut self, s: &Sample) {
        let slot = (s.opcode as usize).min(SLOTS - 1);
        if self.ops.len() < SLOTS {
            self.ops.resize_with(SLOTS, || None);
        }
        let op = self.ops[slot].get_or_insert_with(Box::default);
        let ns = |d: Duration| d.as_nanos() as u64;
        op.wait.record(ns(s.wait));
        op.io.record(ns(s.io));
        op.cpu.record(ns(s.total.saturating_sub(s.wait + s.io)));
        op.total.record(ns(s.total));
        op.switches += u64::from(s.switches);
        op.sqes += u64::from(s.sqes);
        op.syscalls += u64::from(s.syscalls);
    }

    /// Adds another accounting (another worker's) to this one.
    pub fn merge(&mut self, other: &Accounting) {
        for (slot, theirs) in other.ops.iter().enumerate() {
            let Some(theirs) = theirs else { continue };
            if self.ops.len() < SLOTS {
                self.ops.resize_with(SLOTS, || None);
            }
            let mine = self.ops[slot].get_or_insert_with(Box::default);
            mine.wait.merge(&theirs.wait);
            mine.io.merge(&theirs.io);
            mine.cpu.merge(&theirs.cpu);
            mine.total.merge(&theirs.total);
            mine.switches += theirs.switches;
            mine.sqes += theirs.sqes;
            mine.syscalls += theirs.syscalls;
        }
    }

    /// The report, keyed by opcode name (`READ`, `WRITE`...).
    pub fn report(&self) -> BTreeMap<String, OpReport> {
        let mut out = BTreeMap::new();
        for (slot, op) in self.ops.iter().enumerate() {
            let Some(op) = op else { continue };
            let count = op.total.count();
            let per = |sum: u64| sum as f64 / count.max(1) as f64;
            let name = match opcode_name(slot as u32) {
                Some(name) if slot < SLOTS - 1 => name.to_string(),
                _ => format!("OPCODE_{slot}+"),
            };
            out.insert(
                name,
                OpReport {
                    count,
                    family: Some(OpKind::from_opcode(slot as u32).family()),
                    wait: op.wait.summary(),
                    io: op.io.summary(),
                    cpu: op.cpu.summary(),
                    total: op.total.summary(),
                    switches_per_request: per(op.switches),
                    sqes_per_request: per(op.sqes),
                    syscalls_per_request: per(op.syscalls),
                },
            );
        }
        out
    }
}

/// Times one request on its coroutine (see the module docs).
pub(crate) struct RequestClock {
    opcode: u32,
    started: Instant,
    wait: Duration,
    before: CoStats,
}

impl RequestClock {
    pub(crate) fn start(co: &Co<'_>, opcode: u32) -> RequestClock {
        let started = Instant::now();
        let wait = co
            .reaped_at()
            .map_or(Duration::ZERO, |t| started.saturating_duration_since(t));
        RequestClock {
            opcode,
            started,
            wait,
            before: co.stats(),
        }
    }

    /// The sample, counting the read that delivered the request (one SQE, and the resume
    /// and final switch of its coroutine) and `syscalls` direct /dev/fuse calls.
    pub(crate) fn finish(self, co: &Co<'_>, syscalls: u32) -> Sample {
        let now = co.stats();
        Sample {
            opcode: self.opcode,
            wait: self.wait,
            io: now.io_wait.saturating_sub(self.before.io_wait),
            total: self.started.elapsed() + self.wait,
            switches: 2 + 2 * (now.suspends - self.before.suspends),
            sqes: 1 + now.sqes - self.before.sqes,
            syscalls,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_land_under_their_opcode_with_cpu_as_the_remainder() {
        let mut acc = Accounting::default();
        for i in 1..=100u64 {
            acc.record(&Sample {
                opcode: fuse::abi::FUSE_READ,
                wait: Duration::from_nanos(100),
                io: Duration::from_nanos(1000 * i),
                total: Duration::from_nanos(1000 * i + 600),
                switches: 4,
                sqes: 2,
                syscalls: 1,
            });
        }
        let mut other = Accounting::default();
        other.record(&Sample {
            opcode: fuse::abi::FUSE_GETATTR,
            total: Duration::from_micros(3),
            switches: 2,
            sqes: 1,
            syscalls: 1,
            ..Sample::default()
        });
        acc.merge(&other);
        let report = acc.report();
        let read = &report["READ"];
        assert_eq!(read.count, 100);
        assert_eq!(read.cpu.max_ns, 500, "total - wait - io");
        assert_eq!(read.wait.p50_ns, 100);
        assert_eq!(read.io.max_ns, 100_000);
        assert_eq!(
            (read.switches_per_request, read.sqes_per_request),
            (4.0, 2.0)
        );
        assert_eq!(report["GETATTR"].count, 1);
        assert_eq!(report.len(), 2);
        assert_eq!(read.family, Some(Family::Data));
        assert_eq!(report["GETATTR"].family, Some(Family::Attributes));
    }
}
