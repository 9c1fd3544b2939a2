//! The data of open files: READ, WRITE, FSYNC (and fdatasync), FALLOCATE, LSEEK and
//! COPY_FILE_RANGE (and its 64-bit form), on the open file's descriptor on the source,
//! through the request's [`Ctx`] (io_uring from a coroutine, blocking calls elsewhere)
//! with no copy of ours. (An open that passes through sends its reads and writes straight
//! to the source file instead: [`super::open`].)
//!
//! Rules of the source kept here:
//! - A short read is retried up to the end of the file: a READ reply shorter than asked
//!   means EOF to the kernel.
//! - Privilege bits: cleared before a WRITE where the kernel asks
//!   (FUSE_WRITE_KILL_SUIDGID), and before FALLOCATE and COPY_FILE_RANGE unless the
//!   caller holds CAP_FSETID ([`DirFs::kill_unless_fsetid`]).
//! - Times: the data moves through the source's own calls, so the source file system
//!   keeps the file's atime and mtime by its own rules (its mount options).
//! - A page-cache writeback the open's O_DIRECT descriptor cannot take goes through a
//!   buffered descriptor of its own ([`DirFs::writeback_fd`]).
//! - COPY_FILE_RANGE is passed through: `copy_file_range(2)` between the two source
//!   files, so the data never crosses /dev/fuse (a reflink where the source file system
//!   has them). It is a blocking call on every transport (io_uring has no such
//!   operation), so one request copies at most [`COPY_CHUNK`] bytes and answers the
//!   count: a short copy, which callers of copy_file_range(2) loop on, as they must.

use std::io::{self, IoSliceMut};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use fuse::abi::*;
use fuse::{Errno, Reply, Request};
use runtime::Ctx;
use zerocopy::FromZeros;

use super::{errno, status, Answer, DirFs, Scratch};
use crate::sys;

/// The most one COPY_FILE_RANGE copies (a blocking call: this bounds how long it holds
/// the loop, to about what a 1 MiB WRITE takes).
pub const COPY_CHUNK: usize = 1 << 20;

