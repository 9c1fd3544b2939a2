//! Kernel tests for `corofuse mount`: each test runs the real binary, mounts an image over a
//! regular file with mount(2) and checks the CLI contract from outside, as a script would.
//!
//! The tests need root, /dev/fuse and CAP_SYS_ADMIN (our CI has them); elsewhere each one
//! prints why it is skipped and passes, unless `COROFUSE_TEST_NO_SKIP=1` (set by `.ci/run`)
//! makes every such skip a failure ([`require`]). Every mount test is named `mount_*`, so
//! `cargo test -p corofuse-tests mount_` selects them and `--skip mount_` leaves them out.
//!
//! Every export test runs in each `--dispatch` mode ([`Dispatch`]): a body taking the mode,
//! and [`dispatch_tests!`] to make `mount_x::coroutine`, `mount_x::inline` and
//! `mount_x::threads` of it. Tests of an option that only the coroutine transport has
//! (`--ring-replies`, `--readers`) list only `coroutine`; setup errors run once.
//!
//! ```no_run
//! use corofuse_tests::{dispatch_tests, Dispatch, MountedExport, Sandbox};
//!
//! dispatch_tests!(mount_reads_sevens);
//! fn mount_reads_sevens(mode: Dispatch) {
//!     let sandbox = Sandbox::new();
//!     let image = sandbox.file("disk.img", &[7u8; 8192]);
//!     let export = MountedExport::start(&image, &sandbox.mountpoint("mnt"), mode, &["-w"]);
//!     assert_eq!(std::fs::read(export.path()).unwrap(), [7u8; 8192]);
//!     export.stop(); // SIGTERM: exit status 0, mount gone
//! }
//! # fn main() {}
//! ```
//!
//! Layout: [`bin`] finds (and builds) the binary, [`require`] probes and skips visibly,
//! [`dispatch`] names the modes and makes one test per mode, [`export`] is the daemon
//! guard, [`mountinfo`] reads /proc/self/mountinfo, [`sandbox`] holds per-test files,
//! [`buf`] has aligned buffers, patterns and test seeds, [`mapping`] mmap(2) of a file,
//! [`diag`] describes a hung daemon, [`qemu`] runs QEMU's tools and a
//! qemu-storage-daemon, [`tool`] runs an outside test program bounded in time,
//! [`pjdfstest`] configures, runs and parses the POSIX file-system test suite, [`sys`]
//! the syscalls.
//!
//! Knobs: `COROFUSE_BIN=/path` tests that binary instead of building `target/<profile>/
//! corofuse`; `COROFUSE_TEST_LOG=debug` sets the daemons' `RUST_LOG` (default `info`), and
//! a failing test shows the daemon's stderr; `COROFUSE_TEST_DISPATCH=inline` (or
//! `coroutine`, `threads`, `threads:N`, comma-separated) runs only those modes;
//! `COROFUSE_TEST_SEED=N` replays a randomised test (a failing one prints its seed).
#![warn(missing_docs)]

pub mod bin;
pub mod buf;
pub mod diag;
pub mod dispatch;
pub mod export;
pub mod fio;
pub mod mapping;
pub mod mountinfo;
pub mod nbd;
pub mod pjdfstest;
pub mod qcow2;
pub mod qemu;
pub mod qsd;
pub mod require;
pub mod sandbox;
pub mod sys;
pub mod tls;
pub mod tool;
pub mod uring;

use std::fmt::Debug;
use std::io;

pub use buf::{assert_bytes_eq, pattern, AlignedBuf, Rng, Seed};
pub use dispatch::Dispatch;
pub use export::MountedExport;
pub use mapping::{Access, Mapping, Sharing};
pub use sandbox::{open_direct, open_rw, Sandbox};

/// KiB.
pub const KIB: u64 = 1024;
/// MiB.
pub const MIB: u64 = 1024 * 1024;

/// The errno of a call that must fail; panics, naming `what`, if it succeeded.
#[track_caller]
pub fn errno_of<T: Debug>(result: io::Result<T>, what: &str) -> i32 {
    match result {
        Ok(v) => panic!("{what}: succeeded ({v:?}), expected an error"),
        Err(e) => e
            .raw_os_error()
            .unwrap_or_else(|| panic!("{what}: error without errno: {e}")),
    }
}
