//! The directory export served by the `server` crate's library call (as the readdir bench
//! serves it) with worker threads and with coroutines, mounted for real; every operation in
//! every mode is tested through the `corofuse mount-dir` command (tests/tests/mount_dir.rs).
//!
//! Skips visibly without root or /dev/fuse; with `COROFUSE_TEST_NO_SKIP` set (as `.ci/run`
//! sets it), that is a failure instead.

use std::fs;
use std::path::Path;
use std::sync::Arc;

use dir_export::{DirFs, DirOptions};
use server::{Background, Dispatch, ServeOptions, Target};

/// Mounts `source` on `mountpoint`, runs `f`, unmounts (on every path: the guard's drop).
fn with_mount(source: &Path, mountpoint: &Path, dispatch: Dispatch, f: impl FnOnce(&Path)) {
    let fs = DirFs::new(source, DirOptions::default()).expect("source");
    let target = Target {
        mountpoint: mountpoint.to_path_buf(),
        name: source.display().to_string(),
        directory: true,
        read_only: false,
    };
    let options = ServeOptions {
        dispatch,
        ..ServeOptions::default()
    };
    let mounted = Background::start(Arc::new(fs), &target, &options).expect("mount");
    f(mounted.path());
    let served = mounted.finish();
    assert_eq!(served.result.map_err(|e| e.to_string()), Ok(()));
    assert!(
        served.report.queue.requests > 0,
        "{:?}",
        served.report.queue
    );
}

#[test]
fn a_mounted_tree_served_by_threads() {
    a_mounted_tree_reads_writes_lists_and_renames(Dispatch::Threads(2));
}

/// The same on the coroutine queue: READ and WRITE go through io_uring.
#[test]
fn a_mounted_tree_served_by_coroutines() {
    a_mounted_tree_reads_writes_lists_and_renames(Dispatch::Coroutine);
}

/// The library call the readdir bench uses works with both dispatches: a read, a listing, a write
/// seen on the source. (Every operation in every mode: tests/tests/mount_dir.rs, through
/// the `corofuse mount-dir` command.)
fn a_mounted_tree_reads_writes_lists_and_renames(dispatch: Dispatch) {
    corofuse_tests::require_fuse!();
    let source = tempfile::tempdir().unwrap();
    let mnt = tempfile::tempdir().unwrap();
    fs::write(source.path().join("hello"), b"hello").unwrap();
    with_mount(source.path(), mnt.path(), dispatch, |m| {
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
