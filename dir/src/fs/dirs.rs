//! Directories: OPENDIR, READDIR, READDIRPLUS and FSYNCDIR (RELEASEDIR goes with RELEASE,
//! [`super::open`]). Each open directory is one [`crate::dirstream`], linear however the
//! kernel splits the listing; what listings cost is counted per request and summed into
//! the stats.
//!
//! Rules kept here:
//! - READDIRPLUS looks every entry up (one lookup counted, undone if the entry does not
//!   fit); `.` and `..` go without attributes (node id 0: the kernel counts no lookup for
//!   them), and so does an entry whose lookup finds no descriptor left. An entry gone
//!   since it was listed is left out.

use fuse::abi::*;
use fuse::reply::{Pushed, ReaddirBuf, ReaddirPlusBuf};
use fuse::{Errno, Reply, Request};
use runtime::Ctx;
use zerocopy::FromZeros;

use super::{errno, status, Answer, DirFs, Scratch};
use crate::handles::Open;

impl DirFs {
    /// OPENDIR: the directory's stream, registered as a handle.
    pub(super) fn opendir<'b>(&self, req: &Request<'_>, s: &'b mut Scratch) -> Answer<'b> {
        let stream = self.tree.opendir(req.nodeid).map_err(errno)?;
        s.open = FromZeros::new_zeroed();
        s.open.fh = self
            .handles
            .insert(Open::Dir(std::sync::Mutex::new(stream)));
        Ok(Reply::arg(req.unique, &s.open))
    }

    /// Runs a READDIR or READDIRPLUS, counting it and its time in the listing stats.
    pub(super) fn timed<T>(&self, f: impl FnOnce() -> T) -> T {
        let started = std::time::Instant::now();
        let answer = f();
        let mut l = self.listing();
        l.requests += 1;
        l.request_ns += started.elapsed().as_nanos() as u64;
        answer
    }

    /// READDIR and READDIRPLUS from the open directory `fh`, from `arg.offset` on.
    pub(super) fn readdir<'b>(
        &self,
        req: &Request<'_>,
        arg: &fuse_read_in,
        plus: bool,
        data: &'b mut [u8],
    ) -> Answer<'b> {
        let open = self.handles.get(arg.fh).ok_or(Errno::EBADF)?;
        let Open::Dir(stream) = &*open else {
            return Err(Errno::EBADF);
        };
        let mut stream = stream.lock().unwrap_or_else(|e| e.into_inner());
        if !plus {
            let mut list = ReaddirBuf::new(data, arg.size);
            stream
                .read(arg.offset, |e| {
                    !matches!(
                        list.push(e.ino, e.next, u32::from(e.kind), e.name),
                        Pushed::Full
                    )
                })
                .map_err(errno)?;
            return Ok(list.reply(req.unique));
        }
        let dir = self.tree.node(req.nodeid).map_err(errno)?;
        let mut list = ReaddirPlusBuf::new(data, arg.size);
        let mut out = fuse_entry_out::new_zeroed();
        let mut failed = None;
        stream
            .read(arg.offset, |e| {
                let counted = if e.is_dot() {
                    out = without_attributes(e);
                    None
                } else {
                    match self.tree.inodes.lookup(req.nodeid, &dir, e.cname) {
                        Ok(found) => {
                            self.fill_entry(&mut out, &found);
                            Some(found.nodeid)
                        }
                        // Gone since it was listed: leave it out.
                        Err(err) if err.raw_os_error() == Some(libc::ENOENT) => return true,
                        // Out of descriptors (a node each): list it without attributes,
                        // as for `.`; a later LOOKUP of it reports the error.
                        Err(err)
                            if matches!(err.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) =>
                        {
                            out = without_attributes(e);
                            None
                        }
                        Err(err) => {
                            failed = Some(err);
                            return false;
                        }
                    }
                };
                match list.push(&out, e.next, e.name) {
                    Pushed::Full => {
                        // The kernel will not see this entry: its lookup did not happen.
                        if let Some(nodeid) = counted {
                            self.tree.inodes.forget(nodeid, 1);
                        }
                        false
                    }
                    Pushed::Added | Pushed::BadName => true,
                }
            })
            .map_err(errno)?;
        match failed {
            Some(err) if list.is_empty() => Err(errno(err)),
            _ => Ok(list.reply(req.unique)),
        }
    }

    /// FSYNCDIR of an open directory.
    pub(super) fn fsyncdir<'b>(
        &self,
        cx: &Ctx<'_>,
        unique: u64,
        arg: &fuse_fsync_in,
    ) -> Answer<'b> {
        let open = self.handles.get(arg.fh);
        let Some(Open::Dir(stream)) = open.as_deref() else {
            return Err(Errno::EBADF);
        };
        let stream = stream.lock().unwrap_or_else(|e| e.into_inner());
        status(unique, cx.fsync(&stream.fd()))
    }
}

/// A READDIRPLUS entry that gives the kernel no node (id 0), only the inode number and
/// type: it counts no lookup and looks the name up itself when it needs it.
fn without_attributes(e: &crate::dirstream::DirEntry<'_>) -> fuse_entry_out {
    let mut out = fuse_entry_out::new_zeroed();
    (out.attr.ino, out.attr.mode) = (e.ino, u32::from(e.kind) << 12);
    out
}
