//! One export daemon (`corofuse mount`) owned by the lab: found, started, waited for until
//! the kernel lists its mount, asked for statistics, and always stopped.
//!
//! # Cleanup contract
//! [`Daemon::stop`] (also run by `Drop`, so on every error path and after Ctrl-C) sends
//! SIGTERM to the daemon's PID, waits up to [`STOP_TIMEOUT`], then SIGKILLs it, and
//! finally lazy-unmounts the mount point if something is still mounted there. Daemons
//! run in their own process group, so a Ctrl-C reaches only the lab, which then stops
//! them in order; `PR_SET_PDEATHSIG` (SIGTERM) covers a lab killed with SIGKILL.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{child, interrupt, mountinfo};

/// How long a daemon may take to mount.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a daemon may take to exit after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a daemon may take to write its statistics after SIGUSR1.
const STATS_TIMEOUT: Duration = Duration::from_secs(5);

/// Where a daemon's files go.
pub struct Paths<'a> {
    pub mountpoint: &'a Path,
    pub pidfile: &'a Path,
    pub log: &'a Path,
    /// `--stats` file.
    pub stats: &'a Path,
}

pub struct Daemon {
    child: Option<Child>,
    name: &'static str,
    mountpoint: PathBuf,
    stats: PathBuf,
    log: PathBuf,
}

impl Daemon {
    /// Spawns `cmd` and waits until it has written its pidfile and the mount is live.
    pub fn start(mut cmd: Command, name: &'static str, paths: &Paths) -> Result<Daemon, String> {
        for p in [paths.pidfile, paths.stats] {
            child::remove_if_present(p)?;
        }
        let log = File::create(paths.log).map_err(|e| format!("{}: {e}", paths.log.display()))?;
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .process_group(0);
        interrupt::tie_to_lab(&mut cmd, libc::SIGTERM);
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {name}: {e}"))?;
        let mut daemon = Daemon {
            child: Some(child),
            name,
            mountpoint: paths.mountpoint.to_path_buf(),
            stats: paths.stats.to_path_buf(),
            log: paths.log.to_path_buf(),
        };
        if let Err(e) = daemon.wait_mounted(paths.pidfile) {
            // `e` already carries the log; stopping only has to clean up.
            let _ = daemon.stop();
            return Err(e);
        }
        Ok(daemon)
    }

    /// The daemon's PID.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    fn wait_mounted(&mut self, pidfile: &Path) -> Result<(), String> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let has_pid =
                std::fs::read_to_string(pidfile).is_ok_and(|s| s.trim().parse::<u32>().is_ok());
            if has_pid && mountinfo::fuse_mounted(&self.mountpoint) {
                return Ok(());
            }
            self.check_alive("before mounting")?;
            interrupt::check()?;
            if Instant::now() >= deadline {
                return Err(format!(
                    "{} did not mount {} within {START_TIMEOUT:?}; its log:{}",
                    self.name,
                    self.mountpoint.display(),
                    child::tail(&self.log, 20)
                ));
            }
            std::thread::sleep(child::POLL);
        }
    }

    /// An error carrying the daemon's log if it has exited.
    fn check_alive(&mut self, when: &str) -> Result<(), String> {
        let Some(c) = self.child.as_mut() else {
            return Err(format!("{} was already stopped", self.name));
        };
        match c.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(format!(
                "{} exited ({status}) {when}; its log:{}",
                self.name,
                child::tail(&self.log, 20)
            )),
            Err(e) => Err(format!("waiting for {}: {e}", self.name)),
        }
    }

    /// Asks for a `--stats` snapshot (SIGUSR1) and returns it once written.
    pub fn snapshot(&mut self) -> Result<Value, String> {
        let path = self.stats.clone();
        child::remove_if_present(&path)?;
        if let Some(c) = &self.child {
            child::signal(c, libc::SIGUSR1).map_err(|e| format!("SIGUSR1: {e}"))?;
        }
        let deadline = Instant::now() + STATS_TIMEOUT;
        loop {
            // A half-written file does not parse: try again.
            if let Some(v) = std::fs::read_to_string(&path)
                .ok()
                .and_then(|s| serde_json::from_str(&s).ok())
            {
                return Ok(v);
            }
            self.check_alive("while writing statistics")?;
            if Instant::now() >= deadline {
                return Err(format!(
                    "{} wrote no statistics to {} within {STATS_TIMEOUT:?} of SIGUSR1",
                    self.name,
                    path.display()
                ));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// User plus system CPU seconds of all the daemon's threads so far.
    pub fn cpu_seconds(&self) -> Option<f64> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).ok()?;
        // Fields after the command name, which is in parentheses and may hold spaces:
        // state is field 3, utime 14 and stime 15 (proc(5)).
        let rest = &stat[stat.rfind(')')? + 1..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
        // SAFETY: sysconf touches no memory.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        (hz > 0).then(|| ticks as f64 / hz as f64)
    }

    /// Stops the daemon (see the module docs). Idempotent. An error reports what had to be
    /// forced, after everything has been cleaned up anyway.
    pub fn stop(&mut self) -> Result<(), String> {
        let Some(mut c) = self.child.take() else {
            return Ok(());
        };
        let mut problems = Vec::new();
        let status = match c.try_wait() {
            Ok(Some(status)) => {
                problems.push(format!("it had already exited ({status})"));
                Some(status)
            }
            _ => child::terminate(&mut c, STOP_TIMEOUT, &mut problems),
        };
        if let Some(s) = status.filter(|s| !s.success() && problems.is_empty()) {
            problems.push(format!("it exited with {s}"));
        }
        if mountinfo::fuse_mounted(&self.mountpoint) {
            match mountinfo::lazy_unmount(&self.mountpoint) {
                Ok(()) => problems.push("its mount was still there: lazily unmounted".into()),
                Err(e) => problems.push(format!(
                    "its mount is still there and umount -l failed: {e}; run: umount -l {}",
                    self.mountpoint.display()
                )),
            }
        }
        if problems.is_empty() {
            return Ok(());
        }
        Err(format!(
            "stopping {} (pid {}): {}; its log:{}",
            self.name,
            c.id(),
            problems.join("; "),
            child::tail(&self.log, 10)
        ))
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            eprintln!("corofuse-lab bench: warning: {e}");
        }
    }
}

