//! The system calls the directory export makes on the source tree, each a thin safe
//! wrapper: the only unsafe code of this crate.
//!
//! Why `*at` calls on descriptors, never paths: a passthrough file system must resolve
//! each name relative to the directory the kernel named, by its handle, so that a rename
//! elsewhere in the tree, or a symlink planted in a path, cannot redirect a request.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

fn cvt(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// `openat(dir, name, flags | O_CLOEXEC)`.
fn open_at(dir: BorrowedFd<'_>, name: &CStr, flags: libc::c_int) -> io::Result<OwnedFd> {
    runtime::file_io::openat(dir, name, flags, 0)
}

/// A handle on `name` in `dir` that opens nothing for I/O (`O_PATH`) and does not follow a
/// symlink in the last component (the link itself is the node).
pub fn open_path(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<OwnedFd> {
    open_at(dir, name, libc::O_PATH | libc::O_NOFOLLOW)
}

/// The directory behind an `O_PATH` handle, opened for reading its entries.
pub fn open_dir(handle: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    open_at(handle, c".", libc::O_RDONLY | libc::O_DIRECTORY)
}

/// `fstatat(fd, "", AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW)`: the node itself, symlinks too.
pub fn stat(fd: BorrowedFd<'_>) -> io::Result<libc::stat> {
    // SAFETY: stat is plain data; all-zero is a valid value, overwritten by the call.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let flags = libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW;
    // SAFETY: the path is an empty NUL-terminated string and `st` a writable stat.
    cvt(unsafe { libc::fstatat(fd.as_raw_fd(), c"".as_ptr(), &mut st, flags) })?;
    Ok(st)
}

/// `getdents64(dir, buf)`: packed `linux_dirent64` records; 0 at the end.
pub fn getdents(dir: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is writable for its whole length, which is what the kernel is told.
    let n = unsafe {
        libc::syscall(
            libc::SYS_getdents64,
            dir.as_raw_fd(),
            buf.as_mut_ptr(),
            buf.len(),
        )
    };
    cvt_size(n as libc::ssize_t)
}

/// Moves a directory stream to `cookie` (0: the start; else a `d_off` it returned).
pub fn seek_dir(dir: BorrowedFd<'_>, cookie: u64) -> io::Result<()> {
    let off =
        libc::off_t::try_from(cookie).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: lseek on a descriptor we hold; no memory is passed.
    if unsafe { libc::lseek(dir.as_raw_fd(), off, libc::SEEK_SET) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `/proc/self/fd/N` for a descriptor, NUL-terminated in a buffer of its own (no
/// allocation): the way to reach the file behind an `O_PATH` handle with the calls that
/// take no descriptor (reopen for I/O, chmod, xattrs), as passthrough_hp and virtiofsd do.
pub struct ProcPath {
    buf: [u8; 32],
}

impl ProcPath {
    pub fn of(fd: BorrowedFd<'_>) -> ProcPath {
        let mut buf = [0u8; 32];
        let prefix = b"/proc/self/fd/";
        buf[..prefix.len()].copy_from_slice(prefix);
        let mut digits = [0u8; 10];
        let mut n = fd.as_raw_fd() as u32;
        let mut len = 0;
        loop {
            digits[len] = b'0' + (n % 10) as u8;
            len += 1;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        for (i, d) in digits[..len].iter().rev().enumerate() {
            buf[prefix.len() + i] = *d;
        }
        ProcPath { buf }
    }

    pub fn as_cstr(&self) -> &CStr {
        CStr::from_bytes_until_nul(&self.buf).expect("NUL-terminated by construction")
    }
}

/// Reopens the file behind an `O_PATH` handle with `flags` (for I/O).
pub fn reopen(handle: BorrowedFd<'_>, flags: libc::c_int) -> io::Result<OwnedFd> {
    let path = ProcPath::of(handle);
    // SAFETY: the path is NUL-terminated; the returned descriptor is fresh and ours.
    let fd = cvt(unsafe { libc::open(path.as_cstr().as_ptr(), flags | libc::O_CLOEXEC) })?;
    // SAFETY: `fd` was just opened and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `openat(dir, name, flags | O_CREAT | O_NOFOLLOW, mode)`.
pub fn create(
    dir: BorrowedFd<'_>,
    name: &CStr,
    flags: libc::c_int,
    mode: u32,
) -> io::Result<OwnedFd> {
    runtime::file_io::openat(dir, name, flags | libc::O_CREAT | libc::O_NOFOLLOW, mode)
}

pub fn mkdir(dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> io::Result<()> {
    // SAFETY: `name` is NUL-terminated.
    cvt(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), mode) }).map(drop)
}

pub fn mknod(dir: BorrowedFd<'_>, name: &CStr, mode: u32, rdev: u64) -> io::Result<()> {
    // SAFETY: `name` is NUL-terminated.
    cvt(unsafe { libc::mknodat(dir.as_raw_fd(), name.as_ptr(), mode, rdev) }).map(drop)
}

pub fn symlink(target: &CStr, dir: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    // SAFETY: both strings are NUL-terminated.
    cvt(unsafe { libc::symlinkat(target.as_ptr(), dir.as_raw_fd(), name.as_ptr()) }).map(drop)
}

/// A new name `name` in `dir` for the file behind `handle` (through its /proc path, so
/// that no capability beyond the caller's is needed, unlike `AT_EMPTY_PATH`).
pub fn link(handle: BorrowedFd<'_>, dir: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    let path = ProcPath::of(handle);
    // SAFETY: both strings are NUL-terminated.
    let rc = unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            path.as_cstr().as_ptr(),
            dir.as_raw_fd(),
            name.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    };
    cvt(rc).map(drop)
}

/// `unlinkat(dir, name, flags)` (`AT_REMOVEDIR` for rmdir).
pub fn unlink(dir: BorrowedFd<'_>, name: &CStr, flags: libc::c_int) -> io::Result<()> {
    // SAFETY: `name` is NUL-terminated.
    cvt(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), flags) }).map(drop)
}

/// `renameat2(2)` with `RENAME_NOREPLACE`, `RENAME_EXCHANGE`, `RENAME_WHITEOUT` flags.
pub fn rename(
    from_dir: BorrowedFd<'_>,
    from: &CStr,
    to_dir: BorrowedFd<'_>,
    to: &CStr,
    flags: u32,
) -> io::Result<()> {
    // SAFETY: both names are NUL-terminated; renameat2 takes no other memory.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            from_dir.as_raw_fd(),
            from.as_ptr(),
            to_dir.as_raw_fd(),
            to.as_ptr(),
            flags,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The target of the symlink behind `handle`, into `buf`; returns its length (it may be
/// cut at `buf`'s length, as readlink(2) cuts it).
pub fn readlink(handle: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: the path is empty and NUL-terminated (the handle itself); `buf` is writable
    // for its length.
    cvt_size(unsafe {
        libc::readlinkat(
            handle.as_raw_fd(),
            c"".as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    })
}

/// chmod of the file behind `handle` (symlinks have no mode of their own: EOPNOTSUPP).
pub fn chmod(handle: BorrowedFd<'_>, mode: u32) -> io::Result<()> {
    let path = ProcPath::of(handle);
    // SAFETY: the path is NUL-terminated.
    cvt(unsafe { libc::chmod(path.as_cstr().as_ptr(), mode) }).map(drop)
}

/// chown of the node itself (`AT_EMPTY_PATH`: a symlink's own owner); `u32::MAX` keeps one.
pub fn chown(handle: BorrowedFd<'_>, uid: u32, gid: u32) -> io::Result<()> {
    let flags = libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW;
    // SAFETY: the path is empty and NUL-terminated.
    cvt(unsafe { libc::fchownat(handle.as_raw_fd(), c"".as_ptr(), uid, gid, flags) }).map(drop)
}

/// Sets access and modification times of the file behind `handle` (`UTIME_NOW` and
/// `UTIME_OMIT` in `tv_nsec` as utimensat(2) has them).
pub fn utimens(handle: BorrowedFd<'_>, times: &[libc::timespec; 2]) -> io::Result<()> {
    let path = ProcPath::of(handle);
    // SAFETY: the path is NUL-terminated and `times` two valid timespecs.
    cvt(unsafe { libc::utimensat(libc::AT_FDCWD, path.as_cstr().as_ptr(), times.as_ptr(), 0) })
        .map(drop)
}

/// The file status flags of an open descriptor (`fcntl(F_GETFL)`: O_DIRECT among them).
pub fn status_flags(fd: BorrowedFd<'_>) -> io::Result<libc::c_int> {
    // SAFETY: F_GETFL only reads the flags of a descriptor we hold.
    cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) })
}

pub fn ftruncate(fd: BorrowedFd<'_>, len: u64) -> io::Result<()> {
    let len = libc::off_t::try_from(len).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
    // SAFETY: a plain call on a descriptor we hold.
    cvt(unsafe { libc::ftruncate(fd.as_raw_fd(), len) }).map(drop)
}

pub fn statfs(handle: BorrowedFd<'_>) -> io::Result<libc::statvfs> {
    // SAFETY: statvfs is plain data; all-zero is a valid value, overwritten by the call.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a writable statvfs.
    cvt(unsafe { libc::fstatvfs(handle.as_raw_fd(), &mut st) })?;
    Ok(st)
}

/// `access(2)` of the file behind `handle` with `mask` (R_OK, W_OK, X_OK, F_OK).
pub fn access(handle: BorrowedFd<'_>, mask: i32) -> io::Result<()> {
    let path = ProcPath::of(handle);
    // SAFETY: the path is NUL-terminated.
    cvt(unsafe { libc::access(path.as_cstr().as_ptr(), mask) }).map(drop)
}

fn cvt_size(n: libc::ssize_t) -> io::Result<usize> {
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// getxattr of the file behind `handle`; an empty `buf` asks for the size.
pub fn getxattr(handle: BorrowedFd<'_>, name: &CStr, buf: &mut [u8]) -> io::Result<usize> {
    let path = ProcPath::of(handle);
    // SAFETY: both strings are NUL-terminated; `buf` is writable for its length (a null
    // pointer with length 0 is the size query getxattr(2) defines).
    cvt_size(unsafe {
        libc::getxattr(
            path.as_cstr().as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    })
}

pub fn setxattr(handle: BorrowedFd<'_>, name: &CStr, value: &[u8], flags: i32) -> io::Result<()> {
    let path = ProcPath::of(handle);
    // SAFETY: both strings are NUL-terminated; `value` is readable for its length.
    cvt(unsafe {
        libc::setxattr(
            path.as_cstr().as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            flags,
        )
    })
    .map(drop)
}

/// listxattr: NUL-separated names into `buf`; an empty `buf` asks for the size.
pub fn listxattr(handle: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    let path = ProcPath::of(handle);
    // SAFETY: the path is NUL-terminated; `buf` is writable for its length.
    cvt_size(unsafe {
        libc::listxattr(path.as_cstr().as_ptr(), buf.as_mut_ptr().cast(), buf.len())
    })
}

pub fn removexattr(handle: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    let path = ProcPath::of(handle);
    // SAFETY: both strings are NUL-terminated.
    cvt(unsafe { libc::removexattr(path.as_cstr().as_ptr(), name.as_ptr()) }).map(drop)
}

/// `lseek(fd, offset, whence)` (SEEK_DATA, SEEK_HOLE...), the resulting offset.
pub fn lseek(fd: BorrowedFd<'_>, offset: u64, whence: i32) -> io::Result<u64> {
    // The kernel sends the caller's `off_t` as it was: a negative one comes as a large
    // u64, and the source's own lseek says what it means (ENXIO for SEEK_DATA and
    // SEEK_HOLE, EINVAL for SEEK_SET).
    let off = offset as libc::off_t;
    // SAFETY: lseek on a descriptor we hold; no memory is passed.
    let r = unsafe { libc::lseek(fd.as_raw_fd(), off, whence) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r as u64)
}

/// `copy_file_range(2)` of up to `len` bytes between two open files at explicit offsets
/// (neither file position moves): the bytes copied, which may be fewer.
pub fn copy_file_range(
    from: BorrowedFd<'_>,
    off_from: u64,
    to: BorrowedFd<'_>,
    off_to: u64,
    len: usize,
) -> io::Result<usize> {
    let invalid = || io::Error::from_raw_os_error(libc::EINVAL);
    let mut off_in = libc::off64_t::try_from(off_from).map_err(|_| invalid())?;
    let mut off_out = libc::off64_t::try_from(off_to).map_err(|_| invalid())?;
    // SAFETY: both descriptors are ours and both offsets writable locals; no buffer is
    // passed (the kernel copies between the files).
    let n = unsafe {
        libc::copy_file_range(
            from.as_raw_fd(),
            &mut off_in,
            to.as_raw_fd(),
            &mut off_out,
            len,
            0,
        )
    };
    cvt_size(n)
}

/// `fstat(2)` of an open file.
pub fn fstat(fd: BorrowedFd<'_>) -> io::Result<libc::stat> {
    // SAFETY: stat is plain data; all-zero is a valid value, overwritten by the call.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a writable stat.
    cvt(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
    Ok(st)
}

/// Sets this process's umask to 0 and returns the one it had: the mode of a node made
/// for a client is the one the kernel sends, with the caller's umask applied, and the
/// daemon's own umask must not take more bits off it (as passthrough_hp clears it too).
pub fn clear_umask() -> u32 {
    // SAFETY: umask(2) cannot fail and takes no memory.
    unsafe { libc::umask(0) }
}

/// Raises this process's limit on open files (every node the kernel holds keeps a
/// descriptor, as in passthrough_hp and virtiofsd): with the privilege to (root), both
/// limits to the kernel's `fs.nr_open`, as virtiofsd does; otherwise the soft limit to
/// the hard one. Returns the new soft limit.
pub fn raise_nofile_limit() -> io::Result<u64> {
    // SAFETY: rlimit is plain data; all-zero is valid and overwritten by the call.
    let mut lim: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: `lim` is a writable rlimit.
    cvt(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) })?;
    let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse::<libc::rlim_t>().ok());
    if let Some(max) = nr_open.filter(|&max| max > lim.rlim_max) {
        let wanted = libc::rlimit {
            rlim_cur: max,
            rlim_max: max,
        };
        // SAFETY: `wanted` is a valid rlimit; without CAP_SYS_RESOURCE this fails (EPERM)
        // and the soft limit is raised below instead.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &wanted) } == 0 {
            return Ok(max);
        }
    }
    if lim.rlim_cur < lim.rlim_max {
        lim.rlim_cur = lim.rlim_max;
        // SAFETY: `lim` is a valid rlimit.
        cvt(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) })?;
    }
    Ok(lim.rlim_cur)
}

