//! [`run_bounded`]: an outside test program (pjdfstest, fsx) run to completion with its
//! output kept, and never left running: past its time limit it is killed by the PID we
//! started, and it gets SIGTERM if the thread that started it dies.
//!
//! Why files and not pipes for the output: these tools print a line per test or
//! operation, and a pipe nobody drains while we poll for the exit would stall them.

use std::fs::{self, File};
use std::io;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::sys;

/// How a bounded run ended.
#[derive(Debug)]
pub struct Ran {
    /// Its exit status.
    pub status: ExitStatus,
    /// What it wrote to stdout.
    pub stdout: String,
    /// What it wrote to stderr.
    pub stderr: String,
}

impl Ran {
    /// Status, stdout and stderr, for an assertion message.
    pub fn describe(&self) -> String {
        format!(
            "{}\n--- stdout:\n{}--- stderr:\n{}",
            self.status, self.stdout, self.stderr
        )
    }
}

/// Runs `command` (stdin from /dev/null) until it exits, for at most `limit`; `Err` says
/// what it printed if it had to be killed, or why it could not start.
pub fn run_bounded(command: &mut Command, limit: Duration) -> Result<Ran, String> {
    let scratch = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
    let (out_path, err_path) = (scratch.path().join("stdout"), scratch.path().join("stderr"));
    let out = File::create(&out_path).map_err(|e| e.to_string())?;
    let err = File::create(&err_path).map_err(|e| e.to_string())?;
    command.stdin(Stdio::null()).stdout(out).stderr(err);
    // SAFETY: the closure only calls prctl(2), which is async-signal-safe.
    unsafe { command.pre_exec(sys::term_with_parent) };
    let what = format!("{:?}", command.get_program());
    let mut child = command.spawn().map_err(|e| format!("spawn {what}: {e}"))?;
    let status = wait_or_kill(&mut child, limit).map_err(|e| format!("wait {what}: {e}"))?;
    let stdout = fs::read_to_string(&out_path).unwrap_or_default();
    let stderr = fs::read_to_string(&err_path).unwrap_or_default();
    match status {
        Some(status) => Ok(Ran {
            status,
            stdout,
            stderr,
        }),
        None => Err(format!(
            "{what} still running after {limit:?}: killed; stdout:\n{stdout}\nstderr:\n{stderr}"
        )),
    }
}

/// Waits up to `limit` for `child` to exit; past that SIGKILLs it (the PID we started),
/// reaps it and returns `None`.
pub fn wait_or_kill(child: &mut Child, limit: Duration) -> io::Result<Option<ExitStatus>> {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
