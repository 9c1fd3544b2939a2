//! Acting as the caller: the changes a caller makes to the tree (making nodes, links,
//! renames, attribute and extended attribute changes) run with the caller's file system
//! credentials, as virtiofsd runs them, so that a node is born owned by its caller (the
//! source's quota, its set-group-ID directories, its inotify watchers and its own
//! permission checks see the caller, not the daemon), instead of being made by the daemon
//! and given away with a chown after.
//!
//! How: around the one synchronous system call, this thread's fsuid, fsgid and
//! supplementary groups become the caller's ([`CallerCreds`], a guard: the daemon's own
//! come back when it drops). They are per-thread credentials in the kernel (`setfsuid`,
//! `setfsgid`, and the raw `setgroups` system call, not the C library's, which changes
//! every thread), so an event loop switches for one call of one request, never across a
//! suspension, and worker threads each switch their own. Changing the fsuid away from 0
//! drops the file system capabilities (CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_FOWNER,
//! CAP_FSETID, CAP_MKNOD...) for the call, exactly what a caller without them lacks; a
//! root caller keeps the daemon's credentials. The supplementary groups are read from
//! the caller's `/proc/PID/status` ([`crate::caller`]); where it cannot be read the
//! caller acts with none (less, never more).
//!
//! Only a daemon running as root can switch; elsewhere the daemon acts as itself, which
//! is what it is.

use std::io;

use crate::caller;
use crate::sys;

/// Supplementary groups taken from a caller, at most.
const MAX_GROUPS: usize = 256;

/// The daemon's own credentials, to come back to.
pub struct Credentials {
    uid: u32,
    gid: u32,
    groups: [libc::gid_t; MAX_GROUPS],
    count: usize,
    /// The daemon runs as root, so it may take on its callers' credentials.
    switchable: bool,
}

impl Credentials {
    /// The calling thread's credentials as the daemon's own: read once at start, since
    /// every thread of the daemon has the same.
    pub fn of_daemon() -> Credentials {
        let root = fuse::mount::is_root();
        let (uid, gid) = sys::effective_ids();
        match sys::thread_groups::<MAX_GROUPS>() {
            Ok((groups, count)) => Credentials {
                uid,
                gid,
                groups,
                count,
                switchable: root,
            },
            Err(e) => {
                log::warn!("getgroups: {e}; nodes are made as the daemon and given to callers");
                Credentials {
                    uid,
                    gid,
                    groups: [0; MAX_GROUPS],
                    count: 0,
                    switchable: false,
                }
            }
        }
    }

    /// Whether the daemon takes on its callers' credentials for their changes.
    pub fn switchable(&self) -> bool {
        self.switchable
    }

    /// Takes on the credentials of the caller with fsuid `uid`, fsgid `gid`, thread `pid`
    /// on this thread until the guard drops. `Ok(None)` where there is nothing to do (a
    /// root caller, or a daemon that is not root).
    pub fn become_caller(
        &self,
        uid: u32,
        gid: u32,
        pid: u32,
    ) -> io::Result<Option<CallerCreds<'_>>> {
        if !self.switchable || uid == 0 {
            return Ok(None);
        }
        let mut groups = [0u32; MAX_GROUPS];
        let n = caller::groups(pid, &mut groups).unwrap_or(0);
        let guard = CallerCreds { daemon: self };
        // Any failure drops the guard, which restores everything.
        sys::set_thread_groups(&groups[..n])?;
        sys::set_fsgid(gid)?;
        sys::set_fsuid(uid)?;
        Ok(Some(guard))
    }
}

/// The caller's credentials on this thread; the daemon's come back when it drops.
pub struct CallerCreds<'a> {
    daemon: &'a Credentials,
}

impl Drop for CallerCreds<'_> {
    fn drop(&mut self) {
        // The fsuid first: back to the daemon's, its file system capabilities with it.
        let daemon = self.daemon;
        let restored = sys::set_fsuid(daemon.uid)
            .and_then(|()| sys::set_fsgid(daemon.gid))
            .and_then(|()| sys::set_thread_groups(&daemon.groups[..daemon.count]));
        if let Err(e) = restored {
            // A thread left with a caller's credentials would act as that caller for
            // every later request: nothing is safe to serve from it.
            panic!("restoring the daemon's credentials: {e}");
        }
    }
}