/// The `corofuse` binary that serves the lab's exports: `given` (`--corofuse`), else
/// `$COROFUSE`, else the `corofuse` beside this binary (`cargo build --release -p corofuse
/// -p corofuse-lab` puts both in target/release/).
pub fn program(given: Option<&Path>) -> Result<PathBuf, String> {
    let path = match (given, std::env::var_os("COROFUSE")) {
        (Some(p), _) => p.to_path_buf(),
        (None, Some(p)) => PathBuf::from(p),
        (None, None) => std::env::current_exe()
            .map_err(|e| format!("cannot find my own binary: {e}"))?
            .with_file_name("corofuse"),
    };
    if !path.is_file() {
        return Err(format!(
            "no corofuse binary at {} to serve the exports: build it beside this one (cargo \
             build --release -p corofuse -p corofuse-lab) or name it with --corofuse PATH",
            path.display()
        ));
    }
    Ok(path)
}

/// The `corofuse mount` command of `program` for an image (or `null:1G`).
pub fn corofuse_command(program: &Path, image: &str, paths: &Paths, extra: &[String]) -> Command {
    let mut cmd = Command::new(program);
    cmd.arg("mount")
        .arg(image)
        .arg(paths.mountpoint)
        .arg("--writable")
        .arg("--pidfile")
        .arg(paths.pidfile)
        .arg("--stats")
        .arg(paths.stats);
    cmd.args(extra);
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_daemon_is_the_binary_given_and_must_exist() {
        let e = program(Some(Path::new("/nonexistent/corofuse"))).expect_err("missing");
        assert!(
            e.contains("/nonexistent/corofuse") && e.contains("--corofuse"),
            "{e}"
        );
        let me = std::env::current_exe().expect("current_exe");
        assert_eq!(program(Some(&me)), Ok(me.clone()));
        let paths = Paths {
            mountpoint: Path::new("/m/mnt"),
            pidfile: Path::new("/m/pid"),
            log: Path::new("/m/log"),
            stats: Path::new("/m/stats.json"),
        };
        let cmd = corofuse_command(&me, "null:1G", &paths, &["--direct".into()]);
        assert_eq!(cmd.get_program(), me.as_os_str());
        let args: Vec<_> = cmd.get_args().map(|a| a.to_string_lossy()).collect();
        assert_eq!(
            args,
            [
                "mount",
                "null:1G",
                "/m/mnt",
                "--writable",
                "--pidfile",
                "/m/pid",
                "--stats",
                "/m/stats.json",
                "--direct"
            ]
        );
    }
}
