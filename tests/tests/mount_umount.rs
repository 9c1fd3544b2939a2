//! `corofuse umount MOUNTPOINT`: it removes a corofuse mount whose daemon was killed (the
//! path usable again), a live one (the daemon exits 0) and a busy one (detached lazily,
//! said so, freed when the last file closes), and refuses, with one line and exit status 1,
//! a path that is not a mount and a mount that is not corofuse's (which stays mounted).

use std::fs::{self, File};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use corofuse_tests::export::{run_to_exit, umount, Exited, TIMEOUT};
use corofuse_tests::mountinfo::{fstypes_at, is_corofuse_mount};
use corofuse_tests::{
    assert_bytes_eq, dispatch_tests, errno_of, pattern, require_fuse, sys, Dispatch, MountedExport,
    Sandbox, MIB,
};

/// Asserts that `corofuse umount` succeeded and said `words` on stderr.
#[track_caller]
fn assert_done(run: &Exited, words: &[&str]) {
    assert!(
        run.status.success(),
        "{}; stderr:\n{}",
        run.status,
        run.stderr
    );
    assert_said(run, words);
}

/// Asserts that `corofuse umount` failed with one line on stderr holding `words`.
#[track_caller]
fn assert_refused(run: &Exited, words: &[&str]) {
    assert_eq!(run.status.code(), Some(1), "stderr:\n{}", run.stderr);
    assert_eq!(
        run.stderr.lines().count(),
        1,
        "not one line:\n{}",
        run.stderr
    );
    assert_said(run, words);
}

#[track_caller]
fn assert_said(run: &Exited, words: &[&str]) {
    let missing: Vec<_> = words.iter().filter(|w| !run.stderr.contains(*w)).collect();
    assert!(missing.is_empty(), "{missing:?} not in {:?}", run.stderr);
}

dispatch_tests!(mount_umount_cleans_up_after_a_killed_daemon);
/// After SIGKILL the mount stays, dead (ENOTCONN), and `corofuse mount` on it points to
/// `corofuse umount`, which removes it: the file underneath is back, and mounts again.
fn mount_umount_cleans_up_after_a_killed_daemon(mode: Dispatch) {
    let sandbox = Sandbox::new();
    let underneath = pattern(5, 0, 5000);
    let image = sandbox.file("disk.img", &pattern(1, 0, MIB as usize));
    let mut export = MountedExport::start(&image, &sandbox.file("mnt", &underneath), mode, &[]);
    let path = export.path().to_path_buf();
    export.crash();
    // The kernel answers ENOTCONN, or in some modes ECONNABORTED (seen with inline, queues).
    let errno = errno_of(fs::metadata(&path), "stat of a mount whose daemon is dead");
    assert!(
        [libc::ENOTCONN, libc::ECONNABORTED].contains(&errno),
        "errno {errno}"
    );
    let again = run_to_exit(
        &["mount".as_ref(), image.as_os_str(), path.as_os_str()],
        &path,
    );
    let hint = format!("corofuse umount {}", path.display());
    assert_refused(&again, &["already a FUSE mountpoint", &hint]);

    assert_done(&umount(&path), &["unmounted", "its daemon was gone"]);
    export.assert_unmounted();
    assert_bytes_eq(&fs::read(&path).unwrap(), &underneath, "file underneath");
    MountedExport::start(&image, &path, mode, &[]).stop();
}

dispatch_tests!(mount_umount_of_a_live_mount_ends_the_daemon + ring);
fn mount_umount_of_a_live_mount_ends_the_daemon(mode: Dispatch) {
    let sandbox = Sandbox::new();
    let image = sandbox.file("disk.img", &pattern(1, 0, MIB as usize));
    let mut export = MountedExport::start(&image, &sandbox.mountpoint("mnt"), mode, &["-w"]);
    fs::read(export.path()).unwrap();
    let run = umount(export.path());
    assert_done(&run, &["unmounted", "its daemon exits"]);
    assert!(!run.stderr.contains("lazily"), "{}", run.stderr);
    let status = export
        .wait_exit(TIMEOUT)
        .expect("the daemon exits after the unmount");
    assert!(status.success(), "{status}; stderr:\n{}", export.stderr());
    export.assert_unmounted();
}

dispatch_tests!(mount_umount_of_a_busy_mount_detaches_it);
/// A file open on the mount makes it busy: detached at once (gone from mountinfo, said
/// so), while the open file still reads through the daemon, which exits 0 once it closes.
fn mount_umount_of_a_busy_mount_detaches_it(mode: Dispatch) {
    let sandbox = Sandbox::new();
    let data = pattern(2, 0, MIB as usize);
    let image = sandbox.file("disk.img", &data);
    let mut export = MountedExport::start(&image, &sandbox.mountpoint("mnt"), mode, &[]);
    let open = File::open(export.path()).unwrap();
    assert_done(&umount(export.path()), &["is busy", "detached it lazily"]);
    assert!(!is_corofuse_mount(export.path()), "still in mountinfo");
    assert!(
        export.try_status().is_none(),
        "the daemon left with a file open"
    );
    let mut back = vec![0; 8192];
    open.read_exact_at(&mut back, 4096)
        .expect("read the detached mount");
    assert_bytes_eq(&back, &data[4096..][..8192], "read after the detach");
    drop(open);
    let status = export
        .wait_exit(TIMEOUT)
        .expect("the daemon exits once the file closes");
    assert!(status.success(), "{status}; stderr:\n{}", export.stderr());
    export.assert_unmounted();
}

