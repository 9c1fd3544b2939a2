//! The matrix runner: every (export, workload, server) cell, `trials` times, each run on
//! a freshly started daemon, with progress on stderr.
//!
//! Why this order: trials are the outer loop, so noise from the shared machine spreads
//! over all cells instead of hitting one; with `--compare-qsd`, corofuse and qsd run back
//! to back for each cell, alternating which goes first. A fresh daemon per run keeps
//! runs independent (no state carried from a previous workload) and gives clean
//! statistics, which are still taken as the difference of two SIGUSR1 snapshots around
//! the load so that mounting and opening are not counted.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::affinity::{self, Placement};
use super::daemon::{self, Daemon, Paths};
use super::lab::Lab;
use super::load::LoadResult;
use super::stats::{self, PerRequest};
use super::workload::{ExportKind, Server, Workload, EXPORT_SIZE};
use super::{child, fio, interrupt, qsd};

/// What to run, resolved from the command line.
pub struct Plan {
    pub seconds: f64,
    pub trials: usize,
    pub exports: Vec<ExportKind>,
    pub workloads: Vec<Workload>,
    pub servers: Vec<Server>,
    pub mount_opts: Vec<String>,
    pub placement: Option<Placement>,
    pub fio: bool,
    /// `--ring-replies` is among the mount options: replies are not syscalls.
    pub ring_replies: bool,
}

/// One run of one cell.
#[derive(Clone, Debug, Serialize)]
pub struct Run {
    pub load: LoadResult,
    /// Daemon CPU time over the run's wall time, percent of one CPU.
    pub daemon_cpu_pct: Option<f64>,
    pub per_request: Option<PerRequest>,
}

/// All runs of one (export, workload, server).
#[derive(Clone, Debug, Serialize)]
pub struct Cell {
    pub export: ExportKind,
    pub workload: Workload,
    pub server: Server,
    pub runs: Vec<Run>,
}

/// Runs the plan; `lab` already holds the image if a file export is planned.
pub fn run(plan: &Plan, lab: &Lab) -> Result<Vec<Cell>, String> {
    let mut cells = Vec::new();
    for &export in &plan.exports {
        for &workload in &plan.workloads {
            for &server in &plan.servers {
                cells.push(Cell {
                    export,
                    workload,
                    server,
                    runs: Vec::new(),
                });
            }
        }
    }
    let total = cells.len() * plan.trials;
    let mut step = 0;
    for trial in 0..plan.trials {
        let per_cell = plan.servers.len();
        for group in cells.chunks_mut(per_cell) {
            let order: Vec<usize> = if trial % 2 == 0 {
                (0..per_cell).collect()
            } else {
                (0..per_cell).rev().collect()
            };
            for i in order {
                step += 1;
                let cell = &mut group[i];
                progress_start(step, total, cell, trial, plan.trials);
                let run = run_one(plan, lab, cell).inspect_err(|_| eprintln!("failed"))?;
                progress_end(&run);
                cell.runs.push(run);
            }
        }
    }
    Ok(cells)
}

fn progress_start(step: usize, total: usize, c: &Cell, trial: usize, trials: usize) {
    let trial = if trials > 1 {
        format!(" (trial {}/{trials})", trial + 1)
    } else {
        String::new()
    };
    eprint!(
        "[{step}/{total}] {} {} {}{trial} ... ",
        c.export.name(),
        c.workload.label(),
        c.server.name()
    );
}

fn progress_end(r: &Run) {
    eprintln!(
        "{:.0} IOPS, {:.1} MB/s, p99 {:.1} us",
        r.load.iops, r.load.mb_s, r.load.p99_us
    );
}

