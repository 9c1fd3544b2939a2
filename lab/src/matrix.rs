//! The matrix runner: every (export, workload) cell, `trials` times, each run on a freshly
//! started daemon, with progress on stderr.
//!
//! Why this order ([`rounds::schedule`]): trials are the outer loop, so noise from the
//! shared machine spreads over all cells instead of hitting one. A fresh daemon per run
//! keeps runs independent (no state carried from a previous workload) and gives clean
//! statistics, which are still taken as the difference of two SIGUSR1 snapshots around
//! the load so that mounting and opening are not counted. Every run on the image on real
//! storage starts with the image out of the page cache ([`storage::evict`]), the
//! `device` row runs the load on the image itself, with no daemon, and the `local` row
//! on /dev/zero or /dev/null ([`export::local_target`]).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::daemon::{self, Daemon};
use super::export::{self, ExportKind};
use super::lab::Lab;
use super::load::LoadResult;
use super::plan::Plan;
use super::stats::{self, PerRequest};
use super::storage::{self, Image};
use super::workload::Workload;
use super::{child, interrupt, rounds};

/// One run of one cell.
#[derive(Clone, Debug, Serialize)]
pub struct Run {
    pub load: LoadResult,
    /// Daemon CPU time over the run's wall time, percent of one CPU.
    pub daemon_cpu_pct: Option<f64>,
    pub per_request: Option<PerRequest>,
}

/// All runs of one (export, workload).
#[derive(Clone, Debug, Serialize)]
pub struct Cell {
    pub export: ExportKind,
    pub workload: Workload,
    pub runs: Vec<Run>,
}

/// Runs the plan; `lab` already holds the tmpfs image if the `file` row is planned,
/// and `storage` is the image on real storage if a storage row is.
pub fn run(plan: &Plan, lab: &Lab, storage: Option<&Image>) -> Result<Vec<Cell>, String> {
    let mut cells: Vec<Cell> = (plan.rows.iter())
        .flat_map(|row| {
            row.workloads.iter().map(|&workload| Cell {
                export: row.export,
                workload,
                runs: Vec::new(),
            })
        })
        .collect();
    let steps = rounds::schedule(plan.trials, &vec![1; cells.len()]);
    for (i, &step) in steps.iter().enumerate() {
        let cell = &mut cells[step.group];
        let what = format!("{} {}", cell.export.name(), cell.workload.label());
        rounds::progress(i, steps.len(), &what, step, plan.trials);
        let run = run_one(plan, lab, storage, cell).inspect_err(|_| eprintln!("failed"))?;
        let load = &run.load;
        eprintln!(
            "{:.0} IOPS, {:.1} MB/s, p99 {:.1} us",
            load.iops, load.mb_s, load.p99_us
        );
        cell.runs.push(run);
    }
    Ok(cells)
}

/// The image behind a row (`None` for null and local).
fn image_of<'a>(
    export: ExportKind,
    lab: &'a Lab,
    storage: Option<&'a Image>,
) -> Result<Option<&'a Path>, String> {
    Ok(match export {
        ExportKind::Null | ExportKind::Local => None,
        ExportKind::File => Some(lab.image().ok_or("the file row needs the tmpfs image")?),
        _ => Some(
            storage
                .map(|s| s.path.as_path())
                .ok_or("the storage rows need the image on real storage")?,
        ),
    })
}

