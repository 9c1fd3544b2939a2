//! Notifications: messages the server writes to the kernel unasked, on any /dev/fuse fd
//! of the connection (a `fuse_out_header` with `unique` 0 and the notification's code in
//! `error`, then its argument). They still go through /dev/fuse with FUSE over io_uring.
//!
//! Only what a passthrough server needs so far: [`inval_attrs`], for a change the kernel
//! did not see go through it (a file changed under it on the source, privilege bits the
//! server cleared itself) and would otherwise keep showing from its attribute cache until
//! the timeout. Nothing here allocates: the message is built on the stack.

use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, BorrowedFd};

use zerocopy::IntoBytes;

use crate::abi::{fuse_notify_inval_inode_out, fuse_out_header, FUSE_NOTIFY_INVAL_INODE};
use crate::sys::cvt;

/// FUSE_NOTIFY_INVAL_INODE with no page range: the kernel drops the cached attributes of
/// node `nodeid` (and its cached ACLs), so that the next `stat` asks the server again;
/// its cached pages stay. A node the kernel does not hold answers ENOENT, which is
/// taken as done (nothing is cached). The kernel takes no inode lock for it, so a
/// server may send it while it answers a request on that node.
pub fn inval_attrs(dev: BorrowedFd<'_>, nodeid: u64) -> io::Result<()> {
    let arg = fuse_notify_inval_inode_out {
        ino: nodeid,
        off: -1,
        len: 0,
    };
    let header = fuse_out_header {
        len: (size_of::<fuse_out_header>() + size_of::<fuse_notify_inval_inode_out>()) as u32,
        error: FUSE_NOTIFY_INVAL_INODE,
        unique: 0,
    };
    let iov = [
        IoSlice::new(header.as_bytes()),
        IoSlice::new(arg.as_bytes()),
    ];
    // SAFETY: writev reads the two live local buffers the iovecs describe; the fd is open
    // for the whole call.
    let written = cvt(unsafe {
        libc::writev(
            dev.as_raw_fd(),
            iov.as_ptr().cast::<libc::iovec>(),
            iov.len() as libc::c_int,
        )
    });
    match written {
        Ok(_) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        Err(e) => Err(e),
    }
}
