//! Durability through a real mount, checked from the write log (`--record-writes`):
//! - every way a client asks for durability (fsync, fdatasync, an O_SYNC or O_DSYNC
//!   write) reaches the image as a flush before it returns: in the log, a flush that
//!   covers the data's writes lies before the marker write the client sent once the call
//!   returned. (`sync_file_range` never reaches a FUSE server: the kernel only starts the
//!   writeback of its own page cache, and promises no durability; it is reported, not
//!   required.) The same through an NBD export: each reaches nbdkit as NBD_CMD_FLUSH.
//! - workloads through the mount (`qemu-img convert` into the export, synced writes, a
//!   `--growable` export grown by writes) leave a log whose crash states all pass
//!   `corofuse crash-check`.

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::process::Command;

use backend::record::format::{read_log, Record};
use backend::record::{Kind, Level};
use corofuse_tests::nbd::{NbdServer, Via};
use corofuse_tests::qcow2::{create, qemu_img};
use corofuse_tests::{bin, pattern, require_tool, Dispatch, MountedExport, Sandbox, KIB, MIB};

/// Where each client call leaves its data (and its marker, written once it returned).
const SLOT: u64 = 256 * KIB;
const MARKERS: u64 = 4 * MIB;

/// A way to ask for durability, applied after writing `data` at `at` (or with it).
#[derive(Clone, Copy, Debug)]
enum Durability {
    Fsync,
    Fdatasync,
    OSync,
    ODsync,
    SyncFileRange,
}

impl Durability {
    const ALL: [Durability; 5] = [
        Durability::Fsync,
        Durability::Fdatasync,
        Durability::OSync,
        Durability::ODsync,
        Durability::SyncFileRange,
    ];

    /// Returns the file, still open: its close would flush the image (FUSE_FLUSH) and
    /// hide a missing flush.
    fn run(self, mount: &Path, data: &[u8], at: u64) -> File {
        let flags = match self {
            Durability::OSync => libc::O_SYNC,
            Durability::ODsync => libc::O_DSYNC,
            _ => 0,
        };
        let file = OpenOptions::new()
            .write(true)
            .custom_flags(flags)
            .open(mount)
            .expect("open the mount");
        file.write_all_at(data, at)
            .expect("write through the mount");
        match self {
            Durability::Fsync => file.sync_all().expect("fsync"),
            Durability::Fdatasync => file.sync_data().expect("fdatasync"),
            Durability::SyncFileRange => {
                let how = libc::SYNC_FILE_RANGE_WAIT_BEFORE
                    | libc::SYNC_FILE_RANGE_WRITE
                    | libc::SYNC_FILE_RANGE_WAIT_AFTER;
                // SAFETY: a plain syscall on an fd we own; no memory is passed.
                let rc = unsafe {
                    libc::sync_file_range(
                        std::os::fd::AsRawFd::as_raw_fd(&file),
                        at as i64,
                        data.len() as i64,
                        how,
                    )
                };
                assert_eq!(
                    rc,
                    0,
                    "sync_file_range: {}",
                    std::io::Error::last_os_error()
                );
            }
            Durability::OSync | Durability::ODsync => {}
        }
        file
    }
}

/// Each way in turn: 64 KiB of data at its slot, the call, then (once it returned) a
/// 512-byte marker at its place past [`MARKERS`].
fn drive_syncs(mount: &Path) {
    // Opened once, closed at the end: a close flushes.
    let marker = OpenOptions::new().write(true).open(mount).unwrap();
    for (i, sync) in Durability::ALL.iter().enumerate() {
        let at = i as u64 * SLOT;
        let file = sync.run(mount, &pattern(i as u64, at, 64 * 1024), at);
        // Sent once the call returned: everything the call made durable lies before it.
        marker
            .write_all_at(&[0xa5; 512], MARKERS + i as u64 * 4096)
            .unwrap();
        drop(file);
    }
}

fn log_of(path: &Path) -> Vec<Record> {
    let log = read_log(File::open(path).expect("open the log"), "log").expect("read the log");
    assert_eq!(log.truncated, None);
    log.records
}

