//! Mounting a file system over a regular file or a directory, and the
//! [`Mount`] guard that unmounts it.
//!
//! # Contract
//!
//! - The mountpoint must be of the root's kind, an existing regular file (a
//!   directory with [`MountOptions::directory`]), and not already a FUSE
//!   mountpoint; anything else fails before mounting, with a message naming
//!   the path. Mounting over a file the file system itself reads works: open
//!   it first, then mount over its path; the open fd keeps reaching the file
//!   underneath.
//! - As root, the kernel is asked directly: `mount(2)` with fstype
//!   `fuse.<subtype>` and `fd=N,rootmode=100000,user_id=U,group_id=G,...`
//!   (`rootmode=40000` for a directory; see `mount/privileged.rs`). Otherwise
//!   `fusermount3` mounts and passes the /dev/fuse fd back over a socket (see
//!   `mount/fusermount.rs`).
//! - `mount(2)` returns before INIT is answered: the caller serves the
//!   returned [`FuseDev`] from another thread or loop, or the first access to
//!   the mountpoint blocks.
//! - Dropping the [`Mount`] (or [`Mount::unmount`]) detaches the mount
//!   (`umount2(MNT_DETACH)` or `fusermount3 -u -z`); the server's next read
//!   then fails with ENODEV. No DESTROY request is sent for a `fuse` mount.
//! - A [`Mount`] whose connection is gone (unmounted from outside, or aborted)
//!   detaches nothing: the mount now on its path, if any, is someone else's,
//!   even when the kernel gave it the same device number. The guard keeps a
//!   duplicate of the session's /dev/fuse fd, which polls `POLLERR` once the
//!   connection is gone, as libfuse checks before it unmounts.
//! - [`unmount_path`] removes a mount from outside its server (`corofuse
//!   umount`), live or with the server gone; the caller first checks with
//!   [`mount_at`] that the mount on the path is one it may remove.

mod check;
mod fusermount;
mod privileged;
mod probe;

use crate::dev::FuseDev;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

pub use crate::mountinfo::MountEntry;
pub use check::{fuse_mount_at, fuse_mount_device, is_fuse_mountpoint, mount_at, resolve};
pub use probe::{is_root, mount_unavailable};

/// The fuse module's switch for FUSE over io_uring (Linux 6.14+; N by default): read by
/// the daemon to say why `--transport uring` cannot run, set by the lab and the tests
/// for the runs that need it.
pub const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// How to mount: names and kernel options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountOptions {
    /// Source shown in /proc/mounts (e.g. the path served, or "corofuse").
    pub fsname: String,
    /// File system subtype: the fstype is `fuse.<subtype>`.
    pub subtype: String,
    /// Let other users access the mount (non-root needs `user_allow_other`).
    pub allow_other: bool,
    /// Let the kernel check permissions against the reported mode.
    pub default_permissions: bool,
    /// Cap on READ size; must not be below what the server negotiates.
    pub max_read: Option<u32>,
    /// Mount read-only (MS_RDONLY).
    pub read_only: bool,
    /// The root is a directory, mounted over a directory; else a regular file, mounted
    /// over a regular file.
    pub directory: bool,
}

impl Default for MountOptions {
    fn default() -> MountOptions {
        MountOptions {
            fsname: "corofuse".into(),
            subtype: "corofuse".into(),
            allow_other: false,
            default_permissions: true,
            max_read: None,
            read_only: false,
            directory: false,
        }
    }
}

impl MountOptions {
    /// The fstype mount(2) gets and mountinfo shows: `fuse.<subtype>`.
    pub fn fstype(&self) -> String {
        format!("fuse.{}", self.subtype)
    }

    /// The `,allow_other,default_permissions,max_read=N` part shared by both paths.
    fn common_options(&self) -> String {
        let mut opts = String::new();
        if self.allow_other {
            opts.push_str(",allow_other");
        }
        if self.default_permissions {
            opts.push_str(",default_permissions");
        }
        if let Some(max_read) = self.max_read {
            opts.push_str(&format!(",max_read={max_read}"));
        }
        opts
    }
}

