//! The few raw syscalls the tests need, each behind a safe function. All the crate's
//! unsafe code is here (plus the aligned allocation in [`crate::buf`] and the memory
//! mappings in [`crate::mapping`]).

use std::ffi::CString;
use std::fs;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Runs a libc call; a negative result becomes `io::Error::last_os_error()` (mio's shape).
macro_rules! syscall {
    ($call:expr) => {{
        let res = $call;
        if res < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(res)
        }
    }};
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

/// `fallocate(2)` on `file`.
pub fn fallocate(file: &File, mode: i32, offset: u64, len: u64) -> io::Result<()> {
    // SAFETY: fallocate(2) takes a valid fd (borrowed from `file`) and plain integers.
    syscall!(unsafe { libc::fallocate(file.as_raw_fd(), mode, offset as i64, len as i64) })
        .map(drop)
}

/// `lseek(2)` on `file`, e.g. with `SEEK_DATA` or `SEEK_HOLE`.
pub fn lseek(file: &File, offset: u64, whence: i32) -> io::Result<u64> {
    // SAFETY: lseek(2) takes a valid fd (borrowed from `file`) and plain integers.
    syscall!(unsafe { libc::lseek(file.as_raw_fd(), offset as i64, whence) }).map(|o| o as u64)
}

/// lseek's result or errno, comparable.
pub fn seek(file: &File, offset: u64, whence: i32) -> Result<u64, i32> {
    lseek(file, offset, whence).map_err(|e| e.raw_os_error().unwrap_or(0))
}

/// Asserts that `SEEK_DATA` and `SEEK_HOLE` from each of `offsets` give the same result
/// (offset or errno) on `mount` as on `image`; `what` names the moment in a failure.
pub fn assert_same_seeks(image: &File, mount: &File, offsets: &[u64], what: &str) {
    for whence in [libc::SEEK_DATA, libc::SEEK_HOLE] {
        for &offset in offsets {
            let want = seek(image, offset, whence);
            let got = seek(mount, offset, whence);
            assert_eq!(
                got, want,
                "{what}: lseek({offset}, {whence}), mount vs image"
            );
        }
    }
}

/// `copy_file_range(2)` of up to `len` bytes from `from` at `off_from` to `to` at
/// `off_to` (the file positions do not move): the bytes copied.
pub fn copy_file_range(
    from: &File,
    off_from: u64,
    to: &File,
    off_to: u64,
    len: usize,
) -> io::Result<usize> {
    let (mut a, mut b) = (off_from as i64, off_to as i64);
    // SAFETY: two valid fds (borrowed), two writable local offsets, plain integers.
    let n =
        unsafe { libc::copy_file_range(from.as_raw_fd(), &mut a, to.as_raw_fd(), &mut b, len, 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// `umount2(path, MNT_DETACH)`: what `umount -l` does.
pub fn umount_lazy(path: &Path) -> io::Result<()> {
    let target = c_path(path)?;
    // SAFETY: `target` is a NUL-terminated path that outlives the call.
    syscall!(unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) }).map(drop)
}

/// `mount(2)` of `fstype` from `source` on `target` with the option text `data` (for a
/// test's own mounts, e.g. a tmpfs; undo with [`umount_lazy`]).
pub fn mount(source: &str, target: &Path, fstype: &str, data: &str) -> io::Result<()> {
    let text =
        |s: &str| CString::new(s).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e));
    let (source, fstype, data) = (text(source)?, text(fstype)?, text(data)?);
    let target = c_path(target)?;
    let flags = libc::MS_NOSUID | libc::MS_NODEV;
    // SAFETY: every pointer is a NUL-terminated string that outlives the call.
    syscall!(unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            flags,
            data.as_ptr().cast(),
        )
    })
    .map(drop)
}

/// Sends `signal` to the process `pid` (only ever a child the tests started).
pub fn kill(pid: u32, signal: i32) -> io::Result<()> {
    // SAFETY: kill(2) takes plain integers and touches no memory.
    syscall!(unsafe { libc::kill(pid as libc::pid_t, signal) }).map(drop)
}

