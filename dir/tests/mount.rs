//! The directory export mounted for real (root and /dev/fuse), served by the worker-thread
//! transport, used through ordinary file-system calls on the mountpoint, and checked on
//! the source tree. The `corofuse mount-dir` command will wrap the same pieces; until
//! then this is the end-to-end check that the kernel and `DirFs` agree.
//!
//! Skips visibly without root or /dev/fuse; with `COROFUSE_TEST_NO_SKIP` set (as `.ci/run`
//! sets it), that is a failure instead.

use dir_export::harness::{MountedDir, Serve};
use dir_export::DirOptions;
use std::fs;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

fn skip(why: &str) {
    assert!(
        std::env::var_os("COROFUSE_TEST_NO_SKIP").is_none(),
        "cannot run: {why} (COROFUSE_TEST_NO_SKIP is set)"
    );
    eprintln!("SKIPPED the directory mount test: {why}");
}

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

fn a_mounted_tree_reads_writes_lists_and_renames(serve: Serve) {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return skip("not root");
    }
    if fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .is_err()
    {
        return skip("no /dev/fuse");
    }
    let source = tempfile::tempdir().unwrap();
    let mnt = tempfile::tempdir().unwrap();
    fs::write(source.path().join("hello"), b"hello, world\n").unwrap();
    fs::create_dir(source.path().join("sub")).unwrap();
    for i in 0..500 {
        fs::write(source.path().join(format!("sub/f{i:03}")), i.to_string()).unwrap();
    }
    with_mount(source.path(), mnt.path(), serve, |m| {
        assert_eq!(fs::read(m.join("hello")).unwrap(), b"hello, world\n");
        let mut names: Vec<String> = fs::read_dir(m.join("sub"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names.len(), 500);
        assert_eq!(names[0], "f000");
        assert_eq!(fs::read_to_string(m.join("sub/f499")).unwrap(), "499");
        // Writes, creates, directories, renames, links, removals: seen on the source.
        let mut f = fs::OpenOptions::new()
            .append(true)
            .open(m.join("hello"))
            .unwrap();
        f.write_all(b"more\n").unwrap();
        drop(f);
        fs::write(m.join("new"), b"created").unwrap();
        fs::create_dir(m.join("d")).unwrap();
        fs::rename(m.join("new"), m.join("d/moved")).unwrap();
        fs::hard_link(m.join("d/moved"), m.join("hard")).unwrap();
        assert_eq!(fs::metadata(m.join("hard")).unwrap().nlink(), 2);
        std::os::unix::fs::symlink("d/moved", m.join("ln")).unwrap();
        assert_eq!(fs::read_link(m.join("ln")).unwrap(), Path::new("d/moved"));
        assert_eq!(
            fs::read(m.join("ln")).unwrap(),
            b"created",
            "followed by the kernel"
        );
        fs::remove_file(m.join("sub/f000")).unwrap();
        let meta = fs::metadata(m.join("hello")).unwrap();
        assert_eq!(meta.len(), 18);
        assert_eq!(
            meta.ino(),
            fs::metadata(source.path().join("hello")).unwrap().ino(),
            "the source's inode numbers"
        );
        let err = fs::read(m.join("missing")).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOENT));
    });
    let s = source.path();
    assert_eq!(fs::read(s.join("hello")).unwrap(), b"hello, world\nmore\n");
    assert_eq!(fs::read(s.join("d/moved")).unwrap(), b"created");
    assert_eq!(fs::metadata(s.join("hard")).unwrap().nlink(), 2);
    assert!(!s.join("sub/f000").exists());
    assert!(fs::symlink_metadata(s.join("ln")).unwrap().is_symlink());
    assert!(
        fs::read_dir(mnt.path()).unwrap().next().is_none(),
        "unmounted: the mountpoint is an empty directory again"
    );
}