/// The kernel's largest file handle (`MAX_HANDLE_SZ`).
const MAX_HANDLE_SZ: usize = 128;

/// `struct file_handle` with room for the largest handle.
#[repr(C)]
struct RawFileHandle {
    handle_bytes: u32,
    handle_type: libc::c_int,
    f_handle: [u8; MAX_HANDLE_SZ],
}

/// A file handle (`name_to_handle_at(2)`): names a file on its file system for as long as
/// the file exists, without holding it open.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileHandle {
    kind: libc::c_int,
    bytes: Box<[u8]>,
}

/// The file handle of the file behind `fd` (`name_to_handle_at(fd, "", AT_EMPTY_PATH)`)
/// and the id of the mount it is on.
pub fn file_handle(fd: BorrowedFd<'_>) -> io::Result<(FileHandle, libc::c_int)> {
    let mut raw = RawFileHandle {
        handle_bytes: MAX_HANDLE_SZ as u32,
        handle_type: 0,
        f_handle: [0; MAX_HANDLE_SZ],
    };
    let mut mount_id: libc::c_int = 0;
    // SAFETY: the path is an empty NUL-terminated string, `raw` a writable file_handle
    // whose handle_bytes says how much room f_handle has, `mount_id` a writable int.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_name_to_handle_at,
            fd.as_raw_fd(),
            c"".as_ptr(),
            &mut raw as *mut RawFileHandle,
            &mut mount_id as *mut libc::c_int,
            libc::AT_EMPTY_PATH,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    let len = (raw.handle_bytes as usize).min(MAX_HANDLE_SZ);
    let handle = FileHandle {
        kind: raw.handle_type,
        bytes: raw.f_handle[..len].into(),
    };
    Ok((handle, mount_id))
}