/// One run: start the daemon, snapshot, load, snapshot, stop. On the device and local
/// rows: only the load, on the image or the character device itself.
fn run_one(plan: &Plan, lab: &Lab, storage: Option<&Image>, cell: &Cell) -> Result<Run, String> {
    let size = cell.export.size(plan.storage_size);
    let image = image_of(cell.export, lab, storage)?;
    if let Some(path) = image.filter(|_| cell.export.on_storage()) {
        storage::evict(path)?;
    }
    if !cell.export.mounted() {
        let target = match cell.export {
            ExportKind::Local => Path::new(export::local_target(cell.workload.rw.writes())),
            _ => image.ok_or("the device row needs an image")?,
        };
        return Ok(Run {
            load: load(plan, lab, target, size, &cell.workload)?,
            daemon_cpu_pct: None,
            per_request: None,
        });
    }
    let mut daemon = start(plan, lab, cell.export, image)?;
    let before = daemon.snapshot()?;
    let cpu0 = daemon.cpu_seconds();
    let started = Instant::now();
    let load = load(plan, lab, &lab.mountpoint(), size, &cell.workload)?;
    let wall = started.elapsed().as_secs_f64();
    let cpu1 = daemon.cpu_seconds();
    let after = daemon.snapshot()?;
    rounds::stop(&mut daemon);
    Ok(Run {
        load,
        daemon_cpu_pct: cpu0.zip(cpu1).map(|(a, b)| (b - a) / wall * 100.0),
        per_request: PerRequest::from_stats(&stats::diff(&before, &after), plan.ring_replies),
    })
}

/// Starts `corofuse mount` for the row, on `image` (or null:1G).
fn start(
    plan: &Plan,
    lab: &Lab,
    export: ExportKind,
    image: Option<&Path>,
) -> Result<Daemon, String> {
    let mountpoint = lab.mountpoint();
    rounds::start_daemon(lab, &mountpoint, |paths| {
        let spec = image.map_or("null:1G".into(), |p| p.display().to_string());
        let extra = corofuse_options(export, &plan.mount_opts);
        let cmd = daemon::corofuse_command(&plan.corofuse, &spec, paths, &extra);
        Daemon::start(cmd, "corofuse mount", paths).map_err(|e| {
            if plan.mount_opts.is_empty() {
                e
            } else {
                format!(
                    "{e}\n(extra options from --mount-opt: {})",
                    plan.mount_opts.join(" ")
                )
            }
        })
    })
}

/// The options `corofuse mount` gets for a row beyond `-w`: `--direct` and
/// `--passthrough` as the row says, `--format raw` for the raw image files (a probed raw
/// image's first sector is checked on every write to it, and its mappings are not passed
/// through), then `--mount-opt`'s.
fn corofuse_options(export: ExportKind, mount_opts: &[String]) -> Vec<String> {
    let mut extra = Vec::new();
    if export.direct() {
        extra.push("--direct".to_string());
    }
    if export.passthrough() {
        extra.push("--passthrough".to_string());
    }
    if export.raw_file() {
        extra.extend(["--format".to_string(), "raw".to_string()]);
    }
    extra.extend(mount_opts.iter().cloned());
    extra
}

/// Runs the built-in load (O_DIRECT) on `target`, over its first `size` bytes.
fn load(
    plan: &Plan,
    lab: &Lab,
    target: &Path,
    size: u64,
    w: &Workload,
) -> Result<LoadResult, String> {
    let (out, err) = (lab.file("load.out"), lab.file("load.err"));
    let exe = std::env::current_exe().map_err(|e| format!("cannot find my own binary: {e}"))?;
    let mut cmd = Command::new(exe);
    cmd.arg("bench")
        .arg("load")
        .arg("--file")
        .arg(target)
        .args(["--rw", w.rw.name(), "--engine", w.engine.name()])
        .args([
            "--bs",
            &w.bs.to_string(),
            "--iodepth",
            &w.iodepth.to_string(),
        ])
        .args(["--seconds", &plan.seconds.to_string()])
        .args(["--jobs", &plan.jobs.to_string()])
        .args(["--size", &size.to_string()]);
    let mut c = child::spawn_load(&mut cmd, &out, &err)?
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn corofuse_options_per_row() {
        assert!(corofuse_options(ExportKind::Null, &[]).is_empty());
        assert_eq!(corofuse_options(ExportKind::Disk, &[]), ["--format", "raw"]);
        assert_eq!(
            corofuse_options(ExportKind::DiskDirect, &[]),
            ["--direct", "--format", "raw"]
        );
        assert_eq!(
            corofuse_options(ExportKind::DiskDirectPt, &["--poll-us".into(), "50".into()]),
            [
                "--direct",
                "--passthrough",
                "--format",
                "raw",
                "--poll-us",
                "50"
            ]
        );
    }
}
