//! The FUSE kernel protocol and its syscalls, without libfuse and without an
//! async runtime.
//!
//! This crate is pure protocol plus blocking syscalls, so that several
//! transports (a coroutine loop over io_uring, blocking threads, FUSE over
//! io_uring: the `transport` crate) and any file system served over them can
//! share it. It starts no threads, never allocates on the decode/reply path,
//! and never panics on what the kernel sends. It depends on neither the
//! runtime nor a backend: only libc, log and zerocopy.
//!
//! ```
//! use fuse::abi::{fuse_in_header, fuse_read_in, FUSE_READ};
//! use fuse::{Operation, Reply, Request};
//! use zerocopy::IntoBytes;
//!
//! // A READ of 4 KiB at 4096, as a read of /dev/fuse would deliver it,
//! // in an 8-byte aligned buffer.
//! let header = fuse_in_header {
//!     len: 80, opcode: FUSE_READ, unique: 42, nodeid: 1,
//!     uid: 0, gid: 0, pid: 1, total_extlen: 0, padding: 0,
//! };
//! let arg = fuse_read_in {
//!     fh: 0, offset: 4096, size: 4096, read_flags: 0, lock_owner: 0, flags: 0, padding: 0,
//! };
//! let mut buf = [0u64; 10];
//! buf.as_mut_bytes()[..40].copy_from_slice(header.as_bytes());
//! buf.as_mut_bytes()[40..].copy_from_slice(arg.as_bytes());
//!
//! let req = Request::decode(buf.as_bytes(), &[]).unwrap();
//! println!("{req}");
//! let Operation::Read { arg } = req.op else { unreachable!() };
//! let data = vec![0xA5; arg.size as usize];
//! let reply = Reply::data(req.unique, &data);
//! assert_eq!(reply.io_slices().len(), 2); // header + data, no copy
//! assert_eq!(reply.header().len, 16 + 4096);
//! # assert_eq!(req.to_string(), "FUSE(  42) READ fh=0 off=4096 len=4096");
//! ```
//!
//! prints `FUSE(  42) READ fh=0 off=4096 len=4096`.
//!
//! # Modules, in the order a server uses them
//!
//! - [`mount`]: check the mountpoint, mount (mount(2) as root, fusermount3
//!   otherwise), unmount on drop.
//! - [`dev`]: open /dev/fuse, clone queues, read requests, write replies.
//! - [`decode`] / [`request`]: bytes to [`Request`] with an [`Operation`];
//!   [`kind`]: what each operation is ([`OpKind`]: reply or not, data buffer or not...).
//! - [`init`]: INIT negotiation and the buffer sizes it implies.
//! - [`reply`] / [`errno`]: replies as iovecs, directory listings packed in
//!   place ([`reply::ReaddirBuf`]), errors as [`Errno`].
//! - [`abi`]: the kernel structs and constants (ABI 7.45).
//! - [`session`]: the INIT handshake of a mount, on the session fd.
//! - [`backing`]: FUSE passthrough's backing files (register, unregister).
//! - [`notify`]: notifications the server sends unasked (attributes invalidated).
//!
//! A minimal blocking server loop:
//!
//! ```no_run
//! use fuse::{dev::{split_read, Received}, init, mount, reply, Operation, Reply, Request, Errno};
//! # fn main() -> std::io::Result<()> {
//! let (dev, guard) = mount::mount("/tmp/mountpoint".as_ref(), &Default::default())?;
//! let config = init::InitConfig::new().with_system_limits();
//! let mut head = vec![0u64; init::RECOMMENDED_HEAD_SIZE / 8];
//! let mut tail = vec![0u8; init::tail_size(init::RECOMMENDED_HEAD_SIZE, config.max_write)];
//! loop {
//!     use zerocopy::IntoBytes;
//!     let n = match dev.read_split(head.as_mut_bytes(), &mut tail)? {
//!         Received::Request(n) => n,
//!         Received::Retry => continue,
//!         Received::Unmounted => break,
//!     };
//!     let (h, t) = split_read(head.as_bytes(), &tail, n);
//!     let Ok(req) = Request::decode(h, t) else { continue };
//!     log::debug!("{req}");
//!     let _ = match req.op {
//!         Operation::Init { arg } => reply::send(&dev, &init::negotiate(&arg, &config).reply(req.unique))?,
//!         _ if !req.expects_reply() => continue,
//!         _ => reply::send(&dev, &Reply::error(req.unique, Errno::ENOSYS))?,
//!     };
//! }
//! drop(guard);
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

pub mod abi;
pub mod backing;
pub mod decode;
pub mod dev;
pub mod display;
pub mod errno;
pub mod flags;
pub mod init;
pub mod kind;
pub mod mount;
pub mod mountinfo;
pub mod notify;
pub mod reply;
pub mod request;
pub mod session;
mod sys;

pub use decode::{DecodeError, Features};
pub use errno::Errno;
pub use kind::{Family, OpKind};
pub use reply::{Reply, Sent};
pub use request::{Operation, Request, WriteData};
