//! FUSE passthrough's backing files (Linux 6.9+): a file registered with the kernel, so
//! that an OPEN reply with `FOPEN_PASSTHROUGH` and its id sends the client's reads,
//! writes and mappings of that open straight to it, without a request to the server.
//!
//! # Contract (fs/fuse/backing.c, passthrough.c, iomode.c)
//!
//! - The session must have FUSE_PASSTHROUGH with a `max_stack_depth` of 1 or 2, and no
//!   writeback cache ([`crate::init`]); the caller needs CAP_SYS_ADMIN. Otherwise
//!   [`open`] fails with EPERM: say so once and serve without passthrough.
//! - [`open`] takes any /dev/fuse fd of the connection (the session's or a clone's) and an
//!   open regular file (an `O_PATH` one will do: the kernel reopens the file's path with
//!   each client's own open flags, under the credentials of the thread that registered
//!   it). A file on a stacked file system deeper than the depth gives ELOOP.
//! - The kernel looks the id up when the client's open completes, after the reply was
//!   written: an id must stay registered while an OPEN reply naming it may be in flight.
//!   Close it after the last RELEASE of the files opened with it.
//! - All passthrough opens of one inode must name the same id, and an inode may not
//!   have passthrough and cached opens at once: the client sees EIO otherwise.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

use crate::abi::{fuse_backing_map, FUSE_DEV_IOC_BACKING_CLOSE, FUSE_DEV_IOC_BACKING_OPEN};
use crate::sys::cvt;

/// A registered backing file: what goes in `fuse_open_out::backing_id`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackingId(pub i32);

/// Registers `file` for passthrough on the connection of `dev`.
pub fn open(dev: BorrowedFd<'_>, file: BorrowedFd<'_>) -> io::Result<BackingId> {
    let map = fuse_backing_map {
        fd: file.as_raw_fd(),
        flags: 0,
        padding: 0,
    };
    // SAFETY: BACKING_OPEN reads one fuse_backing_map through the pointer, a live local;
    // both descriptors are open for the whole call.
    let id = cvt(unsafe {
        libc::ioctl(
            dev.as_raw_fd(),
            FUSE_DEV_IOC_BACKING_OPEN as libc::Ioctl,
            &map,
        )
    })?;
    Ok(BackingId(id))
}

/// Unregisters `id` (the files opened with it keep their own references).
pub fn close(dev: BorrowedFd<'_>, id: BackingId) -> io::Result<()> {
    let id = id.0 as u32;
    // SAFETY: BACKING_CLOSE reads one u32 through the pointer, a live local; the
    // descriptor is open for the whole call.
    cvt(unsafe {
        libc::ioctl(
            dev.as_raw_fd(),
            FUSE_DEV_IOC_BACKING_CLOSE as libc::Ioctl,
            &id,
        )
    })
    .map(drop)
}

/// The session's side of passthrough: whether it is on, the /dev/fuse fd its ioctls go
/// to, and what it did. Shared by every queue and worker of a file system.
#[derive(Debug, Default)]
pub struct Session {
    dev: std::sync::OnceLock<std::os::fd::OwnedFd>,
    /// Off for good: not granted, or the kernel refused a registration with EPERM.
    off: std::sync::atomic::AtomicBool,
    /// Backing files registered, and opens answered with `FOPEN_PASSTHROUGH`.
    registered: std::sync::atomic::AtomicU64,
    passed: std::sync::atomic::AtomicU64,
}

/// What a [`Session`] did, for `--stats`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PassthroughStats {
    /// Whether passthrough is in use.
    pub enabled: bool,
    /// Backing files registered with the kernel.
    pub registered: u64,
    /// Opens answered with `FOPEN_PASSTHROUGH` (their reads, writes or mappings go to the
    /// backing file; with `FOPEN_DIRECT_IO` too, only their mappings do).
    pub opens: u64,
}

impl Session {
    /// Passthrough as the INIT handshake left it: `granted` (FUSE_PASSTHROUGH was
    /// negotiated with a stack depth), on the connection of `dev` (duplicated and kept).
    /// Says why, in one log line, when it is not in use.
    pub fn start(&self, granted: bool, dev: BorrowedFd<'_>) {
        use std::sync::atomic::Ordering;
        if !granted {
            log::info!("FUSE passthrough: not offered by this kernel (Linux 6.9+, CONFIG_FUSE_PASSTHROUGH); serving every read and write");
            self.off.store(true, Ordering::Relaxed);
            return;
        }
        match dev.try_clone_to_owned() {
            Ok(fd) => {
                let _ = self.dev.set(fd);
            }
            Err(e) => {
                log::warn!("FUSE passthrough off: cannot duplicate the /dev/fuse fd: {e}");
                self.off.store(true, Ordering::Relaxed);
            }
        }
    }

