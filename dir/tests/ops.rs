//! Each tree operation on a real temporary tree, checked against what the file system
//! shows through its own paths: the operation did what it says, by node id, and failed
//! with the source's own errno where it should.

use std::ffi::{CStr, CString};
use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use dir_export::{SetAttr, Time, Tree, ROOT};

fn c(s: &str) -> CString {
    CString::new(s).unwrap()
}

fn errno<T>(r: std::io::Result<T>) -> i32 {
    r.err().and_then(|e| e.raw_os_error()).expect("an errno")
}

fn tree(dir: &Path) -> Tree {
    Tree::new(dir, false, 1 << 16).unwrap()
}

#[test]
fn names_are_made_and_removed() {
    let dir = tempfile::tempdir().unwrap();
    let t = tree(dir.path());
    let sub = t.mkdir(ROOT, &c("sub"), 0o777, 0o022).unwrap();
    let meta = fs::metadata(dir.path().join("sub")).unwrap();
    assert!(meta.is_dir());
    assert_eq!(meta.permissions().mode() & 0o777, 0o755, "umask applied");
    assert_eq!(t.inodes.lookups(sub.nodeid), 1);
    assert_eq!(errno(t.mkdir(ROOT, &c("sub"), 0o777, 0)), libc::EEXIST);

    let fifo = t
        .mknod(sub.nodeid, &c("fifo"), libc::S_IFIFO | 0o666, 0, 0o077)
        .unwrap();
    assert_eq!(fifo.attr.st_mode, libc::S_IFIFO | 0o600);

    let link = t.symlink(sub.nodeid, &c("ln"), &c("../target")).unwrap();
    let mut buf = [0u8; 64];
    let n = t.readlink(link.nodeid, &mut buf).unwrap();
    assert_eq!(&buf[..n], b"../target");
    assert_eq!(
        errno(t.readlink(sub.nodeid, &mut buf)),
        libc::EINVAL,
        "not a symlink"
    );

    let (mut file, f) = t
        .create(sub.nodeid, &c("f"), libc::O_RDWR, 0o666, 0o022)
        .map(|(fd, e)| (fs::File::from(fd), e))
        .unwrap();
    file.write_all(b"hello").unwrap();
    let hard = t.link(f.nodeid, ROOT, &c("hard")).unwrap();
    assert_eq!(hard.nodeid, f.nodeid, "a hard link is the same node");
    assert_eq!(fs::read(dir.path().join("hard")).unwrap(), b"hello");
    assert_eq!(errno(t.link(sub.nodeid, ROOT, &c("dirlink"))), libc::EPERM);

    t.unlink(ROOT, &c("hard")).unwrap();
    assert!(!dir.path().join("hard").exists());
    assert_eq!(errno(t.rmdir(ROOT, &c("sub"))), libc::ENOTEMPTY);
    for name in ["fifo", "ln", "f"] {
        t.unlink(sub.nodeid, &c(name)).unwrap();
    }
    t.rmdir(ROOT, &c("sub")).unwrap();
    assert!(!dir.path().join("sub").exists());
    assert_eq!(errno(t.unlink(ROOT, &c("nothing"))), libc::ENOENT);
    // Names inside something that is not a directory.
    fs::write(dir.path().join("plain"), b"").unwrap();
    let plain = t
        .lookup(&runtime::Ctx::Blocking, ROOT, &c("plain"))
        .unwrap();
    assert_eq!(
        errno(t.mkdir(plain.nodeid, &c("x"), 0o755, 0)),
        libc::ENOTDIR
    );
    assert_eq!(
        errno(t.lookup(&runtime::Ctx::Blocking, 12345, &c("x"))),
        libc::ESTALE,
        "an id never given"
    );
}

#[test]
fn rename_with_flags() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("a"), b"A").unwrap();
    fs::write(dir.path().join("b"), b"B").unwrap();
    fs::create_dir(dir.path().join("d")).unwrap();
    let t = tree(dir.path());
    let d = t.lookup(&runtime::Ctx::Blocking, ROOT, &c("d")).unwrap();
    let noreplace = libc::RENAME_NOREPLACE;
    assert_eq!(
        errno(t.rename(ROOT, &c("a"), ROOT, &c("b"), noreplace)),
        libc::EEXIST
    );
    t.rename(ROOT, &c("a"), ROOT, &c("b"), libc::RENAME_EXCHANGE)
        .unwrap();
    assert_eq!(fs::read(dir.path().join("a")).unwrap(), b"B");
    assert_eq!(fs::read(dir.path().join("b")).unwrap(), b"A");
    t.rename(ROOT, &c("a"), d.nodeid, &c("moved"), 0).unwrap();
    assert_eq!(fs::read(dir.path().join("d/moved")).unwrap(), b"B");
    assert!(!dir.path().join("a").exists());
}

