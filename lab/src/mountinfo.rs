//! Is a path a mount point right now, and which file system holds a path? Read from
//! /proc/self/mountinfo, the kernel's own list (a pidfile only says that the daemon got
//! far enough to write it), with `fuse::mountinfo`'s parser, the one the daemon uses.

use std::io;
use std::path::Path;

use fuse::mountinfo;

/// The filesystem type mounted on `path`, if any (the last mount wins when stacked).
pub fn fstype_at(path: &Path) -> Option<String> {
    let mounts = mountinfo::read().ok()?;
    mountinfo::mounts_on(&mounts, path).pop().map(|m| m.fstype)
}

/// Whether a FUSE filesystem (`fuse`, `fuse.NAME`, `fuseblk`) is mounted on `path`.
pub fn fuse_mounted(path: &Path) -> bool {
    fstype_at(path).is_some_and(|t| mountinfo::is_fuse(&t))
}

/// The file system holding `path` (which must exist): its type and source, e.g.
/// ("ext4", "/dev/vda"), from the mount whose mount point is the longest prefix.
pub fn fs_of(path: &Path) -> Option<(String, String)> {
    let path = std::fs::canonicalize(path).ok()?;
    let m = mountinfo::holding(&mountinfo::read().ok()?, &path)?;
    Some((m.fstype, m.source))
}

/// Removes the mount on `path` when a daemon did not: at once, or detached if busy.
pub fn lazy_unmount(path: &Path) -> io::Result<()> {
    fuse::mount::unmount_path(path).map(drop)
}