    /// Whether registering may be tried.
    pub fn is_on(&self) -> bool {
        self.dev.get().is_some() && !self.off.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Registers `file`, or `None` where passthrough is off or the kernel refused this
    /// file (logged). An EPERM (no CAP_SYS_ADMIN, or not granted after all) turns
    /// passthrough off for the session, with one log line.
    pub fn register(&self, file: BorrowedFd<'_>) -> Option<BackingId> {
        use std::sync::atomic::Ordering;
        let dev = self.dev.get().filter(|_| self.is_on())?;
        match open(std::os::fd::AsFd::as_fd(dev), file) {
            Ok(id) => {
                self.registered.fetch_add(1, Ordering::Relaxed);
                Some(id)
            }
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                if !self.off.swap(true, Ordering::Relaxed) {
                    log::warn!(
                        "FUSE passthrough off: the kernel refused a backing file ({e}; it \
                         needs CAP_SYS_ADMIN); serving every read and write"
                    );
                }
                None
            }
            Err(e) => {
                log::debug!("no passthrough for one file: {e}");
                None
            }
        }
    }

    /// Unregisters `id` (after the last release of the files opened with it).
    pub fn unregister(&self, id: BackingId) {
        if let Some(dev) = self.dev.get() {
            if let Err(e) = close(std::os::fd::AsFd::as_fd(dev), id) {
                log::warn!("closing passthrough backing id {}: {e}", id.0);
            }
        }
    }

    /// Counts an open answered with `FOPEN_PASSTHROUGH`.
    pub fn count_open(&self) {
        self.passed
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// What it did so far.
    pub fn stats(&self) -> PassthroughStats {
        use std::sync::atomic::Ordering;
        PassthroughStats {
            enabled: self.is_on(),
            registered: self.registered.load(Ordering::Relaxed),
            opens: self.passed.load(Ordering::Relaxed),
        }
    }
}

/// One inode's mode, as the kernel's inode I/O modes require: while any passthrough open
/// of it may exist, every open of it names the same backing id; while other opens exist,
/// none does. Counts its opens of each kind until their RELEASE.
#[derive(Debug, Default)]
pub struct Inode {
    state: std::sync::Mutex<InodeState>,
}

#[derive(Debug, Default)]
struct InodeState {
    id: Option<BackingId>,
    passthrough: u32,
    other: u32,
}

/// How one open of an inode is answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `FOPEN_PASSTHROUGH` with this id (the caller may add `FOPEN_DIRECT_IO` to keep
    /// the open's reads and writes on the server).
    Passthrough(BackingId),
    /// No passthrough: served by the server as without it.
    Served,
}

impl Inode {
    /// Decides an open: `want` says whether this open should be in the passthrough
    /// family (an id with it); `register` makes the inode's id when it has none. An
    /// inode that has passthrough opens gets them whatever `want` says; one that has
    /// other opens gets none. Pair every call with [`release`](Self::release).
    pub fn open(&self, want: bool, register: impl FnOnce() -> Option<BackingId>) -> Mode {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let mode = match (s.id, s.other) {
            (Some(id), _) => Mode::Passthrough(id),
            (None, 0) if want => register().map_or(Mode::Served, Mode::Passthrough),
            (None, _) => Mode::Served,
        };
        match mode {
            Mode::Passthrough(id) => {
                s.id = Some(id);
                s.passthrough += 1;
            }
            Mode::Served => s.other += 1,
        }
        mode
    }

    /// An open decided by [`open`](Self::open) was released (or its reply never sent):
    /// returns the id to unregister when it was the last passthrough open.
    pub fn release(&self, mode: Mode) -> Option<BackingId> {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match mode {
            Mode::Passthrough(_) => {
                s.passthrough = s.passthrough.saturating_sub(1);
                if s.passthrough == 0 {
                    return s.id.take();
                }
                None
            }
            Mode::Served => {
                s.other = s.other.saturating_sub(1);
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_inode_keeps_one_mode_while_opens_of_it_live() {
        let inode = Inode::default();
        let mut made = 0;
        let mut register = || {
            made += 1;
            Some(BackingId(7))
        };
        let a = inode.open(true, &mut register);
        assert_eq!(a, Mode::Passthrough(BackingId(7)));
        let b = inode.open(false, || panic!("already registered"));
        assert_eq!(
            b,
            Mode::Passthrough(BackingId(7)),
            "the same id, wanted or not"
        );
        assert_eq!(inode.release(a), None);
        assert_eq!(
            inode.release(b),
            Some(BackingId(7)),
            "the last one closes it"
        );
        let c = inode.open(false, || panic!("not wanted"));
        assert_eq!(c, Mode::Served);
        let d = inode.open(true, || panic!("a served open is live"));
        assert_eq!(d, Mode::Served, "no passthrough beside a served open");
        assert_eq!(inode.release(c), None);
        assert_eq!(inode.release(d), None);
        assert_eq!(
            inode.open(true, &mut register),
            Mode::Passthrough(BackingId(7))
        );
        assert_eq!(made, 2);
    }

    #[test]
    fn a_refused_registration_is_served() {
        let inode = Inode::default();
        let m = inode.open(true, || None);
        assert_eq!(m, Mode::Served);
        assert_eq!(inode.open(true, || Some(BackingId(1))), Mode::Served);
    }

    #[test]
    fn a_session_not_granted_registers_nothing() {
        let session = Session::default();
        let null = std::fs::File::open("/dev/null").unwrap();
        session.start(false, std::os::fd::AsFd::as_fd(&null));
        assert!(!session.is_on());
        assert_eq!(session.register(std::os::fd::AsFd::as_fd(&null)), None);
        assert_eq!(session.stats(), PassthroughStats::default());
    }
}
