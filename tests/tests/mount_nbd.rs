//! `corofuse mount nbd://... | nbd+unix://...`: an NBD export served as the file, through a
//! real mount, against qemu-nbd and nbdkit started by the test (stopped by PID when it
//! ends). Data written through the mount is checked in the server's image file after both
//! daemons stop; a failing server gives the client EIO and the daemon goes on serving.
//!
//! The export answers OPEN with FOPEN_DIRECT_IO, so pread/pwrite reach the daemon as they
//! are.

use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use corofuse_tests::nbd::{NbdServer, Via};
use corofuse_tests::sys::{assert_same_seeks, seek};
use corofuse_tests::tls::TlsCerts;
use corofuse_tests::{
    assert_bytes_eq, dispatch_tests, errno_of, open_rw, pattern, require_fuse, require_tool,
    Dispatch, MountedExport, Sandbox, KIB, MIB,
};

const LEN: usize = 16 * MIB as usize;

/// Where each mode reaches its server: both transports get every mode between them.
fn via(mode: Dispatch) -> Via {
    match mode {
        Dispatch::Coroutine | Dispatch::Inline => Via::Unix,
        _ => Via::Tcp,
    }
}

dispatch_tests!(mount_nbd_qemu_nbd_data);
/// qemu-nbd serves a raw file; writes of several sizes through the mount, read back
/// through it, are in the file once both daemons have stopped.
fn mount_nbd_qemu_nbd_data(mode: Dispatch) {
    require_fuse!();
    require_tool!("qemu-nbd");
    let sandbox = Sandbox::new();
    let mut model = pattern(1, 0, LEN);
    let image = sandbox.file("disk.raw", &model);
    let server = NbdServer::qemu_nbd(&image, "raw", "disk", via(mode), &[]);
    let export = MountedExport::start(server.uri(), &sandbox.mountpoint("mnt"), mode, &["-w"]);
    let file = open_rw(export.path()).unwrap();
    assert_eq!(file.metadata().unwrap().len(), LEN as u64);
    for (i, (offset, len)) in [
        (0, 4 * KIB),
        (7, 1000),
        (MIB + 512, 128 * KIB),
        (3 * MIB, MIB),
    ]
    .into_iter()
    .enumerate()
    {
        let data = pattern(100 + i as u64, offset, len as usize);
        file.write_all_at(&data, offset).unwrap();
        model[offset as usize..][..data.len()].copy_from_slice(&data);
        let mut back = vec![0u8; data.len()];
        file.read_exact_at(&mut back, offset).unwrap();
        assert_bytes_eq(&back, &data, "read back through the mount");
    }
    file.sync_all().unwrap();
    let mut all = vec![0u8; LEN];
    file.read_exact_at(&mut all, 0).unwrap();
    assert_bytes_eq(&all, &model, "the whole export");
    drop(file);
    export.stop();
    drop(server);
    assert_bytes_eq(&fs::read(&image).unwrap(), &model, "the image file");
}

dispatch_tests!(mount_nbd_error_keeps_serving[coroutine, threads]);
/// nbdkit's error filter fails reads while a trigger file exists: the client gets EIO,
/// then correct data again once it is gone; the daemon exits 0.
fn mount_nbd_error_keeps_serving(mode: Dispatch) {
    require_fuse!();
    require_tool!("nbdkit");
    let sandbox = Sandbox::new();
    let trigger = sandbox.path("fail");
    let file_arg = format!("error-pread-file={}", trigger.display());
    let args = [
        "--filter=error",
        "memory",
        "16M",
        "error-pread=EIO",
        "error-pread-rate=100%",
    ];
    let server = NbdServer::nbdkit(via(mode), &[&args[..], &[&file_arg]].concat());
    let export = MountedExport::start(server.uri(), &sandbox.mountpoint("mnt"), mode, &["-w"]);
    let file = open_rw(export.path()).unwrap();
    file.write_all_at(&[7; 4096], 8192).unwrap();
    fs::write(&trigger, b"").unwrap();
    let mut buf = [0u8; 4096];
    assert_eq!(
        errno_of(file.read_exact_at(&mut buf, 8192), "read"),
        libc::EIO
    );
    fs::remove_file(&trigger).unwrap();
    file.read_exact_at(&mut buf, 8192).unwrap();
    assert_eq!(buf, [7; 4096]);
    drop(file);
    export.stop();
}

