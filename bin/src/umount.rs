//! `corofuse umount MOUNTPOINT`: remove a corofuse mount, whether its daemon still serves it
//! or was killed.
//!
//! Why a command of our own: a daemon killed with SIGKILL (or crashed) leaves its mount
//! behind, and every access to the path then fails with ENOTCONN ("Transport endpoint is
//! not connected") until someone unmounts it; `corofuse mount` refuses the path meanwhile.
//! Plain `umount -l` would do, but it unmounts whatever is there. This command first checks
//! /proc/self/mountinfo: the mount on top of MOUNTPOINT must be FUSE with corofuse's
//! fstype (`fuse.corofuse`); a path that is not a mount, or someone else's mount, is left
//! alone with a one-line error and exit status 1.
//!
//! Then a plain unmount; if the mount is busy (a file on it is open), a lazy one
//! (MNT_DETACH, said in a warning): the mount leaves the namespace at once and is freed when
//! its last file closes. A live daemon sees the unmount and exits with status 0, as after
//! any unmount from outside. As root this is umount2(2); otherwise `fusermount3 -u`.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use fuse::mount::{MountOptions, Unmounted};

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// The file a corofuse mount covers (as given to `corofuse mount`)
    mountpoint: PathBuf,
}

/// How long a live daemon may take to answer the probe before we stop waiting.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// What the probe learnt of the daemon behind a mount.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Server {
    /// stat(2) failed with ENOTCONN or ECONNABORTED: the daemon is gone.
    Gone,
    /// It answered.
    Serving,
    /// No answer within [`PROBE_TIMEOUT`].
    Silent,
}

pub fn run(args: &Args) -> Result<(), String> {
    let given = args.mountpoint.display();
    let path = fuse::mount::resolve(&args.mountpoint).map_err(|e| format!("{given}: {e}"))?;
    check_ours(&path)?;
    let server = probe(&path);
    let how = fuse::mount::unmount_path(&path).map_err(|e| e.to_string())?;
    let path = path.display();
    let after = match server {
        Server::Gone => "its daemon was gone".to_string(),
        Server::Serving => "its daemon exits once the mount is freed".to_string(),
        Server::Silent => format!("its daemon did not answer within {PROBE_TIMEOUT:?}"),
    };
    match how {
        Unmounted::Now => log::info!("unmounted {path} ({after})"),
        Unmounted::Lazily => log::warn!(
            "{path} is busy (a file on it is open): detached it lazily, so it is gone from \
             the mount table now and freed when the last file on it closes ({after})"
        ),
    }
    Ok(())
}

/// Refuses a path whose topmost mount is not corofuse's.
fn check_ours(path: &Path) -> Result<(), String> {
    let ours = MountOptions::default().fstype();
    let shown = path.display();
    let mount = fuse::mount::mount_at(path).map_err(|e| format!("/proc/self/mountinfo: {e}"))?;
    match mount {
        None => Err(format!("{shown} is not a mount point; nothing to unmount")),
        Some(m) if m.fstype != ours => Err(format!(
            "{shown} is a {} mount, not a corofuse one ({ours}); not unmounting it",
            m.fstype
        )),
        Some(_) => Ok(()),
    }
}

/// Asks the mount for its attributes from a helper thread: a mount whose daemon is gone
/// fails at once (ENOTCONN; ECONNABORTED with some transports), a live daemon answers, and one that hangs costs only
/// [`PROBE_TIMEOUT`] (the thread is left behind; the process exits soon anyway).
fn probe(path: &Path) -> Server {
    let (tx, rx) = mpsc::channel();
    let path = path.to_path_buf();
    std::thread::spawn(move || {
        let errno = std::fs::symlink_metadata(path)
            .err()
            .and_then(|e| e.raw_os_error());
        let _ = tx.send(errno);
    });
    match rx.recv_timeout(PROBE_TIMEOUT) {
        Ok(Some(libc::ENOTCONN | libc::ECONNABORTED)) => Server::Gone,
        Ok(_) => Server::Serving,
        Err(_) => Server::Silent,
    }
}
