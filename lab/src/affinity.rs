//! `--cpus same|split|load`: where the daemon and the load run.
//!
//! Why: at iodepth 1 placement decides the result (CONTEXT.md: qemu-storage-daemon does
//! ~21k IOPS with daemon and client on different vCPUs, ~105k on the same one, because
//! waking a halted vCPU costs ~20 µs). Pinning every task of the daemon
//! (/proc/PID/task/*) and the load makes runs comparable. `load` pins only the load: the
//! daemon's loops pin themselves one per CPU, and FUSE over io_uring serves a request on
//! the CPU that issued it, which an unpinned client defeats by moving between CPUs.

use serde::Serialize;

/// The placement policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Cpus {
    /// Daemon and load on the same CPU.
    Same,
    /// Daemon on one CPU, load on another.
    Split,
    /// The load on the last CPU, the daemon where it places itself (its loops pinned one
    /// per CPU by default).
    Load,
}

/// The CPUs chosen for the daemon (`None`: not pinned by the lab) and for the load.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Placement {
    pub daemon: Option<usize>,
    pub load: usize,
}

impl Placement {
    /// Resolves a policy against the CPUs this process may use.
    pub fn choose(cpus: Cpus) -> Result<Placement, String> {
        let allowed = allowed_cpus().map_err(|e| format!("sched_getaffinity: {e}"))?;
        let first = *allowed
            .first()
            .ok_or("no CPU in this process's affinity mask")?;
        match cpus {
            Cpus::Same => Ok(Placement {
                daemon: Some(first),
                load: first,
            }),
            Cpus::Load => Ok(Placement {
                daemon: None,
                load: *allowed.last().unwrap_or(&first),
            }),
            Cpus::Split => match allowed.get(1) {
                Some(&second) => Ok(Placement {
                    daemon: Some(first),
                    load: second,
                }),
                None => Err("--cpus split needs two CPUs; this process may use one".into()),
            },
        }
    }
}

pub use runtime::affinity::{allowed_cpus, pin};

/// Pins every thread of process `pid`.
pub fn pin_process(pid: u32, cpu: usize) -> Result<(), String> {
    let dir = format!("/proc/{pid}/task");
    let tasks = std::fs::read_dir(&dir).map_err(|e| format!("{dir}: {e}"))?;
    for task in tasks.flatten() {
        let Some(tid) = task.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        match pin(tid, cpu) {
            // The thread exited between the listing and the call.
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
            Err(e) => return Err(format!("pinning task {tid} of {pid} to CPU {cpu}: {e}")),
            Ok(()) => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placements() {
        let allowed = allowed_cpus().expect("affinity");
        let same = Placement::choose(Cpus::Same).expect("one CPU is enough");
        assert_eq!((same.daemon, same.load), (Some(allowed[0]), allowed[0]));
        let load = Placement::choose(Cpus::Load).expect("one CPU is enough");
        assert_eq!(load.daemon, None, "the daemon places itself");
        assert_eq!(load.load, *allowed.last().expect("a CPU"));
        match Placement::choose(Cpus::Split) {
            Ok(p) => assert_eq!((p.daemon, p.load), (Some(allowed[0]), allowed[1])),
            Err(e) => assert!(allowed.len() == 1 && e.contains("two CPUs"), "{e}"),
        }
    }
}