/// How long [`open_by_handle`] waits out the creation of a file that reuses a deleted
/// file's inode number (see there).
const RECREATE_WAIT: std::time::Duration = std::time::Duration::from_millis(12);

/// Opens the file `handle` names on the file system of `mount` (`open_by_handle_at(2)`,
/// which needs CAP_DAC_READ_SEARCH); ESTALE once the file is gone.
pub fn open_by_handle(
    mount: BorrowedFd<'_>,
    handle: &FileHandle,
    flags: libc::c_int,
) -> io::Result<OwnedFd> {
    let mut raw = RawFileHandle {
        handle_bytes: handle.bytes.len() as u32,
        handle_type: handle.kind,
        f_handle: [0; MAX_HANDLE_SZ],
    };
    raw.f_handle[..handle.bytes.len()].copy_from_slice(&handle.bytes);
    let open = || {
        // SAFETY: `raw` is a valid file_handle of handle_bytes bytes, read only by the
        // call; the returned descriptor is fresh and ours.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_open_by_handle_at,
                mount.as_raw_fd(),
                &raw const raw,
                flags | libc::O_CLOEXEC,
            )
        };
        match fd < 0 {
            true => Err(io::Error::last_os_error()),
            false => Ok(fd),
        }
    };
    // The kernel answers ENOMEM, not ESTALE, while the file's inode number is being
    // given to a new file: the handle's file was deleted, and a creation anywhere on the
    // file system holds the number in the inode cache as I_CREATING until it completes
    // (fs/inode.c find_inode_fast answers ESTALE for it, iget_locked turns that into
    // NULL, ext4_iget into ENOMEM). Once the creation is done the decode sees the new
    // file's generation and answers ESTALE. So ENOMEM is tried again after sleeps doubling
    // from 50 us, 13 ms in all at most (a creation may wait on the journal); a real
    // shortage of memory still ends as ENOMEM. The caller's thread sleeps: this happens
    // only to a cold node whose file was deleted, at the moment its number is reused.
    // Seen in 3-4 of 100 runs of dir/tests/tree.rs, whose tests create files in
    // parallel, and once in CI after a single retry.
    let mut pause = std::time::Duration::from_micros(50);
    let mut waited = std::time::Duration::ZERO;
    let fd = loop {
        match open() {
            Err(e) if e.raw_os_error() == Some(libc::ENOMEM) && waited < RECREATE_WAIT => {
                std::thread::sleep(pause);
                waited += pause;
                pause *= 2;
            }
            done => break done?,
        }
    };
    // SAFETY: `fd` was just opened and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// An open file description lock command (`fcntl(fd, cmd, lock)`, `cmd` one of
