//! `corofuse mount-dir`: the directory export mounted for real by the daemon, in every
//! dispatch mode and transport, used through ordinary file-system calls and checked on the
//! source tree; SIGTERM ends it cleanly; refusals are clear.

use std::fs;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use corofuse_tests::{dispatch_tests, Dispatch, MountedExport};

/// A source tree: a file, a directory of 300 files.
fn source() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("hello"), b"hello, world\n").unwrap();
    fs::create_dir(dir.path().join("sub")).unwrap();
    for i in 0..300 {
        fs::write(dir.path().join(format!("sub/f{i:03}")), i.to_string()).unwrap();
    }
    dir
}

dispatch_tests!(mount_dir_reads_writes_lists_renames_and_links);
fn mount_dir_reads_writes_lists_renames_and_links(mode: Dispatch) {
    let src = source();
    let mnt = tempfile::tempdir().unwrap();
    let export = MountedExport::start_dir(src.path(), mnt.path(), mode, &[]);
    let m = export.path();
    assert_eq!(fs::read(m.join("hello")).unwrap(), b"hello, world\n");
    let mut names: Vec<String> = fs::read_dir(m.join("sub"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!((names.len(), names[0].as_str()), (300, "f000"));
    assert_eq!(fs::read_to_string(m.join("sub/f299")).unwrap(), "299");
    let mut f = fs::OpenOptions::new()
        .append(true)
        .open(m.join("hello"))
        .unwrap();
    f.write_all(b"more\n").unwrap();
    f.sync_all().unwrap();
    drop(f);
    fs::write(m.join("new"), vec![7u8; 256 * 1024]).unwrap();
    fs::create_dir(m.join("d")).unwrap();
    fs::rename(m.join("new"), m.join("d/moved")).unwrap();
    fs::hard_link(m.join("d/moved"), m.join("hard")).unwrap();
    assert_eq!(fs::metadata(m.join("hard")).unwrap().nlink(), 2);
    std::os::unix::fs::symlink("d/moved", m.join("ln")).unwrap();
    assert_eq!(fs::read_link(m.join("ln")).unwrap(), Path::new("d/moved"));
    assert_eq!(fs::read(m.join("ln")).unwrap().len(), 256 * 1024);
    fs::remove_file(m.join("sub/f000")).unwrap();
    assert_eq!(
        fs::metadata(m.join("hello")).unwrap().ino(),
        fs::metadata(src.path().join("hello")).unwrap().ino(),
        "the source's inode numbers"
    );
    let missing = fs::read(m.join("missing")).unwrap_err();
    assert_eq!(missing.raw_os_error(), Some(libc::ENOENT));
    let not_empty = fs::remove_dir(m.join("sub")).unwrap_err();
    assert_eq!(not_empty.raw_os_error(), Some(libc::ENOTEMPTY));
    export.stop();
    let s = src.path();
    assert_eq!(fs::read(s.join("hello")).unwrap(), b"hello, world\nmore\n");
    assert_eq!(fs::read(s.join("d/moved")).unwrap(), vec![7u8; 256 * 1024]);
    assert!(!s.join("sub/f000").exists());
    assert!(fs::symlink_metadata(s.join("ln")).unwrap().is_symlink());
}

dispatch_tests!(mount_dir_read_only_refuses_changes[coroutine, threads]);
fn mount_dir_read_only_refuses_changes(mode: Dispatch) {
    let src = source();
    let mnt = tempfile::tempdir().unwrap();
    let export = MountedExport::start_dir(src.path(), mnt.path(), mode, &["--read-only"]);
    let m = export.path();
    assert_eq!(fs::read(m.join("hello")).unwrap(), b"hello, world\n");
    for err in [
        fs::write(m.join("new"), b"x").unwrap_err(),
        fs::create_dir(m.join("d")).unwrap_err(),
        fs::remove_file(m.join("hello")).unwrap_err(),
    ] {
        assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
    }
    export.stop();
    assert_eq!(
        fs::read_dir(src.path()).unwrap().count(),
        2,
        "nothing changed"
    );
}

#[test]
fn mount_dir_refuses_a_source_or_mountpoint_that_is_not_a_directory() {
    corofuse_tests::require_fuse!();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("file");
    fs::write(&file, b"").unwrap();
    let run = |source: &Path, mountpoint: &Path| {
        let out = std::process::Command::new(corofuse_tests::bin::corofuse())
            .arg("mount-dir")
            .arg(source)
            .arg(mountpoint)
            .output()
            .unwrap();
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        let lines: Vec<&str> = stderr.lines().filter(|l| l.contains("corofuse:")).collect();
        assert_eq!(lines.len(), 1, "one line: {stderr}");
        stderr
    };
    assert!(run(&file, dir.path()).contains("is not a directory"));
    assert!(run(&dir.path().join("missing"), dir.path()).contains("No such file"));
    assert!(run(dir.path(), &file)
        .contains("not a directory; a directory export mounts over a directory"));
}
