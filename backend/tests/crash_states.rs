//! The crash-state checker (`backend::crash`, `corofuse crash-check`) on logs recorded
//! through the backend API: raw and qcow2 (v2 and v3, 64 KiB and 512-byte clusters, an
//! internal snapshot, a backing file, a dirty image repaired at open), with random writes
//! flushed every few operations, discards and zeroes, growth, and writes into clusters a
//! snapshot shares. Every state of every window must pass; and the checker must catch an
//! export that acknowledges a flush before the writes it covers reach the image.
//!
//! Images live on /dev/shm where it is tmpfs (the checker's state files are synced by
//! corofuse's close: cheap there). `COROFUSE_TEST_SEED` picks the seed.

mod util;

use std::fs;
use std::io::{self, IoSlice, IoSliceMut};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use backend::crash::{self, CheckError};
use backend::record::{self, Level, RecordBackend, WriteLog};
use backend::{BlockBackend, Ctx, Extent, FileBackend, OpenOptions};
use corofuse_tests::qcow2::{create, make_snapshot, qemu_io};
use corofuse_tests::{pattern, require_tool, Rng, Seed};

const RW: OpenOptions = OpenOptions {
    writable: true,
    direct: false,
    lock: false,
    format: backend::Format::Auto,
    snapshot: None,
};
const MIB: u64 = 1 << 20;
/// Random states per window.
const STATES: u32 = 10;

/// A temporary directory on tmpfs if there is one.
fn scratch() -> tempfile::TempDir {
    match util::fs_type(Path::new("/dev/shm")).as_deref() {
        Some("tmpfs") => tempfile::tempdir_in("/dev/shm").unwrap(),
        _ => tempfile::tempdir().unwrap(),
    }
}

/// What a workload does besides random writes.
#[derive(Clone, Copy, Default)]
struct Mix {
    /// A flush every this many operations.
    flush_every: u64,
    /// Discards and write_zeroes among the operations.
    zeroes: bool,
    /// Grow the disk half-way and write past the old end.
    grow: bool,
    /// Write sizes up to this (bytes).
    max_write: u64,
}

fn workload(cx: &Ctx<'_>, disk: &dyn BlockBackend, rng: &mut Rng, ops: u64, mix: Mix) {
    for i in 1..=ops {
        if mix.grow && i == ops / 2 {
            disk.resize(cx, disk.len() + MIB).unwrap();
        }
        let len = disk.len();
        let at = match mix.grow && i > ops / 2 && rng.below(3) == 0 {
            true => len - MIB + rng.below(MIB),
            false => rng.below(len),
        };
        let n = (1 + rng.below(mix.max_write)).min(len - at);
        match rng.below(8) {
            0 if mix.zeroes => disk.discard(cx, at, n).unwrap(),
            1 if mix.zeroes => disk.write_zeroes(cx, at, n, rng.below(2) == 0).unwrap(),
            _ => {
                let data = pattern(rng.next_u64(), at, n as usize);
                disk.writev(cx, &[IoSlice::new(&data)], at).unwrap();
            }
        }
        if i % mix.flush_every == 0 {
            disk.flush(cx).unwrap();
        }
    }
}

/// Records `ops` operations of `mix` on `image` and checks every crash state of the log.
fn record_and_check(image: &Path, ops: u64, mix: Mix) -> crash::Report {
    let seed = Seed::choose().value();
    let base = base_of(image);
    fs::copy(image, &base).unwrap();
    let log_path = image.with_extension("log");
    let disk = open_recording(image, &log_path);
    workload(&Ctx::Blocking, &*disk, &mut Rng::new(seed), ops, mix);
    drop(disk);
    check(&base, &log_path, seed)
}

/// `image` opened writable, in the format its magic names (as a user names it: a probed
/// qcow2 image's backing file is not followed), recording into a new log at `log_path`.
fn open_recording(image: &Path, log_path: &Path) -> Arc<dyn BlockBackend> {
    let log = Arc::new(WriteLog::create(log_path, record::DEFAULT_CAP).unwrap());
    let opts = OpenOptions {
        format: match backend::crash::is_qcow2(image).unwrap() {
            true => backend::Format::Qcow2,
            false => backend::Format::Raw,
        },
        ..RW
    };
    backend::open_recorded(image.to_str().unwrap(), &opts, &log).unwrap()
}