/// A read-only export on the server: `-w` is refused at start in one line.
#[test]
fn mount_nbd_read_only_refused() {
    require_fuse!();
    require_tool!("qemu-nbd");
    let sandbox = Sandbox::new();
    let image = sandbox.file("ro.raw", &[1u8; 65536]);
    let server = NbdServer::qemu_nbd(&image, "raw", "ro", Via::Unix, &["-r"]);
    let mnt = sandbox.mountpoint("mnt");
    let err = MountedExport::try_start(server.uri(), &mnt, Dispatch::Coroutine, &["-w"])
        .err()
        .expect("a writable mount of a read-only export fails");
    assert!(
        err.contains("exports it read-only; mount without -w"),
        "{err}"
    );
    let export = MountedExport::start(server.uri(), &mnt, Dispatch::Coroutine, &[]);
    assert_eq!(fs::read(export.path()).unwrap(), [1u8; 65536]);
    export.stop();
}

dispatch_tests!(mount_nbd_server_killed[coroutine, threads]);
/// The server dies under the mount: reads fail with EIO (no hang), the daemon logs one
/// line saying why and goes on answering; once the server is back, the next read is
/// served on a new connection, with no remount (as QEMU's nbd driver recovers; before,
/// every later read failed until a remount).
fn mount_nbd_server_killed(mode: Dispatch) {
    require_fuse!();
    require_tool!("nbdkit");
    let sandbox = Sandbox::new();
    let mut server = NbdServer::nbdkit(via(mode), &["memory", "16M"]);
    let mut export = MountedExport::start(server.uri(), &sandbox.mountpoint("mnt"), mode, &["-w"]);
    let file = open_rw(export.path()).unwrap();
    let mut buf = [0u8; 4096];
    file.read_exact_at(&mut buf, 0).unwrap();
    server.kill();
    for _ in 0..3 {
        assert_eq!(errno_of(file.read_exact_at(&mut buf, 0), "read"), libc::EIO);
    }
    assert_eq!(file.metadata().unwrap().len(), 16 * MIB, "still answering");
    let log = export.stderr();
    assert!(
        log.contains("its requests fail with EIO, and each new one tries a new connection"),
        "{log}"
    );
    server.restart(); // a new, empty memory disk on the same socket
    std::thread::sleep(std::time::Duration::from_millis(150)); // past the retry pause
    file.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(buf, [0u8; 4096], "served by the new server");
    file.write_all_at(&[3u8; 4096], 0).unwrap();
    file.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(buf, [3u8; 4096]);
    drop(file);
    assert!(
        export.stderr().contains("reconnected"),
        "{}",
        export.stderr()
    );
    export.terminate();
}

