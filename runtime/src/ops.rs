//! The ring side of [`Ctx`](crate::Ctx): one crate-internal method of [`Co`] per io_uring
//! operation, each building one SQE, submitting it and suspending until its CQE. Outside the
//! runtime they are reached through `Ctx::Coroutine` ([`Co::ctx`]), which adds the checks and
//! retries of its contract and the blocking twin of each.
//!
//! Buffers are borrowed for the duration of the call and handed to the kernel as they are:
//! no copies. That is sound because the call does not return, and the coroutine's stack is
//! not freed, before the CQE arrives (see the executor's shutdown contract).
//!
//! Transfers return what the kernel returned: short reads and writes are the caller's to
//! retry. Errors are the CQE's negative errno as an [`io::Error`].

use std::ffi::CStr;
use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

use io_uring::{opcode, types};

use crate::co::Co;

/// Offset value that makes a read or write use (and advance) the file position: for pipes,
/// sockets and character devices such as /dev/fuse.
const CURRENT_POSITION: u64 = u64::MAX;

fn fd(f: &impl AsFd) -> types::Fd {
    types::Fd(f.as_fd().as_raw_fd())
}

#[inline]
fn check(res: io::Result<i32>) -> io::Result<usize> {
    let res = res?;
    if res < 0 {
        Err(io::Error::from_raw_os_error(-res))
    } else {
        Ok(res as usize)
    }
}

