//! Runs `--dir`'s plan: every (job, server) on a freshly started daemon, in the
//! interleaved order of [`rounds::schedule`], with progress on stderr, and an error per row
//! rather than an end to the run when a row fails (a daemon that does not start, an
//! EMFILE, a fio error): the other rows go on.
//!
//! Why a fresh daemon per job: each mount starts with the kernel's caches of the export
//! empty, so no row is served from what the row before looked up; the metadata job mounts
//! twice for that reason (create on one mount; stat and unlink on the next, so that the
//! stats reach the daemon instead of the kernel's attribute cache). The daemon's CPU time
//! (/proc, all threads) is read around each timed phase.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde::Serialize;

use super::meta::{self, Op, Timed};
use super::plan::{DirPlan, Job, Section};
use super::readdir::{self, Listing};
use super::servers::Server;
use super::tree::Tree;
use crate::daemon::Daemon;
use crate::lab::Lab;
use crate::load::LoadResult;
use crate::rounds::{self, stop};
use crate::{child, fio, interrupt};

/// How long one client phase may take before it is killed (a stuck FUSE request).
const CLIENT_TIMEOUT: Duration = Duration::from_secs(600);

/// One row's figures from one run.
#[derive(Clone, Debug, Serialize)]
pub struct Measure {
    /// Operations done: files, entries, or fio's I/Os.
    pub ops: u64,
    pub seconds: f64,
    /// The daemon's CPU time over the phase.
    pub daemon_cpu_seconds: Option<f64>,
    /// corofuse's own count of a readdir row's listing.
    pub listing: Option<Listing>,
    pub fio: Option<LoadResult>,
}

impl Measure {
    /// Operations per second of the client (fio's IOPS for a fio row).
    pub fn ops_per_second(&self) -> f64 {
        if let Some(f) = &self.fio {
            f.iops
        } else if self.seconds > 0.0 {
            self.ops as f64 / self.seconds
        } else {
            f64::NAN
        }
    }

    /// The client's time per operation, microseconds (fio's mean latency for a fio row).
    pub fn us_per_op(&self) -> f64 {
        match &self.fio {
            Some(f) => f.mean_us,
            None if self.ops > 0 => self.seconds * 1e6 / self.ops as f64,
            None => f64::NAN,
        }
    }

    /// The daemon's CPU time per operation, microseconds.
    pub fn daemon_cpu_us_per_op(&self) -> Option<f64> {
        self.daemon_cpu_seconds
            .filter(|_| self.ops > 0)
            .map(|c| c * 1e6 / self.ops as f64)
    }
}

/// A run's result for one row.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Ok(Measure),
    Failed(String),
    /// A row the server does not run (the source ceiling runs only the fio rows).
    NotRun,
}

/// All runs of one (row, server).
#[derive(Clone, Debug, Serialize)]
pub struct Cell {
    pub row: String,
    pub section: Section,
    pub server: String,
    pub corofuse: bool,
    pub runs: Vec<Outcome>,
}

/// Runs the plan on `tree`; an error only when interrupted.
pub fn run(plan: &DirPlan, lab: &Lab, tree: &Tree) -> Result<Vec<Cell>, String> {
    // cells[job][row][server]
    let mut cells: Vec<Vec<Vec<Cell>>> = plan
        .jobs
        .iter()
        .map(|job| {
            job.rows(plan)
                .into_iter()
                .map(|row| {
                    plan.servers
                        .iter()
                        .map(|s| Cell {
                            row: row.clone(),
                            section: job.section(),
                            server: s.name(),
                            corofuse: s.is_corofuse(),
                            runs: Vec::new(),
                        })
                        .collect()
                })
                .collect()
        })
        .collect();
    let steps = rounds::schedule(plan.trials, &vec![plan.servers.len(); plan.jobs.len()]);
    for (i, &step) in steps.iter().enumerate() {
        let (job, server) = (&plan.jobs[step.group], &plan.servers[step.server]);
        let what = format!("{} {}", job.rows(plan).join(", "), server.name());
        rounds::progress(i, steps.len(), &what, step, plan.trials);
        let outcomes = run_one(plan, lab, tree, job, server, i)?;
        interrupt::check()?;
        let summary: Vec<String> = outcomes.iter().map(progress).collect();
        eprintln!("{}", summary.join("; "));
        for (cell, outcome) in cells[step.group].iter_mut().zip(outcomes) {
            cell[step.server].runs.push(outcome);
        }
    }
    Ok(cells.into_iter().flatten().flatten().collect())
}

