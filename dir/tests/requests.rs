//! The directory export answering real FUSE requests (built as the kernel lays them out,
//! decoded by `fuse`, served by `DirFs` with blocking I/O) on a temporary source tree, with
//! the replies parsed and checked against the tree itself. No mount: this is the file
//! system's own logic; the transports are tested with the image export.

use std::ffi::CStr;
use std::fs;

use dir_export::{DirFs, DirOptions, ROOT};
use fuse::abi::*;
use fuse::Request;
use runtime::Ctx;
use transport::FileSystem;
use zerocopy::{FromBytes, FromZeros, IntoBytes};

/// A server and the bytes of its replies.
struct Harness {
    fs: DirFs,
    data: Vec<u8>,
    unique: u64,
}

/// One parsed reply.
struct Answer {
    error: i32,
    payload: Vec<u8>,
}

impl Answer {
    fn ok(self) -> Vec<u8> {
        assert_eq!(self.error, 0, "errno {}", -self.error);
        self.payload
    }

    fn arg<T: FromBytes>(self) -> T {
        T::read_from_prefix(&self.ok()).expect("reply argument").0
    }
}

impl Harness {
    fn new(dir: &std::path::Path, read_only: bool) -> Harness {
        let options = DirOptions {
            read_only,
            ..DirOptions::default()
        };
        Harness {
            fs: DirFs::new(dir, options).unwrap(),
            data: vec![0; 1 << 20],
            unique: 0,
        }
    }

    /// Sends `opcode` on `nodeid` with `args` (a struct's bytes, then NUL-terminated names
    /// or data); `None` when the request takes no reply.
    fn send(&mut self, opcode: u32, nodeid: u64, args: &[&[u8]]) -> Option<Answer> {
        self.unique += 2;
        let body: Vec<u8> = args.concat();
        let header = fuse_in_header {
            len: (40 + body.len()) as u32,
            opcode,
            unique: self.unique,
            nodeid,
            uid: 0,
            gid: 0,
            pid: 1,
            ..FromZeros::new_zeroed()
        };
        let bytes = [header.as_bytes(), &body].concat();
        let mut words = vec![0u64; bytes.len().div_ceil(8)];
        words.as_mut_bytes()[..bytes.len()].copy_from_slice(&bytes);
        let head = &words.as_bytes()[..bytes.len()];
        let req = Request::decode(head, &[]).expect("a well-formed request");
        let mut scratch = Default::default();
        let data: &mut [u8] = if req.op.kind().needs_data_buffer() {
            &mut self.data
        } else {
            &mut []
        };
        let reply = self.fs.handle(&Ctx::Blocking, &req, &mut scratch, data)?;
        let out: Vec<u8> = reply.io_slices().iter().flat_map(|s| s.to_vec()).collect();
        let (h, payload) = fuse_out_header::read_from_prefix(&out).unwrap();
        assert_eq!(h.len as usize, out.len());
        assert_eq!(h.unique, self.unique);
        Some(Answer {
            error: h.error,
            payload: payload.to_vec(),
        })
    }

    fn call(&mut self, opcode: u32, nodeid: u64, args: &[&[u8]]) -> Answer {
        self.send(opcode, nodeid, args).expect("a reply")
    }

    fn lookup(&mut self, parent: u64, name: &CStr) -> Answer {
        self.call(FUSE_LOOKUP, parent, &[name.to_bytes_with_nul()])
    }

    fn open(&mut self, nodeid: u64, opcode: u32, flags: i32) -> u64 {
        let mut arg = fuse_open_in::new_zeroed();
        arg.flags = flags as u32;
        self.call(opcode, nodeid, &[arg.as_bytes()])
            .arg::<fuse_open_out>()
            .fh
    }

    fn read(&mut self, nodeid: u64, opcode: u32, fh: u64, offset: u64, size: u32) -> Answer {
        let mut arg = fuse_read_in::new_zeroed();
        (arg.fh, arg.offset, arg.size) = (fh, offset, size);
        self.call(opcode, nodeid, &[arg.as_bytes()])
    }
}

/// (name, off, nodeid) of each record of a READDIR (`plus`: READDIRPLUS) reply.
fn records(mut bytes: &[u8], plus: bool) -> Vec<(String, u64, u64)> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let (nodeid, dirent) = if plus {
            let (entry, _) = fuse_entry_out::read_from_prefix(bytes).unwrap();
            (
                entry.nodeid,
                &bytes[std::mem::size_of::<fuse_entry_out>()..],
            )
        } else {
            (0, bytes)
        };
        let (d, _) = fuse_dirent::read_from_prefix(dirent).unwrap();
        let name = &dirent[24..24 + d.namelen as usize];
        out.push((String::from_utf8(name.to_vec()).unwrap(), d.off, nodeid));
        let len = (bytes.len() - dirent.len()) + (24 + d.namelen as usize).next_multiple_of(8);
        bytes = &bytes[len..];
    }
    out
}

