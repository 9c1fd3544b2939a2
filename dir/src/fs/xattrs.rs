//! Extended attributes: GETXATTR, LISTXATTR and SETXATTR (REMOVEXATTR is one line in the
//! dispatch table, on [`Tree::removexattr`](crate::tree::Tree::removexattr)).
//!
//! Rules of the source kept here:
//! - A GETXATTR or LISTXATTR value goes in the transport's data buffer, which it hands
//!   over only for requests that fit its small-request area; a longer one gets ERANGE.
//! - LISTXATTR shows `trusted.*` names to callers with CAP_SYS_ADMIN only, as the
//!   source's own file system lists them.
//! - SETXATTR and REMOVEXATTR run with the caller's credentials where the daemon takes
//!   them on (the dispatch table, [`crate::creds`]), so the source's own checks decide; a
//!   SETXATTR value split between the request's head and tail is refused (E2BIG) rather
//!   than copied.

use std::ffi::CStr;
use std::io;

use fuse::abi::*;
use fuse::{Errno, Reply, Request};

use super::{errno, status, Answer, DirFs, Scratch};
use crate::caller;

impl DirFs {
    /// GETXATTR and LISTXATTR: the size when asked with size 0, else the value.
    pub(super) fn xattr<'b>(
        &self,
        unique: u64,
        size: u32,
        s: &'b mut Scratch,
        data: &'b mut [u8],
        get: impl FnOnce(&mut [u8]) -> io::Result<usize>,
    ) -> Answer<'b> {
        if size == 0 {
            let n = get(&mut []).map_err(errno)?;
            return Ok(Reply::xattr_size(unique, n, &mut s.xattr));
        }
        let len = size as usize;
        if len > data.len() {
            return Err(Errno::ERANGE);
        }
        let n = get(&mut data[..len]).map_err(errno)?;
        Ok(Reply::xattr_value(unique, size, &data[..n]))
    }

    /// LISTXATTR. `trusted.*` names are for callers with CAP_SYS_ADMIN only, as the
    /// source's own file system lists them ([`caller::has_capability`]); for the others
    /// the list is read whole into `data` and those names are dropped, the size asked
    /// with size 0 included. A list too long for `data` answers an unfiltered size (an
    /// upper bound: the caller then asks again with room enough, and gets the filtered
    /// list).
    pub(super) fn listxattr<'b>(
        &self,
        req: &Request<'_>,
        size: u32,
        s: &'b mut Scratch,
        data: &'b mut [u8],
    ) -> Answer<'b> {
        let (unique, node) = (req.unique, req.nodeid);
        let list = |buf: &mut [u8]| self.tree.listxattr(node, buf);
        if caller::has_capability(req.uid, req.pid, caller::CAP_SYS_ADMIN) {
            return self.xattr(unique, size, s, data, list);
        }
        let n = match list(data) {
            Ok(n) => n,
            Err(e) if e.raw_os_error() == Some(libc::ERANGE) && size == 0 => {
                return self.xattr(unique, size, s, data, list);
            }
            Err(e) => return Err(errno(e)),
        };
        let kept = drop_names(&mut data[..n], |name| name.starts_with(b"trusted."));
        if size == 0 {
            return Ok(Reply::xattr_size(unique, kept, &mut s.xattr));
        }
        Ok(Reply::xattr_value(unique, size, &data[..kept]))
    }

    /// SETXATTR of a value that came whole in the request's buffer: every transport reads
    /// a request into one buffer, and a value split between head and tail would need a
    /// copy this server does not make (E2BIG).
    pub(super) fn setxattr<'b>(
        &self,
        req: &Request<'_>,
        arg: &fuse_setxattr_in,
        name: &CStr,
        value: fuse::WriteData<'_>,
    ) -> Answer<'b> {
        let (head, tail) = value.parts();
        if !tail.is_empty() {
            return Err(Errno::E2BIG);
        }
        let set = self.tree.setxattr(req.nodeid, name, head, arg.flags as i32);
        status(req.unique, set)
    }
}

/// Removes from a list of NUL-terminated names (as listxattr(2) gives it) those `hidden`
/// picks, in place, keeping the order; returns the new length.
fn drop_names(list: &mut [u8], hidden: impl Fn(&[u8]) -> bool) -> usize {
    let (mut read, mut kept) = (0, 0);
    while read < list.len() {
        let end = list[read..]
            .iter()
            .position(|&b| b == 0)
            .map_or(list.len(), |i| read + i + 1);
        if !hidden(&list[read..end]) {
            list.copy_within(read..end, kept);
            kept += end - read;
        }
        read = end;
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::drop_names;

    #[test]
    fn drop_names_keeps_the_others_in_order() {
        let trusted = |name: &[u8]| name.starts_with(b"trusted.");
        let mut list = *b"user.a\0trusted.b\0security.c\0trusted.d\0user.e\0";
        let n = drop_names(&mut list, trusted);
        assert_eq!(&list[..n], b"user.a\0security.c\0user.e\0");
        let mut only = *b"trusted.x\0";
        assert_eq!(drop_names(&mut only, trusted), 0);
        assert_eq!(drop_names(&mut [], trusted), 0);
        let mut unterminated = *b"user.a\0trusted.b";
        let n = drop_names(&mut unterminated, trusted);
        assert_eq!(&unterminated[..n], b"user.a\0");
    }
}