/// How a mount was made, hence how to undo it.
#[derive(Debug)]
enum Method {
    /// mount(2); undone with umount2(MNT_DETACH).
    Syscall,
    /// fusermount3 at this path; undone with `fusermount3 -u -z`.
    Fusermount(PathBuf),
}

/// A live mount; unmounts (lazily) when dropped.
#[derive(Debug)]
#[must_use = "dropping the Mount unmounts it"]
pub struct Mount {
    path: PathBuf,
    method: Method,
    mounted: bool,
    /// Our mount's device in mountinfo, so that we never detach someone else's.
    device: Option<String>,
    /// A duplicate of the session's /dev/fuse fd: it tells whether our connection is
    /// still alive, which the device number alone cannot (the kernel reuses it for the
    /// next FUSE mount as soon as ours is gone).
    session: OwnedFd,
}

/// Mounts a FUSE file system over the regular file `mountpoint` (over the directory
/// `mountpoint` with [`MountOptions::directory`]).
///
/// Returns the session's /dev/fuse fd, to be served, and the guard.
pub fn mount(mountpoint: &Path, opts: &MountOptions) -> io::Result<(FuseDev, Mount)> {
    let path = check::check_mountpoint(mountpoint, opts.directory)?;
    let (dev, method) = if privileged::is_root() {
        (privileged::mount(&path, opts)?, Method::Syscall)
    } else {
        let bin = fusermount::find()?;
        (
            fusermount::mount(&bin, &path, opts)?,
            Method::Fusermount(bin),
        )
    };
    log::info!(
        "mounted {} (fuse.{}) over {} via {:?}, /dev/fuse fd {}",
        opts.fsname,
        opts.subtype,
        path.display(),
        method,
        dev.as_raw_fd()
    );
    let device = check::fuse_mount_device(&path)?;
    let session = dev.as_fd().try_clone_to_owned()?;
    Ok((
        dev,
        Mount {
            path,
            method,
            mounted: true,
            device,
            session,
        },
    ))
}

/// How [`unmount_path`] removed a mount.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unmounted {
    /// At once: nothing on it was in use.
    Now,
    /// Detached (MNT_DETACH, `fusermount3 -u -z`) because it was busy: gone from the
    /// namespace now, freed when the last file on it closes.
    Lazily,
}

/// Unmounts the mount on top of `path` (absolute, see [`resolve`]) from outside its
/// server, whether the server still runs or is gone: a plain unmount, and a lazy one
/// only if that fails because the mount is busy. As root with umount2(2), else with
/// `fusermount3 -u` (`-u -z`). The caller checks that the mount is one it may remove
/// ([`mount_at`]); the server's next read of /dev/fuse then fails with ENODEV.
pub fn unmount_path(path: &Path) -> io::Result<Unmounted> {
    if privileged::is_root() {
        privileged::unmount_or_detach(path)
    } else {
        fusermount::unmount_or_detach(&fusermount::find()?, path)
    }
}

impl Mount {
    /// The absolute mountpoint.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Unmounts now, reporting failure (Drop can only log it). The guard is
    /// consumed either way: after an error the mount may remain, and nothing
    /// retries.
    pub fn unmount(mut self) -> io::Result<()> {
        self.mounted = false;
        self.detach()
    }

    /// Whether our mount is still there (it may have been unmounted from outside, and
    /// something else mounted on the same path since, with the same device number):
    /// our connection must be alive and the topmost FUSE mount on the path must have
    /// our device.
    pub fn is_mounted(&self) -> bool {
        if crate::dev::connection_gone(self.session.as_fd()) {
            return false;
        }
        match check::fuse_mount_device(&self.path) {
            Ok(device) => device.is_some() && device == self.device,
            Err(_) => true,
        }
    }

    fn detach(&self) -> io::Result<()> {
        if !self.is_mounted() {
            log::info!("{} was already unmounted", self.path.display());
            return Ok(());
        }
        match &self.method {
            Method::Syscall => privileged::unmount(&self.path)?,
            Method::Fusermount(bin) => fusermount::unmount(bin, &self.path)?,
        }
        log::info!("unmounted {}", self.path.display());
        Ok(())
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if self.mounted {
            if let Err(err) = self.detach() {
                log::error!("unmounting {} failed: {err}", self.path.display());
            }
        }
    }
}
