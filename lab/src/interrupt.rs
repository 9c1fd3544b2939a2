//! Ctrl-C, SIGTERM and SIGHUP during a lab run: remember them, never die of them.
//!
//! Why: the lab owns mounts, daemons, a 1 GiB image on tmpfs, and possibly a storage
//! image half written (removed unless complete). Dying on a signal would leave them
//! behind, so the handler only sets a flag; every wait loop polls
//! [`requested`] and returns an error, and the guards' `Drop` impls clean up on the way
//! out. Children get `PR_SET_PDEATHSIG` ([`die_with_parent`]) in case the lab itself is
//! killed with SIGKILL.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};

static REQUESTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    REQUESTED.store(true, Ordering::SeqCst);
}

/// Installs the flag-setting handler for SIGINT, SIGTERM and SIGHUP.
pub fn install() -> Result<(), String> {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: sigaction is plain data; zeroed means no flags and an empty mask.
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        // SAFETY: the handler only stores to an atomic (async-signal-safe); `action` is
        // initialised and a null old-action pointer is allowed.
        if unsafe { libc::sigaction(sig, &action, std::ptr::null_mut()) } != 0 {
            return Err(format!("sigaction({sig}): {}", io::Error::last_os_error()));
        }
    }
    Ok(())
}

/// Whether the user asked the lab to stop.
pub fn requested() -> bool {
    REQUESTED.load(Ordering::SeqCst)
}

/// The error a wait loop returns once [`requested`] is true.
pub fn check() -> Result<(), String> {
    if requested() {
        Err("interrupted; cleaned up".into())
    } else {
        Ok(())
    }
}

/// Makes the process `cmd` starts receive `sig` when the lab dies (see
/// [`die_with_parent`]): the daemons, loads and servers the lab starts never outlive it.
pub fn tie_to_lab(cmd: &mut std::process::Command, sig: libc::c_int) {
    use std::os::unix::process::CommandExt;
    // SAFETY: getpid cannot fail.
    let parent = unsafe { libc::getpid() };
    // SAFETY: the closure only makes async-signal-safe system calls (prctl, getppid).
    unsafe {
        cmd.pre_exec(move || die_with_parent(sig, parent));
    }
}

/// For `pre_exec`: the child receives `sig` when the lab dies. Only async-signal-safe
/// calls (a forked child of a possibly multi-threaded parent).
pub fn die_with_parent(sig: libc::c_int, parent: libc::pid_t) -> io::Result<()> {
    // SAFETY: prctl(PR_SET_PDEATHSIG) takes a signal number and touches no memory.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, sig as libc::c_ulong) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: getppid cannot fail.
    if unsafe { libc::getppid() } != parent {
        // The lab died before prctl took effect: nobody will clean this child up.
        return Err(io::Error::other("the lab exited before this child started"));
    }
    Ok(())
}