#[test]
fn mount_umount_refuses_a_path_that_is_not_a_mount() {
    let sandbox = Sandbox::new();
    let plain = sandbox.file("plain.img", b"data");
    assert_refused(&umount(&plain), &["is not a mount point", "plain.img"]);
    assert_eq!(fs::read(&plain).unwrap(), b"data");
    let missing = sandbox.path("no/such.img");
    assert_refused(&umount(&missing), &["no/such.img", "No such file"]);
}

/// A mount the test made itself, detached when dropped (and the /dev/fuse fd of a FUSE one
/// closed after that).
struct OtherMount {
    path: PathBuf,
    _fuse: Option<File>,
}

impl OtherMount {
    fn tmpfs(dir: &Path) -> OtherMount {
        sys::mount("corofuse-test", dir, "tmpfs", "size=1m").expect("mount a tmpfs");
        OtherMount {
            path: dir.to_path_buf(),
            _fuse: None,
        }
    }

    /// A FUSE mount of another subtype over the regular file `file`. Nobody answers its
    /// INIT, so any access to it would block: `corofuse umount` must decide from
    /// mountinfo alone.
    fn fuse(file: &Path) -> OtherMount {
        let dev = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/fuse")
            .unwrap();
        let data = format!(
            "fd={},rootmode=100000,user_id=0,group_id=0",
            dev.as_raw_fd()
        );
        sys::mount("other", file, "fuse.othersub", &data).expect("mount a FUSE file");
        OtherMount {
            path: file.to_path_buf(),
            _fuse: Some(dev),
        }
    }
}

impl Drop for OtherMount {
    fn drop(&mut self) {
        if let Err(e) = sys::umount_lazy(&self.path) {
            corofuse_tests::require::note(&format!("umount2 {}: {e}", self.path.display()));
        }
    }
}

#[test]
fn mount_umount_refuses_a_mount_that_is_not_corofuse() {
    require_fuse!();
    let sandbox = Sandbox::new();
    let dir = sandbox.path("tmpfs");
    fs::create_dir(&dir).unwrap();
    let dir = fs::canonicalize(dir).unwrap();
    let tmpfs = OtherMount::tmpfs(&dir);
    assert_refused(&umount(&dir), &["is a tmpfs mount, not a corofuse one"]);
    assert_eq!(fstypes_at(&dir), ["tmpfs"], "the tmpfs must stay mounted");
    drop(tmpfs);

    let file = fs::canonicalize(sandbox.mountpoint("fuse")).unwrap();
    let fuse = OtherMount::fuse(&file);
    assert_refused(
        &umount(&file),
        &["is a fuse.othersub mount, not a corofuse one"],
    );
    assert_eq!(
        fstypes_at(&file),
        ["fuse.othersub"],
        "the FUSE mount must stay"
    );
    drop(fuse);
    assert!(fstypes_at(&file).is_empty());
}

dispatch_tests!(mount_umount_then_remount_at_once_keeps_the_new_mount);
/// Unmounted from outside, a daemon exits; a second daemon mounted on the same path at
/// once (the kernel may give its mount the same device number) keeps its mount: the
/// first never unmounts what is not its own (it checks its own connection, which is
/// gone). Five rounds of each export.
fn mount_umount_then_remount_at_once_keeps_the_new_mount(mode: Dispatch) {
    let sandbox = Sandbox::new();
    let image = sandbox.file("disk.img", &pattern(3, 0, MIB as usize));
    let (src, dir_mnt) = (sandbox.path("src"), sandbox.path("dir.mnt"));
    fs::create_dir(&src).unwrap();
    fs::create_dir(&dir_mnt).unwrap();
    fs::write(src.join("f"), b"in the source").unwrap();
    let file_mnt = sandbox.mountpoint("mnt");
    let start = |dir_export: bool| match dir_export {
        true => MountedExport::start_dir(&src, &dir_mnt, mode, &[]),
        false => MountedExport::start(&image, &file_mnt, mode, &[]),
    };
    for dir_export in [false, true] {
        let mut first = start(dir_export);
        for round in 0..5 {
            let path = first.path().to_path_buf();
            sys::umount_lazy(&path).unwrap();
            let second = start(dir_export);
            let status = first
                .wait_exit(TIMEOUT)
                .expect("the first daemon exits after the unmount");
            assert!(status.success(), "{status}; stderr:\n{}", first.stderr());
            // The first daemon's exit path has run; give a stray unmount time to show.
            std::thread::sleep(std::time::Duration::from_millis(50));
            assert!(
                is_corofuse_mount(&path),
                "{mode}, round {round}, {}: the second mount is gone; first daemon's \
                 stderr:\n{}",
                if dir_export { "directory" } else { "image" },
                first.stderr()
            );
            let read = match dir_export {
                true => fs::read(path.join("f")).unwrap(),
                false => fs::read(&path).unwrap()[..4].to_vec(),
            };
            assert!(!read.is_empty(), "{mode}: the second mount serves");
            first.released();
            first = second;
        }
        first.stop();
    }
}
