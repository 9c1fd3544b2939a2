//! Whether a path is a corofuse mount, from /proc/self/mountinfo (never by touching the
//! path: stat(2) on a mount whose server died fails, and on a live one it asks the server).
//! The parsing is `fuse::mountinfo`'s, the one the daemon uses.

use std::path::Path;

use fuse::mountinfo;

/// The fstype corofuse mounts with.
pub const FSTYPE: &str = "fuse.corofuse";

/// How many mounts of any `fuse`/`fuse.*` type sit on `path` (an absolute path, symlinks
/// resolved, as the kernel writes it).
pub fn fuse_mounts_at(path: &Path) -> usize {
    fstypes_at(path)
        .iter()
        .filter(|t| mountinfo::is_fuse(t))
        .count()
}

/// Whether `path` has a [`FSTYPE`] mount on it.
pub fn is_corofuse_mount(path: &Path) -> bool {
    fstypes_at(path).iter().any(|t| t == FSTYPE)
}

/// The fstype of each mount on `path`, in mount order (the last one is on top).
pub fn fstypes_at(path: &Path) -> Vec<String> {
    let mounts = mountinfo::read().expect("read /proc/self/mountinfo");
    let on = mountinfo::mounts_on(&mounts, path);
    on.into_iter().map(|m| m.fstype).collect()
}