#[test]
fn files_are_looked_up_read_written_and_created() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("hello"), b"hello, world").unwrap();
    let mut h = Harness::new(dir.path(), false);

    let entry = h.lookup(ROOT, c"hello").arg::<fuse_entry_out>();
    assert_eq!(entry.attr.size, 12);
    assert_eq!(entry.attr.mode & libc::S_IFMT, libc::S_IFREG);
    assert_eq!(h.lookup(ROOT, c"missing").error, -libc::ENOENT);

    let fh = h.open(entry.nodeid, FUSE_OPEN, libc::O_RDWR);
    assert_eq!(h.read(entry.nodeid, FUSE_READ, fh, 7, 100).ok(), b"world");
    let mut w = fuse_write_in::new_zeroed();
    (w.fh, w.offset, w.size) = (fh, 0, 5);
    let written = h.call(FUSE_WRITE, entry.nodeid, &[w.as_bytes(), b"HELLO"]);
    assert_eq!(written.arg::<fuse_write_out>().size, 5);
    assert_eq!(fs::read(dir.path().join("hello")).unwrap(), b"HELLO, world");
    assert_eq!(
        h.read(entry.nodeid, FUSE_READ, 999, 0, 10).error,
        -libc::EBADF
    );

    let mut c = fuse_create_in::new_zeroed();
    (c.flags, c.mode, c.umask) = ((libc::O_RDWR | libc::O_CREAT) as u32, 0o644, 0o022);
    let created = h.call(FUSE_CREATE, ROOT, &[c.as_bytes(), b"new\0"]).ok();
    let (e, rest) = fuse_entry_out::read_from_prefix(&created).unwrap();
    let (o, _) = fuse_open_out::read_from_prefix(rest).unwrap();
    assert!(dir.path().join("new").exists());
    assert_eq!(e.attr.mode, libc::S_IFREG | 0o644);
    let mut rel = fuse_release_in::new_zeroed();
    rel.fh = o.fh;
    h.call(FUSE_RELEASE, e.nodeid, &[rel.as_bytes()]).ok();
    rel.fh = fh;
    h.call(FUSE_RELEASE, entry.nodeid, &[rel.as_bytes()]).ok();
    assert!(h.fs.handles().is_empty(), "every handle released");

    // Attributes, and SETATTR of the size.
    let mut set = fuse_setattr_in::new_zeroed();
    (set.valid, set.size) = (FATTR_SIZE, 3);
    let attr = h
        .call(FUSE_SETATTR, entry.nodeid, &[set.as_bytes()])
        .arg::<fuse_attr_out>();
    assert_eq!(attr.attr.size, 3);
    let got = h
        .call(FUSE_GETATTR, entry.nodeid, &[&[0; 16]])
        .arg::<fuse_attr_out>();
    assert_eq!(got.attr.size, 3);

    // FORGET takes the lookups back.
    let fs_tree = h.fs.tree();
    let held = fs_tree.inodes.lookups(entry.nodeid);
    assert!(held >= 1);
    assert!(h
        .send(FUSE_FORGET, entry.nodeid, &[&held.to_le_bytes()])
        .is_none());
    assert!(h.fs.tree().inodes.get(entry.nodeid).is_none(), "forgotten");
}

#[test]
fn names_are_made_renamed_and_removed() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = Harness::new(dir.path(), false);
    let mut m = fuse_mkdir_in::new_zeroed();
    (m.mode, m.umask) = (0o755, 0);
    let d = h
        .call(FUSE_MKDIR, ROOT, &[m.as_bytes(), b"d\0"])
        .arg::<fuse_entry_out>();
    assert_eq!(d.attr.mode, libc::S_IFDIR | 0o755);
    let l = h
        .call(FUSE_SYMLINK, d.nodeid, &[b"ln\0", b"../target\0"])
        .arg::<fuse_entry_out>();
    assert_eq!(h.call(FUSE_READLINK, l.nodeid, &[]).ok(), b"../target");
    let mut r = fuse_rename2_in::new_zeroed();
    (r.newdir, r.flags) = (ROOT, 0);
    h.call(FUSE_RENAME2, d.nodeid, &[r.as_bytes(), b"ln\0", b"moved\0"])
        .ok();
    assert!(fs::symlink_metadata(dir.path().join("moved"))
        .unwrap()
        .is_symlink());
    assert_eq!(
        h.call(FUSE_RMDIR, ROOT, &[b"nothing\0"]).error,
        -libc::ENOENT
    );
    h.call(FUSE_UNLINK, ROOT, &[b"moved\0"]).ok();
    h.call(FUSE_RMDIR, ROOT, &[b"d\0"]).ok();
    assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
    let st = h.call(FUSE_STATFS, ROOT, &[]).arg::<fuse_statfs_out>();
    assert!(st.st.bsize > 0 && st.st.namelen > 0);
}

