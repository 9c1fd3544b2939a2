//! Attributes: GETATTR, SETATTR and STATFS (ACCESS is one line in the dispatch table, on
//! [`Tree::access`](crate::tree::Tree::access); STATX answers ENOSYS there, and the
//! kernel falls back to GETATTR), how long the kernel may keep them, and the privilege
//! bits a change of a file's data clears.
//!
//! Rules of the source kept here:
//! - Validity: attributes are valid for the export's timeout, or for no time while an
//!   open of the node that passes through may write: a shared mapping's writes change the
//!   source's times with no request ([`crate::fresh`]).
//! - GETATTR with a file handle this server opened stats the open file, else the node.
//! - SETATTR changes mode, owner, size and times (atime and mtime: to the time given, or
//!   to now) as the kernel names them, through the open file where it names one
//!   ([`Tree::setattr`](crate::tree::Tree::setattr)), with the caller's credentials where
//!   the daemon takes them on (the dispatch table, [`crate::creds`]), so that the source's
//!   own permission checks apply.
//! - Privilege bits: before a data change by a caller without CAP_FSETID, set-user-ID is
//!   cleared, and set-group-ID where a local file system would clear it
//!   ([`DirFs::kill_suidgid_of`]): where the kernel asks (HANDLE_KILLPRIV_V2: writes,
//!   truncation, `O_TRUNC` opens), and before `fallocate` and `copy_file_range`, which it
//!   leaves to the daemon ([`DirFs::kill_unless_fsetid`]). Only a daemon running as root
//!   clears them; under any other, the source's kernel does, as for its own writes.

use std::io;
use std::os::fd::{AsFd, BorrowedFd};

use fuse::abi::*;
use fuse::{Reply, Request};
use zerocopy::FromZeros;

use super::{errno, Answer, DirFs, Scratch};
use crate::attr;
use crate::caller;
use crate::inodes::Inode;
use crate::sys;
use crate::tree::{SetAttr, Time};

impl DirFs {
    pub(super) fn valid(&self) -> (u64, u32) {
        let t = self.options.timeout;
        (t.as_secs(), t.subsec_nanos())
    }

    /// How long the kernel may keep `inode`'s attributes: no time while a passthrough
    /// open of it may write ([`crate::fresh`]).
    pub(super) fn attr_valid(&self, inode: Option<&Inode>) -> (u64, u32) {
        match inode {
            Some(inode) if inode.writers.any() => (0, 0),
            _ => self.valid(),
        }
    }

    /// [`DirFs::attr_valid`] of node `nodeid` (looked up only where passthrough is on).
    fn attr_valid_of(&self, nodeid: u64) -> (u64, u32) {
        if !self.passthrough.is_on() {
            return self.valid();
        }
        self.attr_valid(self.tree.inodes.get(nodeid).as_deref())
    }