/// `--format qcow2` over NBD: nbdkit's file plugin serves a qcow2 file as plain bytes,
/// and the mount reads the disk it holds as `qemu-img convert -O raw` does (data, zero
/// clusters, unallocated ones).
#[test]
fn mount_nbd_qcow2_reads_as_qemu_img() {
    require_fuse!();
    require_tool!("nbdkit", "qemu-img");
    let sandbox = Sandbox::new();
    let mut disk = pattern(7, 0, LEN);
    disk[MIB as usize..2 * MIB as usize].fill(0); // a hole
    let raw = sandbox.file("src.raw", &disk);
    let qcow2 = sandbox.path("disk.qcow2");
    let convert = |args: &[&str]| {
        let out = corofuse_tests::qemu::qemu("qemu-img", args);
        assert!(out.status.success(), "qemu-img {args:?}: {out:?}");
    };
    convert(&[
        "convert",
        "-O",
        "qcow2",
        raw.to_str().unwrap(),
        qcow2.to_str().unwrap(),
    ]);
    let expected = sandbox.path("expected.raw");
    convert(&[
        "convert",
        "-O",
        "raw",
        qcow2.to_str().unwrap(),
        expected.to_str().unwrap(),
    ]);
    let server = NbdServer::nbdkit(Via::Unix, &["file", qcow2.to_str().unwrap()]);
    let mnt = sandbox.mountpoint("mnt");
    let export = MountedExport::start(
        server.uri(),
        &mnt,
        Dispatch::Coroutine,
        &["--format", "qcow2"],
    );
    let file = fs::File::open(export.path()).unwrap();
    assert_eq!(
        file.metadata().unwrap().len(),
        LEN as u64,
        "the disk's size, not the file's"
    );
    let mut all = vec![0u8; LEN];
    file.read_exact_at(&mut all, 0).unwrap();
    assert_bytes_eq(
        &all,
        &fs::read(&expected).unwrap(),
        "qemu-img convert -O raw",
    );
    drop(file);
    export.stop();
}

dispatch_tests!(mount_nbd_tls);
/// qemu-nbd requires TLS with a client certificate: `--tls-creds DIR` mounts over TCP or
/// a unix socket (by mode), writes through the mount land in the image file; without
/// `--tls-creds` the mount is refused in one line that says to give it.
fn mount_nbd_tls(mode: Dispatch) {
    require_fuse!();
    require_tool!("qemu-nbd", "openssl");
    let sandbox = Sandbox::new();
    let certs = TlsCerts::new();
    let mut model = pattern(3, 0, 4 * MIB as usize);
    let image = sandbox.file("disk.raw", &model);
    let args = certs.qemu_nbd_args(true);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = NbdServer::qemu_nbd(&image, "raw", "disk", via(mode), &args);
    let mnt = sandbox.mountpoint("mnt");
    let err = MountedExport::try_start(server.uri(), &mnt, mode, &["-w"])
        .err()
        .expect("a mount without --tls-creds fails");
    assert!(
        err.contains("the server requires TLS: give --tls-creds DIR"),
        "{err}"
    );
    let creds = certs.client().display().to_string();
    let export = MountedExport::start(server.uri(), &mnt, mode, &["-w", "--tls-creds", &creds]);
    let file = open_rw(export.path()).unwrap();
    let data = pattern(7, MIB, 256 * KIB as usize);
    file.write_all_at(&data, MIB).unwrap();
    model[MIB as usize..][..data.len()].copy_from_slice(&data);
    file.sync_all().unwrap();
    let mut all = vec![0u8; model.len()];
    file.read_exact_at(&mut all, 0).unwrap();
    assert_bytes_eq(&all, &model, "the whole export, over TLS");
    drop(file);
    export.stop();
    drop(server);
    assert_bytes_eq(&fs::read(&image).unwrap(), &model, "the image file");
}