impl Co<'_> {
    /// `IORING_OP_NOP` (Linux 5.1): a full round trip through the ring that does nothing.
    /// Always inlined, as the suspend it contains must be (see [`Co::yield_now`]): with
    /// `#[inline]` alone the compiler kept it out of line, a frame of its own around the
    /// switch.
    #[inline(always)]
    pub(crate) fn nop(&self) -> io::Result<()> {
        // SAFETY: a NOP points to no memory and yields one CQE.
        let res = unsafe { self.submit(opcode::Nop::new().build()) }?;
        // As `check`, without the conversion to a length (the compiler kept a test of a
        // constant for it).
        if res < 0 {
            return Err(io::Error::from_raw_os_error(-res));
        }
        Ok(())
    }

    /// `IORING_OP_READ` (Linux 5.6) at `offset`.
    pub(crate) fn read_at(
        &self,
        file: &impl AsFd,
        buf: &mut [u8],
        offset: u64,
    ) -> io::Result<usize> {
        let sqe = opcode::Read::new(fd(file), buf.as_mut_ptr(), buf.len() as u32)
            .offset(offset)
            .build();
        // SAFETY: `buf` is borrowed until this call returns, which is after the CQE.
        check(unsafe { self.submit(sqe) })
    }

    /// `IORING_OP_READ` (Linux 5.6) at the file position: pipes, sockets, devices.
    pub(crate) fn read(&self, file: &impl AsFd, buf: &mut [u8]) -> io::Result<usize> {
        self.read_at(file, buf, CURRENT_POSITION)
    }

    /// `IORING_OP_RECV` (Linux 5.6) from a socket with `recv(2)`'s `flags`. With
    /// `MSG_WAITALL` (Linux 5.18 retries inside the ring) one completion brings the whole
    /// of `buf` unless the connection ends or fails first: a large message that arrives in
    /// many pieces costs one suspension, not one per piece.
    pub(crate) fn recv(&self, socket: &impl AsFd, buf: &mut [u8], flags: i32) -> io::Result<usize> {
        let sqe = opcode::Recv::new(fd(socket), buf.as_mut_ptr(), buf.len() as u32)
            .flags(flags)
            .build();
        // SAFETY: `buf` is borrowed until this call returns, which is after the CQE.
        check(unsafe { self.submit(sqe) })
    }

    /// `IORING_OP_WRITE` (Linux 5.6) at `offset`.
    pub(crate) fn write_at(&self, file: &impl AsFd, buf: &[u8], offset: u64) -> io::Result<usize> {
        let sqe = opcode::Write::new(fd(file), buf.as_ptr(), buf.len() as u32)
            .offset(offset)
            .build();
        // SAFETY: `buf` is borrowed until this call returns, which is after the CQE.
        check(unsafe { self.submit(sqe) })
    }

    /// `IORING_OP_READV` (Linux 5.1) at `offset`, straight into the caller's buffers.
    pub(crate) fn readv_at(
        &self,
        file: &impl AsFd,
        bufs: &mut [IoSliceMut<'_>],
        offset: u64,
    ) -> io::Result<usize> {
        // `IoSliceMut` is ABI-compatible with `struct iovec` on Unix (documented by std).
        let iov = bufs.as_mut_ptr().cast::<libc::iovec>();
        let sqe = opcode::Readv::new(fd(file), iov, bufs.len() as u32)
            .offset(offset)
            .build();
        // SAFETY: the iovec array and the buffers it names are borrowed until the CQE.
        check(unsafe { self.submit(sqe) })
    }

    /// `IORING_OP_WRITEV` (Linux 5.1) at `offset`, straight from the caller's buffers.
    pub(crate) fn writev_at(
        &self,
        file: &impl AsFd,
        bufs: &[IoSlice<'_>],
        offset: u64,
    ) -> io::Result<usize> {
        // `IoSlice` is ABI-compatible with `struct iovec` on Unix (documented by std).
        let iov = bufs.as_ptr().cast::<libc::iovec>();
        let sqe = opcode::Writev::new(fd(file), iov, bufs.len() as u32)
            .offset(offset)
            .build();
        // SAFETY: the iovec array and the buffers it names are borrowed until the CQE.
        check(unsafe { self.submit(sqe) })
    }

    /// `IORING_OP_WRITEV` (Linux 5.1) at the file position (e.g. a FUSE reply).
    pub(crate) fn writev(&self, file: &impl AsFd, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        self.writev_at(file, bufs, CURRENT_POSITION)
    }

    /// `IORING_OP_FSYNC` (Linux 5.1): data and metadata.
    pub(crate) fn fsync(&self, file: &impl AsFd) -> io::Result<()> {
        // SAFETY: no memory is referenced.
        check(unsafe { self.submit(opcode::Fsync::new(fd(file)).build()) }).map(drop)
    }

    /// `IORING_OP_FSYNC` with `IORING_FSYNC_DATASYNC` (Linux 5.1): data only.
    pub(crate) fn fdatasync(&self, file: &impl AsFd) -> io::Result<()> {
        let sqe = opcode::Fsync::new(fd(file))
            .flags(types::FsyncFlags::DATASYNC)
            .build();
        // SAFETY: no memory is referenced.
        check(unsafe { self.submit(sqe) }).map(drop)
    }

    /// `IORING_OP_FALLOCATE` (Linux 5.6) with fallocate(2)'s `mode` flags.
    pub(crate) fn fallocate(
        &self,
        file: &impl AsFd,
        mode: i32,
        offset: u64,
        len: u64,
    ) -> io::Result<()> {
        let sqe = opcode::Fallocate::new(fd(file), len)
            .offset(offset)
            .mode(mode)
            .build();
        // SAFETY: no memory is referenced.
        check(unsafe { self.submit(sqe) }).map(drop)
    }

    /// `IORING_OP_OPENAT2` (Linux 5.6): `path` relative to the directory `dir`, with
    /// open(2)'s `flags` and `mode`. The kernel first tries it without blocking (a path
    /// in the dentry cache completes at submission) and otherwise in one of the ring's
    /// worker threads, so a slow path walk (a cold disk, a network file system) stops
    /// this coroutine only, not the loop.
    pub(crate) fn openat(
        &self,
        dir: &impl AsFd,
        path: &CStr,
        flags: i32,
        mode: u32,
    ) -> io::Result<OwnedFd> {
        let how = types::OpenHow::new()
            .flags((flags | libc::O_CLOEXEC) as u32 as u64)
            .mode(u64::from(mode));
        let sqe = opcode::OpenAt2::new(fd(dir), path.as_ptr(), &how).build();
        // SAFETY: `path` and `how` are borrowed, on this coroutine's stack or the caller's,
        // until the CQE arrives.
        let opened = check(unsafe { self.submit(sqe) })?;
        // SAFETY: the CQE's result is a descriptor the kernel just opened for us.
        Ok(unsafe { OwnedFd::from_raw_fd(opened as i32) })
    }

    /// `IORING_OP_POLL_ADD` (Linux 5.1), one shot: waits until `file` reports one of the
    /// `events` (`libc::POLLIN`...); returns the events that fired.
    pub(crate) fn poll(&self, file: &impl AsFd, events: i16) -> io::Result<i16> {
        let sqe = opcode::PollAdd::new(fd(file), events as u16 as u32).build();
        // SAFETY: no memory is referenced.
        check(unsafe { self.submit(sqe) }).map(|revents| revents as i16)
    }

    /// `IORING_OP_TIMEOUT` (Linux 5.4): suspends for `duration` without blocking the loop.
    pub(crate) fn sleep(&self, duration: Duration) -> io::Result<()> {
        let ts = types::Timespec::from(duration);
        let sqe = opcode::Timeout::new(&ts).build();
        // SAFETY: `ts` lives on this coroutine's stack until the CQE arrives.
        match check(unsafe { self.submit(sqe) }) {
            Err(e) if e.raw_os_error() == Some(libc::ETIME) => Ok(()),
            other => other.map(drop),
        }
    }
}
