//! `memfs`: an in-memory file system served by the `server` crate, to show its API.
//!
//! ```text
//! cargo run -p corofuse-server --example memfs -- MOUNTPOINT \
//!     [--dispatch coroutine|inline|threads:N] [--transport dev|uring|auto]
//! cargo run -p corofuse-server --example memfs -- --shared MOUNTPOINT MOUNTPOINT...
//! ```
//!
//! It mounts an empty directory tree on MOUNTPOINT (an existing directory, whose owner
//! the root of the tree takes) and serves it until the file system is unmounted from
//! outside: `umount MOUNTPOINT` (`fusermount3 -u MOUNTPOINT` without root). Then it says
//! how many requests it served and exits; whatever was written is gone. With `--shared`,
//! each MOUNTPOINT gets a tree of its own, all served by one event loop
//! ([`server::Exports::add_on`] on a [`server::LoopSet`]); each unmounted one is removed
//! ([`server::Exports::reap`]) while the others serve on, and it exits after the last. It catches no
//! signal (that needs unsafe code, or a crate, which this example does without): Ctrl-C
//! kills it without unmounting, and the mount answers "Transport endpoint is not
//! connected" until `umount MOUNTPOINT` removes it. A program that must stop serving by
//! itself takes a [`server::ServeHandle`] from [`Server::handle`] and calls `stop()` from
//! another thread: the `corofuse` binary does so from the thread that reads its
//! signalfd.
//!
//! ```text
//! # mkdir -p /tmp/mnt
//! # cargo run -p corofuse-server --example memfs -- /tmp/mnt --dispatch threads:4 &
//! # echo hello > /tmp/mnt/greeting && mkdir /tmp/mnt/d && ls -l /tmp/mnt && cat /tmp/mnt/greeting
//! # umount /tmp/mnt
//! ```
//!
//! Mounting needs root (mount(2)) or `fusermount3` on the PATH; `--transport uring` needs
//! Linux 6.14+ with `echo Y > /sys/module/fuse/parameters/enable_uring`. The server
//! logs at `info` (mount, dispatch, unmount); `RUST_LOG=debug` shows more.
//!
//! What the API takes: a [`transport::FileSystem`] (here [`fs::MemFs`], in `fs.rs`: its
//! answer to each FUSE operation in [`transport::Operations`], the rest ENOSYS), a
//! [`Target`] (where and as what to mount) and [`ServeOptions`] (how to serve: dispatch,
//! transport, loops). [`Server::mount`] mounts and answers INIT, [`Server::serve`] serves,
//! then flushes, unmounts and reports. `server::serve` does both in one call; a test
//! serves in the background with [`server::Background`] (see `server/tests/memfs.rs`).

#![forbid(unsafe_code)]

mod fs;

use std::error::Error;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use server::{Exports, LoopSet, ServeOptions, Server, Target};

use fs::MemFs;

/// The most bytes the files may hold together (memory is taken only as they are written).
const CAPACITY: u64 = 1 << 30;

const USAGE: &str = "usage: memfs MOUNTPOINT [--dispatch coroutine|inline|threads:N] \
                     [--transport dev|uring|auto]\n       memfs --shared MOUNTPOINT...";

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().is_some_and(|a| a == "--shared") {
        let mountpoints: Vec<PathBuf> = args[1..].iter().map(PathBuf::from).collect();
        return match run_shared(&mountpoints) {
            Ok(()) => ExitCode::SUCCESS,
            Err(message) => {
                eprintln!("memfs: {message}");
                ExitCode::FAILURE
            }
        };
    }
    let (mountpoint, options) = match parse(args.into_iter()) {
        Ok(parsed) => parsed,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    match run(mountpoint, &options) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("memfs: {message}");
            ExitCode::FAILURE
        }
    }
}

/// A new tree for `mountpoint`, owned by its owner, and where to mount it.
fn tree(mountpoint: PathBuf) -> Result<(Arc<MemFs>, Target), String> {
    let owner =
        std::fs::metadata(&mountpoint).map_err(|e| format!("{}: {e}", mountpoint.display()))?;
    let fs = Arc::new(MemFs::new(CAPACITY, owner.uid(), owner.gid()));
    let target = Target {
        mountpoint,
        name: "memfs".into(),
        directory: true,
        read_only: false,
    };
    Ok((fs, target))
}

/// `--shared`: one tree per mount point, all on one event loop; each removed once
/// unmounted from outside, until none is left.
fn run_shared(mountpoints: &[PathBuf]) -> Result<(), Box<dyn Error>> {
    if mountpoints.is_empty() {
        return Err(USAGE.into());
    }
    let set = Arc::new(LoopSet::new());
    let on = set
        .add_loop(None, Default::default())
        .map_err(|e| format!("starting the event loop: {e}"))?;
    let mut exports = Exports::with_loops(set);
    for (i, mountpoint) in mountpoints.iter().enumerate() {
        let (fs, target) = tree(mountpoint.clone())?;
        exports.add_on(&i.to_string(), fs, &target, &ServeOptions::default(), &[on])?;
    }
    while exports.ids().next().is_some() {
        std::thread::sleep(std::time::Duration::from_millis(100));
        for (id, served) in exports.reap() {
            let path = mountpoints[id.parse::<usize>().unwrap_or(0)].display();
            log::info!("{path}: served {} requests", served.report.queue.requests);
            served.result?;
        }
    }
    Ok(())
}

/// Mounts, serves until the unmount, reports.
fn run(mountpoint: PathBuf, options: &ServeOptions) -> Result<(), Box<dyn Error>> {
    let (fs, target) = tree(mountpoint)?;
    let server = Server::mount(fs, &target, options)?;
    log::info!(
        "serving {} with {} dispatch until `umount {}`",
        target.mountpoint.display(),
        server.dispatch(),
        target.mountpoint.display()
    );
    let served = server.serve();
    let queue = &served.report.queue;
    log::info!(
        "served {} requests, {} replies",
        queue.requests,
        queue.replies
    );
    Ok(served.result?)
}

/// The mount point and the serving options from the command line.
fn parse(mut args: impl Iterator<Item = String>) -> Result<(PathBuf, ServeOptions), String> {
    let mut mountpoint = None;
    let mut options = ServeOptions::default();
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value\n{USAGE}"));
        match arg.as_str() {
            "--dispatch" => {
                options.dispatch = value()?.parse().map_err(|e| format!("{arg}: {e}"))?
            }
            "--transport" => {
                options.transport = value()?.parse().map_err(|e| format!("{arg}: {e}"))?
            }
            "-h" | "--help" => return Err(USAGE.into()),
            _ if arg.starts_with('-') => return Err(format!("unknown option {arg}\n{USAGE}")),
            _ if mountpoint.is_none() => mountpoint = Some(PathBuf::from(arg)),
            _ => return Err(format!("one mount point only\n{USAGE}")),
        }
    }
    Ok((mountpoint.ok_or(USAGE)?, options))
}
