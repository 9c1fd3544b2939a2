//! The crate's own harness (`MountedDir`, which the readdir bench uses) mounted for real
//! on both of its servers; every operation in every mode is tested through the
//! `corofuse mount-dir` command (tests/tests/mount_dir.rs).
//!
//! Skips visibly without root or /dev/fuse; with `COROFUSE_TEST_NO_SKIP` set (as `.ci/run`
//! sets it), that is a failure instead.

use dir_export::harness::{MountedDir, Serve};
use dir_export::DirOptions;
use std::fs;
use std::path::Path;

/// Mounts `source` on `mountpoint`, runs `f`, unmounts (on every path: the guard's drop).
fn with_mount(source: &Path, mountpoint: &Path, serve: Serve, f: impl FnOnce(&Path)) {
    let mounted =
        MountedDir::served(source, mountpoint, DirOptions::default(), serve).expect("mount");
    f(mounted.path());
}

#[test]
fn a_mounted_tree_served_by_threads() {
    a_mounted_tree_reads_writes_lists_and_renames(Serve::Threads(2));
}

/// The same on the coroutine queue: READ and WRITE go through io_uring.
#[test]
fn a_mounted_tree_served_by_coroutines() {
    a_mounted_tree_reads_writes_lists_and_renames(Serve::Coroutines);
}

/// The harness the readdir bench uses works on both servers: a read, a listing, a write
/// seen on the source. (Every operation in every mode: tests/tests/mount_dir.rs, through
/// the `corofuse mount-dir` command.)
fn a_mounted_tree_reads_writes_lists_and_renames(serve: Serve) {
    corofuse_tests::require_fuse!();
    let source = tempfile::tempdir().unwrap();
    let mnt = tempfile::tempdir().unwrap();
    fs::write(source.path().join("hello"), b"hello").unwrap();
    with_mount(source.path(), mnt.path(), serve, |m| {
        assert_eq!(fs::read(m.join("hello")).unwrap(), b"hello");
        fs::write(m.join("new"), b"written").unwrap();
        assert_eq!(fs::read_dir(m).unwrap().count(), 2);
    });
    assert_eq!(fs::read(source.path().join("new")).unwrap(), b"written");
    assert!(
        fs::read_dir(mnt.path()).unwrap().next().is_none(),
        "unmounted"
    );
}
