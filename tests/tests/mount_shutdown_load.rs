//! SIGTERM under load, in every dispatch mode and transport: 64 writes in flight from four
//! client jobs (16 threads each, one O_DIRECT write at a time per thread), then SIGTERM.
//! The daemon must exit 0 within 5 seconds, leave no mount, and every write it
//! acknowledged must be in the image, byte for byte.
//!
//! How "acknowledged" is checked without ambiguity: each thread owns its own blocks (block
//! b belongs to thread b % 64) and has at most one write in flight, so for every block the
//! image must hold the last write acknowledged for it, or else the one write its thread
//! still had in flight when the stop came (the kernel may have sent it and the daemon
//! completed it, or not). Each block's bytes are a pattern of (thread, sequence number),
//! so a torn or misplaced write shows too. Buffered on tmpfs, buffered on a disk-backed
//! file system (blocking writes on the loops), and with `--direct` there, where the
//! image's own O_DIRECT I/O is what must not be lost.

use std::fs;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use corofuse_tests::export::wait_for_progress;
use corofuse_tests::{
    assert_bytes_eq, dispatch_tests, open_direct, pattern, AlignedBuf, Dispatch, MountedExport,
    Sandbox, KIB, MIB,
};

const JOBS: u64 = 4;
const THREADS_PER_JOB: u64 = 16;
const THREADS: u64 = JOBS * THREADS_PER_JOB;
const BLOCK: u64 = 4 * KIB;
const LEN: u64 = 16 * MIB;
const BLOCKS: u64 = LEN / BLOCK;
/// The bound the issue sets on a stop under load.
const STOP_WITHIN: Duration = Duration::from_secs(5);

/// What one writer thread knows at the end: per owned block, the sequence number of the
/// last acknowledged write (0: none), and the write it had in flight when it stopped.
struct Ledger {
    acked: Vec<u64>,
    in_flight: Option<(u64, u64)>,
}

/// The pattern seed of write `seq` by `thread` (never 0, the image's initial seed).
fn seed(thread: u64, seq: u64) -> u64 {
    thread << 40 | seq
}

/// Writes random owned blocks until a write fails; returns the failing errno.
fn writer(file: &fs::File, thread: u64, ledger: &Mutex<Ledger>, writes: &AtomicU64) -> i32 {
    let owned = BLOCKS / THREADS;
    let mut rng = thread.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for seq in 1.. {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let block = (rng % owned) * THREADS + thread;
        let offset = block * BLOCK;
        let data = AlignedBuf::from_slice(&pattern(seed(thread, seq), offset, BLOCK as usize));
        ledger.lock().unwrap().in_flight = Some((block, seq));
        if let Err(e) = file.write_all_at(&data, offset) {
            return e.raw_os_error().unwrap_or(0);
        }
        let mut l = ledger.lock().unwrap();
        l.acked[(block / THREADS) as usize] = seq;
        l.in_flight = None;
        drop(l);
        writes.fetch_add(1, SeqCst);
    }
    unreachable!()
}

