//! How long a set of CPUs sat idle, from `/proc/stat`: whether a crowded loop of the ring
//! would find room if it floated (`loop_class`). With one deep client the other CPU idles
//! while the client's CPU is shared; with a client on every CPU none does, and floating
//! only costs (2 jobs at iodepth 64: 0.89x).
//!
//! `/proc/stat` gives each CPU's idle and iowait time in `USER_HZ` ticks (10 ms), computed
//! from the precise no-HZ idle clock where the kernel has one. The file is opened once and
//! read with one `pread` into a buffer on the stack: the guard allocates nothing while it
//! watches. CPUs whose lines lie beyond the buffer count as busy.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::time::Duration;

use runtime::affinity::CpuSet;

/// The bytes of `/proc/stat` read each time: the per-CPU lines come first (about 60-90
/// bytes each).
const READ: usize = 8192;

/// Idle time of a set of CPUs, read from `/proc/stat`.
pub struct CpuIdle {
    file: File,
    cpus: CpuSet,
    /// Ticks per second of `/proc/stat`'s counters.
    hz: u64,
    last: u64,
}

impl CpuIdle {
    /// A reader of the idle time of `cpus`.
    pub fn open(cpus: CpuSet) -> std::io::Result<CpuIdle> {
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        let mut idle = CpuIdle {
            file: File::open("/proc/stat")?,
            cpus,
            hz: u64::try_from(hz).ok().filter(|&h| h > 0).unwrap_or(100),
            last: 0,
        };
        idle.last = idle.ticks()?;
        Ok(idle)
    }

    /// The time the CPUs sat idle (summed over them) since the last call.
    pub fn since_last(&mut self) -> std::io::Result<Duration> {
        let now = self.ticks()?;
        let ticks = now.saturating_sub(self.last);
        self.last = now;
        Ok(Duration::from_nanos(ticks * 1_000_000_000 / self.hz))
    }

    fn ticks(&self) -> std::io::Result<u64> {
        let mut text = [0u8; READ];
        let n = self.file.read_at(&mut text, 0)?;
        Ok(idle_ticks(&text[..n], |cpu| self.cpus.contains(cpu)))
    }
}

/// The idle + iowait ticks of the `cpuN` lines of `/proc/stat` text whose N `wanted`.
fn idle_ticks(stat: &[u8], wanted: impl Fn(usize) -> bool) -> u64 {
    let mut sum = 0;
    for line in stat.split(|&b| b == b'\n') {
        let mut fields = line
            .split(|&b| b == b' ')
            .filter(|f| !f.is_empty())
            .map(|f| std::str::from_utf8(f).unwrap_or(""));
        let Some(cpu) = fields.next().and_then(|name| name.strip_prefix("cpu")) else {
            continue;
        };
        let Ok(cpu) = cpu.parse::<usize>() else {
            continue; // the "cpu" line of all CPUs
        };
        if !wanted(cpu) {
            continue;
        }
        // user nice system idle iowait ...
        let mut values = fields.skip(3).map(|v| v.parse::<u64>().unwrap_or(0));
        sum += values.next().unwrap_or(0) + values.next().unwrap_or(0);
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &[u8] = b"cpu  100 0 50 9000 10 0 5 0 0 0
cpu0 60 0 30 4000 4 0 3 0 0 0
cpu1 40 0 20 5000 6 0 2 0 0 0
intr 12345 0 1
ctxt 999
";

    #[test]
    fn idle_and_iowait_of_the_wanted_cpus() {
        assert_eq!(idle_ticks(STAT, |c| c == 0), 4004);
        assert_eq!(idle_ticks(STAT, |c| c == 1), 5006);
        assert_eq!(idle_ticks(STAT, |_| true), 9010);
        assert_eq!(idle_ticks(STAT, |c| c == 7), 0);
        assert_eq!(idle_ticks(b"", |_| true), 0);
    }

    #[test]
    fn a_reading_is_bounded_by_the_wall_time_of_its_cpus() {
        let mut idle = CpuIdle::open(CpuSet::of_thread(0).unwrap()).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        // Two ticks of slack: the counters move in whole ticks.
        let cpus = CpuSet::of_thread(0).unwrap().count() as u32;
        assert!(idle.since_last().unwrap() <= Duration::from_millis(220) * cpus);
    }
}