/// `F_OFD_GETLK`, `F_OFD_SETLK`, `F_OFD_SETLKW`); GETLK fills `lock` in.
pub fn ofd_lock(fd: BorrowedFd<'_>, cmd: libc::c_int, lock: &mut libc::flock) -> io::Result<()> {
    // SAFETY: the fd is open for the call and `lock` a valid, writable `struct flock`.
    cvt(unsafe { libc::fcntl(fd.as_raw_fd(), cmd, lock as *mut libc::flock) }).map(drop)
}

/// `flock(2)` with `operation` (`LOCK_SH`, `LOCK_EX` or `LOCK_UN`, with `LOCK_NB`).
pub fn flock(fd: BorrowedFd<'_>, operation: libc::c_int) -> io::Result<()> {
    // SAFETY: plain syscall on an fd that is open for the call; no memory is passed.
    cvt(unsafe { libc::flock(fd.as_raw_fd(), operation) }).map(drop)
}

/// Sets this thread's file system user id (`setfsuid(2)`, per thread), checking that it
/// took: the call reports no error of its own.
pub fn set_fsuid(uid: u32) -> io::Result<()> {
    // SAFETY: plain syscalls without memory; they change only this thread's credentials.
    let now = unsafe {
        libc::setfsuid(uid);
        libc::setfsuid(u32::MAX) // an invalid id changes nothing and returns the current
    };
    match now as u32 == uid {
        true => Ok(()),
        false => Err(io::Error::from_raw_os_error(libc::EPERM)),
    }
}

