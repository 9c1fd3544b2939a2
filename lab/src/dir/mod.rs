//! `corofuse bench --dir`: the directory export (`corofuse mount-dir`) measured beside
//! libfuse's passthrough_hp, in one run, on the same source tree on a real file system:
//! metadata (create, stat, unlink of many small files; `ls -l`; `find`), readdir of
//! large directories with the driver's and the requests' time beside the client's, and
//! fio's 4 KiB random IOPS at qd1 and qd64 and 1 MiB random writes by 16 jobs.
//!
//! Why inside the image lab: the same rules hold (ratios within one run, servers
//! interleaved, medians, a fresh daemon per run, nothing left behind) and the same parts
//! do the work: [`plan::common`](crate::plan::common) reads the options both labs share,
//! [`rounds`](crate::rounds) gives the interleaved order and starts and stops the servers
//! with [`daemon`](crate::daemon), [`fio`] drives the data rows, and the reports share
//! [`median`](crate::median) and the table.
//! The project never builds or ships a peer: passthrough_hp is the user's binary
//! (`--passthrough-hp PATH` or `COROFUSE_PASSTHROUGH_HP`); without it the corofuse rows
//! run alone and the header says why.
//!
//! Layout: [`plan`] (the command line resolved), [`servers`]
//! (command lines and the like-for-like flags), [`tree`] (the source tree),
//! [`meta`] (the client's timed system calls, hidden `bench dir-client`), [`readdir`] (corofuse's own count of a
//! listing), [`runner`] (runs the plan), [`report`] (medians, ratios, tables, JSON).

mod meta;
mod plan;
mod readdir;
mod report;
mod runner;
mod servers;
mod tree;

use std::path::PathBuf;
use std::time::Instant;

use super::{fio, lab, mountinfo, LabArgs};

pub use meta::{run as client, Args as ClientArgs};

/// The environment variable naming passthrough_hp's binary.
pub const HP_ENV: &str = "COROFUSE_PASSTHROUGH_HP";

/// Which rows `--dir` runs (`--rows`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RowSet {
    /// create, stat, unlink of --files files; ls -l; find
    Meta,
    /// readdir at each --entries size
    Readdir,
    /// fio 4 KiB random read/write at qd1 and qd64; 1 MiB random writes, 16 jobs x qd64
    Fio,
}

impl RowSet {
    pub const ALL: [RowSet; 3] = [RowSet::Meta, RowSet::Readdir, RowSet::Fio];
}

#[derive(clap::Args)]
pub struct DirArgs {
    /// Benchmark the directory export (corofuse mount-dir) instead of the image rows,
    /// beside passthrough_hp when --passthrough-hp (or COROFUSE_PASSTHROUGH_HP) names it;
    /// uses --trials, --seconds (per fio run), --storage-dir (the source tree),
    /// --scratch-dir, --mount-opt, --queues, --transport, --json
    #[arg(long = "dir")]
    pub enabled: bool,
    /// --dir: files created, stat'ed and unlinked through the mount, and in find's tree
    #[arg(long, value_name = "N", default_value_t = 100_000, requires = "enabled",
          value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub files: u64,
    /// --dir: sizes of the directories the readdir rows list (the largest is also the
    /// ls -l row's)
    #[arg(long, value_name = "LIST", value_delimiter = ',', requires = "enabled",
          default_values_t = [1_000u64, 10_000, 100_000])]
    pub entries: Vec<u64>,
    /// --dir: MiB of the file in the tree that the fio rows run on
    #[arg(long, value_name = "MIB", default_value_t = 1024, requires = "enabled",
          value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    pub file_mib: u64,
    /// --dir: libfuse's passthrough_hp binary, built by you (default:
    /// $COROFUSE_PASSTHROUGH_HP); without it the corofuse rows run alone
    #[arg(long, value_name = "PATH")]
    pub passthrough_hp: Option<PathBuf>,
    /// --dir: passthrough_hp's options, one configuration per use (default:
    /// "--nopassthrough", like-for-like with corofuse's defaults here)
    #[arg(
        long = "hp-opt",
        value_name = "OPTS",
        allow_hyphen_values = true,
        requires = "enabled"
    )]
    pub hp_opts: Vec<String>,
    /// --dir: only these rows (default: all)
    #[arg(
        long = "rows",
        value_enum,
        value_delimiter = ',',
        value_name = "LIST",
        requires = "enabled"
    )]
    pub rows: Vec<RowSet>,
}

pub fn run(args: &LabArgs) -> Result<(), String> {
    let started = Instant::now();
    let plan = plan::build(args, std::env::var_os(HP_ENV))?;
    let mut environment = super::begin()?;
    if plan.has(|j| matches!(j, plan::Job::Fio(_))) {
        environment.fio_version = Some(fio::version()?);
    }
    for s in &plan.servers {
        if let servers::Server::Hp { path, .. } = s {
            if !path.is_file() {
                return Err(format!(
                    "--passthrough-hp {}: no such file (libfuse's example/passthrough_hp, \
                     built by you)",
                    path.display()
                ));
            }
        }
    }
    if let Some(why) = &plan.hp_absent {
        eprintln!("corofuse bench --dir: {why}");
    }
    let _uring = super::arm(plan.uses_uring())?;
    let lab = lab::Lab::new(&plan.scratch_dir)?;
    let tree = tree::Tree::create(&plan)?;
    eprintln!(
        "corofuse bench --dir: {} mounts ({} server(s), {} trial(s)); Ctrl-C stops and cleans up",
        plan.mounts(),
        plan.servers.len(),
        plan.trials
    );
    let cells = runner::run(&plan, &lab, &tree)?;
    let tree_fs = mountinfo::fs_of(tree.root())
        .map_or_else(|| "unknown".into(), |(t, s)| format!("{t} on {s}"));
    let options = report::Options {
        trials: plan.trials,
        seconds: plan.seconds,
        files: plan.files,
        entries: plan.entries.clone(),
        file_mib: plan.file_size >> 20,
        servers: plan
            .servers
            .iter()
            .map(|s| (s.name(), s.command_line()))
            .collect(),
        hp_absent: plan.hp_absent.clone(),
        tree: tree.root().display().to_string(),
        tree_fs,
    };
    drop(tree);
    drop(lab);
    let report = report::DirReport::new(environment, options, cells);
    super::emit(&report, args.json, report::render)?;
    eprintln!("done in {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}