/// The first record at `level` that writes into `[at, at + len)`, from `from` on.
fn write_into(records: &[Record], level: Level, at: u64, len: u64) -> Option<usize> {
    records.iter().position(|r| {
        r.head.level == level
            && r.head.kind == Kind::Write
            && r.head.offset < at + len
            && at < r.head.offset + r.head.len
    })
}

/// Whether a completed image-level flush covers record `data` and lies before `marker`.
fn flushed_between(records: &[Record], data: usize, marker: usize) -> bool {
    records[..marker].iter().any(|r| {
        r.head.level == Level::Image
            && r.head.kind == Kind::Flush
            && !r.head.failed()
            && r.head.begun as usize > data
    })
}

fn sync_calls_reach_the_image_as_flushes(mode: Dispatch, opts: &str) {
    let sandbox = Sandbox::new();
    let image = sandbox.path("sync.img");
    match opts {
        "raw" => drop(sandbox.sparse("sync.img", 8 * MIB)),
        opts => create(&image, opts, Some("8M")),
    }
    let log_path = sandbox.path("sync.log");
    let log_arg = log_path.to_str().unwrap();
    let export = MountedExport::start(
        &image,
        &sandbox.mountpoint("mnt"),
        mode,
        &["-w", "--record-writes", log_arg],
    );
    drive_syncs(export.path());
    export.stop();
    let records = log_of(&log_path);
    // The guest level where there is one (qcow2), else the image's.
    let level = match records.iter().any(|r| r.head.level == Level::Guest) {
        true => Level::Guest,
        false => Level::Image,
    };
    for (i, sync) in Durability::ALL.iter().enumerate() {
        let at = i as u64 * SLOT;
        let data = write_into(&records, level, at, 64 * 1024).expect("the data's write");
        let marker = write_into(&records, level, MARKERS + i as u64 * 4096, 512)
            .expect("the marker's write");
        let flushed = flushed_between(&records, data, marker);
        match sync {
            Durability::SyncFileRange => eprintln!("{opts}: sync_file_range flushed: {flushed}"),
            _ => assert!(
                flushed,
                "{opts} {mode}: {sync:?} returned before a flush covered its write \
                 (record #{data}; the marker after it is #{marker})"
            ),
        }
    }
}

#[test]
fn mount_crash_states_sync_calls_flush_raw() {
    for mode in [Dispatch::Coroutine, Dispatch::THREADS] {
        sync_calls_reach_the_image_as_flushes(mode, "raw");
    }
}

#[test]
fn mount_crash_states_sync_calls_flush_qcow2() {
    require_tool!("qemu-img");
    sync_calls_reach_the_image_as_flushes(Dispatch::Coroutine, "compat=1.1");
}

/// Over NBD: each call's data reaches the server, then an NBD_CMD_FLUSH completes, before
/// the marker is sent (nbdkit's log filter lists the commands in order).
#[test]
fn mount_crash_states_sync_calls_flush_nbd() {
    require_tool!("nbdkit");
    let sandbox = Sandbox::new();
    let log = sandbox.path("nbdkit.log");
    let logfile = format!("logfile={}", log.display());
    let server = NbdServer::nbdkit(Via::Unix, &["--filter=log", "memory", "8M", &logfile]);
    let export = MountedExport::start(
        server.uri(),
        &sandbox.mountpoint("mnt"),
        Dispatch::Coroutine,
        &["-w"],
    );
    drive_syncs(export.path());
    export.stop();
    let text = fs::read_to_string(&log).expect("the nbdkit log");
    let lines: Vec<&str> = text.lines().collect();
    let write_at = |offset: u64| {
        let at = format!("offset={offset:#x} ");
        lines
            .iter()
            .position(|l| l.contains(" Write id=") && l.contains(&at))
    };
    for (i, sync) in Durability::ALL.iter().enumerate() {
        let data = write_at(i as u64 * SLOT).expect("the data's write");
        let marker = write_at(MARKERS + i as u64 * 4096).expect("the marker's write");
        let flushed = lines[data..marker]
            .iter()
            .any(|l| l.contains("...Flush id=") && l.contains("return=0"));
        match sync {
            Durability::SyncFileRange => eprintln!("nbd: sync_file_range flushed: {flushed}"),
            _ => assert!(
                flushed,
                "nbd: {sync:?} returned with no NBD flush after its write:\n{text}"
            ),
        }
    }
}