/// One run: start the daemon, snapshot, load, snapshot, stop.
fn run_one(plan: &Plan, lab: &Lab, cell: &Cell) -> Result<Run, String> {
    let mut daemon = start(plan, lab, cell)?;
    if let Some(p) = plan.placement {
        affinity::pin_process(daemon.pid(), p.daemon)?;
    }
    let corofuse = cell.server == Server::Corofuse;
    let before = if corofuse {
        Some(daemon.snapshot()?)
    } else {
        None
    };
    let cpu0 = daemon.cpu_seconds();
    let started = Instant::now();
    let load = load(plan, lab, &cell.workload)?;
    let wall = started.elapsed().as_secs_f64();
    let cpu1 = daemon.cpu_seconds();
    let after = if corofuse {
        Some(daemon.snapshot()?)
    } else {
        None
    };
    if let Err(e) = daemon.stop() {
        eprintln!("\ncorofuse bench: warning: {e}");
    }
    let per_request = before
        .zip(after)
        .and_then(|(b, a)| PerRequest::from_stats(&stats::diff(&b, &a), plan.ring_replies));
    Ok(Run {
        load,
        daemon_cpu_pct: cpu0.zip(cpu1).map(|(a, b)| (b - a) / wall * 100.0),
        per_request,
    })
}

fn start(plan: &Plan, lab: &Lab, cell: &Cell) -> Result<Daemon, String> {
    let mountpoint = lab.mountpoint();
    let (pidfile, log, stats) = (
        lab.file("pid"),
        lab.file("daemon.log"),
        lab.file("stats.json"),
    );
    let corofuse = cell.server == Server::Corofuse;
    let paths = Paths {
        mountpoint: &mountpoint,
        pidfile: &pidfile,
        log: &log,
        stats: corofuse.then_some(stats.as_path()),
    };
    let image = match cell.export {
        ExportKind::Null => None,
        ExportKind::File => Some(lab.image().ok_or("the file export needs the image")?),
    };
    let cmd = match cell.server {
        Server::Corofuse => {
            let spec = image.map_or_else(|| "null:1G".to_string(), |p| p.display().to_string());
            daemon::corofuse_command(&spec, &paths, &plan.mount_opts)?
        }
        Server::Qsd => qsd::command(cell.export, image.unwrap_or(Path::new("")), &paths),
    };
    let name = match cell.server {
        Server::Corofuse => "corofuse mount",
        Server::Qsd => qsd::PROGRAM,
    };
    Daemon::start(cmd, name, &paths).map_err(|e| {
        if corofuse && !plan.mount_opts.is_empty() {
            format!(
                "{e}\n(extra options from --mount-opt: {})",
                plan.mount_opts.join(" ")
            )
        } else {
            e
        }
    })
}

fn load(plan: &Plan, lab: &Lab, w: &Workload) -> Result<LoadResult, String> {
    let (out, err) = (lab.file("load.out"), lab.file("load.err"));
    let cpu = plan.placement.map(|p| p.load);
    if plan.fio {
        return fio::run(&lab.mountpoint(), w, plan.seconds, cpu, &out, &err);
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find my own binary: {e}"))?;
    let mut cmd = Command::new(exe);
    cmd.arg("bench")
        .arg("load")
        .arg("--file")
        .arg(lab.mountpoint())
        .args(["--rw", w.rw.name(), "--engine", w.engine.name()])
        .args([
            "--bs",
            &w.bs.to_string(),
            "--iodepth",
            &w.iodepth.to_string(),
        ])
        .args(["--seconds", &plan.seconds.to_string()])
        .args(["--size", &EXPORT_SIZE.to_string()]);
    let mut c = child::spawn_load(&mut cmd, cpu, &out, &err)?
        .map_err(|e| format!("cannot start the load: {e}"))?;
    let timeout = Duration::from_secs_f64(plan.seconds + 60.0);
    let status = child::wait(&mut c, timeout, "the load")?;
    interrupt::check()?;
    if !status.success() {
        return Err(format!(
            "the load failed ({status}):{}",
            child::tail(&err, 10)
        ));
    }
    LoadResult::parse(&std::fs::read_to_string(&out).unwrap_or_default())
}