/// Asks the kernel to send `SIGTERM` to this process when the thread that forked it
/// exits. Meant for `CommandExt::pre_exec`: it is async-signal-safe.
pub fn term_with_parent() -> io::Result<()> {
    // SAFETY: prctl(PR_SET_PDEATHSIG) takes plain integers and touches no memory.
    syscall!(unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM as libc::c_ulong) })
        .map(drop)
}

/// `truncate(2)` by path (not through an open fd).
pub fn truncate(path: &Path, len: u64) -> io::Result<()> {
    let path = c_path(path)?;
    // SAFETY: `path` is a NUL-terminated string that outlives the call.
    syscall!(unsafe { libc::truncate(path.as_ptr(), len as i64) }).map(drop)
}

/// `statfs(2)`'s `f_type` for the file system holding `path` (e.g. `libc::TMPFS_MAGIC`).
pub fn fs_type(path: &Path) -> io::Result<u64> {
    let path = c_path(path)?;
    let mut st = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: `path` is NUL-terminated and outlives the call; `st` has room for the
    // struct statfs(2) fills in.
    syscall!(unsafe { libc::statfs(path.as_ptr(), st.as_mut_ptr()) })?;
    // SAFETY: statfs(2) succeeded, so it initialised `st`.
    let st = unsafe { st.assume_init() };
    Ok(st.f_type as u64)
}

/// The size of a memory page (`sysconf(_SC_PAGESIZE)`).
pub fn page_size() -> usize {
    // SAFETY: sysconf(3) takes a plain integer and touches no memory of ours.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size).expect("sysconf(_SC_PAGESIZE) fails")
}

/// `setxattr(2)` of `name` to `value` on `path` (flags 0: create or replace).
pub fn setxattr(path: &Path, name: &str, value: &[u8]) -> io::Result<()> {
    let path = c_path(path)?;
    let name = CString::new(name).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: both strings are NUL-terminated and outlive the call; `value` is readable
    // for its length.
    syscall!(unsafe {
        libc::setxattr(
            path.as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    })
    .map(drop)
}

/// A POSIX ACL as the kernel's xattr format has it (`system.posix_acl_access` or
/// `system.posix_acl_default`; version 2): each entry a tag (`ACL_USER_OBJ` 0x01,
/// `ACL_USER` 0x02, `ACL_GROUP_OBJ` 0x04, `ACL_GROUP` 0x08, `ACL_MASK` 0x10, `ACL_OTHER`
/// 0x20), permission bits (4 read, 2 write, 1 execute) and the user or group id
/// (`u32::MAX` for the tags that name none).
pub fn posix_acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for &(tag, perm, id) in entries {
        v.extend(tag.to_le_bytes());
        v.extend(perm.to_le_bytes());
        v.extend(id.to_le_bytes());
    }
    v
}

/// The default ACL that gives owner, group and others rwx: a directory whose new nodes
/// then ignore the creator's umask.
pub fn default_acl_rwx() -> Vec<u8> {
    posix_acl(&[
        (0x01, 7, u32::MAX),
        (0x04, 7, u32::MAX),
        (0x20, 7, u32::MAX),
    ])
}

/// `listxattr(2)` of `path`: the names, in the order the file system gives them.
pub fn listxattr(path: &Path) -> io::Result<Vec<String>> {
    let path = c_path(path)?;
    let mut buf = vec![0u8; 64 * 1024];
    // SAFETY: the path is NUL-terminated; `buf` is writable for its length.
    let res = unsafe { libc::listxattr(path.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    let n = syscall!(res)?;
    buf.truncate(n as usize);
    Ok(buf
        .split(|&b| b == 0)
        .filter(|name| !name.is_empty())
        .map(|name| String::from_utf8_lossy(name).into_owned())
        .collect())
}

/// `renameat2(2)` of `from` to `to` with `flags` (e.g. `RENAME_WHITEOUT`).
pub fn renameat2(from: &Path, to: &Path, flags: u32) -> io::Result<()> {
    let (from, to) = (c_path(from)?, c_path(to)?);
    // SAFETY: both paths are NUL-terminated and outlive the call.
    syscall!(unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            flags,
        )
    })
    .map(drop)
}

