//! The export's [`Operations`]: which family module answers each operation, and where and
//! as whom it runs ([`Operations::run`]).
//!
//! Each method hands over to the family module's own method (`attrs`, `entries`, `open`,
//! `data`, `dirs`, `xattrs`, `locks`; several keep the operation's name: an inherent
//! method is found before a trait's, so those calls are to the module, not recursive).
//! What is not here answers ENOSYS: POLL, TMPFILE, STATX, SYNCFS (the kernel falls back).
//!
//! Where and as whom, for every kind, from the one classification in `fuse`
//! ([`OpKind`]): the requests that change the tree as their caller
//! ([`OpKind::changes_as_caller`]) run with the caller's credentials ([`crate::creds`]);
//! with metadata calls off the loop ([`MetadataPolicy`](super::MetadataPolicy)) the kinds
//! [`runs_on_loop`] does not keep run on a helper thread.

use std::ffi::CStr;

use fuse::abi::*;
use fuse::{OpKind, Reply, Request, WriteData};
use runtime::Ctx;
use transport::{Answer, Operations};

use super::{status, DirFs, Scratch};

/// Whether a request of `kind` stays on the loop when metadata calls run off it: its
/// calls go through the ring (data, sync, LOOKUP's path walk) or never wait (locks,
/// FLUSH, the session's, the forgets). Every other kind waits on the source's metadata
/// and runs on a helper thread.
pub(super) const fn runs_on_loop(kind: OpKind) -> bool {
    use OpKind::*;
    match kind {
        Lookup | Read | Write | Fsync | Fsyncdir | Fallocate | Getlk | Setlk | Setlkw | Flush
        | Destroy | Init | Forget | BatchForget | Interrupt => true,
        Getattr | Setattr | Readlink | Symlink | Mknod | Mkdir | Unlink | Rmdir | Rename | Link
        | Open | Statfs | Release | Setxattr | Getxattr | Listxattr | Removexattr | Opendir
        | Readdir | Releasedir | Access | Create | Poll | Readdirplus | Rename2 | Lseek
        | CopyFileRange | Syncfs | Tmpfile | Statx | CopyFileRange64 | Unknown => false,
    }
}

impl Operations for DirFs {
    type Scratch = Scratch;

