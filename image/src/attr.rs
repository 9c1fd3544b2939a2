//! The exported file's attributes: size and blocks from the backend, the rest in memory.
//!
//! Mode, owner and times are not stored in the image; like QEMU we keep them in memory for
//! the life of the export. The file starts owner-only (`0600`, `0400` read-only) whether or
//! not other users may reach the mount, as in QEMU: an image is the whole disk of a VM,
//! and a root daemon with `--allow-other` must not hand it to every local user. QEMU's
//! rules for changing them:
//! - the file type is always a regular file; only the permission bits change;
//! - without `allow_other`, nobody but the owner can reach the file, so group and other
//!   bits are refused (`EPERM`), and so is a change of owner (`EOPNOTSUPP`);
//! - a read-only export cannot be given write bits (`EROFS`).
//!
//! Unlike QEMU, times may be set (so `touch` works), a read-only export refuses a size
//! change with `EROFS` rather than `EACCES`, and only a growable export can be truncated
//! to a larger size (`EFBIG` otherwise; shrinking needs only a writable export).

use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use zerocopy::FromZeros;

use crate::ExportOptions;
use fuse::abi::*;
use fuse::Errno;

/// How long the kernel may cache attributes. Every change goes through us and returns
/// fresh attributes, so only `st_blocks` can lag behind by this much.
const ATTR_VALID_SECS: u64 = 1;

/// Preferred I/O size reported in `st_blksize`.
const BLKSIZE: u32 = 4096;

#[derive(Clone, Copy)]
struct Time {
    secs: u64,
    nsecs: u32,
}

impl Time {
    fn now() -> Time {
        let d = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        Time {
            secs: d.as_secs(),
            nsecs: d.subsec_nanos(),
        }
    }
}

#[derive(Clone, Copy)]
struct State {
    mode: u32,
    uid: u32,
    gid: u32,
    atime: Time,
    mtime: Time,
    ctime: Time,
}

/// The in-memory attributes of the export.
pub struct Attributes {
    state: Mutex<State>,
    allow_other: bool,
    writable: bool,
    growable: bool,
}

impl Attributes {
    /// Owner: the user running the export. Mode: `0400`, `0600` when writable, with or
    /// without `allow_other` (as QEMU): the mount has `default_permissions`, so the kernel
    /// keeps everyone else out until the owner grants access through the mount (chmod,
    /// chown, which `allow_other` permits).
    pub fn new(options: &ExportOptions) -> Attributes {
        let perm = if options.writable { 0o600 } else { 0o400 };
        let now = Time::now();
        // SAFETY: getuid(2) and getgid(2) cannot fail and touch no memory.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        Attributes {
            state: Mutex::new(State {
                mode: libc::S_IFREG | perm,
                uid,
                gid,
                atime: now,
                mtime: now,
                ctime: now,
            }),
            allow_other: options.allow_other,
            writable: options.writable,
            growable: options.growable,
        }
    }

    fn state(&self) -> State {
        *self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The reply to GETATTR (and SETATTR) for an image of `size` bytes.
    pub fn attr_out(&self, size: u64, allocated: u64) -> fuse_attr_out {
        let s = self.state();
        let mut out: fuse_attr_out = FromZeros::new_zeroed();
        out.attr_valid = ATTR_VALID_SECS;
        out.attr = fuse_attr {
            ino: FUSE_ROOT_ID,
            size,
            blocks: allocated.div_ceil(512),
            atime: s.atime.secs,
            mtime: s.mtime.secs,
            ctime: s.ctime.secs,
            atimensec: s.atime.nsecs,
            mtimensec: s.mtime.nsecs,
            ctimensec: s.ctime.nsecs,
            mode: s.mode,
            nlink: 1,
            uid: s.uid,
            gid: s.gid,
            rdev: 0,
            blksize: BLKSIZE,
            flags: 0,
        };
        out
    }

    /// Checks a SETATTR against the rules before anything changes.
    pub fn check(&self, arg: &fuse_setattr_in) -> Result<(), Errno> {
        const IGNORED: u32 = FATTR_FH | FATTR_LOCKOWNER | FATTR_KILL_SUIDGID;
        const TIMES: u32 =
            FATTR_ATIME | FATTR_MTIME | FATTR_CTIME | FATTR_ATIME_NOW | FATTR_MTIME_NOW;
        let mut supported = FATTR_MODE | FATTR_SIZE | TIMES | IGNORED;
        if self.allow_other {
            supported |= FATTR_UID | FATTR_GID;
        }
        if arg.valid & !supported != 0 {
            return Err(Errno::EOPNOTSUPP);
        }
        if arg.valid & FATTR_MODE != 0 {
            if !self.allow_other && arg.mode & 0o077 != 0 {
                return Err(Errno::EPERM);
            }
            if !self.writable && arg.mode & 0o222 != 0 {
                return Err(Errno::EROFS);
            }
        }
        if arg.valid & FATTR_SIZE != 0 && !self.writable {
            return Err(Errno::EROFS);
        }
        Ok(())
    }

    /// Checks a size change against the current size: growing needs a growable export.
    pub fn check_size(&self, arg: &fuse_setattr_in, len: u64) -> Result<(), Errno> {
        if arg.valid & FATTR_SIZE != 0 && arg.size > len && !self.growable {
            return Err(Errno::EFBIG);
        }
        Ok(())
    }

    /// Applies the in-memory part of a checked SETATTR (everything but the size).
    pub fn apply(&self, arg: &fuse_setattr_in) {
        let now = Time::now();
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let v = arg.valid;
        if v & FATTR_MODE != 0 {
            s.mode = libc::S_IFREG | (arg.mode & 0o7777);
        }
        if v & FATTR_UID != 0 {
            s.uid = arg.uid;
        }
        if v & FATTR_GID != 0 {
            s.gid = arg.gid;
        }
        let given = |secs, nsecs| Time { secs, nsecs };
        if v & FATTR_ATIME_NOW != 0 {
            s.atime = now;
        } else if v & FATTR_ATIME != 0 {
            s.atime = given(arg.atime, arg.atimensec);
        }
        if v & FATTR_MTIME_NOW != 0 {
            s.mtime = now;
        } else if v & FATTR_MTIME != 0 {
            s.mtime = given(arg.mtime, arg.mtimensec);
        }
        if v & FATTR_SIZE != 0 {
            s.mtime = now;
        }
        s.ctime = if v & FATTR_CTIME != 0 {
            given(arg.ctime, arg.ctimensec)
        } else {
            now
        };
    }
}