/// A `rounds` process (tests/src/bin/rounds.rs) writing and reading back its own slots of
/// the file; stopped by closing its stdin, killed by PID if still running when dropped.
struct Rounds {
    child: Child,
    stdin: Option<ChildStdin>,
    /// The last round it finished.
    latest: Arc<AtomicU64>,
    /// Its lines other than round numbers (`done N`, `error ...`).
    said: Arc<Mutex<Vec<String>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Rounds {
    const CHUNK: u64 = 16 * KIB;
    const SLOTS: u64 = 1024;
    const PACE_MS: u64 = 2;

    /// `rounds PATH BASE SLOTS CHUNK PACE_MS` on the `index`th region of `path`.
    fn start(path: &Path, index: u64) -> Rounds {
        let base = index * Self::SLOTS * Self::CHUNK;
        let args = [base, Self::SLOTS, Self::CHUNK, Self::PACE_MS].map(|n| n.to_string());
        let mut child = Command::new(env!("CARGO_BIN_EXE_rounds"))
            .arg(path)
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start rounds");
        let (latest, said) = (Arc::new(AtomicU64::new(0)), Arc::new(Mutex::new(vec![])));
        let out = BufReader::new(child.stdout.take().unwrap());
        let (l, s) = (Arc::clone(&latest), Arc::clone(&said));
        let reader = std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                match line.parse() {
                    Ok(round) => l.store(round, Ordering::Relaxed),
                    Err(_) => s.lock().unwrap().push(line),
                }
            }
        });
        let stdin = child.stdin.take();
        Rounds {
            child,
            stdin,
            latest,
            said,
            reader: Some(reader),
        }
    }

    fn latest(&self) -> u64 {
        self.latest.load(Ordering::Relaxed)
    }

    /// Waits until it has finished round `n`; panics with what it said if it stops first
    /// or takes longer than `within`.
    fn wait_for(&mut self, n: u64, within: Duration, export: &MountedExport) {
        let start = Instant::now();
        while self.latest() < n {
            let exited = self.child.try_wait().ok().flatten();
            if exited.is_some() || start.elapsed() > within {
                let said = self.said.lock().unwrap().join("; ");
                panic!(
                    "rounds: at round {} of {n} after {:?} ({exited:?}): {said}; daemon: {}",
                    self.latest(),
                    start.elapsed(),
                    export.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Closes its stdin and waits for `done N`: returns N.
    fn finish(mut self) -> u64 {
        drop(self.stdin.take());
        let status = self.child.wait().expect("wait for rounds");
        self.reader.take().unwrap().join().unwrap();
        let said = self.said.lock().unwrap().join("; ");
        assert!(status.success(), "rounds exited with {status}: {said}");
        let done = said.strip_prefix("done ").and_then(|n| n.parse().ok());
        done.unwrap_or_else(|| panic!("rounds said {said:?}, not `done N`"))
    }

    /// The image its rounds leave in its region: the last round written to each slot.
    fn model(index: u64, rounds: u64, disk: &mut [u8]) {
        let base = index * Self::SLOTS * Self::CHUNK;
        for round in 1..=rounds {
            let offset = base + ((round - 1) % Self::SLOTS) * Self::CHUNK;
            let data = pattern(round, offset, Self::CHUNK as usize);
            disk[offset as usize..][..data.len()].copy_from_slice(&data);
        }
    }
}

impl Drop for Rounds {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

dispatch_tests!(mount_nbd_reconnect_under_load[coroutine, threads]);
/// qemu-nbd SIGKILLed under load through the mount and restarted on its socket, with
/// `--reconnect-delay 10`: the load goes on with no error well within the delay, the
/// daemon logs the reconnection, and every round written before and after the restart is
/// in the image file afterwards.
///
/// The load runs in `rounds` processes: the test process holds no descriptor on the mount
/// when it restarts the server, because the fork/exec of qemu-nbd closes the child's copies
/// of such descriptors, and each close is a FUSE FLUSH, an NBD flush, which waits for the
/// server being restarted (until the delay expires).
fn mount_nbd_reconnect_under_load(mode: Dispatch) {
    const WORKERS: u64 = 4;
    const DELAY: Duration = Duration::from_secs(10);
    require_fuse!();
    require_tool!("qemu-nbd");
    let sandbox = Sandbox::new();
    let len = WORKERS * Rounds::SLOTS * Rounds::CHUNK;
    let image = sandbox.file("disk.raw", &vec![0u8; len as usize]);
    let mut server = NbdServer::qemu_nbd(&image, "raw", "disk", via(mode), &[]);
    let delay = DELAY.as_secs().to_string();
    let args = ["-w", "--reconnect-delay", &delay];
    let export = MountedExport::start(server.uri(), &sandbox.mountpoint("mnt"), mode, &args);
    let mut workers: Vec<Rounds> = (0..WORKERS)
        .map(|w| Rounds::start(export.path(), w))
        .collect();
    for w in &mut workers {
        w.wait_for(20, DELAY, &export);
    }
    let before: Vec<u64> = workers.iter().map(Rounds::latest).collect();
    let started = Instant::now();
    server.restart();
    let restarted = started.elapsed();
    for (w, before) in workers.iter_mut().zip(&before) {
        w.wait_for(
            before + 20,
            DELAY.saturating_sub(started.elapsed()),
            &export,
        );
    }
    let outage = started.elapsed();
    let rounds: Vec<u64> = workers.into_iter().map(Rounds::finish).collect();
    let log = export.stderr();
    assert!(log.contains("reconnecting (requests wait up to"), "{log}");
    assert!(log.contains("reconnected"), "{log}");
    assert!(!log.contains("fail with EIO"), "{log}");
    export.stop();
    drop(server);
    corofuse_tests::require::note(&format!(
        "{mode}: server restarted in {restarted:?}, 20 rounds each after it in {outage:?}; \
         rounds {before:?} before, {rounds:?} in all"
    ));
    let mut model = vec![0u8; len as usize];
    for (w, &n) in rounds.iter().enumerate() {
        assert!(
            n <= Rounds::SLOTS,
            "worker {w}: {n} rounds wrapped its slots"
        );
        Rounds::model(w as u64, n, &mut model);
    }
    assert_bytes_eq(&fs::read(&image).unwrap(), &model, "the image file");
}

dispatch_tests!(mount_nbd_seek_data_and_hole[coroutine, threads]);
/// SEEK_DATA / SEEK_HOLE through a mounted NBD export answer what the file qemu-nbd
/// serves says (block status, `base:allocation`), and a hole punched through the mount is
/// one afterwards.
fn mount_nbd_seek_data_and_hole(mode: Dispatch) {
    require_fuse!();
    require_tool!("qemu-nbd");
    let sandbox = Sandbox::on_tmpfs().unwrap_or_default();
    let len = 2 * MIB;
    // data 0..64K, hole 64K..1M, data 1M..1M+64K, hole to 2M.
    let image = sandbox.sparse("disk.raw", len);
    let writer = fs::OpenOptions::new().write(true).open(&image).unwrap();
    for at in [0, MIB] {
        let data = pattern(at, at, 64 * KIB as usize);
        writer.write_all_at(&data, at).unwrap();
    }
    drop(writer);
    let on_image = fs::File::open(&image).unwrap();
    assert_eq!(
        seek(&on_image, 0, libc::SEEK_HOLE),
        Ok(64 * KIB),
        "image layout"
    );
    let server = NbdServer::qemu_nbd(&image, "raw", "disk", via(mode), &[]);
    let export = MountedExport::start(server.uri(), &sandbox.mountpoint("mnt"), mode, &["-w"]);
    let on_mount = open_rw(export.path()).unwrap();
    let offsets = [
        0,
        1,
        4095,
        64 * KIB,
        100 * KIB,
        MIB - 1,
        MIB,
        MIB + 64 * KIB - 1,
        MIB + 64 * KIB,
        len - 1,
        len,
    ];
    let compare = |what: &str| assert_same_seeks(&on_image, &on_mount, &offsets, what);
    compare("as served");
    assert_eq!(seek(&on_mount, 64 * KIB, libc::SEEK_DATA), Ok(MIB));
    // A hole punched through the mount (WRITE_ZEROES that may unmap) is one for both.
    let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    corofuse_tests::sys::fallocate(&on_mount, punch, MIB, 64 * KIB).unwrap();
    compare("after a punch");
    assert_eq!(seek(&on_mount, 64 * KIB, libc::SEEK_DATA), Err(libc::ENXIO));
    drop(on_mount);
    export.stop();
}

dispatch_tests!(mount_nbd_unaligned_io_on_a_4k_minimum[coroutine, threads]);
/// A server whose minimum block is 4 KiB and which refuses anything smaller (nbdkit's
/// blocksize-policy filter): unaligned preads and pwrites through the mount, which reach
/// the daemon as they are, are made whole blocks and work; a hole punched across two
/// blocks reads as zeroes.
fn mount_nbd_unaligned_io_on_a_4k_minimum(mode: Dispatch) {
    require_fuse!();
    require_tool!("nbdkit");
    let sandbox = Sandbox::new();
    let server = NbdServer::nbdkit(
        via(mode),
        &[
            "--filter=blocksize-policy",
            "memory",
            "4M",
            "blocksize-minimum=4096",
            "blocksize-error-policy=error",
        ],
    );
    let export = MountedExport::start(server.uri(), &sandbox.mountpoint("mnt"), mode, &["-w"]);
    let file = open_rw(export.path()).unwrap();
    let mut model = vec![0u8; 4 * MIB as usize];
    for (i, (offset, len)) in [(3, 7), (4090, 20), (5000, 70_000), (MIB - 1, 2)]
        .into_iter()
        .enumerate()
    {
        let data = pattern(200 + i as u64, offset, len);
        file.write_all_at(&data, offset).unwrap();
        model[offset as usize..][..len].copy_from_slice(&data);
        let mut back = vec![0u8; len + 3];
        file.read_exact_at(&mut back, offset - 1).unwrap();
        let want = &model[offset as usize - 1..][..len + 3];
        assert_bytes_eq(&back, want, "an unaligned read around an unaligned write");
    }
    let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    corofuse_tests::sys::fallocate(&file, punch, 4000, 200).unwrap();
    model[4000..4200].fill(0);
    let mut all = vec![0u8; model.len()];
    file.read_exact_at(&mut all, 0).unwrap();
    assert_bytes_eq(&all, &model, "the whole export");
    drop(file);
    export.stop();
}

dispatch_tests!(mount_nbd_stop_with_a_stalled_server[coroutine, threads]);
/// A server that no longer answers (nbdkit's delay filter holds reads for 10 minutes):
/// SIGTERM waits for the read in flight, as for any stop; a second SIGTERM gives up on it,
/// the reader gets EIO, and the daemon unmounts and exits: 0 read-only, 1 writable (its
/// final flush cannot reach the server either, and it says so).
fn mount_nbd_stop_with_a_stalled_server(mode: Dispatch) {
    require_fuse!();
    require_tool!("nbdkit");
    for writable in [false, true] {
        let sandbox = Sandbox::new();
        let stalled = ["--filter=delay", "memory", "16M", "delay-read=600"];
        let server = NbdServer::nbdkit(via(mode), &stalled);
        let args: &[&str] = if writable { &["-w"] } else { &[] };
        let mount = sandbox.mountpoint("mnt");
        let mut export = MountedExport::start(server.uri(), &mount, mode, args);
        let path = export.path().to_owned();
        let reader = std::thread::spawn(move || {
            let file = fs::File::open(&path)?;
            file.read_exact_at(&mut [0u8; 4096], 0)
        });
        // Long enough for the read to reach the server; if it did not, the first SIGTERM
        // ends the daemon and the assertion below says so.
        std::thread::sleep(Duration::from_millis(500));
        export.signal(libc::SIGTERM);
        std::thread::sleep(Duration::from_secs(1));
        assert!(
            export.try_status().is_none(),
            "the first SIGTERM waits for the read in flight; stderr:\n{}",
            export.stderr()
        );
        export.signal(libc::SIGTERM);
        let status = export.wait_exit(Duration::from_secs(10));
        let status = status.unwrap_or_else(|| panic!("still running; {}", export.diagnose()));
        let stderr = export.stderr();
        assert_eq!(status.code(), Some(i32::from(writable)), "{stderr}");
        if writable {
            assert!(stderr.contains("the final flush of nbd"), "{stderr}");
        }
        let read = reader.join().expect("the reader thread");
        assert_eq!(
            read.map_err(|e| e.raw_os_error()).err(),
            Some(Some(libc::EIO))
        );
        assert!(stderr.contains("given up"), "{stderr}");
        export.assert_unmounted();
    }
}