    /// A GETATTR or SETATTR reply: `st` as the attributes of `req`'s node.
    fn attr<'b>(
        &self,
        req: &Request<'_>,
        s: &'b mut Scratch,
        st: io::Result<libc::stat>,
    ) -> Answer<'b> {
        let (unique, st) = (req.unique, st.map_err(errno)?);
        let (secs, nsecs) = self.attr_valid_of(req.nodeid);
        s.attr = FromZeros::new_zeroed();
        (s.attr.attr_valid, s.attr.attr_valid_nsec) = (secs, nsecs);
        s.attr.attr = attr::of_stat(&st);
        Ok(Reply::arg(unique, &s.attr))
    }

    /// GETATTR: from the open file where the kernel names one this server opened, else
    /// from the node.
    pub(super) fn getattr<'b>(
        &self,
        req: &Request<'_>,
        arg: &fuse_getattr_in,
        s: &'b mut Scratch,
    ) -> Answer<'b> {
        let by_fh = (arg.getattr_flags & FUSE_GETATTR_FH != 0)
            .then(|| self.file(arg.fh).ok())
            .flatten();
        let st = match by_fh {
            Some(open) => sys::fstat(open.fd().as_fd()),
            None => self.tree.getattr(req.nodeid),
        };
        self.attr(req, s, st)
    }

    pub(super) fn setattr<'b>(
        &self,
        req: &Request<'_>,
        arg: &fuse_setattr_in,
        s: &'b mut Scratch,
    ) -> Answer<'b> {
        let v = arg.valid;
        let has = |bit: u32| v & bit != 0;
        let time = |now: u32, at: u32, secs: u64, nsecs: u32| {
            if has(now) {
                Some(Time::Now)
            } else if has(at) {
                Some(Time::At(secs as i64, nsecs))
            } else {
                None
            }
        };
        let set = SetAttr {
            mode: has(FATTR_MODE).then_some(arg.mode),
            uid: has(FATTR_UID).then_some(arg.uid),
            gid: has(FATTR_GID).then_some(arg.gid),
            size: has(FATTR_SIZE).then_some(arg.size),
            atime: time(FATTR_ATIME_NOW, FATTR_ATIME, arg.atime, arg.atimensec),
            mtime: time(FATTR_MTIME_NOW, FATTR_MTIME, arg.mtime, arg.mtimensec),
        };
        let open = if has(FATTR_FH) {
            Some(self.file(arg.fh)?)
        } else {
            None
        };
        let fd = open.as_ref().map(|o| o.fd().as_fd());
        if has(FATTR_KILL_SUIDGID) {
            self.kill_suidgid(req, req.nodeid).map_err(errno)?;
        }
        let st = self.tree.setattr(req.nodeid, &set, fd);
        self.attr(req, s, st)
    }

    pub(super) fn statfs<'b>(&self, req: &Request<'_>, s: &'b mut Scratch) -> Answer<'b> {
        let st = self.tree.statfs(req.nodeid).map_err(errno)?;
        s.statfs = FromZeros::new_zeroed();
        let k = &mut s.statfs.st;
        (k.blocks, k.bfree, k.bavail) = (st.f_blocks, st.f_bfree, st.f_bavail);
        (k.files, k.ffree) = (st.f_files, st.f_ffree);
        (k.bsize, k.frsize, k.namelen) =
            (st.f_bsize as u32, st.f_frsize as u32, st.f_namemax as u32);
        Ok(Reply::arg(req.unique, &s.statfs))
    }

    /// Clears the privilege bits of the node `nodeid` as a data change by the caller of
    /// `req` would: see [`DirFs::kill_suidgid_of`].
    pub(super) fn kill_suidgid(&self, req: &Request<'_>, nodeid: u64) -> io::Result<()> {
        self.kill_suidgid_of(req, nodeid, self.tree.node(nodeid)?.handle()?.as_fd())
    }

    /// Clears the privilege bits of the file behind `fd` (node `nodeid`) as a data change
    /// by a caller without CAP_FSETID does on a local file system: set-user-ID always; set-group-ID
    /// where the group may execute, or else (a mandatory-locking mark) where the caller
    /// is not a member of the file's group. Done before the data changes (a program run
    /// between the two must not run changed bytes with the old privileges). The kernel
    /// asks for it under HANDLE_KILLPRIV_V2 for writes, truncation and `O_TRUNC` opens
    /// (FUSE_WRITE_KILL_SUIDGID, FATTR_KILL_SUIDGID, FUSE_OPEN_KILL_SUIDGID), and leaves
    /// `fallocate` and `copy_file_range` to the daemon ([`DirFs::kill_unless_fsetid`]).
    /// Only a daemon running as root needs to: one without CAP_FSETID has the source's
    /// kernel clear them by itself. (File capabilities the source file system removes on
    /// its own.) The kernel is told its cached attributes went stale: it invalidates
    /// only size and times after a data change, and would show the old mode.
    pub(super) fn kill_suidgid_of(
        &self,
        req: &Request<'_>,
        nodeid: u64,
        fd: BorrowedFd<'_>,
    ) -> io::Result<()> {
        if !self.as_root {
            return Ok(());
        }
        let st = sys::stat(fd)?;
        let old = st.st_mode & 0o7777;
        let mut mode = old & !libc::S_ISUID;
        if mode & libc::S_ISGID != 0
            && (mode & libc::S_IXGRP != 0 || !caller::in_group(req.gid, req.pid, st.st_gid))
        {
            mode &= !libc::S_ISGID;
        }
        if mode != old {
            sys::chmod(fd, mode)?;
            self.notify.stale(nodeid);
        }
        Ok(())
    }

    /// The privilege bits of the file behind `fd` cleared before a `fallocate` or a
    /// `copy_file_range` into it, unless the caller holds CAP_FSETID
    /// ([`caller::has_capability`]).
    pub(super) fn kill_unless_fsetid(
        &self,
        req: &Request<'_>,
        nodeid: u64,
        fd: BorrowedFd<'_>,
    ) -> io::Result<()> {
        if caller::has_capability(req.uid, req.pid, caller::CAP_FSETID) {
            return Ok(());
        }
        self.kill_suidgid_of(req, nodeid, fd)
    }
}