    /// As the caller where the kind says so; on a helper thread where metadata calls run
    /// off the loop and the kind does not stay on it (the module's doc).
    fn run<'b>(
        &self,
        cx: &Ctx<'_>,
        req: &Request<'_>,
        kind: OpKind,
        answer: impl FnOnce(&Ctx<'_>) -> Answer<'b> + Send,
    ) -> Answer<'b> {
        let here = |cx: &Ctx<'_>| {
            let _acting = kind
                .changes_as_caller()
                .then(|| self.tree.acting_for(req.uid, req.gid, req.pid));
            answer(cx)
        };
        match &self.offload {
            Some(offload) if !runs_on_loop(kind) => offload.run(cx, || here(&Ctx::Blocking)),
            _ => here(cx),
        }
    }

    /// The path walk goes through the ring where metadata calls run off the loop.
    fn lookup<'b>(
        &self,
        cx: &Ctx<'_>,
        req: &Request<'_>,
        name: &CStr,
        s: &'b mut Scratch,
    ) -> Answer<'b> {
        let walk = if self.offload.is_some() {
            cx
        } else {
            &Ctx::Blocking
        };
        let found = self.tree.lookup(walk, req.nodeid, name);
        self.entry(req.unique, s, found)
    }

    fn forget(&self, nodeid: u64, nlookup: u64) {
        self.tree.inodes.forget(nodeid, nlookup);
    }

    /// Ends a lock's wait.
    fn interrupt(&self, arg: &fuse_interrupt_in) {
        self.locks.interrupt(arg.unique);
    }

    fn getattr<'b>(
        &self,
        _cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_getattr_in,
        s: &'b mut Scratch,
    ) -> Answer<'b> {
        self.getattr(req, arg, s)
    }

    fn setattr<'b>(
        &self,
        _cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_setattr_in,
        s: &'b mut Scratch,
    ) -> Answer<'b> {
        self.setattr(req, arg, s)
    }

    fn access<'b>(&self, _cx: &Ctx<'_>, req: &Request<'_>, arg: &fuse_access_in) -> Answer<'b> {
        status(req.unique, self.tree.access(req.nodeid, arg.mask as i32))
    }

    fn statfs<'b>(&self, _cx: &Ctx<'_>, req: &Request<'_>, s: &'b mut Scratch) -> Answer<'b> {
        self.statfs(req, s)
    }

    fn readlink<'b>(&self, _cx: &Ctx<'_>, req: &Request<'_>, data: &'b mut [u8]) -> Answer<'b> {
        self.readlink(req, data)
    }

    fn symlink<'b>(
        &self,
        _cx: &Ctx<'_>,
        req: &Request<'_>,
        name: &CStr,
        target: &CStr,
        s: &'b mut Scratch,
    ) -> Answer<'b> {
        let made = self.tree.symlink(req.nodeid, name, target);
        self.made(req, s, made)
    }

    fn mknod<'b>(
        &self,
        _cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_mknod_in,
        name: &CStr,
        s: &'b mut Scratch,
    ) -> Answer<'b> {
        let rdev = u64::from(arg.rdev);
        let made = self.tree.mknod(req.nodeid, name, arg.mode, rdev, arg.umask);
        self.made(req, s, made)
    }

    fn mkdir<'b>(
        &self,
        _cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_mkdir_in,
        name: &CStr,
        s: &'b mut Scratch,
    ) -> Answer<'b> {
        let made = self.tree.mkdir(req.nodeid, name, arg.mode, arg.umask);
        self.made(req, s, made)
    }

    fn unlink<'b>(&self, _cx: &Ctx<'_>, req: &Request<'_>, name: &CStr) -> Answer<'b> {
        status(req.unique, self.tree.unlink(req.nodeid, name))
    }

    fn rmdir<'b>(&self, _cx: &Ctx<'_>, req: &Request<'_>, name: &CStr) -> Answer<'b> {
        status(req.unique, self.tree.rmdir(req.nodeid, name))
    }

    fn rename<'b>(
        &self,
        _cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_rename_in,
        name: &CStr,
        newname: &CStr,
    ) -> Answer<'b> {
        let renamed = self.tree.rename(req.nodeid, name, arg.newdir, newname, 0);
        status(req.unique, renamed)
    }

    fn rename2<'b>(
        &self,
        _cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_rename2_in,
        name: &CStr,
        newname: &CStr,
    ) -> Answer<'b> {
        status(req.unique, self.rename2(req, arg, name, newname))
    }

    fn link<'b>(
        &self,
        _cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_link_in,
        newname: &CStr,
        s: &'b mut Scratch,
    ) -> Answer<'b> {
        let linked = self.tree.link(arg.oldnodeid, req.nodeid, newname);
        self.entry(req.unique, s, linked)
    }

    fn open<'b>(
        &self,
        _cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_open_in,
        s: &'b mut Scratch,
    ) -> Answer<'b> {
        self.open(req, arg, s)
    }

    fn create<'b>(
        &self,
        _cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_create_in,
        name: &CStr,
        s: &'b mut Scratch,
    ) -> Answer<'b> {
        self.create(req, arg, name, s)
    }

    fn read<'b>(
        &self,
        cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_read_in,
        data: &'b mut [u8],
    ) -> Answer<'b> {
        self.read(cx, req, arg, data)
    }

    fn write<'b>(
        &self,
        cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_write_in,
        data: WriteData<'_>,
        s: &'b mut Scratch,
    ) -> Answer<'b> {
        self.write(cx, req, arg, data, s)
    }

    /// Lets go of the closing owner's locks.
    fn flush_file<'b>(&self, _cx: &Ctx<'_>, req: &Request<'_>, arg: &fuse_flush_in) -> Answer<'b> {
        self.locks.flush(req.nodeid, arg.lock_owner);
        Ok(Reply::empty(req.unique))
    }

    fn release<'b>(&self, _cx: &Ctx<'_>, req: &Request<'_>, arg: &fuse_release_in) -> Answer<'b> {
        self.release(req, arg)
    }

    fn fsync<'b>(&self, cx: &Ctx<'_>, req: &Request<'_>, arg: &fuse_fsync_in) -> Answer<'b> {
        self.fsync(cx, req.unique, arg)
    }

    fn fallocate<'b>(
        &self,
        cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_fallocate_in,
    ) -> Answer<'b> {
        self.fallocate(cx, req, arg)
    }

    fn lseek<'b>(
        &self,
        _cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_lseek_in,
        s: &'b mut Scratch,
    ) -> Answer<'b> {
        self.lseek(req.unique, arg, s)
    }

    fn copy_file_range<'b>(
        &self,
        _cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_copy_file_range_in,
        wide: bool,
        s: &'b mut Scratch,
    ) -> Answer<'b> {
        self.copy(req, arg, wide, s)
    }

    fn opendir<'b>(
        &self,
        _cx: &Ctx<'_>,
        req: &Request<'_>,
        _arg: &fuse_open_in,
        s: &'b mut Scratch,
    ) -> Answer<'b> {
        self.opendir(req, s)
    }

    fn readdir<'b>(
        &self,
        _cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_read_in,
        plus: bool,
        data: &'b mut [u8],
    ) -> Answer<'b> {
        self.timed(|| self.readdir(req, arg, plus, data))
    }

    fn releasedir<'b>(
        &self,
        _cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_release_in,
    ) -> Answer<'b> {
        self.release(req, arg)
    }

    fn fsyncdir<'b>(&self, cx: &Ctx<'_>, req: &Request<'_>, arg: &fuse_fsync_in) -> Answer<'b> {
        self.fsyncdir(cx, req.unique, arg)
    }

    fn setxattr<'b>(
        &self,
        _cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_setxattr_in,
        name: &CStr,
        value: WriteData<'_>,
    ) -> Answer<'b> {
        self.setxattr(req, arg, name, value)
    }

    fn getxattr<'b>(
        &self,
        _cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_getxattr_in,
        name: &CStr,
        s: &'b mut Scratch,
        data: &'b mut [u8],
    ) -> Answer<'b> {
        let node = req.nodeid;
        self.xattr(req.unique, arg.size, s, data, |buf| {
            self.tree.getxattr(node, name, buf)
        })
    }

    fn listxattr<'b>(
        &self,
        _cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_getxattr_in,
        s: &'b mut Scratch,
        data: &'b mut [u8],
    ) -> Answer<'b> {
        self.listxattr(req, arg.size, s, data)
    }

    fn removexattr<'b>(&self, _cx: &Ctx<'_>, req: &Request<'_>, name: &CStr) -> Answer<'b> {
        status(req.unique, self.tree.removexattr(req.nodeid, name))
    }

    fn getlk<'b>(
        &self,
        _cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_lk_in,
        s: &'b mut Scratch,
    ) -> Answer<'b> {
        self.getlk(req, arg, s)
    }

    fn setlk<'b>(
        &self,
        cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_lk_in,
        wait: bool,
    ) -> Answer<'b> {
        self.setlk(cx, req, arg, wait)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_sync_locks_and_lookup_stay_on_the_loop_and_metadata_leaves_it() {
        let on: Vec<_> = OpKind::KNOWN
            .iter()
            .filter(|k| runs_on_loop(**k))
            .map(|k| k.name())
            .collect();
        assert_eq!(
            on,
            [
                "LOOKUP",
                "FORGET",
                "READ",
                "WRITE",
                "FSYNC",
                "FLUSH",
                "INIT",
                "FSYNCDIR",
                "GETLK",
                "SETLK",
                "SETLKW",
                "INTERRUPT",
                "DESTROY",
                "BATCH_FORGET",
                "FALLOCATE"
            ]
        );
        assert!(!runs_on_loop(OpKind::Unknown));
    }
}
