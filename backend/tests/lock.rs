//! QEMU's image locks on the file backend (`OpenOptions::lock`): the bytes taken, and which
//! opens of one image may coexist. OFD locks of two opens conflict even within one
//! process, so all of this runs in-process; the tests against QEMU's own tools mount for
//! real (tests/tests/mount_locking.rs).

use std::collections::BTreeSet;
use std::fs;
use std::io::ErrorKind;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use backend::{FileBackend, LockError, OpenOptions};

fn options(writable: bool, lock: bool) -> OpenOptions {
    OpenOptions {
        writable,
        direct: false,
        lock,
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

/// The bytes of `path` under OFD locks, from /proc/locks lines such as
/// "3: OFDLCK ADVISORY  READ -1 fe:00:10010745 100 101".
fn locked_bytes(path: &Path) -> BTreeSet<u64> {
    let ino = fs::metadata(path).unwrap().ino().to_string();
    let locks = fs::read_to_string("/proc/locks").unwrap();
    let mut bytes = BTreeSet::new();
    for line in locks.lines().filter(|l| l.contains("OFDLCK")) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [.., dev_ino, start, end] = fields.as_slice() else {
            continue;
        };
        if dev_ino.rsplit(':').next() == Some(ino.as_str()) {
            bytes.extend(start.parse::<u64>().unwrap()..=end.parse::<u64>().unwrap());
        }
    }
    bytes
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