#[test]
fn setattr_changes_mode_size_times_and_owner() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("f"), b"0123456789").unwrap();
    let t = tree(dir.path());
    let f = t.lookup(&runtime::Ctx::Blocking, ROOT, &c("f")).unwrap();
    let set = SetAttr {
        mode: Some(0o640),
        size: Some(4),
        atime: Some(Time::At(1_000_000_000, 5)),
        mtime: Some(Time::At(1_500_000_000, 7)),
        ..SetAttr::default()
    };
    let st = t.setattr(f.nodeid, &set, None).unwrap();
    assert_eq!((st.st_mode & 0o7777, st.st_size), (0o640, 4));
    assert_eq!((st.st_atime, st.st_atime_nsec), (1_000_000_000, 5));
    assert_eq!((st.st_mtime, st.st_mtime_nsec), (1_500_000_000, 7));
    assert_eq!(fs::read(dir.path().join("f")).unwrap(), b"0123");
    // Truncate through an open descriptor, and "now".
    let open = t.open(f.nodeid, libc::O_RDWR).unwrap();
    let set = SetAttr {
        size: Some(2),
        mtime: Some(Time::Now),
        ..SetAttr::default()
    };
    use std::os::fd::AsFd;
    let st = t.setattr(f.nodeid, &set, Some(open.as_fd())).unwrap();
    assert_eq!(st.st_size, 2);
    assert!(st.st_mtime > 1_500_000_000);
    // chown to who owns it already works unprivileged too; root may give it away.
    let me = fs::metadata(dir.path().join("f")).unwrap();
    let set = SetAttr {
        uid: Some(me.uid()),
        gid: Some(me.gid()),
        ..SetAttr::default()
    };
    t.setattr(f.nodeid, &set, None).unwrap();
    assert_eq!(t.getattr(f.nodeid).unwrap().st_uid, me.uid());
}

#[test]
fn open_reads_and_writes_the_file_itself() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("f"), b"abc").unwrap();
    fs::create_dir(dir.path().join("d")).unwrap();
    let t = tree(dir.path());
    let f = t.lookup(&runtime::Ctx::Blocking, ROOT, &c("f")).unwrap();
    let mut text = String::new();
    fs::File::from(t.open(f.nodeid, libc::O_RDONLY).unwrap())
        .read_to_string(&mut text)
        .unwrap();
    assert_eq!(text, "abc");
    let mut w = fs::File::from(t.open(f.nodeid, libc::O_WRONLY | libc::O_APPEND).unwrap());
    w.write_all(b"def").unwrap();
    assert_eq!(fs::read(dir.path().join("f")).unwrap(), b"abcdef");
    let d = t.lookup(&runtime::Ctx::Blocking, ROOT, &c("d")).unwrap();
    assert_eq!(errno(t.open(d.nodeid, libc::O_RDONLY)), libc::EISDIR);
    assert!(t.opendir(d.nodeid).is_ok());
    assert_eq!(errno(t.opendir(f.nodeid)), libc::ENOTDIR);
    let st = t.statfs(ROOT).unwrap();
    assert!(st.f_bsize > 0);
    t.access(f.nodeid, libc::R_OK | libc::W_OK).unwrap();
}

#[test]
fn xattrs_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("f"), b"").unwrap();
    let t = tree(dir.path());
    let f = t.lookup(&runtime::Ctx::Blocking, ROOT, &c("f")).unwrap();
    let name: &CStr = c"user.corofuse";
    match t.setxattr(f.nodeid, name, b"value", 0) {
        Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {
            let why = "the temp dir's file system has no user xattrs";
            return corofuse_tests::require::report_skip(why);
        }
        r => r.unwrap(),
    }
    assert_eq!(
        t.getxattr(f.nodeid, name, &mut []).unwrap(),
        5,
        "size query"
    );
    let mut buf = [0u8; 16];
    let n = t.getxattr(f.nodeid, name, &mut buf).unwrap();
    assert_eq!(&buf[..n], b"value");
    let n = t.listxattr(f.nodeid, &mut buf).unwrap();
    assert_eq!(&buf[..n], b"user.corofuse\0");
    assert_eq!(
        errno(t.setxattr(f.nodeid, name, b"x", libc::XATTR_CREATE)),
        libc::EEXIST
    );
    t.removexattr(f.nodeid, name).unwrap();
    assert_eq!(errno(t.getxattr(f.nodeid, name, &mut buf)), libc::ENODATA);
}

