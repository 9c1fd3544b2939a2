//! The export's answer to each FUSE operation ([`Operations`]): attributes, open and
//! release (with FUSE passthrough's choices), the data path and STATFS; the rest answer
//! ENOSYS. The rules themselves are in the crate's doc and in `data` and `attr`.

use std::ffi::CStr;

use backend::Ctx;
use fuse::abi::*;
use fuse::{Errno, Reply, Request, WriteData};
use transport::{Answer, Operations};

use crate::{Export, ReplyArgs};

/// The operations a single-file export serves; the rest answer ENOSYS. LOOKUP answers
/// ENOENT (the root is a file: no names, so no FORGET ever comes).
impl Operations for Export {
    type Scratch = ReplyArgs;

    fn lookup<'b>(
        &self,
        _: &Ctx<'_>,
        _: &Request<'_>,
        _: &CStr,
        _: &'b mut ReplyArgs,
    ) -> Answer<'b> {
        Err(Errno::ENOENT)
    }

    fn getattr<'b>(
        &self,
        _cx: &Ctx<'_>,
        req: &Request<'_>,
        _arg: &fuse_getattr_in,
        s: &'b mut ReplyArgs,
    ) -> Answer<'b> {
        self.attr_into(&mut s.attr)
            .map(|a| Reply::arg(req.unique, a))
    }

    fn setattr<'b>(
        &self,
        cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_setattr_in,
        s: &'b mut ReplyArgs,
    ) -> Answer<'b> {
        self.set_attr(cx, arg, &mut s.attr)
            .map(|a| Reply::arg(req.unique, a))
    }

    fn statfs<'b>(&self, _cx: &Ctx<'_>, req: &Request<'_>, s: &'b mut ReplyArgs) -> Answer<'b> {
        Ok(Reply::arg(req.unique, self.statfs_into(&mut s.statfs)))
    }

    fn open<'b>(
        &self,
        _cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_open_in,
        s: &'b mut ReplyArgs,
    ) -> Answer<'b> {
        self.open_into(arg, &mut s.open)
            .map(|o| Reply::arg(req.unique, o))
    }

    fn release<'b>(&self, _cx: &Ctx<'_>, req: &Request<'_>, arg: &fuse_release_in) -> Answer<'b> {
        self.release_passthrough(arg);
        Ok(Reply::empty(req.unique))
    }

    fn flush_file<'b>(&self, cx: &Ctx<'_>, req: &Request<'_>, arg: &fuse_flush_in) -> Answer<'b> {
        self.flush_writes(cx, arg.fh)?;
        Ok(Reply::empty(req.unique))
    }

    fn fsync<'b>(&self, cx: &Ctx<'_>, req: &Request<'_>, _arg: &fuse_fsync_in) -> Answer<'b> {
        self.backend.flush(cx).map_err(Errno::from)?;
        Ok(Reply::empty(req.unique))
    }

    fn read<'b>(
        &self,
        cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_read_in,
        data: &'b mut [u8],
    ) -> Answer<'b> {
        self.read_into(cx, arg, data)
            .map(|d| Reply::data(req.unique, d))
    }

    fn write<'b>(
        &self,
        cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_write_in,
        data: WriteData<'_>,
        s: &'b mut ReplyArgs,
    ) -> Answer<'b> {
        self.write_from(cx, arg, data, &mut s.write)
            .map(|w| Reply::arg(req.unique, w))
    }

    fn fallocate<'b>(
        &self,
        cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_fallocate_in,
    ) -> Answer<'b> {
        self.allocate(cx, arg)?;
        Ok(Reply::empty(req.unique))
    }

    fn lseek<'b>(
        &self,
        cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_lseek_in,
        s: &'b mut ReplyArgs,
    ) -> Answer<'b> {
        self.seek_data(cx, arg, &mut s.lseek)
            .map(|l| Reply::arg(req.unique, l))
    }
}
