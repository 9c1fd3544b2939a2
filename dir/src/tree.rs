//! What each directory-export operation does to the source tree, by node id, apart from
//! the FUSE protocol: the layer the FileSystem's request handlers call.
//!
//! Why a layer of its own: each operation here is one or two `*at` system calls on the
//! handles of the inode table, and its errors are the source file system's own errnos,
//! which the handler passes to the client unchanged. Kept free of request decoding and
//! replies, it is tested on a real tree without mounting anything.
//!
//! Permission model (for now): the daemon acts with its own credentials, so the export
//! is meant to be mounted by root with `default_permissions` (the kernel checks the
//! caller's permissions against the attributes this layer reports) for a single user;
//! switching fsuid/fsgid per request is the step after. New nodes are owned by the
//! daemon's user, with the mode the caller asked for less the caller's umask, as a local
//! file system makes them: the mount asks the kernel not to apply the umask itself
//! (FUSE_DONT_MASK) and this layer applies it, except in a directory with a default ACL,
//! where the source file system applies the ACL instead, as it does for a local caller
//! ([`Tree::creation_mode`]). So that the daemon's own umask takes nothing more off (a
//! caller with umask 0 making a 0777 directory gets 0777), [`Tree::new`] sets the
//! process's umask to 0.
//!
//! A read-only tree refuses every change with EROFS before any system call.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use runtime::Ctx;

use crate::creds::Credentials;
use crate::dirstream::DirStream;
use crate::inodes::{Entry, Inode, Inodes};
use crate::sys;

thread_local! {
    /// The caller (fsuid, fsgid, thread) whose changes this thread is making, if any
    /// ([`Tree::acting_for`]).
    static CALLER: std::cell::Cell<Option<(u32, u32, u32)>> = const { std::cell::Cell::new(None) };
}

/// While it lives, the changes the tree makes on this thread are made as one caller.
pub struct ActingFor(());

impl Drop for ActingFor {
    fn drop(&mut self) {
        CALLER.set(None);
    }
}

/// A time for SETATTR.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Time {
    /// The current time (`FATTR_ATIME_NOW`).
    Now,
    /// Seconds and nanoseconds since the epoch.
    At(i64, u32),
}

/// The changes of one SETATTR; `None` leaves a field as it is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<Time>,
    pub mtime: Option<Time>,
}

/// The source tree and the nodes the kernel holds in it.
pub struct Tree {
    pub inodes: Inodes,
    read_only: bool,
    /// The source file system has no POSIX ACLs (a getxattr of a default ACL answered
    /// EOPNOTSUPP): no directory can have one, so none is asked for again.
    no_acls: AtomicBool,
    /// The daemon's own credentials, and whether it can take on its callers'.
    creds: Credentials,
}

/// The xattr holding a directory's default ACL.
const DEFAULT_ACL: &CStr = c"system.posix_acl_default";

fn errno(code: i32) -> io::Error {
    io::Error::from_raw_os_error(code)
}

impl Tree {
    /// The tree rooted at `source` (a directory), keeping at most `node_fds` node
    /// descriptors open where file handles allow ([`crate::nodefd`]). Clears the process's
    /// umask (see the module docs): the caller's umask, which every request that makes a
    /// node carries, is the one that counts.
    pub fn new(source: &Path, read_only: bool, node_fds: usize) -> io::Result<Tree> {
        let was = sys::clear_umask();
        if was != 0 {
            log::debug!("umask {was:03o} cleared: the callers' umasks apply instead");
        }
        Ok(Tree {
            inodes: Inodes::new(source, node_fds)?,
            read_only,
            no_acls: AtomicBool::new(false),
            creds: Credentials::of_daemon(),
        })
    }

    /// Whether the changes callers make are made with their own credentials
    /// ([`crate::creds`]: the daemon is root), so that nodes are born theirs.
    pub fn acts_as_callers(&self) -> bool {
        self.creds.switchable()
    }

