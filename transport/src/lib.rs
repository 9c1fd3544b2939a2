//! corofuse's transports: how FUSE requests reach a [`FileSystem`] and how its replies go
//! back, and the per-request accounting of what that costs.
//!
//! Depends on the protocol crate (`fuse`: ABI, decoding, replies, INIT, /dev/fuse), the
//! coroutine runtime (`runtime`, which also gives the execution context a file system's
//! I/O runs in, [`runtime::Ctx`]); it knows no file system and no block backend: the image
//! export (`image_export::Export`) and any other implement [`FileSystem`].
//!
//! A *session* is one mount: its INIT handshake happens once, on the session fd, before
//! any queue starts (`fuse::session::handshake`). A *queue* is one /dev/fuse fd (the
//! session's, or a clone from `FUSE_DEV_IOC_CLONE`) served by one event loop; every queue
//! shares the file system. The transports: [`coroutine`] (requests read through the loop's
//! io_uring, one coroutine per request, or `inline` on the loop) and [`blocking`] (worker
//! threads, libfuse's model) and [`uring`] (FUSE over io_uring: per-CPU queues of ring
//! entries on the loop's own ring), all with the same [`FileSystem::handle`].
//!
//! Layout: [`service`] (the [`FileSystem`] seam), [`ops`] (its typed half: one method per
//! operation, [`Operations`], and the one match that calls them), [`dispatch`] (one request: decode,
//! handle, reply), [`buffers`] (request buffers whose WRITE data and READ replies are
//! page-aligned), [`backlog`] (requests read ahead, started one client at a time) and [`read_ahead`] (when to read ahead), [`coroutine`], [`blocking`] and [`uring`] (the transports; the one SQE
//! of the last in `uring_cmd`), [`placement`] (which of several /dev/fuse loops take
//! requests), [`accounting`] (per opcode: wait, I/O, CPU, switches, SQEs, syscalls).
#![warn(missing_docs)]

pub mod accounting;
pub mod backlog;
pub mod blocking;
pub mod buffers;
pub mod coroutine;
pub mod dispatch;
pub mod ops;
pub mod placement;
pub mod read_ahead;
pub mod service;
pub mod uring;
mod uring_cmd;

pub use accounting::OpReport;
pub use coroutine::{Queue, QueueConfig};
pub use dispatch::QueueStats;
pub use ops::{Answer, Operations};
pub use service::FileSystem;
