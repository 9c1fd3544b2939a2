//! File locks: GETLK, SETLK and SETLKW, POSIX and flock (FUSE_POSIX_LOCKS,
//! FUSE_FLOCK_LOCKS), taken on the source file per lock owner ([`crate::locks`]).
//!
//! Rules of the source kept here:
//! - A lock the kernel asks for is taken on the source file, so the source's other users
//!   see it; a blocking one (SETLKW) waits without stopping the loop, and ends on
//!   INTERRUPT (one line in the dispatch table).
//! - FLUSH lets go of the closing owner's POSIX locks and answers at once (one line in the
//!   dispatch table; the source's own close semantics apply at RELEASE, which lets go of
//!   the rest: [`super::open`]).

use fuse::abi::*;
use fuse::{Reply, Request};
use runtime::Ctx;

use super::{errno, status, Answer, DirFs, Scratch};

impl DirFs {
    /// GETLK: the lock that would conflict on the source ([`crate::locks`]).
    pub(super) fn getlk<'b>(
        &self,
        req: &Request<'_>,
        arg: &fuse_lk_in,
        s: &'b mut Scratch,
    ) -> Answer<'b> {
        let inode = self.tree.node(req.nodeid).map_err(errno)?;
        let lk = self.locks.getlk(req.nodeid, &inode, arg).map_err(errno)?;
        s.lk = fuse_lk_out { lk };
        Ok(Reply::arg(req.unique, &s.lk))
    }

    /// SETLK, or SETLKW with `wait`: the lock taken, changed or dropped on the source.
    pub(super) fn setlk<'b>(
        &self,
        cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_lk_in,
        wait: bool,
    ) -> Answer<'b> {
        let (unique, node) = (req.unique, req.nodeid);
        let inode = self.tree.node(node).map_err(errno)?;
        status(
            unique,
            self.locks.setlk(cx, unique, node, &inode, arg, wait),
        )
    }
}
