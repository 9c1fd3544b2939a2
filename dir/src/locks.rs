//! File locks passed through to the source: POSIX record locks (`fcntl` F_SETLK and
//! friends, classic or OFD) and BSD `flock(2)` locks taken through the mount are taken on
//! the source file, so a process locking through the mount and one locking on the source
//! directly see each other, as virtiofsd does it.
//!
//! How: the kernel names each lock's owner (`lk_owner`: the locking process's file table
//! for classic POSIX locks, the open file for OFD locks and flock). Each (node, owner,
//! kind) gets an open file description of its own on the source file, and the lock is
//! taken on it, as an OFD lock (`F_OFD_SETLK`, Linux 3.15) or with `flock(2)`: locks of
//! one owner merge and replace each other as the client expects, locks of different
//! owners conflict, and OFD locks conflict with the classic POSIX locks a process on the
//! source takes (flock locks with flock locks). The description closes, and its locks
//! go, when the owner lets go: FLUSH carries the POSIX owner at each close(2) (POSIX
//! drops a process's locks on a file at any close of it), RELEASE the flock owner when
//! the kernel sets FUSE_RELEASE_FLOCK_UNLOCK. An OFD lock taken through the mount is owned
//! by the client's open file, which neither FLUSH nor RELEASE names (the kernel keeps no
//! list of remote locks to undo at close): its description remembers the file handle it
//! was taken through, and goes at that handle's RELEASE, which comes once the client's
//! open file is closed for good.
//!
//! A blocking request (SETLKW, flock without LOCK_NB) never blocks the loop: it retries
//! the non-blocking lock with a growing pause (1 ms doubling to 32 ms, through
//! [`Ctx::sleep`]: a coroutine suspends, a worker thread sleeps), and ends with EINTR when
//! the kernel sends INTERRUPT for it (the client got a signal). The price of not queueing
//! in the kernel: no fairness among waiters, and up to 32 ms between the release and the
//! wakeup.

use std::collections::{HashMap, HashSet};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use fuse::abi::{fuse_file_lock, fuse_lk_in, FUSE_LK_FLOCK};
use runtime::Ctx;

use crate::inodes::Inode;
use crate::sys;

/// `OFFSET_MAX`: the kernel's "to the end of the file" in `fuse_file_lock::end`.
const TO_END: u64 = i64::MAX as u64;
/// The first and the longest pause of a blocking lock's retries.
const FIRST_PAUSE: Duration = Duration::from_millis(1);
const LONGEST_PAUSE: Duration = Duration::from_millis(32);
/// INTERRUPTs remembered for requests not (or no longer) waiting, at most.
const MAX_INTERRUPTS: usize = 1024;

/// Which kind of lock an owner holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Kind {
    Posix,
    Flock,
}

type Key = (u64, u64, Kind);

/// The lock owners' open file descriptions, and the interrupted waits.
#[derive(Default)]
pub struct Locks {
    /// Each owner's description, and the file handle its lock was last taken through.
    owners: Mutex<HashMap<Key, (Arc<OwnedFd>, u64)>>,
    /// `unique` of each request the kernel interrupted.
    interrupted: Mutex<HashSet<u64>>,
}

fn errno(e: i32) -> io::Error {
    io::Error::from_raw_os_error(e)
}

impl Locks {
    fn owners(&self) -> MutexGuard<'_, HashMap<Key, (Arc<OwnedFd>, u64)>> {
        self.owners.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The description `key` locks through (now through handle `fh`), opened on
    /// `inode`'s file if it has none.
    fn description(&self, key: Key, fh: u64, inode: &Inode) -> io::Result<Arc<OwnedFd>> {
        if let Some((fd, through)) = self.owners().get_mut(&key) {
            *through = fh;
            return Ok(Arc::clone(fd));
        }
        let node = inode.handle()?;
        // A write lock needs a description open for writing, a read lock one for reading;
        // the daemon opens for both where it may (the kernel has checked the client's
        // own open mode).
        let fd = [libc::O_RDWR, libc::O_RDONLY, libc::O_WRONLY]
            .into_iter()
            .map(|mode| sys::reopen(node.as_fd(), mode | libc::O_NOCTTY))
            .find_map(Result::ok);
        let fd = Arc::new(fd.ok_or_else(|| errno(libc::EBADF))?);
        Ok(Arc::clone(&self.owners().entry(key).or_insert((fd, fh)).0))
    }

    /// GETLK: the first lock that would conflict with `arg.lk` (type F_UNLCK if none).
    pub fn getlk(
        &self,
        nodeid: u64,
        inode: &Inode,
        arg: &fuse_lk_in,
    ) -> io::Result<fuse_file_lock> {
        let fd = self.description((nodeid, arg.owner, Kind::Posix), arg.fh, inode)?;
        let mut lock = to_flock(&arg.lk)?;
        sys::ofd_lock(fd.as_fd(), libc::F_OFD_GETLK, &mut lock)?;
        Ok(from_flock(&lock))
    }

