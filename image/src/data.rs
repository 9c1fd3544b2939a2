//! The operations that touch the image's bytes: READ, WRITE, FALLOCATE, LSEEK, SETATTR size.

use std::io::{IoSlice, IoSliceMut};

use backend::{Ctx, ExtentKind};

use crate::Export;
use fuse::abi::*;
use fuse::{Errno, WriteData};

const SEEK_DATA: u32 = 3;
const SEEK_HOLE: u32 = 4;

impl Export {
    /// READ: short at the end of the image, empty past it.
    pub(super) fn read_into<'b>(
        &self,
        cx: &Ctx<'_>,
        arg: &fuse_read_in,
        data: &'b mut [u8],
    ) -> Result<&'b [u8], Errno> {
        let len = self.backend.len();
        if arg.offset >= len {
            return Ok(&[]);
        }
        let want = (arg.size as u64).min(len - arg.offset) as usize;
        let buf = data.get_mut(..want).ok_or(Errno::EINVAL)?;
        let n = self
            .backend
            .readv(cx, &mut [IoSliceMut::new(buf)], arg.offset)
            .map_err(Errno::from)?;
        Ok(&data[..n])
    }

    /// WRITE: straight from the request buffers to the backend (no copy). Past the end it
    /// grows a growable export; otherwise it is short up to the end and ENOSPC after it.
    /// A write with O_SYNC or O_DSYNC is flushed before the reply.
    pub(super) fn write_from<'a>(
        &self,
        cx: &Ctx<'_>,
        arg: &fuse_write_in,
        data: WriteData<'_>,
        out: &'a mut fuse_write_out,
    ) -> Result<&'a fuse_write_out, Errno> {
        if !self.options.writable {
            return Err(Errno::EROFS);
        }
        let len = self.backend.len();
        let mut size = data.len() as u64;
        let end = arg.offset.checked_add(size).ok_or(Errno::EFBIG)?;
        if end > len && !self.options.growable {
            if arg.offset >= len {
                return Err(Errno::ENOSPC);
            }
            size = len - arg.offset;
        }
        let (head, tail) = data.parts();
        let head_len = head.len().min(size as usize);
        let tail_len = size as usize - head_len;
        let iov = [
            IoSlice::new(&head[..head_len]),
            IoSlice::new(&tail[..tail_len]),
        ];
        let parts = if tail_len == 0 { &iov[..1] } else { &iov[..] };
        self.backend
            .writev(cx, parts, arg.offset)
            .map_err(Errno::from)?;
        if arg.flags as i32 & libc::O_DSYNC != 0 {
            // O_SYNC or O_DSYNC (the file's, or RWF_DSYNC/RWF_SYNC on this write): the
            // kernel sends no FSYNC after a write to a FOPEN_DIRECT_IO file, it only
            // passes the flag here; so the write is made durable before the reply, as
            // the client was promised. (O_SYNC includes O_DSYNC's bit.)
            self.backend.flush(cx).map_err(Errno::from)?;
        }
        out.size = size as u32;
        Ok(out)
    }

    /// FALLOCATE: mode 0 grows a growable export at or past the end (ENOSPC for a fixed
    /// size) and is accepted inside the image; PUNCH_HOLE|KEEP_SIZE and ZERO_RANGE zero
    /// through the backend; other modes EOPNOTSUPP.
    pub(super) fn allocate(&self, cx: &Ctx<'_>, arg: &fuse_fallocate_in) -> Result<(), Errno> {
        if !self.options.writable {
            return Err(Errno::EROFS);
        }
        let mode = arg.mode as i32;
        let len = self.backend.len();
        let end = arg.offset.checked_add(arg.length).ok_or(Errno::EFBIG)?;
        let keep_size = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        if !keep_size && end > len && !self.options.growable {
            return Err(Errno::ENOSPC);
        }
        let clamped = if keep_size { end.min(len) } else { end };
        let zero = |offset: u64, end: u64, unmap: bool| {
            if end <= offset {
                return Ok(());
            }
            self.backend
                .write_zeroes(cx, offset, end - offset, unmap)
                .map_err(Errno::from)
        };
        match mode & !libc::FALLOC_FL_KEEP_SIZE {
            // Preallocation: inside the image there is nothing to do; past its end, grow
            // it with allocated zeroes (unless KEEP_SIZE asks us not to).
            0 if keep_size => Ok(()),
            0 => zero(len, end, false),
            libc::FALLOC_FL_PUNCH_HOLE if keep_size => zero(arg.offset, clamped, true),
            libc::FALLOC_FL_PUNCH_HOLE => Err(Errno::EINVAL),
            libc::FALLOC_FL_ZERO_RANGE => zero(arg.offset, clamped, false),
            _ => Err(Errno::EOPNOTSUPP),
        }
    }

    /// LSEEK with SEEK_DATA / SEEK_HOLE, from the backend's allocation map. The end of the
    /// image counts as a hole; at or past it, ENXIO.
    pub(super) fn seek_data<'a>(
        &self,
        cx: &Ctx<'_>,
        arg: &fuse_lseek_in,
        out: &'a mut fuse_lseek_out,
    ) -> Result<&'a fuse_lseek_out, Errno> {
        let len = self.backend.len();
        if arg.whence != SEEK_DATA && arg.whence != SEEK_HOLE {
            return Err(Errno::EINVAL);
        }
        let mut offset = arg.offset;
        loop {
            if offset >= len {
                return Err(Errno::ENXIO);
            }
            let extent = self.backend.block_status(cx, offset).map_err(Errno::from)?;
            let found = match (extent.kind, arg.whence) {
                (ExtentKind::Data, SEEK_DATA) | (ExtentKind::Hole, SEEK_HOLE) => Some(offset),
                (ExtentKind::Data, _) if extent.end >= len => Some(len),
                _ => None,
            };
            if let Some(found) = found {
                out.offset = found;
                return Ok(out);
            }
            if extent.end <= offset {
                return Err(Errno::EIO);
            }
            offset = extent.end;
        }
    }

    /// SETATTR: checks everything first, then resizes, then updates the attributes.
    pub(super) fn set_attr<'a>(
        &self,
        cx: &Ctx<'_>,
        arg: &fuse_setattr_in,
        out: &'a mut fuse_attr_out,
    ) -> Result<&'a fuse_attr_out, Errno> {
        self.attrs.check(arg)?;
        self.attrs.check_size(arg, self.backend.len())?;
        if arg.valid & FATTR_SIZE != 0 {
            self.backend.resize(cx, arg.size).map_err(Errno::from)?;
        }
        self.attrs.apply(arg);
        self.attr_into(out)
    }
}