fn progress(o: &Outcome) -> String {
    match o {
        Outcome::Ok(m) => format!("{:.0} ops/s", m.ops_per_second()),
        Outcome::Failed(e) => format!("FAILED: {e}"),
        Outcome::NotRun => "not run".into(),
    }
}

/// One job on one server: its rows' outcomes, in order. An error only when interrupted.
fn run_one(
    plan: &DirPlan,
    lab: &Lab,
    tree: &Tree,
    job: &Job,
    server: &Server,
    step: usize,
) -> Result<Vec<Outcome>, String> {
    let rows = job.rows(plan).len();
    let fail_all = |e: String| Ok(vec![Outcome::Failed(e); rows]);
    if let Server::Source = server {
        return Ok(match job {
            Job::Fio(f) => vec![fio_on(plan, lab, &tree.root().join(Tree::BIG), f, None)],
            _ => vec![Outcome::NotRun; rows],
        });
    }
    if let Job::Meta = job {
        return metadata(plan, lab, tree, server, step);
    }
    let mut daemon = match start(lab, tree, server) {
        Ok(d) => d,
        Err(e) => {
            interrupt::check()?;
            return fail_all(e);
        }
    };
    let mnt = lab.dir_mountpoint()?;
    let outcome = match job {
        Job::Meta => unreachable!("handled above"),
        Job::LsL => {
            let dir = mnt.join(Tree::readdir_name(plan.largest_dir()));
            timed(&daemon, || client(lab, Op::LsL, &dir, 0))
        }
        Job::Find => timed(&daemon, || client(lab, Op::Find, &mnt.join(Tree::FIND), 0)),
        Job::Readdir(n) => listing(lab, &mut daemon, &mnt, *n, server.is_corofuse()),
        Job::Fio(f) => fio_on(plan, lab, &mnt.join(Tree::BIG), f, Some(&daemon)),
    };
    stop(&mut daemon);
    Ok(vec![outcome])
}

/// A fio row on `target` (through a mount, or the source file itself without a daemon),
/// with the daemon's CPU time over it where there is one.
fn fio_on(
    plan: &DirPlan,
    lab: &Lab,
    target: &Path,
    f: &super::plan::FioRow,
    daemon: Option<&Daemon>,
) -> Outcome {
    let cpu0 = daemon.and_then(Daemon::cpu_seconds);
    let (out, err) = (lab.file("fio.out"), lab.file("fio.err"));
    let r = fio::run(
        fio::Target::File(target),
        plan.file_size,
        &f.workload,
        f.jobs,
        plan.seconds,
        None,
        &out,
        &err,
    );
    let cpu = cpu0
        .zip(daemon.and_then(Daemon::cpu_seconds))
        .map(|(a, b)| b - a);
    match r {
        Ok(load) => Outcome::Ok(Measure {
            ops: load.ops,
            seconds: load.seconds,
            daemon_cpu_seconds: cpu,
            listing: None,
            fio: Some(load),
        }),
        Err(e) => Outcome::Failed(e),
    }
}

/// Create through one mount; stat and unlink through the next (module docs). Whatever
/// is left is removed from the source afterwards, untimed.
fn metadata(
    plan: &DirPlan,
    lab: &Lab,
    tree: &Tree,
    server: &Server,
    step: usize,
) -> Result<Vec<Outcome>, String> {
    let name = format!("meta-{step}");
    let result = (|| -> Result<Vec<Outcome>, String> {
        let mut daemon = start(lab, tree, server)?;
        let dir = lab.dir_mountpoint()?.join(&name);
        std::fs::create_dir(&dir).map_err(|e| meta::describe(&e, "mkdir through the mount"))?;
        let (created, create) = phase(&daemon, || client(lab, Op::Create, &dir, plan.files));
        stop(&mut daemon);
        if created == 0 {
            let why = "not run: no file was created".to_string();
            return Ok(vec![
                create,
                Outcome::Failed(why.clone()),
                Outcome::Failed(why),
            ]);
        }
        let mut daemon = start(lab, tree, server)?;
        let (_, stat) = phase(&daemon, || client(lab, Op::Stat, &dir, created));
        let (_, unlink) = phase(&daemon, || client(lab, Op::Unlink, &dir, created));
        stop(&mut daemon);
        Ok(vec![create, stat, unlink])
    })();
    let left = tree.root().join(&name);
    if left.exists() {
        if let Err(e) = std::fs::remove_dir_all(&left) {
            eprintln!(
                "\ncorofuse bench: warning: cannot remove {}: {e}",
                left.display()
            );
        }
    }
    match result {
        Ok(outcomes) => Ok(outcomes),
        Err(e) => {
            interrupt::check()?;
            Ok(vec![Outcome::Failed(e); 3])
        }
    }
}