    /// Until the guard drops, the changes this thread makes to the tree (making nodes,
    /// links, renames, attributes, extended attributes) run with the credentials of the
    /// caller with fsuid `uid`, fsgid `gid`, thread `pid`. Each change switches around
    /// its one system call only ([`Tree::as_caller`]).
    pub fn acting_for(&self, uid: u32, gid: u32, pid: u32) -> ActingFor {
        CALLER.set(Some((uid, gid, pid)));
        ActingFor(())
    }

    /// `op` (one system call, on descriptors already open: reopening a node from its
    /// file handle needs the daemon's own capabilities) with the credentials of the
    /// caller this thread acts for, if any.
    fn as_caller<T>(&self, op: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
        let _creds = match CALLER.get() {
            Some((uid, gid, pid)) => self.creds.become_caller(uid, gid, pid)?,
            None => None,
        };
        op()
    }

    /// The mode to make a node with in `dir`: `mode` less the caller's `umask`, unless
    /// `dir` has a default ACL, which then decides instead (the source file system
    /// applies it; a local file system ignores the umask there too). One getxattr of the
    /// directory per node made, none when the umask takes nothing off or the source has
    /// no ACLs.
    pub fn creation_mode(&self, dir: BorrowedFd<'_>, mode: u32, umask: u32) -> u32 {
        let masked = mode & !(umask & 0o777);
        if masked == mode || self.no_acls.load(Ordering::Relaxed) {
            return masked;
        }
        match sys::getxattr(dir, DEFAULT_ACL, &mut []) {
            Ok(_) => mode,
            Err(e) => {
                if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
                    self.no_acls.store(true, Ordering::Relaxed);
                }
                masked
            }
        }
    }

    /// The node `nodeid`; ESTALE if the kernel sent an id it no longer holds.
    pub fn node(&self, nodeid: u64) -> io::Result<Arc<Inode>> {
        self.inodes.get(nodeid).ok_or_else(|| errno(libc::ESTALE))
    }

    fn writable(&self) -> io::Result<()> {
        if self.read_only {
            return Err(errno(libc::EROFS));
        }
        Ok(())
    }

    /// A directory node, for the operations on names in it.
    fn dir(&self, nodeid: u64) -> io::Result<Arc<Inode>> {
        let dir = self.node(nodeid)?;
        if !dir.is_dir() {
            return Err(errno(libc::ENOTDIR));
        }
        Ok(dir)
    }

    /// LOOKUP of `name` in `parent`, the name opened through `cx` ([`Inodes::lookup_in`]).
    pub fn lookup(&self, cx: &Ctx<'_>, parent: u64, name: &CStr) -> io::Result<Entry> {
        if name.to_bytes() == b"." {
            // Any node, forgotten ones included: how the kernel finds a node again from a
            // file handle (FUSE_EXPORT_SUPPORT).
            return self.inodes.lookup_self(parent);
        }
        let dir = self.dir(parent)?;
        self.inodes.lookup_in(cx, parent, &dir, name)
    }

    pub fn getattr(&self, nodeid: u64) -> io::Result<libc::stat> {
        sys::stat(self.node(nodeid)?.handle()?.as_fd())
    }

    /// Makes `name` in `parent` with `make`, then looks it up (one lookup counted).
    fn made(
        &self,
        parent: u64,
        name: &CStr,
        make: impl FnOnce(BorrowedFd<'_>) -> io::Result<()>,
    ) -> io::Result<Entry> {
        self.writable()?;
        let dir = self.dir(parent)?;
        let dir_fd = dir.handle()?;
        self.as_caller(|| make(dir_fd.as_fd()))?;
        self.inodes.lookup(parent, &dir, name)
    }

    pub fn mkdir(&self, parent: u64, name: &CStr, mode: u32, umask: u32) -> io::Result<Entry> {
        self.made(parent, name, |dir| {
            sys::mkdir(dir, name, self.creation_mode(dir, mode, umask))
        })
    }

    pub fn mknod(
        &self,
        parent: u64,
        name: &CStr,
        mode: u32,
        rdev: u64,
        umask: u32,
    ) -> io::Result<Entry> {
        self.made(parent, name, |dir| {
            sys::mknod(dir, name, self.creation_mode(dir, mode, umask), rdev)
        })
    }

    pub fn symlink(&self, parent: u64, name: &CStr, target: &CStr) -> io::Result<Entry> {
        self.made(parent, name, |dir| sys::symlink(target, dir, name))
    }

    /// LINK: a new name for `nodeid` in `parent`; the entry is the same node.
    pub fn link(&self, nodeid: u64, parent: u64, name: &CStr) -> io::Result<Entry> {
        let file = self.node(nodeid)?;
        if file.is_dir() {
            return Err(errno(libc::EPERM));
        }
        let file_fd = file.handle()?;
        self.made(parent, name, |dir| sys::link(file_fd.as_fd(), dir, name))
    }

    pub fn unlink(&self, parent: u64, name: &CStr) -> io::Result<()> {
        self.writable()?;
        sys::unlink(self.dir(parent)?.handle()?.as_fd(), name, 0)
    }

    pub fn rmdir(&self, parent: u64, name: &CStr) -> io::Result<()> {
        self.writable()?;
        sys::unlink(
            self.dir(parent)?.handle()?.as_fd(),
            name,
            libc::AT_REMOVEDIR,
        )
    }

    /// RENAME and RENAME2 (`flags`: RENAME_NOREPLACE, RENAME_EXCHANGE, RENAME_WHITEOUT,
    /// passed to renameat2 as they are).
    pub fn rename(
        &self,
        parent: u64,
        name: &CStr,
        new_parent: u64,
        new_name: &CStr,
        flags: u32,
    ) -> io::Result<()> {
        self.writable()?;
        let (from, to) = (self.dir(parent)?.handle()?, self.dir(new_parent)?.handle()?);
        self.as_caller(|| sys::rename(from.as_fd(), name, to.as_fd(), new_name, flags))
    }

    /// The whiteout `name` in directory `parent` that a `RENAME_WHITEOUT` left, as an
    /// `O_PATH` handle checked to be one (a character device 0:0), so that what it is
    /// given to is the node checked; `None` if something else is there by now.
    pub fn whiteout(&self, parent: u64, name: &CStr) -> io::Result<Option<OwnedFd>> {
        let dir = self.dir(parent)?;
        let handle = match sys::open_path(dir.handle()?.as_fd(), name) {
            Ok(handle) => handle,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
            Err(e) => return Err(e),
        };
        let st = sys::stat(handle.as_fd())?;
        let is_whiteout = st.st_mode & libc::S_IFMT == libc::S_IFCHR && st.st_rdev == 0;
        Ok(is_whiteout.then_some(handle))
    }

    pub fn readlink(&self, nodeid: u64, buf: &mut [u8]) -> io::Result<usize> {
        let node = self.node(nodeid)?;
        if node.kind != libc::S_IFLNK {
            return Err(errno(libc::EINVAL));
        }
        sys::readlink(node.handle()?.as_fd(), buf)
    }

    /// SETATTR: the changes in `set`, in the order chmod, chown, truncate, times (as
    /// passthrough_hp does them); `open` is the file's open descriptor when the kernel
    /// names one (FATTR_FH), used for the truncate. Returns the attributes after.
    pub fn setattr(
        &self,
        nodeid: u64,
        set: &SetAttr,
        open: Option<BorrowedFd<'_>>,
    ) -> io::Result<libc::stat> {
        if *set != SetAttr::default() {
            self.writable()?;
        }
        let node = self.node(nodeid)?;
        let fd = node.handle()?;
        let fd = fd.as_fd();
        if let Some(mode) = set.mode {
            self.as_caller(|| sys::chmod(fd, mode & 0o7777))?;
        }
        if set.uid.is_some() || set.gid.is_some() {
            let keep = u32::MAX;
            let (uid, gid) = (set.uid.unwrap_or(keep), set.gid.unwrap_or(keep));
            self.as_caller(|| sys::chown(fd, uid, gid))?;
        }
        if let Some(size) = set.size {
            match open {
                Some(open) => self.as_caller(|| sys::ftruncate(open, size))?,
                None => self.as_caller(|| {
                    let file = sys::reopen(fd, libc::O_WRONLY)?;
                    sys::ftruncate(file.as_fd(), size)
                })?,
            }
        }
        if set.atime.is_some() || set.mtime.is_some() {
            let spec = |t: Option<Time>| match t {
                None => libc::timespec {
                    tv_sec: 0,
                    tv_nsec: libc::UTIME_OMIT,
                },
                Some(Time::Now) => libc::timespec {
                    tv_sec: 0,
                    tv_nsec: libc::UTIME_NOW,
                },
                Some(Time::At(s, ns)) => libc::timespec {
                    tv_sec: s as libc::time_t,
                    tv_nsec: ns as libc::c_long,
                },
            };
            let times = [spec(set.atime), spec(set.mtime)];
            self.as_caller(|| sys::utimens(fd, &times))?;
        }
        sys::stat(fd)
    }

    /// OPEN: the file behind `nodeid` opened for I/O with the client's `flags` (less
    /// O_CREAT, O_EXCL and O_NOCTTY, which mean nothing for an existing node).
    pub fn open(&self, nodeid: u64, flags: i32) -> io::Result<OwnedFd> {
        let node = self.node(nodeid)?;
        if node.is_dir() {
            return Err(errno(libc::EISDIR));
        }
        let writes = flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0;
        if writes {
            self.writable()?;
        }
        let flags = flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_NOCTTY);
        sys::reopen(node.handle()?.as_fd(), flags)
    }

    /// CREATE: `name` in `parent` created and opened with `flags` (O_CREAT added), mode
    /// less the caller's umask; its entry (one lookup) and the open descriptor.
    pub fn create(
        &self,
        parent: u64,
        name: &CStr,
        flags: i32,
        mode: u32,
        umask: u32,
    ) -> io::Result<(OwnedFd, Entry)> {
        self.writable()?;
        let dir = self.dir(parent)?;
        let dir_fd = dir.handle()?;
        let mode = self.creation_mode(dir_fd.as_fd(), mode, umask);
        let flags = flags & !libc::O_NOCTTY;
        let fd = self.as_caller(|| sys::create(dir_fd.as_fd(), name, flags, mode))?;
        let entry = self.inodes.lookup(parent, &dir, name)?;
        Ok((fd, entry))
    }

    pub fn opendir(&self, nodeid: u64) -> io::Result<DirStream> {
        DirStream::open(&*self.dir(nodeid)?)
    }

    pub fn statfs(&self, nodeid: u64) -> io::Result<libc::statvfs> {
        sys::statfs(self.node(nodeid)?.handle()?.as_fd())
    }

    /// ACCESS with `mask`; W_OK on a read-only tree is EROFS.
    pub fn access(&self, nodeid: u64, mask: i32) -> io::Result<()> {
        if mask & libc::W_OK != 0 {
            self.writable()?;
        }
        sys::access(self.node(nodeid)?.handle()?.as_fd(), mask)
    }

    pub fn getxattr(&self, nodeid: u64, name: &CStr, buf: &mut [u8]) -> io::Result<usize> {
        sys::getxattr(self.node(nodeid)?.handle()?.as_fd(), name, buf)
    }

    pub fn listxattr(&self, nodeid: u64, buf: &mut [u8]) -> io::Result<usize> {
        sys::listxattr(self.node(nodeid)?.handle()?.as_fd(), buf)
    }

    pub fn setxattr(&self, nodeid: u64, name: &CStr, value: &[u8], flags: i32) -> io::Result<()> {
        self.writable()?;
        let fd = self.node(nodeid)?.handle()?;
        self.as_caller(|| sys::setxattr(fd.as_fd(), name, value, flags))
    }

    pub fn removexattr(&self, nodeid: u64, name: &CStr) -> io::Result<()> {
        self.writable()?;
        let fd = self.node(nodeid)?.handle()?;
        self.as_caller(|| sys::removexattr(fd.as_fd(), name))
    }
}
