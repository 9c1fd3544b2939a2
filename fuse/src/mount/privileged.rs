//! Mounting as root: mount(2) and umount2(2) directly, as libfuse does when
//! it has CAP_SYS_ADMIN.
//!
//! The kernel options: `fd` is the /dev/fuse fd opened here; `rootmode` is the
//! octal `S_IFMT` part of the root's mode, `100000` for a regular file and
//! `40000` for a directory (the VFS refuses to mount a file over a directory
//! and the reverse);
//! `user_id`/`group_id` own the mount (without `allow_other`, only they may
//! access it).

use super::{MountOptions, Unmounted};
use crate::dev::FuseDev;
use crate::sys::{cvt, explain};
use std::ffi::CString;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// `rootmode` for a regular file: S_IFREG in octal.
const ROOTMODE_REGULAR: &str = "100000";
/// `rootmode` for a directory: S_IFDIR in octal.
const ROOTMODE_DIRECTORY: &str = "40000";

/// True when running with euid 0 (mount(2) needs CAP_SYS_ADMIN).
pub(super) fn is_root() -> bool {
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The real uid and gid, which own the mount (as libfuse does).
fn owner() -> (u32, u32) {
    // SAFETY: getuid(2) and getgid(2) have no preconditions and cannot fail.
    unsafe { (libc::getuid(), libc::getgid()) }
}

/// `fd=N,rootmode=100000|40000,user_id=U,group_id=G[,allow_other][,default_permissions][,max_read=N]`
pub(super) fn kernel_options(fd: i32, uid: u32, gid: u32, opts: &MountOptions) -> String {
    let common = opts.common_options();
    let rootmode = if opts.directory {
        ROOTMODE_DIRECTORY
    } else {
        ROOTMODE_REGULAR
    };
    format!("fd={fd},rootmode={rootmode},user_id={uid},group_id={gid}{common}")
}

fn c_string(bytes: &[u8], what: &str) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{what} contains a NUL byte"),
        )
    })
}

/// Opens /dev/fuse and mounts it over `path`, a regular file (a directory with
/// [`MountOptions::directory`]).
pub(super) fn mount(path: &Path, opts: &MountOptions) -> io::Result<FuseDev> {
    let dev = FuseDev::open()?;
    let (uid, gid) = owner();
    let data = c_string(
        kernel_options(dev.as_raw_fd(), uid, gid, opts).as_bytes(),
        "mount options",
    )?;
    let source = c_string(opts.fsname.as_bytes(), "fsname")?;
    let fstype = c_string(opts.fstype().as_bytes(), "subtype")?;
    let target = c_string(path.as_os_str().as_bytes(), "mountpoint")?;
    let mut flags = libc::MS_NOSUID | libc::MS_NODEV;
    if opts.read_only {
        flags |= libc::MS_RDONLY;
    }
    // SAFETY: every pointer is a NUL-terminated string that outlives the call;
    // `data` is the text options string the fuse file system parses.
    let res = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            flags,
            data.as_ptr().cast(),
        )
    };
    cvt(res).map_err(|err| mount_error(err, path))?;
    Ok(dev)
}

fn mount_error(err: io::Error, path: &Path) -> io::Error {
    let path = path.display();
    let hint = match err.raw_os_error() {
        Some(libc::ENODEV) => {
            format!("mounting over {path}: the kernel has no fuse file system; run `modprobe fuse`")
        }
        Some(libc::EPERM) => {
            format!("mounting over {path} needs CAP_SYS_ADMIN; run as root or install fusermount3")
        }
        Some(libc::ENOTDIR) => {
            format!("mounting over {path}: the mountpoint must be a regular file")
        }
        _ => format!("mount(2) over {path} failed"),
    };
    explain(err, hint)
}

/// Detaches the mount at `path` (MNT_DETACH: busy files keep it alive).
pub(super) fn unmount(path: &Path) -> io::Result<()> {
    let what = format!("umount2({}, MNT_DETACH) failed", path.display());
    umount2(path, libc::MNT_DETACH).map_err(|err| explain(err, what))
}

/// Unmounts `path` now, or, if it is busy (EBUSY), detaches it (MNT_DETACH). Never
/// follows a symlink at `path` (UMOUNT_NOFOLLOW): the caller checked the mount on it.
pub(super) fn unmount_or_detach(path: &Path) -> io::Result<Unmounted> {
    let what = |flags| format!("umount2({}, {flags}) failed", path.display());
    match umount2(path, libc::UMOUNT_NOFOLLOW) {
        Ok(()) => Ok(Unmounted::Now),
        Err(err) if err.raw_os_error() == Some(libc::EBUSY) => {
            umount2(path, libc::MNT_DETACH | libc::UMOUNT_NOFOLLOW)
                .map_err(|err| explain(err, what("MNT_DETACH")))?;
            Ok(Unmounted::Lazily)
        }
        Err(err) => Err(explain(err, what("0"))),
    }
}

/// umount2(2); the error keeps its errno.
fn umount2(path: &Path, flags: libc::c_int) -> io::Result<()> {
    let target = c_string(path.as_os_str().as_bytes(), "mountpoint")?;
    // SAFETY: `target` is a NUL-terminated path that outlives the call.
    cvt(unsafe { libc::umount2(target.as_ptr(), flags) }).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_options_string() {
        let opts = MountOptions {
            allow_other: true,
            max_read: Some(1 << 20),
            ..MountOptions::default()
        };
        assert_eq!(
            kernel_options(5, 1000, 100, &opts),
            "fd=5,rootmode=100000,user_id=1000,group_id=100,allow_other,default_permissions,max_read=1048576"
        );
        let bare = MountOptions {
            default_permissions: false,
            ..MountOptions::default()
        };
        assert_eq!(
            kernel_options(3, 0, 0, &bare),
            "fd=3,rootmode=100000,user_id=0,group_id=0"
        );
        let dir = MountOptions {
            directory: true,
            ..bare
        };
        assert_eq!(
            kernel_options(3, 0, 0, &dir),
            "fd=3,rootmode=40000,user_id=0,group_id=0"
        );
    }
}