#[test]
fn a_read_only_tree_refuses_every_change() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("f"), b"x").unwrap();
    let t = Tree::new(dir.path(), true, 1 << 16).unwrap();
    let f = t.lookup(&runtime::Ctx::Blocking, ROOT, &c("f")).unwrap();
    let rofs = libc::EROFS;
    assert_eq!(errno(t.mkdir(ROOT, &c("d"), 0o755, 0)), rofs);
    assert_eq!(errno(t.unlink(ROOT, &c("f"))), rofs);
    assert_eq!(errno(t.rename(ROOT, &c("f"), ROOT, &c("g"), 0)), rofs);
    assert_eq!(errno(t.create(ROOT, &c("n"), libc::O_RDWR, 0o644, 0)), rofs);
    assert_eq!(errno(t.open(f.nodeid, libc::O_RDWR)), rofs);
    assert_eq!(
        errno(t.open(f.nodeid, libc::O_RDONLY | libc::O_TRUNC)),
        rofs
    );
    let set = SetAttr {
        size: Some(0),
        ..SetAttr::default()
    };
    assert_eq!(errno(t.setattr(f.nodeid, &set, None)), rofs);
    assert_eq!(errno(t.access(f.nodeid, libc::W_OK)), rofs);
    assert_eq!(errno(t.setxattr(f.nodeid, c"user.x", b"", 0)), rofs);
    // Reads still work, and nothing changed.
    assert!(t.open(f.nodeid, libc::O_RDONLY).is_ok());
    assert_eq!(fs::read(dir.path().join("f")).unwrap(), b"x");
    assert!(t.getattr(f.nodeid).is_ok());
}

/// The caller's umask is the only one applied: a daemon started under umask 022 still
/// makes a 0777 directory, a 0666 file and a 0666 FIFO for a caller whose umask is 0
/// (pjdfstest's rename::write_access_required_subdir found it: its 0777 directory came
/// out 0755, and `nobody` could no longer rename in it).
#[test]
fn the_daemons_own_umask_takes_nothing_off() {
    // SAFETY: umask(2) cannot fail; this test binary's other tests make trees too, which
    // clear it again.
    unsafe { libc::umask(0o022) };
    let dir = tempfile::tempdir().unwrap();
    let t = tree(dir.path());
    t.mkdir(ROOT, &c("d"), 0o777, 0).unwrap();
    t.mknod(ROOT, &c("fifo"), libc::S_IFIFO | 0o666, 0, 0)
        .unwrap();
    drop(t.create(ROOT, &c("f"), libc::O_RDWR, 0o666, 0).unwrap());
    for (name, mode) in [("d", 0o777), ("fifo", 0o666), ("f", 0o666)] {
        let meta = fs::symlink_metadata(dir.path().join(name)).unwrap();
        assert_eq!(meta.mode() & 0o7777, mode, "{name}");
    }
}

/// In a directory with a default ACL the ACL decides a new node's mode, not the caller's
/// umask, as on a local file system; elsewhere the umask applies.
#[test]
fn a_default_acl_decides_instead_of_the_umask() {
    let dir = tempfile::tempdir().unwrap();
    let acl = dir.path().join("acl");
    fs::create_dir(&acl).unwrap();
    let rwx = corofuse_tests::sys::default_acl_rwx();
    if let Err(e) = corofuse_tests::sys::setxattr(&acl, "system.posix_acl_default", &rwx) {
        return corofuse_tests::require::report_skip(&format!(
            "no default ACL on {}: {e}",
            acl.display()
        ));
    }
    let t = tree(dir.path());
    let acl_node = t
        .lookup(&runtime::Ctx::Blocking, ROOT, &c("acl"))
        .unwrap()
        .nodeid;
    for (parent, d, f, want_d, want_f) in [
        (acl_node, "acl/d", "acl/f", 0o777, 0o666),
        (ROOT, "d", "f", 0o755, 0o644),
    ] {
        let name = |p: &str| c(p.rsplit('/').next().unwrap());
        t.mkdir(parent, &name(d), 0o777, 0o022).unwrap();
        drop(
            t.create(parent, &name(f), libc::O_RDWR, 0o666, 0o022)
                .unwrap(),
        );
        let mode = |p: &str| fs::metadata(dir.path().join(p)).unwrap().mode() & 0o7777;
        assert_eq!((mode(d), mode(f)), (want_d, want_f), "{d}, {f}");
    }
}
