//! Names and the nodes' lifetime: the entry replies of LOOKUP, MKDIR, MKNOD, SYMLINK,
//! LINK and CREATE ([`DirFs::fill_entry`]), READLINK, and RENAME2; LOOKUP, UNLINK, RMDIR,
//! RENAME and FORGET / BATCH_FORGET are one line each in the dispatch table, on the
//! [`Tree`](crate::tree::Tree) and its node table ([`crate::inodes`]).
//!
//! Rules of the source kept here:
//! - Every node the kernel holds keeps an `O_PATH` descriptor while it is among the
//!   [`DirOptions::node_fds`](super::DirOptions::node_fds) most recently used; the others
//!   are closed and reopened from their file handles when next used ([`crate::nodefd`]),
//!   so the nodes held at once are not bounded by the open-file limit (where file handles
//!   work: as root, on a file system that has them). Each entry replied counts one lookup
//!   of its node, which FORGET and BATCH_FORGET take off ([`crate::inodes`]: at zero the
//!   node goes, or is kept, forgotten, where file handles of the mount may ask for it).
//! - Credentials: a node a caller makes is the caller's, as on a local file system: made
//!   with the caller's credentials where the daemon takes them on ([`crate::creds`],
//!   switched by the dispatch table), else given to the caller after by a daemon running
//!   as root ([`DirFs::own`]), the group of a set-group-ID parent kept. The whiteout
//!   RENAME_WHITEOUT leaves under the old name is given to the caller the same way.
//! - An entry's attributes are valid for the export's timeout, or for no time while an
//!   open of the node that passes through may write ([`DirFs::attr_valid`]).

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};

use fuse::abi::*;
use fuse::{Reply, Request};

use super::{errno, Answer, DirFs, Scratch};
use crate::attr;
use crate::inodes::Entry;
use crate::sys;

impl DirFs {
    pub(super) fn fill_entry(&self, out: &mut fuse_entry_out, e: &Entry) {
        let (secs, nsecs) = self.valid();
        let (attr_secs, attr_nsecs) = self.attr_valid(Some(&e.inode));
        *out = fuse_entry_out {
            nodeid: e.nodeid,
            generation: e.inode.generation,
            entry_valid: secs,
            attr_valid: attr_secs,
            entry_valid_nsec: nsecs,
            attr_valid_nsec: attr_nsecs,
            attr: attr::of_stat(&e.attr),
        };
    }

    pub(super) fn entry<'b>(
        &self,
        unique: u64,
        s: &'b mut Scratch,
        e: io::Result<Entry>,
    ) -> Answer<'b> {
        let e = e.map_err(errno)?;
        self.fill_entry(&mut s.entry, &e);
        Ok(Reply::entry(unique, &s.entry))
    }

    /// MKDIR, MKNOD and SYMLINK: the new entry, given to its caller ([`DirFs::own`]).
    pub(super) fn made<'b>(
        &self,
        req: &Request<'_>,
        s: &'b mut Scratch,
        made: io::Result<Entry>,
    ) -> Answer<'b> {
        self.entry(req.unique, s, self.own(req, req.nodeid, made))
    }

    /// Gives a node just made by a caller other than root to that caller, as a local
    /// file system would (the daemon made it with its own credentials).
    pub(super) fn own(
        &self,
        req: &Request<'_>,
        parent: u64,
        made: io::Result<Entry>,
    ) -> io::Result<Entry> {
        let mut e = made?;
        if self.give(req, parent, e.inode.handle()?.as_fd())? {
            e.attr = sys::stat(e.inode.handle()?.as_fd())?;
        }
        Ok(e)
    }

    /// Gives the node behind `handle`, just made in `parent` for the caller, to that
    /// caller: owner the caller's uid, group the caller's gid unless the parent directory
    /// is set-group-ID (the group the source file system gave it then stands). Only a
    /// daemon running as root can, and only a caller other than root needs it, and
    /// only where the node was not made with the caller's credentials in the first place
    /// ([`Tree::acts_as_callers`](crate::tree::Tree::acts_as_callers)); says whether it changed anything.
    fn give(&self, req: &Request<'_>, parent: u64, handle: BorrowedFd<'_>) -> io::Result<bool> {
        if !self.as_root || (req.uid == 0 && req.gid == 0) {
            return Ok(false);
        }
        if req.uid != 0 && self.tree.acts_as_callers() {
            return Ok(false); // born the caller's
        }
        let setgid = self.tree.getattr(parent)?.st_mode & libc::S_ISGID != 0;
        let gid = if setgid { u32::MAX } else { req.gid };
        sys::chown(handle, req.uid, gid)?;
        Ok(true)
    }

    /// RENAME2. With `RENAME_WHITEOUT` (overlayfs over the mount) the source file system
    /// leaves a whiteout (a character device 0:0) under the old name, made with the
    /// daemon's credentials; like any node a caller makes, it is given to the caller, or
    /// in a sticky directory the caller could not remove it again.
    pub(super) fn rename2(
        &self,
        req: &Request<'_>,
        arg: &fuse_rename2_in,
        name: &CStr,
        newname: &CStr,
    ) -> io::Result<()> {
        let parent = req.nodeid;
        self.tree
            .rename(parent, name, arg.newdir, newname, arg.flags)?;
        if arg.flags & libc::RENAME_WHITEOUT != 0 {
            if let Some(whiteout) = self.tree.whiteout(parent, name)? {
                self.give(req, parent, whiteout.as_fd())?;
            }
        }
        Ok(())
    }

    /// READLINK: the target, in the data buffer.
    pub(super) fn readlink<'b>(&self, req: &Request<'_>, data: &'b mut [u8]) -> Answer<'b> {
        let n = self.tree.readlink(req.nodeid, data).map_err(errno)?;
        Ok(Reply::readlink(req.unique, &data[..n]))
    }
}
