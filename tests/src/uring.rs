//! The fuse module's `enable_uring` switch, for the tests of `--transport uring`.
//!
//! FUSE over io_uring is offered only while `/sys/module/fuse/parameters/enable_uring` is
//! Y (N by default). A test that needs it holds an [`EnableUring`]: the first holder sets
//! Y, the last one restores what was there before the first. Holders are counted across
//! test processes, because `cargo nextest` runs every test in a process of its own and
//! several at once: a file beside the switch's users ([`HOLDERS`]), locked with `flock`
//! while read and changed, keeps the value to restore and the PIDs of the processes
//! holding it (threads of one process count once, in [`STATE`]). A process that died
//! holding it (SIGKILL) is pruned by the next one that looks, so a stale entry never
//! keeps the switch on for good. Y changes nothing for the `dev` transport (it only lets
//! INIT offer the flag, which `dev` does not ask for).

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub use fuse::mount::ENABLE_URING;

/// The holders' file: the value to restore, then one holding PID a line.
const HOLDERS: &str = "/run/corofuse-tests.enable_uring";

/// Holders in this process.
static STATE: Mutex<usize> = Mutex::new(0);

/// While alive, `enable_uring` is Y.
pub struct EnableUring(());

/// The holders' file, locked until dropped.
struct Holders {
    file: File,
    /// The value to restore, once someone set Y.
    before: Option<String>,
    pids: Vec<u32>,
}

impl Holders {
    /// Opens and locks the file, and drops the PIDs of processes that are gone.
    fn lock() -> Result<Holders, String> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(HOLDERS)
            .map_err(|e| format!("{HOLDERS}: {e}"))?;
        // SAFETY: flock on a descriptor this function owns; no memory is passed.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(format!(
                "locking {HOLDERS}: {}",
                std::io::Error::last_os_error()
            ));
        }
        let mut text = String::new();
        (&file)
            .read_to_string(&mut text)
            .map_err(|e| format!("{HOLDERS}: {e}"))?;
        let mut lines = text.lines();
        let before = lines.next().filter(|l| !l.is_empty()).map(str::to_owned);
        let pids = lines
            .filter_map(|l| l.trim().parse().ok())
            .filter(|&pid| alive(pid))
            .collect();
        Ok(Holders { file, before, pids })
    }

    /// Writes the state back (the lock goes with `self`).
    fn store(mut self) -> Result<(), String> {
        let mut text = self.before.clone().unwrap_or_default();
        for pid in &self.pids {
            text += &format!("\n{pid}");
        }
        self.file
            .set_len(0)
            .and_then(|()| self.file.rewind())
            .and_then(|()| self.file.write_all(text.as_bytes()))
            .map_err(|e| format!("{HOLDERS}: {e}"))
    }
}

/// Whether process `pid` exists.
fn alive(pid: u32) -> bool {
    // SAFETY: kill with signal 0 only checks that the process exists.
    let found = unsafe { libc::kill(pid as libc::pid_t, 0) } == 0;
    found || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

fn read_switch() -> Result<String, String> {
    std::fs::read_to_string(ENABLE_URING)
        .map(|v| v.trim().to_owned())
        .map_err(|e| format!("{ENABLE_URING}: {e} (kernel without FUSE over io_uring?)"))
}

fn write_switch(value: &str) -> Result<(), String> {
    std::fs::write(ENABLE_URING, value).map_err(|e| format!("setting {ENABLE_URING}: {e}"))
}

impl EnableUring {
    /// Sets Y (if this is the first holder anywhere), or says why it cannot: no such
    /// switch (a kernel without FUSE over io_uring) or no permission.
    pub fn acquire() -> Result<EnableUring, String> {
        let mut mine = STATE.lock().unwrap_or_else(|e| e.into_inner());
        if *mine == 0 {
            let mut holders = Holders::lock()?;
            // Read under the lock: read before it, the value could be the Y of a holder
            // that restored N between the read and the lock, and this holder would put
            // that Y back when it is the last to go.
            let before = read_switch()?;
            // A holder that died kept its value to restore: that one is the original.
            if holders.pids.is_empty() && holders.before.is_none() {
                holders.before = Some(before);
            }
            write_switch("Y")?;
            holders.pids.push(std::process::id());
            holders.store()?;
        }
        *mine += 1;
        Ok(EnableUring(()))
    }
}

impl Drop for EnableUring {
    fn drop(&mut self) {
        let mut mine = STATE.lock().unwrap_or_else(|e| e.into_inner());
        *mine -= 1;
        if *mine > 0 {
            return;
        }
        let Ok(mut holders) = Holders::lock() else {
            return;
        };
        let me = std::process::id();
        holders.pids.retain(|&p| p != me);
        if holders.pids.is_empty() {
            if let Some(before) = holders.before.take() {
                let _ = write_switch(&before);
            }
        }
        let _ = holders.store();
    }
}

/// Runs `f` with `enable_uring` set to `value`, then restores it; for a test that needs it
/// off. Waits (up to 2 minutes) until no process holds [`EnableUring`], and keeps the
/// holders' file locked meanwhile, so that none takes it during `f`; restores the value
/// from before the first holder if holders died without restoring it. Must not be called
/// while this process holds one.
pub fn with_enable_uring<T>(value: &str, f: impl FnOnce() -> T) -> Result<T, String> {
    let mine = STATE.lock().unwrap_or_else(|e| e.into_inner());
    assert_eq!(*mine, 0, "with_enable_uring while EnableUring is held");
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut holders = loop {
        let holders = Holders::lock()?;
        if holders.pids.is_empty() {
            break holders;
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{ENABLE_URING} held on by processes {:?} for 2 minutes",
                holders.pids
            ));
        }
        drop(holders);
        std::thread::sleep(Duration::from_millis(50));
    };
    // No holder is alive: a value to restore still in the file is that of holders that
    // died (SIGKILL) before restoring it, and the switch still shows their Y.
    let before = match holders.before.take() {
        Some(original) => original,
        None => read_switch()?,
    };
    write_switch(value)?;
    let result = f();
    let _ = write_switch(&before);
    let _ = holders.store();
    drop(mine);
    Ok(result)
}