fn base_of(image: &Path) -> PathBuf {
    let name = image.file_name().unwrap().to_string_lossy();
    image.with_file_name(format!("base-{name}"))
}

fn check(base: &Path, log: &Path, seed: u64) -> crash::Report {
    let opts = crash::Options {
        states: STATES,
        seed,
        sector: [512, 4096][(seed % 2) as usize],
        recheck_every: 3,
    };
    match crash::check(base, log, &opts) {
        Ok(report) => {
            eprintln!("{}: {report}", base.display());
            assert!(report.windows > 3, "{report}");
            report
        }
        Err(e) => panic!("{e}"),
    }
}

const RANDOM: Mix = Mix {
    flush_every: 6,
    zeroes: false,
    grow: false,
    max_write: 96 << 10,
};
const ZEROES: Mix = Mix {
    zeroes: true,
    ..RANDOM
};

#[test]
fn crash_states_raw() {
    let dir = scratch();
    let image = dir.path().join("disk.raw");
    fs::write(&image, pattern(3, 0, 4 << 20)).unwrap();
    let mix = Mix {
        grow: true,
        ..ZEROES
    };
    record_and_check(&image, 80, mix);
}

fn qcow2(dir: &Path, name: &str, opts: &str) -> PathBuf {
    let image = dir.join(format!("{name}.qcow2"));
    create(&image, opts, Some("4M"));
    image
}

#[test]
fn crash_states_qcow2_v2_64k_random_writes() {
    require_tool!("qemu-img");
    let dir = scratch();
    record_and_check(&qcow2(dir.path(), "v2", "compat=0.10"), 90, RANDOM);
}

#[test]
fn crash_states_qcow2_v3_64k_discards_zeroes_growth() {
    require_tool!("qemu-img");
    let dir = scratch();
    let mix = Mix {
        grow: true,
        ..ZEROES
    };
    record_and_check(&qcow2(dir.path(), "v3", "compat=1.1"), 90, mix);
}

/// 512-byte clusters: a reservation is 4096 clusters (2 MiB), so big writes cross its
/// refills; many L2 tables are made.
#[test]
fn crash_states_qcow2_v3_512_refills() {
    require_tool!("qemu-img");
    let dir = scratch();
    let image = qcow2(dir.path(), "v3-512", "compat=1.1,cluster_size=512");
    let mix = Mix {
        max_write: 512 << 10,
        ..ZEROES
    };
    record_and_check(&image, 50, mix);
}

/// Writes into clusters and L2 tables that an internal snapshot shares (copied first).
#[test]
fn crash_states_qcow2_snapshot_shared_clusters() {
    require_tool!("qemu-img");
    require_tool!("qemu-io");
    let dir = scratch();
    for (name, opts) in [
        ("snap-v3", "compat=1.1"),
        ("snap-v2-512", "compat=0.10,cluster_size=512"),
    ] {
        let image = qcow2(dir.path(), name, opts);
        qemu_io(&image, &["write -P 0x5a 0 3M", "discard 1M 64k"]);
        make_snapshot(&image, "before");
        let mix = Mix {
            max_write: 32 << 10,
            ..ZEROES
        };
        record_and_check(&image, 60, mix);
    }
}

/// A qcow2 image over a raw backing file: unallocated clusters read from it, and partial
/// writes copy the rest of the cluster from it.
#[test]
fn crash_states_qcow2_backing_file() {
    require_tool!("qemu-img");
    let dir = scratch();
    let backing = dir.path().join("backing.raw");
    fs::write(&backing, pattern(9, 0, 4 << 20)).unwrap();
    let image = dir.path().join("over.qcow2");
    let opts = format!(
        "compat=1.1,backing_file={},backing_fmt=raw",
        backing.display()
    );
    create(&image, &opts, None);
    record_and_check(&image, 80, ZEROES);
}

