//! Image locking against the real QEMU tools: corofuse takes QEMU's lock bytes
//! (block/file-posix.c), so a writable export keeps qemu-io, qemu-img and
//! qemu-storage-daemon from writing the image while `qemu-img info` and QEMU readers still
//! work; corofuse refuses, in one line naming the holder, an image that QEMU or another
//! corofuse has open for writing; `--no-lock` (QEMU's `locking=off`) takes and checks
//! nothing. A read-only export is a QEMU reader: it shares everything, as qemu-io `-r` does.
//!
//! The locks are taken before serving starts, so only the first test runs in every
//! dispatch mode (the locks live as long as the export, whatever serves it).

use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};

use corofuse_tests::export::assert_setup_error;
use corofuse_tests::qemu::{describe, qemu, Qsd, QSD};
use corofuse_tests::{
    dispatch_tests, pattern, require_fuse, require_tool, Dispatch, MountedExport, Sandbox, MIB,
};

/// QEMU's message for a write refused by another process's locks.
const WRITE_LOCK: &str = "Failed to get \"write\" lock";

/// A 1 MiB image full of a pattern, and its bytes.
fn image(sandbox: &Sandbox) -> (PathBuf, Vec<u8>) {
    let data = pattern(9, 0, MIB as usize);
    (sandbox.file("disk.img", &data), data)
}

/// `qemu-io -f raw -c 'write -P 0x55 0 4k' IMAGE`.
fn qemu_io_write(image: &Path) -> std::process::Output {
    let write: [&OsStr; 5] = ["-f", "raw", "-c", "write -P 0x55 0 4k", ""].map(OsStr::new);
    qemu("qemu-io", &[&write[..4], &[image.as_os_str()]].concat())
}

