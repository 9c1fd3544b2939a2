//! The typed dispatch: [`Operations`], one method per FUSE operation, each answering ENOSYS
//! unless a file system serves it, and [`handle`], the one adapter from a decoded
//! [`Request`] to those methods, which [`FileSystem::handle`](crate::FileSystem::handle)
//! runs by default.
//!
//! Why: every file system used to write its own ~44-arm `match` over
//! [`Operation`](fuse::Operation) and the same wrapper around it (no reply for the
//! forgets, an error reply from an `Err`).
//! Here the match is written once and is exhaustive: an operation added to the decoder
//! fails to compile here until it has a method, and a file system that does not serve it
//! answers ENOSYS by default, as fuser's `Filesystem` does.
//!
//! # Contract (the same as [`FileSystem::handle`](crate::FileSystem::handle)'s)
//! - A method's reply borrows only what it is given: `s` (the file system's
//!   [`Operations::Scratch`], on the serving coroutine's or thread's stack) for argument
//!   structs, `data` (the transport's page-aligned buffer, at least `max_read` bytes) for
//!   replies of a length only the file system knows; only the operations whose reply needs
//!   it ([`OpKind::needs_data_buffer`]) get `data`. Nothing is allocated per request.
//! - I/O that may wait goes through `cx` (see [`crate::service`]).
//! - [`Operations::run`] is where a file system decides *where* and *as whom* a request
//!   runs (a helper thread, the caller's credentials): it gets the request's [`OpKind`]
//!   and a closure that calls the method.
//! - INIT is answered at the handshake, never here (a second one gets EPROTO); DESTROY
//!   gets an empty reply after [`Operations::destroy`]; unknown opcodes get ENOSYS.

use std::ffi::CStr;

use fuse::abi::*;
use fuse::{Errno, OpKind, Reply, Request, WriteData};
use runtime::Ctx;

mod adapter;

pub use adapter::handle;

/// A reply, or the errno of an error reply.
pub type Answer<'b> = Result<Reply<'b>, Errno>;

