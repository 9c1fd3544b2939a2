//! Serving a FUSE file system, whatever it is, with every transport corofuse has: one
//! call mounts it, answers INIT, runs the event loops (or worker threads), stops them,
//! flushes, unmounts and reports what serving cost.
//!
//! ```no_run
//! # use std::sync::Arc;
//! # fn demo<F: transport::FileSystem>(fs: F) -> Result<(), Box<dyn std::error::Error>> {
//! use server::{ServeOptions, Server, Target};
//!
//! let target = Target {
//!     mountpoint: "/mnt/export".into(),
//!     name: "demo".into(),
//!     directory: true,
//!     read_only: false,
//! };
//! let server = Server::mount(Arc::new(fs), &target, &ServeOptions::default())?;
//! let handle = server.handle(); // stop() or snapshot() from any thread
//! let served = server.serve(); // until handle.stop() or `umount`
//! println!("{} requests", served.report.queue.requests);
//! Ok(served.result?)
//! # }
//! ```
//!
//! Why a crate of its own: the binary (`corofuse mount`, `mount-dir`), the tests and any
//! other file system share one serving path, so a file system is a [`FileSystem`]
//! implementation and nothing more (`examples/memfs/` is one, in memory). The binary
//! keeps only its arguments, signals, pidfile and `--stats` file.
//!
//! Layout: [`error`] (what can go wrong, one type per concern), [`options`] (how to serve: dispatch, loops and CPUs, transport, placement),
//! `server` ([`Server`]: the mount's life), `loops` (coroutine and inline event loops,
//! one thread each, with the loop placement's supervisor), `threads` (worker threads),
//! `control` ([`ServeHandle`]: stop and snapshots from another thread), `background`
//! ([`Background`]: serving on a thread of its own, stopped when dropped, for tests),
//! `exports` ([`Exports`]: several mounts by id, added and removed while others serve),
//! `loop_set` ([`LoopSet`]: event loops shared by sessions, each taken and dropped while
//! the others are served).
//!
//! Depends on `fuse` (mounting, INIT), `runtime` (the loops) and `transport` (queues and
//! the [`FileSystem`] trait); no file system and no block backend.
//!
//! [`FileSystem`]: transport::FileSystem

mod background;
mod control;
mod cpu_idle;
pub mod error;
mod exports;
mod loop_class;
mod loop_set;
mod loops;
pub mod options;
mod server;
mod threads;

pub use background::Background;
pub use control::ServeHandle;
pub use error::{ExportError, MountError, OptionsError, ParseError, ServeError};
pub use exports::Exports;
pub use loop_set::LoopSet;
pub use options::{Dispatch, IdleWait, LoopPlacement, ServeOptions, Transport, UringClass};
pub use server::{Report, Served, Server, Target};

use std::sync::Arc;

use transport::FileSystem;

/// Mounts `fs` on `target` and serves it as `options` say until the unmount from outside;
/// the whole life of a mount in one call (use [`Server`] to stop it from the program).
pub fn serve<F: FileSystem>(fs: Arc<F>, target: &Target, options: &ServeOptions) -> Served {
    match Server::mount(fs, target, options) {
        Ok(server) => server.serve(),
        Err(e) => Served::failed(ServeError::Mount(e)),
    }
}
