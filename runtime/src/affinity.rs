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
    Ok(CpuSet::of_thread(0)?.cpus().collect())
}

/// A set of CPUs, read from a thread and applied to one without allocating (the guard of
/// the ring's loops moves them while they serve).
#[derive(Clone, Copy)]
pub struct CpuSet(libc::cpu_set_t);

impl CpuSet {
    /// No CPU.
    pub fn empty() -> CpuSet {
        // SAFETY: cpu_set_t is plain data; all-zero is the empty set.
        CpuSet(unsafe { std::mem::zeroed() })
    }

    /// The CPUs task `tid` (0: the calling thread) may run on.
    pub fn of_thread(tid: libc::pid_t) -> io::Result<CpuSet> {
        let mut set = CpuSet::empty();
        // SAFETY: `set.0` is a writable cpu_set_t of the size passed.
        if unsafe { libc::sched_getaffinity(tid, std::mem::size_of_val(&set.0), &mut set.0) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(set)
    }

    /// The CPUs it holds, in order.
    pub fn cpus(&self) -> impl Iterator<Item = usize> + '_ {
        (0..8 * std::mem::size_of_val(&self.0)).filter(|&cpu| self.contains(cpu))
    }

    /// The CPUs in either set.
    pub fn union(&self, other: &CpuSet) -> CpuSet {
        let mut set = self.0;
        for cpu in other.cpus() {
            // SAFETY: CPU_SET bounds-checks `cpu` against the set's size.
            unsafe { libc::CPU_SET(cpu, &mut set) };
        }
        CpuSet(set)
    }

    /// Whether the set holds `cpu`.
    pub fn contains(&self, cpu: usize) -> bool {
        // SAFETY: CPU_ISSET bounds-checks `cpu` against the set's size.
        unsafe { libc::CPU_ISSET(cpu, &self.0) }
    }

    /// How many CPUs the set holds.
    pub fn count(&self) -> usize {
        // SAFETY: CPU_COUNT reads a valid set.
        unsafe { libc::CPU_COUNT(&self.0) as usize }
    }

    /// Lets task `tid` (0: the calling thread) run on these CPUs only.
    pub fn apply(&self, tid: libc::pid_t) -> io::Result<()> {
        // SAFETY: `self.0` is a valid cpu_set_t of the size passed.
        let rc = unsafe { libc::sched_setaffinity(tid, std::mem::size_of_val(&self.0), &self.0) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

impl PartialEq for CpuSet {
    fn eq(&self, other: &CpuSet) -> bool {
        // SAFETY: CPU_EQUAL reads two valid sets.
        unsafe { libc::CPU_EQUAL(&self.0, &other.0) }
    }
}

impl std::fmt::Debug for CpuSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.cpus()).finish()
    }
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

    #[test]
    fn a_thread_moves_to_a_set_and_back() {
        let allowed = allowed_cpus().expect("affinity");
        let (first, last) = (allowed[0], *allowed.last().unwrap());
        std::thread::spawn(move || {
            pin(0, first).expect("pin");
            let home = CpuSet::of_thread(0).expect("affinity");
            assert_eq!(home.count(), 1);
            pin(0, last).expect("pin");
            let wide = home.union(&CpuSet::of_thread(0).expect("affinity"));
            assert_eq!(wide.count(), if first == last { 1 } else { 2 });
            wide.apply(0).expect("apply");
            assert_eq!(CpuSet::of_thread(0).expect("affinity"), wide);
            home.apply(0).expect("apply");
            assert_eq!(allowed_cpus().expect("affinity"), [first]);
        })
        .join()
        .unwrap();
    }
}