#[test]
fn readdir_and_readdirplus_list_everything_once_in_small_replies() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..300 {
        fs::write(dir.path().join(format!("f{i:03}")), b"").unwrap();
    }
    let mut h = Harness::new(dir.path(), false);
    for (opcode, plus) in [(FUSE_READDIR, false), (FUSE_READDIRPLUS, true)] {
        let fh = h.open(ROOT, FUSE_OPENDIR, libc::O_RDONLY);
        let (mut names, mut offset) = (Vec::new(), 0);
        loop {
            // 1 KiB replies: many requests per listing, as the kernel may send.
            let got = records(&h.read(ROOT, opcode, fh, offset, 1024).ok(), plus);
            let Some(last) = got.last() else { break };
            offset = last.1;
            for (name, _, nodeid) in &got {
                if plus && name != "." && name != ".." {
                    assert!(h.fs.tree().inodes.get(*nodeid).is_some(), "{name}: a node");
                }
            }
            names.extend(got.into_iter().map(|r| r.0));
        }
        assert_eq!(names.len(), 302, "{opcode}: 300 files and . and ..");
        let unique: std::collections::BTreeSet<_> = names.iter().collect();
        assert_eq!(unique.len(), 302, "{opcode}: each once");
        let mut rel = fuse_release_in::new_zeroed();
        rel.fh = fh;
        h.call(FUSE_RELEASEDIR, ROOT, &[rel.as_bytes()]).ok();
    }
    // READDIRPLUS counted one lookup per file it listed (and none for the entries that
    // did not fit a reply).
    let f0 = h.lookup(ROOT, c"f000").arg::<fuse_entry_out>();
    assert_eq!(
        h.fs.tree().inodes.lookups(f0.nodeid),
        2,
        "READDIRPLUS + this LOOKUP"
    );
}

#[test]
fn a_read_only_export_refuses_changes_with_erofs() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("f"), b"x").unwrap();
    let mut h = Harness::new(dir.path(), true);
    let mut m = fuse_mkdir_in::new_zeroed();
    m.mode = 0o755;
    assert_eq!(
        h.call(FUSE_MKDIR, ROOT, &[m.as_bytes(), b"d\0"]).error,
        -libc::EROFS
    );
    let f = h.lookup(ROOT, c"f").arg::<fuse_entry_out>();
    let mut o = fuse_open_in::new_zeroed();
    o.flags = libc::O_WRONLY as u32;
    assert_eq!(
        h.call(FUSE_OPEN, f.nodeid, &[o.as_bytes()]).error,
        -libc::EROFS
    );
    assert_eq!(h.call(FUSE_UNLINK, ROOT, &[b"f\0"]).error, -libc::EROFS);
    assert!(dir.path().join("f").exists());
    // Locks are the source's, read-only or not: GETLK of a read lock finds none.
    let mut lk = fuse_lk_in::new_zeroed();
    lk.lk.r#type = libc::F_RDLCK as u32;
    lk.lk.end = i64::MAX as u64;
    let got = h.call(FUSE_GETLK, f.nodeid, &[lk.as_bytes()]);
    assert_eq!(got.error, 0);
    assert_eq!(got.arg::<fuse_lk_out>().lk.r#type, libc::F_UNLCK as u32);
}

#[test]
fn o_direct_opens_are_direct_io_with_parallel_writes() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("f"), vec![0u8; 8192]).unwrap();
    let mut h = Harness::new(dir.path(), false);
    let node = h.lookup(ROOT, c"f").arg::<fuse_entry_out>().nodeid;
    let open_flags = |h: &mut Harness, flags: i32| {
        let mut arg = fuse_open_in::new_zeroed();
        arg.flags = flags as u32;
        let out = h
            .call(FUSE_OPEN, node, &[arg.as_bytes()])
            .arg::<fuse_open_out>();
        out.open_flags
    };
    let direct = FOPEN_DIRECT_IO | FOPEN_PARALLEL_DIRECT_WRITES;
    assert_eq!(open_flags(&mut h, libc::O_RDWR | libc::O_DIRECT), direct);
    assert_eq!(
        open_flags(&mut h, libc::O_RDWR),
        0,
        "--cache auto: the page cache"
    );
}
