//! `corofuse mount nbd://... | nbd+unix://...`: an NBD export served as the file, through a
//! real mount, against qemu-nbd and nbdkit started by the test (stopped by PID when it
//! ends). Data written through the mount is checked in the server's image file after both
//! daemons stop; a failing server gives the client EIO and the daemon goes on serving.
//!
//! The export answers OPEN with FOPEN_DIRECT_IO, so pread/pwrite reach the daemon as they
//! are.

use std::fs;
use std::os::unix::fs::FileExt;

use corofuse_tests::nbd::{NbdServer, Via};
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
/// line saying why and goes on answering.
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
    drop(file);
    let log = export.stderr();
    assert!(
        log.contains("connection closed, its requests fail with EIO"),
        "{log}"
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