/// Runs a phase with the daemon's CPU time around it; also returns the operations done.
fn phase(daemon: &Daemon, f: impl FnOnce() -> Timed) -> (u64, Outcome) {
    let cpu0 = daemon.cpu_seconds();
    let t = f();
    let cpu = cpu0.zip(daemon.cpu_seconds()).map(|(a, b)| b - a);
    let ops = t.ops;
    let outcome = match t.error {
        Some(e) => Outcome::Failed(e),
        None => Outcome::Ok(Measure {
            ops: t.ops,
            seconds: t.seconds,
            daemon_cpu_seconds: cpu,
            listing: None,
            fio: None,
        }),
    };
    (ops, outcome)
}

fn timed(daemon: &Daemon, f: impl FnOnce() -> Timed) -> Outcome {
    phase(daemon, f).1
}

/// A readdir row: the client's listing, and for corofuse its own count of it.
fn listing(lab: &Lab, daemon: &mut Daemon, mnt: &Path, n: u64, corofuse: bool) -> Outcome {
    let before = if corofuse {
        match daemon.snapshot() {
            Ok(v) => Some(v),
            Err(e) => return Outcome::Failed(e),
        }
    } else {
        None
    };
    let dir = mnt.join(Tree::readdir_name(n));
    let mut outcome = timed(daemon, || client(lab, Op::List, &dir, 0));
    if let (Outcome::Ok(m), Some(before)) = (&mut outcome, before) {
        if m.ops != n {
            return Outcome::Failed(format!("listed {} entries, not {n}", m.ops));
        }
        match readdir::settle(daemon, &before, n) {
            Ok(l) => m.listing = Some(l),
            Err(e) => return Outcome::Failed(e),
        }
    }
    outcome
}

/// Runs one phase in a child process (`bench dir-client`, see [`meta`]); a child that
/// fails, hangs past [`CLIENT_TIMEOUT`] or is interrupted is an error of the phase.
fn client(lab: &Lab, op: Op, dir: &Path, files: u64) -> Timed {
    let failed = |e: String| Timed {
        ops: 0,
        seconds: 0.0,
        error: Some(e),
    };
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => return failed(format!("cannot find my own binary: {e}")),
    };
    let mut cmd = Command::new(exe);
    cmd.args(["bench", "dir-client", "--op", op.name(), "--files"])
        .arg(files.to_string())
        .arg("--dir")
        .arg(dir);
    let (out, err) = (lab.file("client.out"), lab.file("client.err"));
    let result = (|| {
        let mut c = child::spawn_load(&mut cmd, None, &out, &err)?
            .map_err(|e| format!("cannot start the client: {e}"))?;
        let status = child::wait(&mut c, CLIENT_TIMEOUT, "the client")?;
        if !status.success() {
            return Err(format!(
                "the client failed ({status}):{}",
                child::tail(&err, 5)
            ));
        }
        let text = std::fs::read_to_string(&out).unwrap_or_default();
        serde_json::from_str::<Timed>(text.trim()).map_err(|e| {
            format!(
                "the client printed no result ({e}):{}",
                child::tail(&err, 5)
            )
        })
    })();
    result.unwrap_or_else(failed)
}

fn start(lab: &Lab, tree: &Tree, server: &Server) -> Result<Daemon, String> {
    let mountpoint = lab.dir_mountpoint()?;
    rounds::start_daemon(lab, &mountpoint, server.is_corofuse(), |paths| {
        let cmd = server.command(tree.root(), paths)?;
        if server.is_corofuse() {
            Daemon::start(cmd, "corofuse mount-dir", paths)
        } else {
            Daemon::start_foreground(cmd, "passthrough_hp", paths)
        }
    })
}
