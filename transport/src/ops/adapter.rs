//! [`handle`]: the one match from a decoded [`Operation`] to its method of
//! [`Operations`], and the wrapper every file system used to write around it (no reply
//! for the forgets and INTERRUPT, an error reply from an `Err`).

use fuse::{Errno, Operation, Reply, Request};
use runtime::Ctx;

use super::{Answer, Operations};

/// Serves `req` with `fs`'s methods: the operations without a reply call theirs and return
/// `None`; every other runs through [`Operations::run`], its `Err` made an error reply.
pub fn handle<'b, T: Operations + ?Sized>(
    fs: &T,
    cx: &Ctx<'_>,
    req: &Request<'_>,
    scratch: &'b mut T::Scratch,
    data: &'b mut [u8],
) -> Option<Reply<'b>> {
    let kind = req.op.kind();
    if !kind.replies() {
        without_reply(fs, req);
        return None;
    }
    let answer = fs.run(cx, req, kind, move |cx| answer(fs, cx, req, scratch, data));
    Some(answer.unwrap_or_else(|errno| Reply::error(req.unique, errno)))
}

/// FORGET, BATCH_FORGET and INTERRUPT.
fn without_reply<T: Operations + ?Sized>(fs: &T, req: &Request<'_>) {
    match req.op {
        Operation::Forget { arg } => fs.forget(req.nodeid, arg.nlookup),
        Operation::BatchForget { nodes, .. } => fs.batch_forget(nodes),
        Operation::Interrupt { arg } => fs.interrupt(arg),
        _ => {}
    }
}

/// The one match from an operation to its method.
fn answer<'b, T: Operations + ?Sized>(
    fs: &T,
    cx: &Ctx<'_>,
    req: &Request<'_>,
    s: &'b mut T::Scratch,
    data: &'b mut [u8],
) -> Answer<'b> {
    match req.op {
        Operation::Lookup { name } => fs.lookup(cx, req, name, s),
        Operation::Getattr { arg } => fs.getattr(cx, req, arg, s),
        Operation::Setattr { arg } => fs.setattr(cx, req, arg, s),
        Operation::Statx { arg } => fs.statx(cx, req, arg, s),
        Operation::Access { arg } => fs.access(cx, req, arg),
        Operation::Statfs => fs.statfs(cx, req, s),
        Operation::Readlink => fs.readlink(cx, req, data),
        Operation::Symlink { name, target } => fs.symlink(cx, req, name, target, s),
        Operation::Mknod { arg, name } => fs.mknod(cx, req, arg, name, s),
        Operation::Mkdir { arg, name } => fs.mkdir(cx, req, arg, name, s),
        Operation::Unlink { name } => fs.unlink(cx, req, name),
        Operation::Rmdir { name } => fs.rmdir(cx, req, name),
        Operation::Rename { arg, name, newname } => fs.rename(cx, req, arg, name, newname),
        Operation::Rename2 { arg, name, newname } => fs.rename2(cx, req, arg, name, newname),
        Operation::Link { arg, newname } => fs.link(cx, req, arg, newname, s),
        Operation::Open { arg } => fs.open(cx, req, arg, s),
        Operation::Create { arg, name } => fs.create(cx, req, arg, name, s),
        Operation::Tmpfile { arg, name } => fs.tmpfile(cx, req, arg, name, s),
        Operation::Read { arg } => fs.read(cx, req, arg, data),
        Operation::Write { arg, data } => fs.write(cx, req, arg, data, s),
        Operation::Flush { arg } => fs.flush_file(cx, req, arg),
        Operation::Release { arg } => fs.release(cx, req, arg),
        Operation::Fsync { arg } => fs.fsync(cx, req, arg),
        Operation::Fallocate { arg } => fs.fallocate(cx, req, arg),
        Operation::Lseek { arg } => fs.lseek(cx, req, arg, s),
        Operation::CopyFileRange { arg } => fs.copy_file_range(cx, req, arg, false, s),
        Operation::CopyFileRange64 { arg } => fs.copy_file_range(cx, req, arg, true, s),
        Operation::Opendir { arg } => fs.opendir(cx, req, arg, s),
        Operation::Readdir { arg } => fs.readdir(cx, req, arg, false, data),
        Operation::Readdirplus { arg } => fs.readdir(cx, req, arg, true, data),
        Operation::Releasedir { arg } => fs.releasedir(cx, req, arg),
        Operation::Fsyncdir { arg } => fs.fsyncdir(cx, req, arg),
        Operation::Setxattr { arg, name, value } => fs.setxattr(cx, req, &arg, name, value),
        Operation::Getxattr { arg, name } => fs.getxattr(cx, req, arg, name, s, data),
        Operation::Listxattr { arg } => fs.listxattr(cx, req, arg, s, data),
        Operation::Removexattr { name } => fs.removexattr(cx, req, name),
        Operation::Getlk { arg } => fs.getlk(cx, req, arg, s),
        Operation::Setlk { arg } => fs.setlk(cx, req, arg, false),
        Operation::Setlkw { arg } => fs.setlk(cx, req, arg, true),
        Operation::Poll { arg } => fs.poll(cx, req, arg, s),
        Operation::Syncfs { arg } => fs.syncfs(cx, req, arg),
        Operation::Destroy => {
            fs.destroy(cx);
            Ok(Reply::empty(req.unique))
        }
        // Answered at the handshake: a second INIT is the kernel's mistake.
        Operation::Init { .. } => Err(Errno::EPROTO),
        Operation::Unknown { .. } => Err(Errno::ENOSYS),
        // Served by `without_reply`, never through here.
        Operation::Forget { .. } | Operation::BatchForget { .. } | Operation::Interrupt { .. } => {
            Err(Errno::ENOSYS)
        }
    }
}
