//! QEMU's image locks on the file backend (`OpenOptions::lock`): the bytes taken, and which
//! opens of one image may coexist. OFD locks of two opens conflict even within one
//! process, so all of this runs in-process; the tests against QEMU's own tools mount for
//! real (tests/tests/mount_locking.rs).

use std::collections::BTreeSet;
use std::fs;
use std::io::ErrorKind;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use backend::{FileBackend, LockError, OpenOptions};

fn options(writable: bool, lock: bool) -> OpenOptions {
    OpenOptions {
        writable,
        direct: false,
        lock,
        format: backend::Format::Auto,
        snapshot: None,
    }
}

fn image(dir: &tempfile::TempDir) -> PathBuf {
    let path = dir.path().join("disk.img");
    fs::write(&path, vec![0u8; 4096]).unwrap();
    path
}

fn open(path: &Path, writable: bool) -> std::io::Result<FileBackend> {
    FileBackend::open(path, &options(writable, true))
}

/// The bytes of QEMU's two lock ranges (100-163, 200-263) that some open file holds a
/// lock on, probed with `F_OFD_GETLK` from a fresh open (which every other open's lock
/// conflicts with). Not from /proc/locks: that file is read in pieces, and while the other
/// tests of this binary take and drop locks, a reader can miss lines.
fn locked_bytes(path: &Path) -> BTreeSet<u64> {
    let probe = fs::File::open(path).unwrap();
    (100..164)
        .chain(200..264)
        .filter(|&byte| {
            // SAFETY: flock is plain data; all-zero is a valid value, filled in below.
            let mut lock: libc::flock = unsafe { std::mem::zeroed() };
            lock.l_type = libc::F_WRLCK as libc::c_short;
            lock.l_whence = libc::SEEK_SET as libc::c_short;
            (lock.l_start, lock.l_len) = (byte as libc::off_t, 1);
            // SAFETY: `probe` is an open file and `lock` a valid flock for F_OFD_GETLK.
            let rc = unsafe { libc::fcntl(probe.as_raw_fd(), libc::F_OFD_GETLK, &mut lock) };
            assert_eq!(rc, 0, "F_OFD_GETLK: {}", std::io::Error::last_os_error());
            lock.l_type != libc::F_UNLCK as libc::c_short
        })
        .collect()
}

#[test]
fn writer_and_reader_take_qemus_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let path = image(&dir);
    let writer = open(&path, true).unwrap();
    assert_eq!(
        locked_bytes(&path),
        BTreeSet::from([100, 101, 103, 201, 202, 203])
    );
    drop(writer);
    assert_eq!(locked_bytes(&path), BTreeSet::new(), "closing unlocks");
    let _reader = open(&path, false).unwrap();
    assert_eq!(locked_bytes(&path), BTreeSet::from([100]));
}

#[test]
fn second_writer_is_refused_naming_the_holder() {
    let dir = tempfile::tempdir().unwrap();
    let path = image(&dir);
    let first = open(&path, true).unwrap();
    let e = open(&path, true).map(drop).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ResourceBusy);
    let lock = e.get_ref().and_then(|e| e.downcast_ref::<LockError>());
    assert!(lock.is_some_and(LockError::is_conflict), "{e:?}");
    let text = e.to_string();
    let me = format!("(pid {})", std::process::id());
    for word in [
        &format!("cannot lock image {} for writing", path.display()),
        &me,
        "has it open for writing (QEMU lock byte 101)",
    ] {
        assert!(text.contains(word), "{word:?} not in {text:?}");
    }
    // The refused open left nothing behind; once the first is gone a writer gets in.
    assert_eq!(locked_bytes(&path).len(), 6);
    drop(first);
    open(&path, true).unwrap();
}

#[test]
fn readers_and_a_writer_coexist() {
    let dir = tempfile::tempdir().unwrap();
    let path = image(&dir);
    let reader = open(&path, false).unwrap();
    let writer = open(&path, true).unwrap();
    let another_reader = open(&path, false).unwrap();
    drop((reader, writer, another_reader));
}

#[test]
fn without_lock_nothing_is_taken_or_checked() {
    let dir = tempfile::tempdir().unwrap();
    let path = image(&dir);
    let _locked = open(&path, true).unwrap();
    let before = locked_bytes(&path);
    let _unlocked = FileBackend::open(&path, &options(true, false)).unwrap();
    assert_eq!(locked_bytes(&path), before);
    let _null = backend::open("null:1M", &options(true, true)).unwrap();
}
