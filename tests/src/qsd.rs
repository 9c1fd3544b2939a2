//! [`StorageDaemon`]: a qemu-storage-daemon, the real one or corofuse standing in for it
//! (the corofuse binary run through a symlink named `qemu-storage-daemon`), with the same
//! arguments, so that a test runs one script against both and compares what it saw.
//!
//! The guard never leaves anything behind: Drop sends SIGTERM to the PID it started (then
//! SIGKILL), and lazily unmounts any FUSE mount still on the mountpoints it was given
//! (the real qsd leaves its mount behind when it fails after mounting).

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::mountinfo::fuse_mounts_at;
use crate::sys;

/// Which daemon.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Which {
    /// `qemu-storage-daemon` from the PATH.
    Qemu,
    /// corofuse, run as `qemu-storage-daemon`.
    Corofuse,
}

impl Which {
    /// Both, the reference first.
    pub const BOTH: [Which; 2] = [Which::Qemu, Which::Corofuse];

    /// The program to run: the real one, or a symlink named like it to corofuse.
    pub fn program(self, scratch: &Path) -> PathBuf {
        match self {
            Which::Qemu => PathBuf::from("qemu-storage-daemon"),
            Which::Corofuse => {
                let link = scratch.join("qemu-storage-daemon");
                if !link.exists() {
                    std::os::unix::fs::symlink(crate::bin::corofuse(), &link)
                        .expect("symlink qemu-storage-daemon -> corofuse");
                }
                link
            }
        }
    }
}

/// A daemon started with some arguments.
pub struct StorageDaemon {
    child: Child,
    status: Option<ExitStatus>,
    mountpoints: Vec<PathBuf>,
    scratch: TempDir,
}

/// How a run that ended went.
#[derive(Debug, PartialEq, Eq)]
pub struct Ended {
    /// The exit code.
    pub code: Option<i32>,
    /// stderr, with the program's path shortened to `qemu-storage-daemon`.
    pub stderr: String,
}

impl StorageDaemon {
    /// Starts `which` with `args`; `mountpoints` are cleaned up by Drop.
    pub fn start(which: Which, args: &[String], mountpoints: &[PathBuf]) -> StorageDaemon {
        let scratch = tempfile::tempdir().expect("temp dir");
        let stderr = File::create(scratch.path().join("stderr")).expect("stderr file");
        let mut command = Command::new(which.program(scratch.path()));
        command
            .args(args)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        let child = command.spawn().expect("spawn the storage daemon");
        StorageDaemon {
            child,
            status: None,
            mountpoints: mountpoints.to_vec(),
            scratch,
        }
    }

    /// Runs `which` with `args` to its end (at most 20 s) and returns how it ended.
    pub fn run_to_exit(which: Which, args: &[String], mountpoints: &[PathBuf]) -> Ended {
        let mut daemon = Self::start(which, args, mountpoints);
        let status = daemon.wait_exit(Duration::from_secs(20));
        assert!(status.is_some(), "{which:?} {args:?} did not exit");
        daemon.ended()
    }

    /// The daemon's PID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits up to `timeout` for the process to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let start = Instant::now();
        while self.status.is_none() && start.elapsed() < timeout {
            self.status = self.child.try_wait().ok().flatten();
            std::thread::sleep(Duration::from_millis(5));
        }
        self.status
    }

    /// How it ended (after [`wait_exit`](Self::wait_exit)).
    pub fn ended(&self) -> Ended {
        Ended {
            code: self.status.and_then(|s| s.code()),
            stderr: self.stderr(),
        }
    }

    /// What it wrote to stderr so far, the program path shortened.
    pub fn stderr(&self) -> String {
        let text = fs::read_to_string(self.scratch.path().join("stderr")).unwrap_or_default();
        let link = self.scratch.path().join("qemu-storage-daemon");
        text.replace(&link.display().to_string(), "qemu-storage-daemon")
    }
}

impl Drop for StorageDaemon {
    fn drop(&mut self) {
        if self.status.is_none() && self.child.try_wait().ok().flatten().is_none() {
            let _ = sys::kill(self.pid(), libc::SIGTERM);
            if self.wait_exit(Duration::from_secs(20)).is_none() {
                let _ = self.child.kill();
                let _ = self.child.wait();
            }
        }
        for path in &self.mountpoints {
            while fuse_mounts_at(path) > 0 {
                if sys::umount_lazy(path).is_err() {
                    break;
                }
            }
        }
    }
}

/// Connects to the Unix socket at `path` once its daemon listens, trying for up to 20 s:
/// the path exists from `bind(2)` on, and a connect before the `listen(2)` that follows is
/// refused. Panics with the last error after that.
pub fn connect_when_listening(path: &Path) -> std::os::unix::net::UnixStream {
    let start = Instant::now();
    loop {
        match std::os::unix::net::UnixStream::connect(path) {
            Ok(stream) => return stream,
            Err(e) if start.elapsed() > Duration::from_secs(20) => {
                panic!("connect to {}: {e}", path.display())
            }
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// Waits until `path` exists (a socket, a pidfile), up to 20 s.
pub fn wait_for(path: &Path) -> bool {
    let start = Instant::now();
    while !path.exists() {
        if start.elapsed() > Duration::from_secs(20) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}