/// What a file system does for each FUSE operation. Every method but [`Operations::run`]
/// answers ENOSYS (or, for those without a reply, does nothing) unless overridden.
///
/// `req` is the whole request (`unique`, `nodeid`, the caller's ids); the other arguments
/// are the operation's own, as decoded ([`Operation`](fuse::Operation) documents each).
#[allow(unused_variables)]
pub trait Operations: Send + Sync + 'static {
    /// Storage for one reply's argument structs, on the serving coroutine's or thread's
    /// stack (`Send`: [`Operations::run`] may hand the request to a helper thread).
    type Scratch: Default + Send;

    /// Runs `answer`, which calls the method of `req`'s operation (of kind `kind`): by
    /// default here, with `cx`. A file system overrides it to run some kinds elsewhere (on
    /// a helper thread, with [`Ctx::Blocking`]) or as the caller. Not called for the
    /// operations without a reply.
    fn run<'b>(
        &self,
        cx: &Ctx<'_>,
        req: &Request<'_>,
        kind: OpKind,
        answer: impl FnOnce(&Ctx<'_>) -> Answer<'b> + Send,
    ) -> Answer<'b> {
        answer(cx)
    }

    /// LOOKUP of `name` in directory `req.nodeid`.
    fn lookup<'b>(
        &self,
        cx: &Ctx<'_>,
        req: &Request<'_>,
        name: &CStr,
        s: &'b mut Self::Scratch,
    ) -> Answer<'b> {
        Err(Errno::ENOSYS)
    }

    /// FORGET: the kernel drops `nlookup` lookups of `nodeid` (no reply).
    fn forget(&self, nodeid: u64, nlookup: u64) {}

    /// BATCH_FORGET (no reply): by default one [`Operations::forget`] per node.
    fn batch_forget(&self, nodes: &[fuse_forget_one]) {
        for node in nodes {
            self.forget(node.nodeid, node.nlookup);
        }
    }

    /// INTERRUPT of request `arg.unique` (no reply).
    fn interrupt(&self, arg: &fuse_interrupt_in) {}

    /// DESTROY (fuseblk mounts only); answered with an empty reply afterwards.
    fn destroy(&self, cx: &Ctx<'_>) {}

    /// GETATTR.
    fn getattr<'b>(
        &self,
        cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_getattr_in,
        s: &'b mut Self::Scratch,
    ) -> Answer<'b> {
        Err(Errno::ENOSYS)
    }

    /// SETATTR.
    fn setattr<'b>(
        &self,
        cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_setattr_in,
        s: &'b mut Self::Scratch,
    ) -> Answer<'b> {
        Err(Errno::ENOSYS)
    }

    /// STATX (ENOSYS makes the kernel fall back to GETATTR).
    fn statx<'b>(
        &self,
        cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_statx_in,
        s: &'b mut Self::Scratch,
    ) -> Answer<'b> {
        Err(Errno::ENOSYS)
    }

    /// ACCESS.
    fn access<'b>(&self, cx: &Ctx<'_>, req: &Request<'_>, arg: &fuse_access_in) -> Answer<'b> {
        Err(Errno::ENOSYS)
    }

    /// STATFS.
    fn statfs<'b>(&self, cx: &Ctx<'_>, req: &Request<'_>, s: &'b mut Self::Scratch) -> Answer<'b> {
        Err(Errno::ENOSYS)
    }

    /// READLINK: the target into `data`.
    fn readlink<'b>(&self, cx: &Ctx<'_>, req: &Request<'_>, data: &'b mut [u8]) -> Answer<'b> {
        Err(Errno::ENOSYS)
    }

    /// SYMLINK `name` -> `target`.
    fn symlink<'b>(
        &self,
        cx: &Ctx<'_>,
        req: &Request<'_>,
        name: &CStr,
        target: &CStr,
        s: &'b mut Self::Scratch,
    ) -> Answer<'b> {
        Err(Errno::ENOSYS)
    }

    /// MKNOD.
    fn mknod<'b>(
        &self,
        cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_mknod_in,
        name: &CStr,
        s: &'b mut Self::Scratch,
    ) -> Answer<'b> {
        Err(Errno::ENOSYS)
    }

    /// MKDIR.
    fn mkdir<'b>(
        &self,
        cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_mkdir_in,
        name: &CStr,
        s: &'b mut Self::Scratch,
    ) -> Answer<'b> {
        Err(Errno::ENOSYS)
    }

    /// UNLINK.
    fn unlink<'b>(&self, cx: &Ctx<'_>, req: &Request<'_>, name: &CStr) -> Answer<'b> {
        Err(Errno::ENOSYS)
    }

    /// RMDIR.
    fn rmdir<'b>(&self, cx: &Ctx<'_>, req: &Request<'_>, name: &CStr) -> Answer<'b> {
        Err(Errno::ENOSYS)
    }

    /// RENAME.
    fn rename<'b>(
        &self,
        cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_rename_in,
        name: &CStr,
        newname: &CStr,
    ) -> Answer<'b> {
        Err(Errno::ENOSYS)
    }

    /// RENAME2.
    fn rename2<'b>(
        &self,
        cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_rename2_in,
        name: &CStr,
        newname: &CStr,
    ) -> Answer<'b> {
        Err(Errno::ENOSYS)
    }

    /// LINK.
    fn link<'b>(
        &self,
        cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_link_in,
        newname: &CStr,
        s: &'b mut Self::Scratch,
    ) -> Answer<'b> {
        Err(Errno::ENOSYS)
    }

    /// OPEN.
    fn open<'b>(
        &self,
        cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_open_in,
        s: &'b mut Self::Scratch,
    ) -> Answer<'b> {
        Err(Errno::ENOSYS)
    }

    /// CREATE.
    fn create<'b>(
        &self,
        cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_create_in,
        name: &CStr,
        s: &'b mut Self::Scratch,
    ) -> Answer<'b> {
        Err(Errno::ENOSYS)
    }

    /// TMPFILE.
    fn tmpfile<'b>(
        &self,
        cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_create_in,
        name: &CStr,
        s: &'b mut Self::Scratch,
    ) -> Answer<'b> {
        Err(Errno::ENOSYS)
    }

    /// READ into `data`.
    fn read<'b>(
        &self,
        cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_read_in,
        data: &'b mut [u8],
    ) -> Answer<'b> {
        Err(Errno::ENOSYS)
    }

    /// WRITE of `data`.
    fn write<'b>(
        &self,
        cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_write_in,
        data: WriteData<'_>,
        s: &'b mut Self::Scratch,
    ) -> Answer<'b> {
        Err(Errno::ENOSYS)
    }

    /// FLUSH, sent at every close(2) of an open file (named apart from
    /// [`FileSystem::flush`](crate::FileSystem::flush), which makes the file system durable).
    fn flush_file<'b>(&self, cx: &Ctx<'_>, req: &Request<'_>, arg: &fuse_flush_in) -> Answer<'b> {
        Err(Errno::ENOSYS)
    }

    /// RELEASE (the last close of an open file).
    fn release<'b>(&self, cx: &Ctx<'_>, req: &Request<'_>, arg: &fuse_release_in) -> Answer<'b> {
        Err(Errno::ENOSYS)
    }

    /// FSYNC.
    fn fsync<'b>(&self, cx: &Ctx<'_>, req: &Request<'_>, arg: &fuse_fsync_in) -> Answer<'b> {
        Err(Errno::ENOSYS)
    }

    /// FALLOCATE.
    fn fallocate<'b>(
        &self,
        cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_fallocate_in,
    ) -> Answer<'b> {
        Err(Errno::ENOSYS)
    }

    /// LSEEK (SEEK_DATA, SEEK_HOLE).
    fn lseek<'b>(
        &self,
        cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_lseek_in,
        s: &'b mut Self::Scratch,
    ) -> Answer<'b> {
        Err(Errno::ENOSYS)
    }

    /// COPY_FILE_RANGE (`wide` false: a `fuse_write_out` reply) and COPY_FILE_RANGE_64
    /// (`wide` true: a `fuse_copy_file_range_out` reply).
    fn copy_file_range<'b>(
        &self,
        cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_copy_file_range_in,
        wide: bool,
        s: &'b mut Self::Scratch,
    ) -> Answer<'b> {
        Err(Errno::ENOSYS)
    }

    /// OPENDIR.
    fn opendir<'b>(
        &self,
        cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_open_in,
        s: &'b mut Self::Scratch,
    ) -> Answer<'b> {
        Err(Errno::ENOSYS)
    }

    /// READDIR (`plus` false) and READDIRPLUS (`plus` true): the listing into `data`.
    fn readdir<'b>(
        &self,
        cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_read_in,
        plus: bool,
        data: &'b mut [u8],
    ) -> Answer<'b> {
        Err(Errno::ENOSYS)
    }

    /// RELEASEDIR.
    fn releasedir<'b>(&self, cx: &Ctx<'_>, req: &Request<'_>, arg: &fuse_release_in) -> Answer<'b> {
        Err(Errno::ENOSYS)
    }

    /// FSYNCDIR.
    fn fsyncdir<'b>(&self, cx: &Ctx<'_>, req: &Request<'_>, arg: &fuse_fsync_in) -> Answer<'b> {
        Err(Errno::ENOSYS)
    }

    /// SETXATTR.
    fn setxattr<'b>(
        &self,
        cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_setxattr_in,
        name: &CStr,
        value: WriteData<'_>,
    ) -> Answer<'b> {
        Err(Errno::ENOSYS)
    }

    /// GETXATTR: the size into `s`, or the value into `data`.
    fn getxattr<'b>(
        &self,
        cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_getxattr_in,
        name: &CStr,
        s: &'b mut Self::Scratch,
        data: &'b mut [u8],
    ) -> Answer<'b> {
        Err(Errno::ENOSYS)
    }

    /// LISTXATTR: the size into `s`, or the names into `data`.
    fn listxattr<'b>(
        &self,
        cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_getxattr_in,
        s: &'b mut Self::Scratch,
        data: &'b mut [u8],
    ) -> Answer<'b> {
        Err(Errno::ENOSYS)
    }

    /// REMOVEXATTR.
    fn removexattr<'b>(&self, cx: &Ctx<'_>, req: &Request<'_>, name: &CStr) -> Answer<'b> {
        Err(Errno::ENOSYS)
    }

    /// GETLK.
    fn getlk<'b>(
        &self,
        cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_lk_in,
        s: &'b mut Self::Scratch,
    ) -> Answer<'b> {
        Err(Errno::ENOSYS)
    }

    /// SETLK (`wait` false) and SETLKW (`wait` true).
    fn setlk<'b>(
        &self,
        cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_lk_in,
        wait: bool,
    ) -> Answer<'b> {
        Err(Errno::ENOSYS)
    }

    /// POLL.
    fn poll<'b>(
        &self,
        cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_poll_in,
        s: &'b mut Self::Scratch,
    ) -> Answer<'b> {
        Err(Errno::ENOSYS)
    }

    /// SYNCFS.
    fn syncfs<'b>(&self, cx: &Ctx<'_>, req: &Request<'_>, arg: &fuse_syncfs_in) -> Answer<'b> {
        Err(Errno::ENOSYS)
    }
}

#[cfg(test)]
mod tests;
