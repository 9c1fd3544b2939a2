//! A thread's scheduling class: normal (`SCHED_OTHER`) or idle (`SCHED_IDLE`).
//!
//! Why: with FUSE over io_uring the kernel queues a request on the ring queue of the CPU
//! its client runs on, and the loop pinned there serves it. The reply wakes the client
//! while that loop is still running, so the scheduler puts the client on the other, idle
//! CPU: at iodepth 1 the client moves on 85% of its requests, each move an
//! inter-processor interrupt, and the next request lands on the other queue (26k IOPS on
//! null, against 90k with the client pinned). A loop in the idle class leaves its CPU
//! looking idle to that wakeup: the client stays, preempts the loop, and the loop
//! finishes when the client waits again (80-87k). The idle class yields to every other
//! thread, so under a CPU hog it starves (59 IOPS): it is only used with a guard that
//! takes the loop back to the normal class (`server`'s `loop_class`), which needs the
//! right to leave it ([`can_leave_idle`]).

use std::io;

/// Puts thread `tid` (0: the calling thread) in the idle class, or back in the normal one
/// (nice 0).
pub fn set_idle(tid: libc::pid_t, idle: bool) -> io::Result<()> {
    let policy = if idle {
        libc::SCHED_IDLE
    } else {
        libc::SCHED_OTHER
    };
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` is a valid sched_param that outlives the call.
    let rc = unsafe { libc::sched_setscheduler(tid, policy, &param) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether thread `tid` (0: the calling thread) is in the idle class.
pub fn is_idle(tid: libc::pid_t) -> io::Result<bool> {
    // SAFETY: no pointer is passed.
    let policy = unsafe { libc::sched_getscheduler(tid) };
    if policy < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(policy == libc::SCHED_IDLE)
}

/// Whether this process may go from the idle class back to nice 0: with `CAP_SYS_NICE`,
/// or a `RLIMIT_NICE` of 20 or more (Linux lets a thread leave `SCHED_IDLE` only for a
/// nice value it could set).
pub fn can_leave_idle() -> bool {
    const CAP_SYS_NICE: u32 = 23;
    let has_cap = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|l| l.starts_with("CapEff:"))?;
            u64::from_str_radix(line.split_whitespace().nth(1)?, 16).ok()
        })
        .is_some_and(|caps| caps & (1 << CAP_SYS_NICE) != 0);
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid rlimit to write.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NICE, &mut limit) };
    has_cap || (rc == 0 && limit.rlim_cur >= 20)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_goes_idle_and_back_where_it_may() {
        if !can_leave_idle() {
            eprintln!("skipped: this process may not leave the idle class (no CAP_SYS_NICE, RLIMIT_NICE < 20)");
            return;
        }
        std::thread::spawn(|| {
            assert!(!is_idle(0).unwrap());
            set_idle(0, true).unwrap();
            assert!(is_idle(0).unwrap());
            set_idle(0, false).unwrap();
            assert!(!is_idle(0).unwrap());
        })
        .join()
        .unwrap();
    }
}