/// An image left dirty (a daemon that never closed it: its reservation leaked, its DIRTY
/// bit set) is repaired at the next writable open: a crash during the repair, or after,
/// must lose nothing flushed.
#[test]
fn crash_states_qcow2_dirty_image_repaired_at_open() {
    require_tool!("qemu-img");
    let dir = scratch();
    let image = qcow2(dir.path(), "dirty", "compat=1.1");
    let disk = backend::open(image.to_str().unwrap(), &RW).unwrap();
    workload(&Ctx::Blocking, &*disk, &mut Rng::new(5), 20, RANDOM);
    std::mem::forget(disk); // no clean close: still dirty, the reservation leaked
    let log_path = image.with_extension("log");
    let base = base_of(&image);
    fs::copy(&image, &base).unwrap();
    let disk = open_recording(&image, &log_path);
    workload(&Ctx::Blocking, &*disk, &mut Rng::new(6), 40, ZEROES);
    drop(disk);
    check(&base, &log_path, Seed::choose().value());
}

/// Regression (found by the checker): a partial write into a cluster whose other bytes
/// come from elsewhere (the backing file; a cluster a snapshot shares) is rewritten into a
/// new cluster and linked in its L2 table. The L2 entry was written with no flush after
/// the new cluster's data, so a power loss could keep the entry and lose the data: the
/// bytes the write did not touch read as zeroes instead of the backing file's or the
/// snapshot's. Found as "byte 244647 of the disk reads 0x00, ... made it 0x71" (backing
/// file) and "byte 786432 reads 0x00 ... 0x5a" (a discard of part of a shared cluster).
/// The state it fails in on the old code: the L1 entry and the L2 entry kept, the new
/// cluster's data lost ("crash state 1:7 (seed 1)").
#[test]
fn crash_states_qcow2_partial_write_copies_before_linking() {
    require_tool!("qemu-img");
    require_tool!("qemu-io");
    let dir = scratch();
    let backing = dir.path().join("backing.raw");
    fs::write(&backing, pattern(9, 0, 1 << 20)).unwrap();
    let over = dir.path().join("over.qcow2");
    let opts = format!(
        "compat=1.1,backing_file={},backing_fmt=raw",
        backing.display()
    );
    create(&over, &opts, None);
    let snap = qcow2(dir.path(), "snap", "compat=1.1");
    qemu_io(&snap, &["write -P 0x5a 0 1M"]);
    make_snapshot(&snap, "before");
    for image in [over, snap] {
        let base = base_of(&image);
        fs::copy(&image, &base).unwrap();
        let log_path = image.with_extension("log");
        let disk = open_recording(&image, &log_path);
        let cx = Ctx::Blocking;
        disk.flush(&cx).unwrap();
        disk.writev(&cx, &[IoSlice::new(&[0xee; 4096])], 65536 + 8192)
            .unwrap();
        disk.discard(&cx, 3 * 65536 + 512, 1024).unwrap();
        disk.flush(&cx).unwrap();
        drop(disk);
        let opts = crash::Options {
            states: 40,
            seed: 1,
            ..crash::Options::default()
        };
        if let Err(e) = crash::check(&base, &log_path, &opts) {
            panic!("{}: {e}", image.display());
        }
    }
}

/// Thousands of copies between two flushes, 512-byte clusters over a backing file, v2 and
/// v3: each copy's L2 entry waits for the flush, whose write-back (a sync, then the
/// entries) a crash may cut anywhere; then discards and whole rewrites of copied clusters
/// whose entries still wait. (More copies than may wait, written back before the flush:
/// `qcow2_deferred.rs`; 32768 of them made this test 200 s long.)
#[test]
fn crash_states_qcow2_many_copies_over_backing_512() {
    require_tool!("qemu-img");
    let dir = scratch();
    let backing = dir.path().join("backing.raw");
    fs::write(&backing, pattern(9, 0, 5 << 20)).unwrap();
    for compat in ["1.1", "0.10"] {
        let image = dir.path().join(format!("deferred-{compat}.qcow2"));
        let opts = format!(
            "compat={compat},cluster_size=512,backing_file={},backing_fmt=raw",
            backing.display()
        );
        create(&image, &opts, None);
        let base = base_of(&image);
        fs::copy(&image, &base).unwrap();
        let log_path = image.with_extension("log");
        let disk = open_recording(&image, &log_path);
        let cx = Ctx::Blocking;
        for c in 0..4200u64 {
            let at = c * 1024 + 100 + c % 300;
            disk.writev(&cx, &[IoSlice::new(&pattern(c, at, 200))], at)
                .unwrap();
        }
        disk.discard(&cx, 1024 * 4100, 512).unwrap();
        disk.writev(&cx, &[IoSlice::new(&[0xee; 512])], 1024 * 4101)
            .unwrap();
        disk.write_zeroes(&cx, 1024 * 4102 + 8, 300, false).unwrap();
        disk.flush(&cx).unwrap();
        drop(disk);
        let opts = crash::Options {
            states: 6,
            seed: Seed::choose().value(),
            sector: 512,
            recheck_every: 3,
        };
        match crash::check(&base, &log_path, &opts) {
            Ok(report) => eprintln!("{}: {report}", image.display()),
            Err(e) => panic!("{}: {e}", image.display()),
        }
    }
}