    /// SETLK, or SETLKW with `wait` (request `unique`): takes, changes or drops the lock.
    pub fn setlk(
        &self,
        cx: &Ctx<'_>,
        unique: u64,
        nodeid: u64,
        inode: &Inode,
        arg: &fuse_lk_in,
        wait: bool,
    ) -> io::Result<()> {
        let kind = match arg.lk_flags & FUSE_LK_FLOCK {
            0 => Kind::Posix,
            _ => Kind::Flock,
        };
        let key = (nodeid, arg.owner, kind);
        if arg.lk.r#type == libc::F_UNLCK as u32 && !self.owners().contains_key(&key) {
            return Ok(()); // nothing held
        }
        let fd = self.description(key, arg.fh, inode)?;
        let try_once = || -> io::Result<()> {
            match kind {
                Kind::Posix => {
                    let mut lock = to_flock(&arg.lk)?;
                    sys::ofd_lock(fd.as_fd(), libc::F_OFD_SETLK, &mut lock)
                }
                Kind::Flock => {
                    let op = match arg.lk.r#type as i32 {
                        libc::F_RDLCK => libc::LOCK_SH,
                        libc::F_WRLCK => libc::LOCK_EX,
                        libc::F_UNLCK => libc::LOCK_UN,
                        _ => return Err(errno(libc::EINVAL)),
                    };
                    sys::flock(fd.as_fd(), op | libc::LOCK_NB)
                }
            }
        };
        let mut pause = FIRST_PAUSE;
        loop {
            match try_once() {
                Err(e) if wait && is_busy(&e) => {}
                // A flock that would block answers EWOULDBLOCK, as flock(2) does; a POSIX
                // one EAGAIN, as fcntl(2) does (the same value on Linux).
                done => {
                    self.interrupted().remove(&unique);
                    return done;
                }
            }
            if self.interrupted().remove(&unique) {
                return Err(errno(libc::EINTR));
            }
            cx.sleep(pause)?;
            pause = (pause * 2).min(LONGEST_PAUSE);
        }
    }

    fn interrupted(&self) -> MutexGuard<'_, HashSet<u64>> {
        self.interrupted.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// INTERRUPT of request `unique`: a lock it waits for ends with EINTR. (Requests of
    /// other kinds finish soon enough by themselves: the interrupt is only remembered.)
    pub fn interrupt(&self, unique: u64) {
        let mut interrupted = self.interrupted();
        if interrupted.len() >= MAX_INTERRUPTS {
            interrupted.clear(); // for requests long answered
        }
        interrupted.insert(unique);
    }

    /// FLUSH (a close(2) by `owner`): its POSIX locks on the node go.
    pub fn flush(&self, nodeid: u64, owner: u64) {
        self.owners().remove(&(nodeid, owner, Kind::Posix));
    }

    /// RELEASE of handle `fh`, with the flock owner where the kernel names one
    /// (FUSE_RELEASE_FLOCK_UNLOCK): that owner's flock lock goes, and so do the locks
    /// last taken through `fh` (OFD locks, owned by the client's open file).
    pub fn release(&self, nodeid: u64, fh: u64, flock_owner: Option<u64>) {
        let mut owners = self.owners();
        if let Some(owner) = flock_owner {
            owners.remove(&(nodeid, owner, Kind::Flock));
        }
        if !owners.is_empty() {
            owners.retain(|&(node, _, _), &mut (_, through)| node != nodeid || through != fh);
        }
    }
}

/// Whether a non-blocking lock failed only because another holds a conflicting one.
fn is_busy(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EACCES))
}

/// The kernel's lock range (`end` inclusive, [`TO_END`]) as a `struct flock`.
fn to_flock(lk: &fuse_file_lock) -> io::Result<libc::flock> {
    let start = libc::off_t::try_from(lk.start).map_err(|_| errno(libc::EINVAL))?;
    let len = match lk.end {
        TO_END => 0,
        end if end >= lk.start => {
            libc::off_t::try_from(end - lk.start + 1).map_err(|_| errno(libc::EINVAL))?
        }
        _ => return Err(errno(libc::EINVAL)),
    };
    Ok(libc::flock {
        l_type: lk.r#type as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: start,
        l_len: len,
        l_pid: 0, // OFD commands require 0
    })
}

/// A `struct flock` that GETLK filled in, as the kernel's lock range. An OFD lock has no
/// process (`l_pid` -1): the kernel then reports none.
fn from_flock(lock: &libc::flock) -> fuse_file_lock {
    let start = lock.l_start.max(0) as u64;
    fuse_file_lock {
        start,
        end: match lock.l_len {
            0 => TO_END,
            len => start + len as u64 - 1,
        },
        r#type: lock.l_type as u32,
        pid: u32::try_from(lock.l_pid).unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_ranges_convert_both_ways() {
        let lk = fuse_file_lock {
            start: 100,
            end: 199,
            r#type: libc::F_WRLCK as u32,
            pid: 0,
        };
        let fl = to_flock(&lk).unwrap();
        assert_eq!((fl.l_start, fl.l_len), (100, 100));
        assert_eq!(from_flock(&fl).end, 199);
        let whole = fuse_file_lock { end: TO_END, ..lk };
        assert_eq!(to_flock(&whole).unwrap().l_len, 0);
        assert_eq!(from_flock(&to_flock(&whole).unwrap()).end, TO_END);
        let backwards = fuse_file_lock { end: 50, ..lk };
        assert_eq!(
            to_flock(&backwards).unwrap_err().raw_os_error(),
            Some(libc::EINVAL)
        );
        let ofd = libc::flock { l_pid: -1, ..fl };
        assert_eq!(from_flock(&ofd).pid, 0);
    }
}