fn sigterm_under_load(mode: Dispatch, sandbox: &Sandbox, args: &[&str]) {
    let image = sandbox.file("disk.img", &pattern(0, 0, LEN as usize));
    let mut export = MountedExport::start(&image, &sandbox.mountpoint("mnt"), mode, args);
    let writes = Arc::new(AtomicU64::new(0));
    let ledgers: Vec<Arc<Mutex<Ledger>>> = (0..THREADS)
        .map(|_| {
            Arc::new(Mutex::new(Ledger {
                acked: vec![0; (BLOCKS / THREADS) as usize],
                in_flight: None,
            }))
        })
        .collect();
    // Not scoped: if the I/O hangs, the test fails instead of hanging with it.
    let mut threads = Vec::new();
    for job in 0..JOBS {
        let file = Arc::new(open_direct(export.path(), true).expect("open the mount"));
        for t in 0..THREADS_PER_JOB {
            let thread = job * THREADS_PER_JOB + t;
            let (file, ledger) = (Arc::clone(&file), Arc::clone(&ledgers[thread as usize]));
            let writes = Arc::clone(&writes);
            threads.push(std::thread::spawn(move || {
                writer(&file, thread, &ledger, &writes)
            }));
        }
    }
    wait_for_progress(&writes, 2000, "no I/O progress through the mount");
    let signalled = Instant::now();
    export.signal(libc::SIGTERM);
    let status = export.wait_exit(STOP_WITHIN).unwrap_or_else(|| {
        panic!(
            "{mode}: no exit {STOP_WITHIN:?} after SIGTERM with 64 writes in flight; {}",
            export.diagnose()
        )
    });
    let took = signalled.elapsed();
    assert!(status.success(), "{status}; stderr:\n{}", export.stderr());
    export.assert_unmounted();
    let ring = (mode == Dispatch::Uring).then_some(libc::ECANCELED);
    for t in threads {
        let errno = t.join().expect("writer thread");
        assert!(
            [libc::ENOTCONN, libc::EIO, libc::ENODEV, libc::ECONNABORTED].contains(&errno)
                || ring == Some(errno),
            "a writer ended with errno {errno}"
        );
    }
    let on_disk = fs::read(&image).unwrap();
    let (mut checked, mut landed_in_flight) = (0, 0);
    for (thread, ledger) in ledgers.iter().enumerate() {
        let thread = thread as u64;
        let l = ledger.lock().unwrap();
        for (i, &seq) in l.acked.iter().enumerate() {
            let block = i as u64 * THREADS + thread;
            let offset = block * BLOCK;
            let bytes = &on_disk[offset as usize..][..BLOCK as usize];
            let acked = pattern(
                if seq == 0 { 0 } else { seed(thread, seq) },
                offset,
                BLOCK as usize,
            );
            if bytes == acked.as_slice() {
                checked += u64::from(seq > 0);
                continue;
            }
            // Only the thread's unacknowledged write may have replaced it.
            match l.in_flight.filter(|&(b, _)| b == block) {
                Some((_, s)) => {
                    let pending = pattern(seed(thread, s), offset, BLOCK as usize);
                    let what = format!(
                        "block {block}: neither write {seq} (acknowledged) nor {s} (in flight) \
                         of thread {thread}"
                    );
                    assert_bytes_eq(bytes, &pending, &what);
                    landed_in_flight += 1;
                }
                None => assert_bytes_eq(
                    bytes,
                    &acked,
                    &format!("block {block}: acknowledged write {seq} of thread {thread}"),
                ),
            }
        }
    }
    assert!(checked > 0, "no acknowledged write to check");
    eprintln!(
        "{mode}: stopped in {took:?} after {} writes; {checked} blocks hold their last acknowledged write, {landed_in_flight} an in-flight one",
        writes.load(SeqCst)
    );
}

dispatch_tests!(mount_sigterm_under_64_writes_from_four_jobs_loses_no_acknowledged_write + ring);
fn mount_sigterm_under_64_writes_from_four_jobs_loses_no_acknowledged_write(mode: Dispatch) {
    sigterm_under_load(mode, &Sandbox::new(), &["-w"]);
}

dispatch_tests!(mount_sigterm_under_64_buffered_writes_on_disk_loses_no_acknowledged_write + ring);
/// The same with the image buffered on a disk-backed file system: its writes are blocking
/// `pwritev`s on the loops (`FileBackend::write_ctx`), not the ring's.
fn mount_sigterm_under_64_buffered_writes_on_disk_loses_no_acknowledged_write(mode: Dispatch) {
    let sandbox = match Sandbox::on_real_fs() {
        Ok(s) => s,
        Err(why) => return corofuse_tests::require::report_skip(&why),
    };
    sigterm_under_load(mode, &sandbox, &["-w"]);
}

dispatch_tests!(mount_sigterm_under_64_direct_writes_on_disk_loses_no_acknowledged_write + ring);
/// The same with the image opened O_DIRECT on a disk-backed file system.
fn mount_sigterm_under_64_direct_writes_on_disk_loses_no_acknowledged_write(mode: Dispatch) {
    let sandbox = match Sandbox::on_real_fs() {
        Ok(s) => s,
        Err(why) => return corofuse_tests::require::report_skip(&why),
    };
    sigterm_under_load(mode, &sandbox, &["-w", "--direct"]);
}