/// Runs `tool ARGS...`, which must succeed; returns its stdout.
#[track_caller]
fn succeeds(tool: &str, args: &[&str]) -> String {
    let out = qemu(tool, args);
    assert!(out.status.success(), "{tool} {args:?}: {}", describe(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `tool ARGS...`, which QEMU's locking must refuse with `message`.
#[track_caller]
fn refused(tool: &str, args: &[&str], message: &str) {
    let out = qemu(tool, args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains(message),
        "{tool} {args:?}: expected {message:?}, got {}",
        describe(&out)
    );
}

/// The first 4 KiB of `path` are `0x55` (qemu-io's write reached it).
#[track_caller]
fn assert_qemu_io_wrote(path: &Path) {
    let head = fs::read(path).unwrap();
    assert!(
        head[..4096].iter().all(|&b| b == 0x55),
        "qemu-io's write missing"
    );
}

/// While `holder` ("PROGRAM (pid N)") writes `image`: `corofuse mount -w` on `mnt` is
/// refused in one line naming the image, the holder and `--no-lock`; a read-only export
/// starts and reads `data` (a reader needs only consistent reads, which writers share).
#[track_caller]
fn assert_writer_refused_reader_served(
    sandbox: &Sandbox,
    (image, data): (&Path, &[u8]),
    mnt: &Path,
    holder: &str,
) {
    let path = image.to_str().unwrap();
    let words = [path, holder, "has it open for writing", "--no-lock"];
    assert_setup_error(sandbox, image.as_os_str(), mnt, &["-w"], &words);
    let reader = MountedExport::start(image, mnt, Dispatch::Coroutine, &[]);
    assert_eq!(fs::read(reader.path()).unwrap(), data);
    reader.stop();
}

dispatch_tests!(mount_lock_writable_export_keeps_qemu_writers_out);
fn mount_lock_writable_export_keeps_qemu_writers_out(mode: Dispatch) {
    require_tool!("qemu-io", "qemu-img");
    let sandbox = Sandbox::new();
    let (image, data) = image(&sandbox);
    let export = MountedExport::start(&image, &sandbox.mountpoint("mnt"), mode, &["-w"]);
    assert_eq!(fs::read(export.path()).unwrap(), data, "the export serves");
    let img = image.to_str().unwrap();
    refused(
        "qemu-io",
        &["-f", "raw", "-c", "write 0 4k", img],
        WRITE_LOCK,
    );
    refused("qemu-img", &["resize", "-f", "raw", img, "2M"], WRITE_LOCK);
    // `qemu-img info` takes no permission; a QEMU reader needs consistent reads, which a
    // writable export shares. No -U (force-share) needed.
    let info = succeeds("qemu-img", &["info", "-f", "raw", img]);
    assert!(
        info.contains("virtual size: 1 MiB"),
        "qemu-img info:\n{info}"
    );
    succeeds("qemu-io", &["-r", "-f", "raw", "-c", "read 0 4k", img]);
    assert_eq!(fs::read(&image).unwrap(), data, "the image changed");
    export.stop();
    // The locks go with the export.
    let out = qemu_io_write(&image);
    assert!(out.status.success(), "after the export: {}", describe(&out));
    assert_qemu_io_wrote(&image);
}

#[test]
fn mount_lock_writable_export_keeps_qsd_out() {
    require_fuse!();
    require_tool!(QSD);
    let sandbox = Sandbox::new();
    let (image, data) = image(&sandbox);
    let export = MountedExport::start(
        &image,
        &sandbox.mountpoint("mnt"),
        Dispatch::Coroutine,
        &["-w"],
    );
    match Qsd::export_writable(&image) {
        Ok(qsd) => panic!("{QSD} (pid {}) exports the image writable too", qsd.pid()),
        Err(e) => assert!(e.contains(WRITE_LOCK), "{e}"),
    }
    assert_eq!(fs::read(&image).unwrap(), data);
    export.stop();
}

#[test]
fn mount_lock_refuses_an_image_qsd_writes() {
    require_fuse!();
    require_tool!(QSD);
    let sandbox = Sandbox::new();
    let (image, data) = image(&sandbox);
    let mnt = sandbox.mountpoint("mnt");
    let qsd = Qsd::export_writable(&image).unwrap();
    let holder = format!("{QSD} (pid {})", qsd.pid());
    assert_writer_refused_reader_served(&sandbox, (&image, &data), &mnt, &holder);
    let forced = MountedExport::start(&image, &mnt, Dispatch::Coroutine, &["-w", "--no-lock"]);
    forced.stop();
    drop(qsd);
}

#[test]
fn mount_lock_second_writable_export_is_refused() {
    require_fuse!();
    let sandbox = Sandbox::new();
    let (image, data) = image(&sandbox);
    let (mnt1, mnt2) = (sandbox.mountpoint("mnt1"), sandbox.mountpoint("mnt2"));
    let first = MountedExport::start(&image, &mnt1, Dispatch::Coroutine, &["-w"]);
    let holder = format!("corofuse (pid {})", first.pid());
    assert_writer_refused_reader_served(&sandbox, (&image, &data), &mnt2, &holder);
    assert_eq!(
        fs::read(first.path()).unwrap(),
        data,
        "the first still serves"
    );
    first.stop();
    let second = MountedExport::start(&image, &mnt2, Dispatch::Coroutine, &["-w"]);
    second.stop();
}

#[test]
fn mount_lock_no_lock_takes_and_checks_nothing() {
    require_fuse!();
    require_tool!("qemu-io");
    let sandbox = Sandbox::new();
    let (image, _) = image(&sandbox);
    let mnts = ["mnt1", "mnt2", "mnt3"].map(|m| sandbox.mountpoint(m));
    let start = |mnt, args| MountedExport::start(&image, mnt, Dispatch::Coroutine, args);
    let unlocked = start(&mnts[0], &["-w", "--no-lock"]);
    let out = qemu_io_write(&image);
    assert!(out.status.success(), "qemu-io: {}", describe(&out));
    assert_qemu_io_wrote(unlocked.path());
    // An unlocked export holds nothing, so a locked one gets in; and with --no-lock,
    // the locked one's bytes are not looked at.
    let locked = start(&mnts[1], &["-w"]);
    let another = start(&mnts[2], &["-w", "--no-lock"]);
    for export in [another, locked, unlocked] {
        export.stop();
    }
}

#[test]
fn mount_lock_readonly_export_is_a_qemu_reader() {
    require_fuse!();
    require_tool!("qemu-io", "qemu-img", QSD);
    let sandbox = Sandbox::new();
    let (image, _) = image(&sandbox);
    let export = MountedExport::start(&image, &sandbox.mountpoint("mnt"), Dispatch::Coroutine, &[]);
    let img = image.to_str().unwrap();
    succeeds("qemu-img", &["info", "-f", "raw", img]);
    succeeds("qemu-io", &["-r", "-f", "raw", "-c", "read 0 4k", img]);
    // QEMU's readers share writes: qemu-io writes, and the export shows it.
    let out = qemu_io_write(&image);
    assert!(out.status.success(), "qemu-io: {}", describe(&out));
    assert_qemu_io_wrote(export.path());
    // So do qemu-storage-daemon and a writable corofuse.
    let qsd = Qsd::export_writable(&image).unwrap_or_else(|e| panic!("{e}"));
    drop(qsd);
    let writer = MountedExport::start(
        &image,
        &sandbox.mountpoint("mnt2"),
        Dispatch::Coroutine,
        &["-w"],
    );
    writer.stop();
    export.stop();
}