impl DirFs {
    pub(super) fn read<'b>(
        &self,
        cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_read_in,
        data: &'b mut [u8],
    ) -> Answer<'b> {
        let open = self.file(arg.fh)?;
        let fd = open.fd();
        let len = (arg.size as usize).min(data.len());
        let mut done = 0;
        // Short reads are retried until the end of the file (a READ reply shorter than
        // asked means EOF to the kernel).
        while done < len {
            let mut bufs = [IoSliceMut::new(&mut data[done..len])];
            let n = cx
                .readv_at(fd, &mut bufs, arg.offset + done as u64)
                .map_err(errno)?;
            if n == 0 {
                break;
            }
            done += n;
        }
        Ok(Reply::data(req.unique, &data[..done]))
    }

    pub(super) fn write<'b>(
        &self,
        cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_write_in,
        payload: fuse::WriteData<'_>,
        s: &'b mut Scratch,
    ) -> Answer<'b> {
        let open = self.file(arg.fh)?;
        let fd = open.fd();
        if arg.write_flags & FUSE_WRITE_KILL_SUIDGID != 0 {
            self.kill_suidgid_of(req, req.nodeid, fd.as_fd())
                .map_err(errno)?;
        }
        let buffered = self
            .writeback_fd(arg, payload.len(), fd.as_fd())
            .map_err(errno)?;
        let n = cx
            .writev_at(
                buffered.as_ref().unwrap_or(fd),
                &payload.io_slices(),
                arg.offset,
            )
            .map_err(errno)?;
        Ok(written(req.unique, s, n))
    }

    /// A descriptor of its own for a write the kernel sends from the page cache
    /// (FUSE_WRITE_CACHE: shared mappings written back, through any open of the file)
    /// that an O_DIRECT open cannot take: a range not in whole pages, as the last page of
    /// a file that ends inside it is written back up to the end of the file (EINVAL from
    /// the source otherwise, and msync fails: xfstests' fsx `-Z` with mapped writes). It
    /// goes through a buffered descriptor of the same file, opened for it; page-aligned
    /// writebacks and every other write keep the open's own (`None`).
    fn writeback_fd(
        &self,
        arg: &fuse_write_in,
        len: usize,
        fd: BorrowedFd<'_>,
    ) -> io::Result<Option<OwnedFd>> {
        const PAGE: u64 = 4096;
        let whole_pages = arg.offset % PAGE == 0 && len as u64 % PAGE == 0;
        if arg.write_flags & FUSE_WRITE_CACHE == 0 || whole_pages {
            return Ok(None);
        }
        if sys::status_flags(fd)? & libc::O_DIRECT == 0 {
            return Ok(None);
        }
        sys::reopen(fd, libc::O_WRONLY).map(Some)
    }

    /// FSYNC, or fdatasync where the kernel says so.
    pub(super) fn fsync<'b>(&self, cx: &Ctx<'_>, unique: u64, arg: &fuse_fsync_in) -> Answer<'b> {
        let open = self.file(arg.fh)?;
        let fd = open.fd();
        let synced = if arg.fsync_flags & FUSE_FSYNC_FDATASYNC != 0 {
            cx.fdatasync(fd)
        } else {
            cx.fsync(fd)
        };
        status(unique, synced)
    }

    /// FALLOCATE, after the privilege bits are cleared ([`DirFs::kill_unless_fsetid`]).
    pub(super) fn fallocate<'b>(
        &self,
        cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_fallocate_in,
    ) -> Answer<'b> {
        let open = self.file(arg.fh)?;
        let fd = open.fd();
        let done = self
            .kill_unless_fsetid(req, req.nodeid, fd.as_fd())
            .and_then(|()| cx.fallocate(fd, arg.mode as i32, arg.offset, arg.length));
        status(req.unique, done)
    }

    /// LSEEK (SEEK_DATA and SEEK_HOLE among others) on the source file.
    pub(super) fn lseek<'b>(
        &self,
        unique: u64,
        arg: &fuse_lseek_in,
        s: &'b mut Scratch,
    ) -> Answer<'b> {
        let open = self.file(arg.fh)?;
        s.lseek.offset =
            sys::lseek(open.fd().as_fd(), arg.offset, arg.whence as i32).map_err(errno)?;
        Ok(Reply::arg(unique, &s.lseek))
    }

    /// COPY_FILE_RANGE ([`DirFs::copy_file_range`]), answered with its 32-bit count or,
    /// for COPY_FILE_RANGE_64 (`wide`), its 64-bit one.
    pub(super) fn copy<'b>(
        &self,
        req: &Request<'_>,
        arg: &fuse_copy_file_range_in,
        wide: bool,
        s: &'b mut Scratch,
    ) -> Answer<'b> {
        let n = self.copy_file_range(req, arg)?;
        if wide {
            s.copy.bytes_copied = n as u64;
            return Ok(Reply::arg(req.unique, &s.copy));
        }
        Ok(written(req.unique, s, n)) // at most COPY_CHUNK
    }

    /// COPY_FILE_RANGE between two open files: at most [`COPY_CHUNK`] bytes, after the
    /// output's privilege bits are cleared ([`DirFs::kill_unless_fsetid`]).
    fn copy_file_range(
        &self,
        req: &Request<'_>,
        arg: &fuse_copy_file_range_in,
    ) -> Result<usize, Errno> {
        if self.options.read_only {
            return Err(Errno::EROFS);
        }
        if arg.flags != 0 {
            return Err(Errno::EINVAL);
        }
        let (from, to) = (self.file(arg.fh_in)?, self.file(arg.fh_out)?);
        let len = usize::try_from(arg.len)
            .unwrap_or(usize::MAX)
            .min(COPY_CHUNK);
        let (off_in, off_out) = (arg.off_in, arg.off_out);
        self.kill_unless_fsetid(req, arg.nodeid_out, to.fd().as_fd())
            .map_err(errno)?;
        sys::copy_file_range(from.fd().as_fd(), off_in, to.fd().as_fd(), off_out, len)
            .map_err(errno)
    }
}

/// The reply of a WRITE, and of a COPY_FILE_RANGE with a 32-bit count: `n` bytes written.
fn written(unique: u64, s: &mut Scratch, n: usize) -> Reply<'_> {
    s.write = FromZeros::new_zeroed();
    s.write.size = n as u32;
    Reply::arg(unique, &s.write)
}