/// An export that acknowledges a flush before the writes it covers reach the image (it
/// holds them back, and writes them after syncing): the checker must fail, name the
/// seed, and shrink the state to the few records that show it.
#[test]
fn crash_check_catches_a_flush_acknowledged_before_its_writes() {
    let dir = scratch();
    let image = dir.path().join("disk.raw");
    fs::write(&image, vec![0u8; 1 << 20]).unwrap();
    let base = base_of(&image);
    fs::copy(&image, &base).unwrap();
    let log_path = image.with_extension("log");
    let log = Arc::new(WriteLog::create(&log_path, record::DEFAULT_CAP).unwrap());
    let file: Arc<dyn BlockBackend> = Arc::new(FileBackend::open(&image, &RW).unwrap());
    let file = Arc::new(RecordBackend::new(file, Arc::clone(&log), Level::Image));
    let lazy = Arc::new(LateWrites {
        inner: file,
        held: Mutex::default(),
    });
    let disk = RecordBackend::new(lazy, Arc::clone(&log), Level::Guest);
    let mix = Mix {
        flush_every: 4,
        max_write: 8 << 10,
        ..Mix::default()
    };
    workload(&Ctx::Blocking, &disk, &mut Rng::new(1), 24, mix);
    drop(disk);
    let opts = crash::Options {
        states: 4,
        seed: 77,
        ..crash::Options::default()
    };
    let failure = match crash::check(&base, &log_path, &opts).map_err(|e| *e) {
        Err(CheckError::Failed(failure)) => failure,
        other => panic!("the checker missed it: {other:?}"),
    };
    let text = failure.to_string();
    assert!(text.contains("(seed 77)"), "{text}");
    assert!(text.contains("what the last completed flush"), "{text}");
    assert!(failure.kept.len() <= 2, "not shrunk: {text}");
}

/// A bad write cache: writes are held until the next flush, which syncs the image first
/// and writes them after.
struct LateWrites {
    inner: Arc<dyn BlockBackend>,
    held: Mutex<Vec<(u64, Vec<u8>)>>,
}

impl BlockBackend for LateWrites {
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn readv(&self, cx: &Ctx<'_>, bufs: &mut [IoSliceMut<'_>], offset: u64) -> io::Result<usize> {
        self.inner.readv(cx, bufs, offset)
    }
    fn writev(&self, _: &Ctx<'_>, bufs: &[IoSlice<'_>], offset: u64) -> io::Result<()> {
        let data = bufs.iter().flat_map(|b| b.iter().copied()).collect();
        self.held.lock().unwrap().push((offset, data));
        Ok(())
    }
    fn flush(&self, cx: &Ctx<'_>) -> io::Result<()> {
        self.inner.flush(cx)?;
        for (at, data) in self.held.lock().unwrap().drain(..) {
            self.inner.writev(cx, &[IoSlice::new(&data)], at)?;
        }
        Ok(())
    }
    fn discard(&self, cx: &Ctx<'_>, offset: u64, len: u64) -> io::Result<()> {
        self.inner.discard(cx, offset, len)
    }
    fn write_zeroes(&self, cx: &Ctx<'_>, offset: u64, len: u64, unmap: bool) -> io::Result<()> {
        self.inner.write_zeroes(cx, offset, len, unmap)
    }
    fn resize(&self, cx: &Ctx<'_>, new_len: u64) -> io::Result<()> {
        self.inner.resize(cx, new_len)
    }
    fn block_status(&self, cx: &Ctx<'_>, offset: u64) -> io::Result<Extent> {
        self.inner.block_status(cx, offset)
    }
    fn allocated_bytes(&self) -> io::Result<u64> {
        self.inner.allocated_bytes()
    }
    fn read_only(&self) -> bool {
        false
    }
    fn describe(&self) -> String {
        "late writes".into()
    }
}
