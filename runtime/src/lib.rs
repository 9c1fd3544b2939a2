//! corofuse's coroutine runtime: one stackful coroutine per request, one io_uring per loop.
//!
//! A [`Runtime`] is a single-threaded event loop. [`Runtime::spawn`] starts a coroutine on a
//! pooled stack; inside it, I/O goes through [`Co::ctx`], the coroutine's [`Ctx`], which
//! submits io_uring operations and suspends until their completion ([`Ctx::read_at`],
//! [`Ctx::writev_at`], [`Ctx::fsync`], [`Ctx::sleep`], ... and the escape hatch
//! [`Ctx::submit`]). [`Ctx`] is the one public I/O API: the same calls made as
//! [`Ctx::Blocking`] are plain syscalls. Everything queued in one loop turn reaches the
//! kernel in one `io_uring_enter`. Counters of every switch and syscall are always on
//! ([`Runtime::counters`]).
//!
//! ```
//! use runtime::{Config, Runtime};
//!
//! let rt = Runtime::new(Config::default())?;
//! let file = tempfile::tempfile()?;
//! let text = rt.block_on(move |co| {
//!     co.ctx().write_at(&file, b"hello, ring", 0).unwrap();
//!     let mut buf = [0u8; 11];
//!     co.ctx().read_at(&file, &mut buf, 0).unwrap();
//!     String::from_utf8(buf.to_vec()).unwrap()
//! })?;
//! assert_eq!(text, "hello, ring");
//! // Two SQEs, each completed and resumed once; the coroutine suspended twice.
//! let c = rt.counters();
//! assert_eq!((c.sqes_submitted, c.cqes_reaped, c.suspends), (2, 2, 2));
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! Layout: `executor` (the [`Runtime`] and its loop: turns, waiting, reaping), `sched`
//! (every coroutine's slot and the run queue), `spawn` (a start queued with its job, a
//! worker promised to it), `submit` (SQEs into the ring, room when it is full, cancels),
//! `fast_paths` (a lone coroutine's turns without the queue, prefetching ahead), `resume`
//! (switching into a coroutine, booking how it came back, panic containment), `shutdown`
//! (cancel, drain, then unwind), `worker` (coroutines that run job after job, as QEMU's
//! pool does), `colored_stack` (stack tops staggered across cache sets), `job` (the
//! spawned closure, stored inline), `coro_store` (workers at stable addresses),
//! `run_queue` (resumes and starts, with the jobs waiting to start, in one FIFO),
//! `reactor` (the ring), `poll` (adaptive polling before sleeping), `co` (the
//! in-coroutine handle), `ops` (the ring side of `Ctx`: one crate-internal method per
//! io_uring operation), `task` (what the loop
//! knows of one coroutine), `sync` (wait queue, mutex, rwlock), `join`, `stack_pool` (idle
//! workers, promised or spare, and bare stacks), `loop_cell` (loop-owned state without
//! `RefCell`'s counting), `config`, `counters`, `ctx` (a call's context: a coroutine's
//! ring or blocking syscalls, the one public I/O API, which every file system, backend
//! and transport uses), `file_io`
//! (the blocking syscalls behind it), `eventfd` (a wake-up another thread sends a loop),
//! `histogram` (latency distributions), `affinity` (CPU pinning).
//!
//! Dependencies: `corosensei` (the stack switch), `io-uring` (the ring), `libc` (the
//! system calls) and `log`; nothing else by default. The runtime writes no reports: it
//! hands out [`CounterSnapshot`] and [`histogram::Summary`] as plain structs, and the
//! `serde` feature (off by default) derives `Serialize` and `Deserialize` on them for the
//! crates that write or read them (the `--stats` document, the transports' per-opcode
//! reports), which choose the format (JSON) themselves.
#![warn(missing_docs)]

pub mod affinity;
mod co;
mod colored_stack;
mod config;
mod coro_store;
mod counters;
mod ctx;
mod eventfd;
mod executor;
mod fast_paths;
pub mod file_io;
pub mod histogram;
mod idle;
mod interrupt;
mod job;
mod join;
mod loop_cell;
mod ops;
mod poll;
mod reactor;
mod remote;
mod resume;
mod run_queue;
mod sched;
pub mod sched_class;
mod shutdown;
mod spawn;
mod stack_pool;
mod submit;
mod sync;
mod task;
mod worker;

pub use co::{Co, CoStats, LocalWaker};
pub use config::{Config, DEFAULT_STACK_SIZE};
pub use counters::CounterSnapshot;
pub use ctx::{Ctx, NoRing};
pub use eventfd::{signal_raw, EventFd};
pub use executor::Runtime;
pub use file_io::IOV_MAX;
pub use io_uring::{opcode, squeue, types};
pub use join::{JoinError, JoinHandle};
pub use remote::remote_file_system;
pub use sync::{CoMutex, CoMutexGuard, CoReadGuard, CoRwLock, CoWriteGuard, WaitQueue};
pub use task::TaskId;
