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
use std::sync::OnceLock;

/// Puts thread `tid` (0: the calling thread) in the idle class, or back in the normal one
/// (at the thread's own nice value).
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
    Ok(policy & !libc::SCHED_RESET_ON_FORK == libc::SCHED_IDLE)
}

/// Whether a thread of this process may go from the idle class back to the normal one.
/// Linux allows it with `CAP_SYS_NICE` in the initial user namespace, or for a nice value
/// within `RLIMIT_NICE`; rather than second-guess either (a container's `CapEff` can show
/// a capability the kernel does not honour), a short-lived thread tries the round trip
/// once per process. A thread that could not leave just ends.
pub fn can_leave_idle() -> bool {
    static CAN: OnceLock<bool> = OnceLock::new();
    *CAN.get_or_init(|| {
        std::thread::Builder::new()
            .name("idle-probe".into())
            .spawn(|| set_idle(0, true).is_ok() && set_idle(0, false).is_ok())
            .ok()
            .and_then(|probe| probe.join().ok())
            .unwrap_or(false)
    })
}

/// The threads of this process, listed without allocating (for a guard that looks every few
/// milliseconds): `/proc/self/task` opened once, read again from its start each time.
pub struct Threads {
    dir: std::fs::File,
}

impl Threads {
    /// Opens `/proc/self/task`.
    pub fn open() -> io::Result<Threads> {
        std::fs::File::open("/proc/self/task").map(|dir| Threads { dir })
    }

    /// Calls `f` with the id of every thread of this process.
    pub fn each(&self, mut f: impl FnMut(libc::pid_t)) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        let fd = self.dir.as_raw_fd();
        // SAFETY: lseek on a descriptor this struct owns; no memory is passed.
        if unsafe { libc::lseek(fd, 0, libc::SEEK_SET) } < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut buf = [0u8; 4096];
        loop {
            // SAFETY: `buf` is valid for writes of its length; getdents64 writes at most
            // that many bytes of whole records.
            let n = unsafe { libc::syscall(libc::SYS_getdents64, fd, buf.as_mut_ptr(), buf.len()) };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            if n == 0 {
                return Ok(());
            }
            let mut at = 0;
            while at + 19 < n as usize {
                // A linux_dirent64: d_ino (8), d_off (8), d_reclen (2), d_type (1), d_name
                // (NUL-terminated).
                let reclen = u16::from_ne_bytes([buf[at + 16], buf[at + 17]]) as usize;
                if reclen == 0 {
                    break;
                }
                let name = &buf[at + 19..(at + reclen).min(n as usize)];
                let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
                if let Some(tid) = std::str::from_utf8(name).ok().and_then(|t| t.parse().ok()) {
                    f(tid);
                }
                at += reclen;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_lists_this_thread_and_others() {
        // SAFETY: gettid has no preconditions.
        let me = unsafe { libc::gettid() };
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let other = std::thread::spawn(move || {
            // SAFETY: as above.
            tx.send(unsafe { libc::gettid() }).unwrap();
            done_rx.recv().unwrap();
        });
        let theirs = rx.recv().unwrap();
        let threads = Threads::open().unwrap();
        for _ in 0..2 {
            let mut seen = Vec::new();
            threads.each(|tid| seen.push(tid)).unwrap();
            assert!(seen.contains(&me) && seen.contains(&theirs), "{seen:?}");
        }
        done_tx.send(()).unwrap();
        other.join().unwrap();
    }

    #[test]
    fn a_thread_goes_idle_and_back_where_it_may() {
        if !can_leave_idle() {
            eprintln!("skipped: this process may not leave the idle class (no CAP_SYS_NICE, RLIMIT_NICE too low)");
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