/// `corofuse crash-check BASE LOG` passes (exit 0, "passed").
fn assert_crash_check_passes(base: &Path, log: &Path, states: &str) {
    let out = Command::new(bin::corofuse())
        .arg("crash-check")
        .args([base, log])
        .args(["--states", states, "--seed", "7", "--recheck-every", "4"])
        .env("RUST_LOG", "error")
        .output()
        .expect("run corofuse crash-check");
    let text = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && text.contains("passed"), "{text}");
    eprintln!("{}: {}", base.display(), text.trim());
}

/// `qemu-img convert` into a qcow2 export (its final flush included), then synced
/// writes through a `--growable` export that grow it: every crash state passes.
#[test]
fn mount_crash_states_convert_and_growth_qcow2() {
    require_tool!("qemu-img");
    let sandbox = Sandbox::new();
    let source = sandbox.file("source.raw", &pattern(11, 0, 4 * MIB as usize));
    let image = sandbox.path("disk.qcow2");
    create(&image, "compat=1.1", Some("4M"));
    let base = sandbox.path("base.qcow2");
    fs::copy(&image, &base).unwrap();
    let log = sandbox.path("w.log");
    let args = ["-w", "--growable", "--record-writes", log.to_str().unwrap()];
    let export = MountedExport::start(
        &image,
        &sandbox.mountpoint("mnt"),
        Dispatch::Coroutine,
        &args,
    );
    let mnt = export.path().to_str().unwrap().to_owned();
    let src = source.to_str().unwrap();
    qemu_img(&[
        "convert", "-n", "-f", "raw", "-O", "raw", "-t", "none", src, &mnt,
    ]);
    let file = OpenOptions::new().write(true).open(export.path()).unwrap();
    for i in 0..12u64 {
        let at = 4 * MIB - 64 * KIB + i * 96 * KIB; // from inside to past the end
        file.write_all_at(&pattern(i, at, 80 * KIB as usize), at)
            .unwrap();
        if i % 3 == 2 {
            file.sync_data().unwrap();
        }
    }
    drop(file);
    export.stop();
    assert_crash_check_passes(&base, &log, "6");
}

/// fio's verify-style random writes (4-64 KiB, O_DIRECT, iodepth 8, an fsync every 8
/// writes, then its read-back check) through a qcow2 export over a raw backing file, so
/// that most writes copy a cluster whose L2 entry waits for the fsync: every crash state
/// passes.
#[test]
fn mount_crash_states_fio_fsync_over_backing_qcow2() {
    require_tool!("qemu-img");
    require_tool!("fio");
    let sandbox = Sandbox::new();
    let backing = sandbox.file("backing.raw", &pattern(5, 0, 8 * MIB as usize));
    let image = sandbox.path("over.qcow2");
    let opts = format!(
        "compat=1.1,backing_file={},backing_fmt=raw",
        backing.display()
    );
    create(&image, &opts, None);
    let base = sandbox.path("base.qcow2");
    fs::copy(&image, &base).unwrap();
    let log = sandbox.path("w.log");
    let args = [
        "-w",
        "--format",
        "qcow2",
        "--record-writes",
        log.to_str().unwrap(),
    ];
    let export = MountedExport::start(
        &image,
        &sandbox.mountpoint("mnt"),
        Dispatch::Coroutine,
        &args,
    );
    let out = Command::new("fio")
        .args([
            "--name=crash",
            "--ioengine=io_uring",
            "--iodepth=8",
            "--direct=1",
            "--rw=randwrite",
            "--bsrange=4k-64k",
            "--fsync=8",
            "--size=8M",
            "--io_size=1M",
            "--verify=crc32c",
            "--verify_fatal=1",
            "--do_verify=1",
            "--verify_state_save=0",
            "--randseed=35",
        ])
        .arg(format!("--filename={}", export.path().display()))
        .output()
        .expect("run fio");
    let report = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "fio failed:\n{report}");
    export.stop();
    assert_crash_check_passes(&base, &log, "2");
}