/// Sets this thread's file system group id (`setfsgid(2)`, per thread), checked as
/// [`set_fsuid`] is.
pub fn set_fsgid(gid: u32) -> io::Result<()> {
    // SAFETY: as in set_fsuid.
    let now = unsafe {
        libc::setfsgid(gid);
        libc::setfsgid(u32::MAX)
    };
    match now as u32 == gid {
        true => Ok(()),
        false => Err(io::Error::from_raw_os_error(libc::EPERM)),
    }
}

/// Sets this thread's supplementary groups: the raw `setgroups(2)` system call, which
/// acts on the calling thread only (the C library's wrapper sets every thread's).
pub fn set_thread_groups(groups: &[libc::gid_t]) -> io::Result<()> {
    // SAFETY: the pointer and length describe a live slice that the call only reads.
    let rc = unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// This thread's supplementary groups (`getgroups(2)`), at most `MAX` of them.
pub fn thread_groups<const MAX: usize>() -> io::Result<([libc::gid_t; MAX], usize)> {
    let mut groups = [0 as libc::gid_t; MAX];
    // SAFETY: the buffer has room for MAX ids, as the count passed says.
    let n = unsafe { libc::getgroups(MAX as libc::c_int, groups.as_mut_ptr()) };
    let n = cvt(n)?;
    Ok((groups, n as usize))
}

/// The process's effective user and group ids (what the fsuid and fsgid follow).
pub fn effective_ids() -> (u32, u32) {
    // SAFETY: plain getters without arguments; they cannot fail.
    unsafe { (libc::geteuid(), libc::getegid()) }
}
