//! Open files: OPEN, CREATE (the new entry and its open file), and RELEASE and RELEASEDIR
//! (every handle goes there, a directory's too), with the cache flags each open gets and
//! FUSE passthrough's choices.
//!
//! Rules kept here:
//! - A file opened with O_DIRECT, or any with `--cache never`, is direct I/O with
//!   parallel direct writes, as passthrough_hp answers; `--cache always` keeps the page
//!   cache across opens. Under the writeback cache, files are opened read-write for
//!   writing and without O_APPEND ([`DirFs::source_flags`]).
//! - An `O_TRUNC` open clears the privilege bits first where the kernel asks
//!   (FUSE_OPEN_KILL_SUIDGID, [`DirFs::kill_suidgid`]); CREATE's node is its caller's
//!   ([`DirFs::own`]).
//! - FUSE passthrough ([`PassthroughPolicy`], Linux 6.9+, root): an open of a regular
//!   file in the passthrough family names its node's backing file, registered from the
//!   first such open's descriptor and unregistered at the node's last RELEASE
//!   ([`fuse::backing::Inode`] keeps one mode per node while opens of it live, as the
//!   kernel requires; a node whose registration failed is served for as long as its
//!   served opens live). The kernel then sends the open's reads, writes and mappings
//!   straight to the source file, where the policy does not keep them here
//!   (`FOPEN_DIRECT_IO` beside `FOPEN_PASSTHROUGH`, [`DirFs::keeps_data`]: among others an
//!   open that may write a file with privilege bits, by a caller without CAP_FSETID).
//!   Attributes still come from here: after a passthrough write the kernel asks again; a
//!   shared mapping's writes change the source's times with no request, so while an open
//!   that passes through may write, its node's attributes are answered valid for no time
//!   ([`crate::fresh`]). Without the kernel's support or CAP_SYS_ADMIN (EPERM at the first
//!   registration), one log line, and every open is served as before.
//! - RELEASE lets go of the flock lock the kernel names and of the locks taken through
//!   the handle ([`crate::locks`]); RELEASEDIR adds the listing's costs to the stats.

use std::ffi::CStr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use fuse::abi::*;
use fuse::backing::Mode;
use fuse::{Errno, Reply, Request};
use zerocopy::FromZeros;

use super::{errno, Answer, Cache, DirFs, PassthroughPolicy, Scratch};
use crate::caller;
use crate::fresh;
use crate::handles::{Backed, Open};
use crate::inodes::Inode;
use crate::sys;

/// A handle checked to be an open file, held for the request.
pub(super) struct OpenFile(std::sync::Arc<Open>);

impl OpenFile {
    pub(super) fn fd(&self) -> &std::os::fd::OwnedFd {
        match &*self.0 {
            Open::File(fd, _) => fd,
            Open::Dir(_) => unreachable!("DirFs::file checks the kind"),
        }
    }
}

impl DirFs {
    /// The open file behind `fh`; EBADF if this server did not open it (or it is a
    /// directory).
    pub(super) fn file(&self, fh: u64) -> Result<OpenFile, Errno> {
        match self.handles.get(fh) {
            Some(open) if matches!(*open, Open::File(..)) => Ok(OpenFile(open)),
            _ => Err(Errno::EBADF),
        }
    }