/// `mknod(2)` of a node of `mode` (type and permissions) and device `rdev` at `path`.
pub fn mknod(path: &Path, mode: u32, rdev: u64) -> io::Result<()> {
    let path = c_path(path)?;
    // SAFETY: the path is NUL-terminated and outlives the call.
    syscall!(unsafe { libc::mknod(path.as_ptr(), mode, rdev) }).map(drop)
}

/// Makes this process user `uid` and group `gid` with no supplementary groups, for good
/// (real, effective and saved ids): what a test's unprivileged helper does first.
pub fn become_user(uid: u32, gid: u32) -> io::Result<()> {
    become_user_in(uid, gid, &[])
}

/// [`become_user`] with the supplementary groups `groups`.
pub fn become_user_in(uid: u32, gid: u32, groups: &[u32]) -> io::Result<()> {
    // SAFETY: setgroups(2) reads `groups.len()` ids from a live slice; setgid(2) and
    // setuid(2) take plain integers.
    unsafe {
        syscall!(libc::setgroups(groups.len(), groups.as_ptr()))?;
        syscall!(libc::setgid(gid))?;
        syscall!(libc::setuid(uid))?;
    }
    Ok(())
}

/// `lseek(2)` on `file` with any `off_t` (negative ones included): the new offset, or
/// the errno.
pub fn lseek_raw(file: &File, offset: i64, whence: i32) -> Result<i64, i32> {
    // SAFETY: lseek(2) takes a valid fd (borrowed from `file`) and plain integers.
    let r = unsafe { libc::lseek(file.as_raw_fd(), offset, whence) };
    if r < 0 {
        return Err(io::Error::last_os_error().raw_os_error().unwrap_or(0));
    }
    Ok(r)
}

/// A file handle from `name_to_handle_at(2)`.
#[repr(C)]
#[derive(Clone)]
pub struct FileHandle {
    handle_bytes: u32,
    handle_type: i32,
    f_handle: [u8; 128],
}

/// The file handle `name_to_handle_at(2)` gives `path`, or the errno.
pub fn file_handle(path: &Path) -> Result<FileHandle, i32> {
    let path = c_path(path).map_err(|_| libc::EINVAL)?;
    let mut handle = FileHandle {
        handle_bytes: 128,
        handle_type: 0,
        f_handle: [0; 128],
    };
    let mut mount_id: libc::c_int = 0;
    // SAFETY: the path is NUL-terminated and outlives the call; `handle` is a writable
    // file_handle whose handle_bytes says how much room f_handle has; `mount_id` a
    // writable int.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_name_to_handle_at,
            libc::AT_FDCWD,
            path.as_ptr(),
            &mut handle as *mut FileHandle,
            &mut mount_id as *mut libc::c_int,
            0,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error().raw_os_error().unwrap_or(0));
    }
    Ok(handle)
}

/// Whether `name_to_handle_at(2)` gives `path` a file handle: `Ok(())`, or the errno.
pub fn name_to_handle(path: &Path) -> Result<(), i32> {
    file_handle(path).map(drop)
}

/// Opens the file `handle` names on the file system `mount` is on
/// (`open_by_handle_at(2)`, root only), with `flags`; or the errno.
pub fn open_by_handle(mount: &Path, handle: &FileHandle, flags: i32) -> Result<fs::File, i32> {
    let dir = fs::File::open(mount).map_err(|e| e.raw_os_error().unwrap_or(0))?;
    // SAFETY: `dir` is an open descriptor for the call, `handle` a valid file_handle
    // that the call only reads.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_open_by_handle_at,
            dir.as_raw_fd(),
            handle as *const FileHandle,
            flags | libc::O_CLOEXEC,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error().raw_os_error().unwrap_or(0));
    }
    // SAFETY: a fresh descriptor the call returned, owned by nothing else.
    Ok(unsafe { fs::File::from_raw_fd(rc as i32) })
}

/// `removexattr(2)` of `name` on `path`.
pub fn removexattr(path: &Path, name: &str) -> io::Result<()> {
    let path = c_path(path)?;
    let name = CString::new(name).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: both strings are NUL-terminated and outlive the call.
    syscall!(unsafe { libc::removexattr(path.as_ptr(), name.as_ptr()) }).map(drop)
}
