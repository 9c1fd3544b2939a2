//! Serving a [`FileSystem`] (the image export, [`crate::export::Export`], is one): the
//! session handshake and the queues.
//!
//! A *session* is one mount: its INIT handshake happens once, on the session fd, before any
//! queue starts ([`session::handshake`]). A *queue* is one /dev/fuse fd (the session's, or a
//! clone from `FUSE_DEV_IOC_CLONE`) served by one event loop; every queue shares the
//! file system. The transports: [`coroutine`] (requests read through the loop's io_uring,
//! one coroutine per request, or `inline` on the loop) and [`blocking`] (worker threads);
//! FUSE over io_uring plugs in beside them, using the same handshake, buffers and
//! [`FileSystem::handle`].

pub mod accounting;
pub mod blocking;
pub mod buffers;
pub mod coroutine;
pub mod dispatch;
pub mod service;
pub mod session;

pub use coroutine::{Queue, QueueConfig};
pub use dispatch::QueueStats;
pub use service::FileSystem;
pub use session::handshake;