    /// OPEN: the privilege bits cleared first where the kernel asks, then the file opened
    /// read-write for the writeback cache where the file allows it, else as asked (a
    /// write-only file stays write-only).
    pub(super) fn open<'b>(
        &self,
        req: &Request<'_>,
        arg: &fuse_open_in,
        s: &'b mut Scratch,
    ) -> Answer<'b> {
        let (node, asked) = (req.nodeid, arg.flags as i32);
        if arg.open_flags & FUSE_OPEN_KILL_SUIDGID != 0 {
            self.kill_suidgid(req, node).map_err(errno)?;
        }
        let fd = self
            .tree
            .open(node, self.source_flags(asked))
            .or_else(|_| self.tree.open(node, asked))
            .map_err(errno)?;
        let inode = self.tree.node(node).map_err(errno)?;
        if self.fill_open(req, &mut s.open, &inode, fd, asked) {
            // Attributes cached before this open would hide what its mappings change.
            self.notify.stale(node);
        }
        Ok(Reply::arg(req.unique, &s.open))
    }

    /// CREATE: the new entry, given to its caller, and the open file.
    pub(super) fn create<'b>(
        &self,
        req: &Request<'_>,
        arg: &fuse_create_in,
        name: &CStr,
        s: &'b mut Scratch,
    ) -> Answer<'b> {
        let (node, asked) = (req.nodeid, arg.flags as i32);
        let (fd, made) = self
            .tree
            .create(node, name, self.source_flags(asked), arg.mode, arg.umask)
            .map_err(errno)?;
        let e = self.own(req, node, Ok(made)).map_err(errno)?;
        // The open first: a passthrough writer's entry is valid for no time.
        self.fill_open(req, &mut s.open, &e.inode, fd, asked);
        self.fill_entry(&mut s.entry, &e);
        Ok(Reply::create(req.unique, &s.entry, &s.open))
    }

    /// Registers the file `fd` (of node `inode`, opened by `req` with `flags`) and fills
    /// its OPEN or CREATE reply.
    ///
    /// Where the session has FUSE passthrough, the node's mode decides first
    /// ([`fuse::backing::Inode`]). An open passes its data through unless it must keep
    /// its reads and writes on the daemon ([`DirFs::keeps_data`]): then it is served as
    /// without passthrough, or, where other opens of the node pass through already (the
    /// kernel allows no other kind beside them), in the passthrough family with
    /// `FOPEN_DIRECT_IO` (its mappings, and only they, go to the source file; its
    /// splice reads use the mount's page cache, which mapped writes no longer reach: a
    /// kernel property, see README). The first open that passes through registers the
    /// node's backing file from `fd`.
    ///
    /// Otherwise, the cache policy: a file the client opened with O_DIRECT (`flags`), or
    /// any with `--cache never`, is direct I/O with parallel direct writes, as
    /// passthrough_hp answers: without FOPEN_DIRECT_IO the kernel serves an O_DIRECT
    /// write under the inode's lock, one at a time, and without
    /// FOPEN_PARALLEL_DIRECT_WRITES it takes that lock for direct writes too (it still
    /// does for appends and writes that extend the file).
    ///
    /// A passthrough open that may write counts among the node's writers
    /// ([`crate::fresh`]); says whether it did.
    fn fill_open(
        &self,
        req: &Request<'_>,
        out: &mut fuse_open_out,
        inode: &Arc<Inode>,
        fd: OwnedFd,
        flags: i32,
    ) -> bool {
        *out = FromZeros::new_zeroed();
        let direct = flags & libc::O_DIRECT != 0 || self.options.cache == Cache::Never;
        let served = if direct {
            FOPEN_DIRECT_IO | FOPEN_PARALLEL_DIRECT_WRITES
        } else if self.options.cache == Cache::Always {
            FOPEN_KEEP_CACHE
        } else {
            0
        };
        let backed = self.passthrough.is_on() && inode.kind == libc::S_IFREG;
        let mode = backed.then(|| {
            let keep = self.keeps_data(req, fd.as_fd(), flags);
            let mode = inode
                .backing
                .open(!keep, || self.passthrough.register(fd.as_fd()));
            (mode, keep)
        });
        out.open_flags = match mode {
            Some((Mode::Passthrough(id), keep)) => {
                self.passthrough.count_open();
                out.backing_id = id.0;
                match keep {
                    true => FOPEN_PASSTHROUGH | FOPEN_DIRECT_IO | FOPEN_PARALLEL_DIRECT_WRITES,
                    false => FOPEN_PASSTHROUGH,
                }
            }
            Some((Mode::Served, _)) | None => served,
        };
        let mode = mode.map(|(mode, _)| mode);
        let writes = matches!(mode, Some(Mode::Passthrough(_))) && fresh::may_write(flags);
        if writes {
            inode.writers.opened();
        }
        let backed = mode.map(|mode| Backed {
            inode: Arc::clone(inode),
            mode,
            writes,
        });
        out.fh = self.handles.insert(Open::File(fd, backed));
        writes
    }

    /// Whether an open keeps its reads and writes on the daemon: under `auto`, an
    /// O_DIRECT open that may write (the daemon runs its writes in parallel); under every
    /// policy, an open that may write a file with privilege bits, by a caller without
    /// CAP_FSETID (with HANDLE_KILLPRIV_V2 the kernel leaves clearing them to the daemon,
    /// which never sees a passthrough write).
    fn keeps_data(&self, req: &Request<'_>, fd: BorrowedFd<'_>, flags: i32) -> bool {
        if flags & libc::O_ACCMODE == libc::O_RDONLY {
            return false;
        }
        if self.options.passthrough == PassthroughPolicy::Auto && flags & libc::O_DIRECT != 0 {
            return true;
        }
        let privileged =
            sys::stat(fd).map_or(true, |st| st.st_mode & (libc::S_ISUID | libc::S_ISGID) != 0);
        privileged && !caller::has_capability(req.uid, req.pid, caller::CAP_FSETID)
    }

    /// The flags a file is opened with on the source: as the client asked, but under the
    /// writeback cache read-write for writing and without O_APPEND (see [`DirOptions`](super::DirOptions)).
    fn source_flags(&self, flags: i32) -> i32 {
        if !self.options.writeback {
            return flags;
        }
        let flags = flags & !libc::O_APPEND;
        if flags & libc::O_ACCMODE == libc::O_WRONLY {
            (flags & !libc::O_ACCMODE) | libc::O_RDWR
        } else {
            flags
        }
    }

    /// RELEASE and RELEASEDIR: the handle goes, with the flock lock the kernel names and
    /// the OFD locks taken through it; a directory's listing costs join the stats, and the
    /// last passthrough open of a node unregisters its backing file (the kernel dropped
    /// the file's I/O mode before sending RELEASE).
    pub(super) fn release<'b>(&self, req: &Request<'_>, arg: &fuse_release_in) -> Answer<'b> {
        let (unique, fh) = (req.unique, arg.fh);
        let flock = arg.release_flags & FUSE_RELEASE_FLOCK_UNLOCK != 0;
        self.locks
            .release(req.nodeid, fh, flock.then_some(arg.lock_owner));
        match self.handles.remove(fh).as_deref() {
            Some(Open::Dir(stream)) => {
                let stream = stream.lock().unwrap_or_else(|e| e.into_inner());
                let mut l = self.listing();
                l.streams.add(&stream.stats());
            }
            Some(Open::File(_, Some(b))) => {
                if b.writes {
                    b.inode.writers.released();
                }
                if let Some(id) = b.inode.backing.release(b.mode) {
                    self.passthrough.unregister(id);
                }
            }
            _ => {}
        }
        Ok(Reply::empty(unique))
    }
}
