//! CPU affinity: which CPUs this process may run on, and pinning a thread to one. An
//! event loop pinned to a CPU keeps its caches and, with FUSE over io_uring, serves the
//! requests of the CPU it sits on; the lab pins its daemons and loads the same way.

use std::io;

fn set_for(cpu: usize) -> libc::cpu_set_t {
    // SAFETY: cpu_set_t is plain data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: CPU_SET bounds-checks `cpu` against the set's size.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    set
}

/// Pins one task (0: the calling thread) to `cpu`. Async-signal-safe, usable in
/// `pre_exec`.
pub fn pin(tid: libc::pid_t, cpu: usize) -> io::Result<()> {
    let set = set_for(cpu);
    // SAFETY: `set` is a valid cpu_set_t of the size passed.
    let rc = unsafe { libc::sched_setaffinity(tid, std::mem::size_of_val(&set), &set) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The CPUs this process may run on, in order.
pub fn allowed_cpus() -> io::Result<Vec<usize>> {
    // SAFETY: cpu_set_t is plain data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a writable cpu_set_t of the size passed.
    if unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let max = 8 * std::mem::size_of_val(&set);
    // SAFETY: CPU_ISSET bounds-checks the index against the set's size.
    Ok((0..max)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_thread_pins_to_an_allowed_cpu() {
        let allowed = allowed_cpus().expect("affinity");
        assert!(!allowed.is_empty());
        let last = *allowed.last().unwrap();
        std::thread::spawn(move || {
            pin(0, last).expect("pin");
            assert_eq!(allowed_cpus().expect("affinity"), [last]);
        })
        .join()
        .unwrap();
    }
}
