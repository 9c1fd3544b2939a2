//! What the numbers were measured on, and the one-way switch cost used to turn switch
//! counts into nanoseconds.
//!
//! Why record it: figures from this lab are only comparable within one run on one
//! machine (BENCHMARKS.md), so every JSON report carries its kernel, CPUs and versions.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::switch::run_case;
use serde::Serialize;

#[derive(Debug, Serialize)]
pub struct Environment {
    pub corofuse_version: &'static str,
    pub kernel: String,
    pub cpus: usize,
    pub cpu_model: String,
    /// `/sys/module/fuse/parameters/enable_uring`, when the module has it.
    pub fuse_enable_uring: Option<String>,
    pub unix_time: u64,
}

impl Environment {
    /// "kernel K, N CPUs (model), corofuse V", for a report's header.
    pub fn line(&self) -> String {
        format!(
            "kernel {}, {} CPUs ({}), corofuse {}",
            self.kernel, self.cpus, self.cpu_model, self.corofuse_version
        )
    }

    pub fn probe() -> Environment {
        let read = |p: &str| {
            std::fs::read_to_string(p)
                .ok()
                .map(|s| s.trim().to_string())
        };
        let cpu_model = read("/proc/cpuinfo")
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("model name"))
                    .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
            })
            .unwrap_or_else(|| "unknown".into());
        Environment {
            corofuse_version: env!("CARGO_PKG_VERSION"),
            kernel: read("/proc/sys/kernel/osrelease").unwrap_or_else(|| "unknown".into()),
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            cpu_model,
            fuse_enable_uring: read("/sys/module/fuse/parameters/enable_uring"),
            unix_time: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        }
    }
}

/// One-way coroutine switch through the runtime's loop, in ns: half the round trip of
/// the `runtime_switch` micro-benchmark, median of 5 runs of about 20 ms each.
pub fn one_way_switch_ns() -> Result<f64, String> {
    let case = |iters| {
        std::panic::catch_unwind(|| run_case("runtime_switch", iters))
            .ok()
            .flatten()
            .ok_or("the runtime_switch micro-benchmark failed (is io_uring available?)")
    };
    let probe = case(10_000)?;
    let per_iter = probe.as_secs_f64() / 10_000.0;
    let iters = ((0.02 / per_iter.max(1e-9)) as u64).clamp(10_000, 2_000_000);
    let runs = (0..5)
        .map(|_| Ok(case(iters)?.as_nanos() as f64 / iters as f64))
        .collect::<Result<Vec<f64>, String>>()?;
    Ok(crate::median::median(runs) / 2.0)
}
