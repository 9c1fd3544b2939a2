//! Serving an [`Export`](crate::export::Export): the session handshake and the queues.
//!
//! A *session* is one mount: its INIT handshake happens once, on the session fd, before any
//! queue starts ([`session::handshake`]). A *queue* is one /dev/fuse fd (the session's, or a
//! clone from `FUSE_DEV_IOC_CLONE`) served by one event loop; every queue shares the
//! `Export`. Today there is one transport, [`coroutine`]: requests read through the
//! loop's io_uring, one coroutine per request. Blocking threads and FUSE over io_uring
//! plug in beside it, using the same handshake, buffers and `Export::handle`.

pub mod accounting;
pub mod blocking;
pub mod buffers;
pub mod coroutine;
pub mod dispatch;
pub mod session;

pub use coroutine::{Queue, QueueConfig};
pub use dispatch::QueueStats;
pub use session::handshake;
