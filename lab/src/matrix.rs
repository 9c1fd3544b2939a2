//! The matrix runner: every (export, workload, server) cell, `trials` times, each run on
//! a freshly started daemon, with progress on stderr.
//!
//! Why this order ([`rounds::schedule`], `--dir`'s too): trials are the outer loop, so noise
//! from the shared machine spreads over all cells instead of hitting one; with
//! `--compare-qsd`, corofuse and qsd run back to back for each cell, alternating which goes
//! first. A fresh daemon per run keeps
//! runs independent (no state carried from a previous workload) and gives clean
//! statistics, which are still taken as the difference of two SIGUSR1 snapshots around
//! the load so that mounting and opening are not counted. Every run on the image on real
//! storage starts with the image out of the page cache ([`storage::evict`]), the
//! `device` row runs the load on the image itself, with no daemon, and the `local` row
//! on /dev/zero or /dev/null ([`export::local_target`]). Every run of the `nbd` row
//! starts qemu-nbd on the (evicted) image and stops it after the run, its clients
//! stopped first ([`QemuNbd`]); its limit runs fio's nbd engine at that qemu-nbd.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::affinity;
use super::daemon::{self, Daemon};
use super::export::{self, ExportKind, Server};
use super::lab::Lab;
use super::load::LoadResult;
use super::nbd::QemuNbd;
use super::plan::Plan;
use super::stats::{self, PerRequest};
use super::storage::{self, Image};
use super::variant::Variant;
use super::workload::Workload;
use super::{child, fio, interrupt, qcow2, qsd, rounds};

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

/// Runs the plan; `lab` already holds the tmpfs image if the `file` row is planned,
/// and `storage` is the image on real storage if a storage row is.
pub fn run(plan: &Plan, lab: &Lab, storage: Option<&Image>) -> Result<Vec<Cell>, String> {
    // One group per (export, workload): its servers run back to back.
    let mut groups: Vec<Vec<Cell>> = Vec::new();
    for row in &plan.rows {
        for &workload in &row.workloads {
            let servers = plan.servers(row.export);
            groups.push(
                servers
                    .into_iter()
                    .map(|server| Cell {
                        export: row.export,
                        workload,
                        server,
                        runs: Vec::new(),
                    })
                    .collect(),
            );
        }
    }
    let sizes: Vec<usize> = groups.iter().map(Vec::len).collect();
    let steps = rounds::schedule(plan.trials, &sizes);
    for (i, &step) in steps.iter().enumerate() {
        let cell = &mut groups[step.group][step.server];
        let (export, server) = (cell.export.name(), cell.server.name());
        let what = format!("{export} {} {server}", cell.workload.label());
        rounds::progress(i, steps.len(), &what, step, plan.trials);
        let run = run_one(plan, lab, storage, cell).inspect_err(|_| eprintln!("failed"))?;
        let load = &run.load;
        eprintln!(
            "{:.0} IOPS, {:.1} MB/s, p99 {:.1} us",
            load.iops, load.mb_s, load.p99_us
        );
        cell.runs.push(run);
    }
    Ok(groups.into_iter().flatten().collect())
}

/// The image behind a row (`None` for null).
fn image_of<'a>(
    export: ExportKind,
    lab: &'a Lab,
    storage: Option<&'a Image>,
) -> Result<Option<&'a Path>, String> {
    Ok(match export {
        ExportKind::Null | ExportKind::Local => None,
        ExportKind::File => Some(lab.image().ok_or("the file row needs the tmpfs image")?),
        ExportKind::Device
        | ExportKind::Disk
        | ExportKind::DiskDirect
        | ExportKind::DiskPt
        | ExportKind::DiskDirectPt
        | ExportKind::Nbd => Some(
            storage
                .map(|s| s.path.as_path())
                .ok_or("the storage rows need the image on real storage")?,
        ),
        ExportKind::Qcow2 => Some(
            storage
                .and_then(|s| s.qcow2.as_ref())
                .map(|q| q.path.as_path())
                .ok_or("the qcow2 row needs its image beside the storage image")?,
        ),
        // Made by `run_one` before each run.
        ExportKind::Qcow2Alloc => None,
    })
}

