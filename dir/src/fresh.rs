//! Attributes the kernel must not keep: where a file changes without the kernel seeing
//! the change go through a request, its cached attributes (kept for `--timeout`) would
//! show the file as it was:
//!
//! - The daemon clears privilege bits itself, before a write, truncation, `fallocate`
//!   or `copy_file_range` by a caller without CAP_FSETID. The kernel's own invalidation
//!   after those covers size and times only, so `stat -c %A` (a statx asking for the
//!   mode alone) would show the bits after the source dropped them. The daemon tells the
//!   kernel ([`Notifier::stale`]: FUSE_NOTIFY_INVAL_INODE, attributes only).
//!
//! Nothing here allocates; a notification is one write(2) on /dev/fuse.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::OnceLock;

/// The connection's /dev/fuse fd, for notifications.
#[derive(Debug, Default)]
pub struct Notifier {
    dev: OnceLock<OwnedFd>,
}

impl Notifier {
    /// Keeps a duplicate of the session's fd (at the start of the session).
    pub fn start(&self, session: BorrowedFd<'_>) {
        match session.try_clone_to_owned() {
            Ok(fd) => {
                let _ = self.dev.set(fd);
            }
            Err(e) => log::warn!(
                "cannot duplicate the /dev/fuse fd ({e}): attributes changed by the daemon \
                 show after the attribute timeout"
            ),
        }
    }

    /// The kernel's cached attributes of `nodeid` are stale: it drops them, and the
    /// next `stat` asks again. A failure is logged; the request goes on.
    pub fn stale(&self, nodeid: u64) {
        let Some(dev) = self.dev.get() else { return };
        if let Err(e) = fuse::notify::inval_attrs(std::os::fd::AsFd::as_fd(dev), nodeid) {
            log::warn!("invalidating the attributes of node {nodeid}: {e}");
        }
    }
}
