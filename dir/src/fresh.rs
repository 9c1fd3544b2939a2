//! Attributes the kernel must not keep: where a file changes without the kernel seeing
//! the change go through a request, its cached attributes (kept for `--timeout`) would
//! show the file as it was. Two such cases, both of a node the kernel has cached:
//!
//! - The daemon clears privilege bits itself, before a write, truncation, `fallocate`
//!   or `copy_file_range` by a caller without CAP_FSETID. The kernel's own invalidation
//!   after those covers size and times only, so `stat -c %A` (a statx asking for the
//!   mode alone) would show the bits after the source dropped them. The daemon tells the
//!   kernel ([`Notifier::stale`]: FUSE_NOTIFY_INVAL_INODE, attributes only).
//! - FUSE passthrough: a shared mapping of a passthrough open maps the source file
//!   itself, and its writes change the source's mtime and ctime (at each first write to
//!   a clean page) with no request at all. While a node has an open that passes through
//!   and may write ([`Writers`]), its attributes are answered valid for no time, so each
//!   `stat` asks again and the daemon answers from the source file; the attributes
//!   cached before such an open are dropped when it opens. A `stat` of a file nobody
//!   has open for writing costs what it did.
//!
//! Nothing here allocates; a notification is one write(2) on /dev/fuse.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};
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

/// A node's opens that pass through and may write (see the module doc).
#[derive(Debug, Default)]
pub struct Writers(AtomicU32);

impl Writers {
    /// One more such open (OPEN or CREATE answered).
    pub fn opened(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    /// One fewer (its RELEASE).
    pub fn released(&self) {
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }

    /// Whether any is open: attributes are then answered valid for no time.
    pub fn any(&self) -> bool {
        self.0.load(Ordering::Relaxed) > 0
    }
}

/// Whether an open with `flags` may write (and so map the file shared and writable).
pub fn may_write(flags: i32) -> bool {
    flags & libc::O_ACCMODE != libc::O_RDONLY
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writers_count_down_to_zero_and_no_further() {
        let w = Writers::default();
        assert!(!w.any());
        w.opened();
        w.opened();
        w.released();
        assert!(w.any());
        w.released();
        w.released();
        assert!(!w.any(), "never below zero");
        assert!(may_write(libc::O_RDWR) && may_write(libc::O_WRONLY));
        assert!(!may_write(libc::O_RDONLY | libc::O_DIRECT));
    }
}