/// One run: start the daemon, snapshot, load, snapshot, stop. On the device row: only
/// the load, on the image itself.
fn run_one(plan: &Plan, lab: &Lab, storage: Option<&Image>, cell: &Cell) -> Result<Run, String> {
    let size = cell.export.size(plan.storage_size);
    // qcow2-alloc: a fresh empty image for every run, removed after it (dropped last).
    let empty = match (cell.export, storage) {
        (ExportKind::Qcow2Alloc, Some(s)) => {
            Some(qcow2::Empty::create(&qcow2::empty_path(&s.path), size)?)
        }
        (ExportKind::Qcow2Alloc, None) => {
            return Err("the qcow2-alloc row needs --storage-dir".into())
        }
        _ => None,
    };
    let image = match &empty {
        Some(e) => Some(e.path()),
        None => image_of(cell.export, lab, storage)?,
    };
    if let Some(path) = image.filter(|_| cell.export.on_storage()) {
        storage::evict(path)?;
    }
    // nbd: qemu-nbd on the image for this run only; declared before the daemon, so
    // dropped after it (the daemon is stopped explicitly anyway).
    let server = match (cell.export, image) {
        (ExportKind::Nbd, Some(path)) => Some(QemuNbd::start(
            path,
            &lab.file("nbd.sock"),
            &lab.file("qemu-nbd.log"),
        )?),
        _ => None,
    };
    if cell.server == Server::NbdLimit {
        let uri = server
            .as_ref()
            .map(QemuNbd::uri)
            .ok_or("the limit needs qemu-nbd")?;
        return Ok(Run {
            load: limit_load(plan, lab, &uri, size, &cell.workload)?,
            daemon_cpu_pct: None,
            per_request: None,
        });
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
    let mut daemon = start(plan, lab, cell, image, server.as_ref())?;
    if let Some(cpu) = plan.placement.and_then(|p| p.daemon) {
        affinity::pin_process(daemon.pid(), cpu)?;
    }
    let corofuse = cell.server.is_corofuse();
    let before = if corofuse {
        Some(daemon.snapshot()?)
    } else {
        None
    };
    let cpu0 = daemon.cpu_seconds();
    let started = Instant::now();
    let load = load(plan, lab, &lab.mountpoint(), size, &cell.workload)?;
    let wall = started.elapsed().as_secs_f64();
    let cpu1 = daemon.cpu_seconds();
    let after = if corofuse {
        Some(daemon.snapshot()?)
    } else {
        None
    };
    rounds::stop(&mut daemon);
    let per_request = before
        .zip(after)
        .and_then(|(b, a)| PerRequest::from_stats(&stats::diff(&b, &a), plan.ring_replies));
    Ok(Run {
        load,
        daemon_cpu_pct: cpu0.zip(cpu1).map(|(a, b)| (b - a) / wall * 100.0),
        per_request,
    })
}

/// Starts the cell's daemon on `image`, or with `server` (the nbd row) on its socket.
fn start(
    plan: &Plan,
    lab: &Lab,
    cell: &Cell,
    image: Option<&Path>,
    server: Option<&QemuNbd>,
) -> Result<Daemon, String> {
    let mountpoint = lab.mountpoint();
    let image = server.map(QemuNbd::socket).or(image);
    rounds::start_daemon(lab, &mountpoint, cell.server.is_corofuse(), |paths| {
        let (cmd, name) = match cell.server {
            Server::Corofuse(variant) => {
                let spec = match (server, image) {
                    (Some(s), _) => s.uri(),
                    (None, Some(p)) => p.display().to_string(),
                    (None, None) => "null:1G".into(),
                };
                let extra = corofuse_options(cell.export, variant, &plan.mount_opts);
                let cmd = daemon::corofuse_command(&spec, paths, &extra)?;
                (cmd, "corofuse mount")
            }
            Server::Qsd => {
                let image = image.unwrap_or(Path::new(""));
                let cmd = qsd::command(&plan.qsd, cell.export, image, paths)?;
                (cmd, qsd::PROGRAM)
            }
            Server::Bare | Server::NbdLimit => {
                return Err("the rows without FUSE have no daemon".into())
            }
        };
        Daemon::start(cmd, name, paths).map_err(|e| match cell.server {
            Server::Corofuse(v) if plan.compares_variants() || !plan.mount_opts.is_empty() => {
                format!(
                    "{e}\n(variant {}, extra options from --mount-opt: {})",
                    v.label(),
                    plan.mount_opts.join(" ")
                )
            }
            _ => e,
        })
    })
}

/// The options `corofuse mount` gets for a row beyond `-w`: `--direct` for disk-direct,
/// `--format qcow2` for the qcow2 rows (the magic would choose it too; said so that a
/// detection mistake fails instead of exporting the container bytes), `--format raw` for
/// the raw image files (as qsd always names its driver; a probed raw image's first sector
/// is checked on every write to it, and its mappings are not passed through), then the
/// variant's and `--mount-opt`'s (the nbd row: those only).
fn corofuse_options(export: ExportKind, variant: Variant, mount_opts: &[String]) -> Vec<String> {
    let mut extra = Vec::new();
    if export.direct() {
        extra.push("--direct".to_string());
    }
    if export.passthrough() {
        extra.push("--passthrough".to_string());
    }
    if export.qcow2() {
        extra.extend(["--format".to_string(), "qcow2".to_string()]);
    }
    if export.raw_file() {
        extra.extend(["--format".to_string(), "raw".to_string()]);
    }
    extra.extend(variant.mount_args());
    extra.extend(mount_opts.iter().cloned());
    extra
}

/// The nbd row's limit: fio's nbd engine at `uri`, over the export's first `size` bytes
/// (fio whatever the load of the other cells: the built-in load speaks no NBD).
fn limit_load(
    plan: &Plan,
    lab: &Lab,
    uri: &str,
    size: u64,
    w: &Workload,
) -> Result<LoadResult, String> {
    let (out, err) = (lab.file("load.out"), lab.file("load.err"));
    let cpu = plan.placement.map(|p| p.load);
    let target = fio::Target::Nbd(uri);
    fio::run(target, size, w, plan.jobs, plan.seconds, cpu, &out, &err)
}

/// Runs the load (built-in or fio, O_DIRECT) on `target`, over its first `size` bytes.
fn load(
    plan: &Plan,
    lab: &Lab,
    target: &Path,
    size: u64,
    w: &Workload,
) -> Result<LoadResult, String> {
    let (out, err) = (lab.file("load.out"), lab.file("load.err"));
    let cpu = plan.placement.map(|p| p.load);
    if plan.fio {
        let target = fio::Target::File(target);
        return fio::run(target, size, w, plan.jobs, plan.seconds, cpu, &out, &err);
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::variant::Transport;

    #[test]
    fn nbd_row_mounts_the_uri_of_its_qemu_nbd() {
        let (mnt, pid, log) = (Path::new("/m/mnt"), Path::new("/m/pid"), Path::new("/m/l"));
        let paths = daemon::Paths {
            mountpoint: mnt,
            pidfile: pid,
            log,
            stats: None,
        };
        let uri = crate::nbd::uri(Path::new("/m/nbd.sock"));
        let cmd = daemon::corofuse_command(&uri, &paths, &[]).expect("command");
        let args = crate::child::args_of(&cmd);
        assert_eq!(
            args,
            [
                "mount",
                "nbd+unix:///?socket=/m/nbd.sock",
                "/m/mnt",
                "--writable",
                "--pidfile",
                "/m/pid"
            ]
        );
    }

    #[test]
    fn corofuse_options_per_row() {
        let base = Variant::default();
        assert!(corofuse_options(ExportKind::Null, base, &[]).is_empty());
        assert_eq!(
            corofuse_options(ExportKind::Disk, base, &[]),
            ["--format", "raw"]
        );
        assert_eq!(
            corofuse_options(ExportKind::DiskDirect, base, &[]),
            ["--direct", "--format", "raw"]
        );
        assert_eq!(
            corofuse_options(ExportKind::DiskDirectPt, base, &[]),
            ["--direct", "--passthrough", "--format", "raw"]
        );
        for e in [ExportKind::Qcow2, ExportKind::Qcow2Alloc] {
            assert_eq!(corofuse_options(e, base, &[]), ["--format", "qcow2"]);
        }
        let q2 = Variant {
            queues: Some(2),
            transport: None,
        };
        assert_eq!(
            corofuse_options(ExportKind::Nbd, q2, &["--poll-us".into(), "50".into()]),
            ["--queues", "2", "--poll-us", "50"],
            "the run's options, nothing of the row's own"
        );
        let v = Variant {
            queues: Some(2),
            transport: Some(Transport::Dev),
        };
        assert_eq!(
            corofuse_options(ExportKind::Qcow2, v, &["--readers".into(), "4".into()]),
            [
                "--format",
                "qcow2",
                "--queues",
                "2",
                "--transport",
                "dev",
                "--readers",
                "4"
            ]
        );
    }
}
