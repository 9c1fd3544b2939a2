//! The psync engine: one blocking pread(2)/pwrite(2) at a time, as fio's `psync` does.
//! At iodepth 1 this measures the full round trip of one request through the daemon.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::time::Instant;

use super::{AlignedBuf, Offsets, Spec, Totals};
use runtime::histogram::Histogram;

pub fn run(file: &File, spec: &Spec, job: usize, hist: &mut Histogram) -> io::Result<Totals> {
    let mut buf = AlignedBuf::new(1, spec.bs as usize).map_err(io::Error::other)?;
    buf.fill_pattern();
    let bs = spec.bs as usize;
    let data = &mut buf.slot(0)[..bs];
    let mut offsets = Offsets::new(spec, job);
    let mut totals = Totals::default();
    let start = Instant::now();
    let deadline = start + spec.duration;
    let mut now = start;
    while now < deadline {
        let offset = offsets.next();
        let n = if spec.rw.writes() {
            file.write_at(data, offset)?
        } else {
            file.read_at(data, offset)?
        };
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("0 bytes transferred at offset {offset}"),
            ));
        }
        let end = Instant::now();
        hist.record((end - now).as_nanos() as u64);
        totals.ops += 1;
        totals.bytes += n as u64;
        now = end;
    }
    Ok(totals)
}
