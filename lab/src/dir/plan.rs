//! `--dir`'s command line resolved: which jobs (each a fresh mount) and which servers
//! (the corofuse configurations, then passthrough_hp's), run in the interleaved order of
//! [`crate::rounds`]; checked before anything is mounted or written.

use std::ffi::OsString;
use std::path::PathBuf;

use super::servers::{self, Server};
use super::RowSet;
use crate::workload::{self, wl, Engine, Rw, Workload};
use crate::LabArgs;

/// One fio row: a workload and how many fio jobs run it (reported as one).
#[derive(Clone, Copy, Debug)]
pub struct FioRow {
    pub workload: Workload,
    pub jobs: u32,
}

impl FioRow {
    pub fn label(&self) -> String {
        if self.jobs > 1 {
            format!("{} x{} jobs", self.workload.label(), self.jobs)
        } else {
            self.workload.label()
        }
    }
}

const fn row(workload: Workload, jobs: u32) -> FioRow {
    FioRow { workload, jobs }
}

/// 4 KiB random reads and writes at qd1 (psync) and qd64 (io_uring), the image lab's
/// first four workloads, and 1 MiB random writes by 16 jobs at qd64 each (virtiofsd's
/// pwritev experiment, CONTEXT.md).
pub const FIO_ROWS: [FioRow; 5] = [
    row(workload::ALL[0], 1),
    row(workload::ALL[1], 1),
    row(workload::ALL[2], 1),
    row(workload::ALL[3], 1),
    row(
        wl(
            "randwrite1m-uring-qd64",
            Rw::Randwrite,
            1 << 20,
            Engine::IoUring,
            64,
        ),
        16,
    ),
];

/// What one mount of one server does.
#[derive(Clone, Copy, Debug)]
pub enum Job {
    /// Create `files` small files through the mount; then, on a fresh mount, stat and
    /// unlink them: three rows.
    Meta,
    /// `ls -l` of the largest readdir directory: list it and lstat every entry.
    LsL,
    /// `find` of the tree: a recursive listing by d_type, no stats.
    Find,
    /// List a directory of this many entries (names only).
    Readdir(u64),
    Fio(FioRow),
}

/// The table's sections.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Section {
    Metadata,
    Readdir,
    Data,
}

impl Job {
    /// The table rows this job yields, in order.
    pub fn rows(&self, plan: &DirPlan) -> Vec<String> {
        match self {
            Job::Meta => ["create", "stat", "unlink"]
                .iter()
                .map(|op| format!("{op} {} files", plan.files))
                .collect(),
            Job::LsL => vec![format!("ls -l {} entries", plan.largest_dir())],
            Job::Find => vec![format!("find {} files", plan.files)],
            Job::Readdir(n) => vec![format!("readdir {n}")],
            Job::Fio(f) => vec![f.label()],
        }
    }

    pub fn section(&self) -> Section {
        match self {
            Job::Meta | Job::LsL | Job::Find => Section::Metadata,
            Job::Readdir(_) => Section::Readdir,
            Job::Fio(_) => Section::Data,
        }
    }
}

/// What to run, resolved from the command line.
pub struct DirPlan {
    pub trials: usize,
    /// Seconds of each fio run.
    pub seconds: f64,
    /// Files the metadata rows create, stat and unlink, and files in the find tree.
    pub files: u64,
    /// The readdir rows' directory sizes, ascending.
    pub entries: Vec<u64>,
    /// Bytes of the file the fio rows run on.
    pub file_size: u64,
    pub jobs: Vec<Job>,
    pub servers: Vec<Server>,
    /// Why no passthrough_hp column, when there is none.
    pub hp_absent: Option<String>,
    /// Where the source tree goes (a real file system).
    pub storage_dir: PathBuf,
    /// Where mount point, pidfiles, logs and stats go.
    pub scratch_dir: PathBuf,
}

impl DirPlan {
    /// The largest readdir directory, which the `ls -l` row lists too.
    pub fn largest_dir(&self) -> u64 {
        self.entries.last().copied().unwrap_or(0)
    }

    pub fn has(&self, f: impl Fn(&Job) -> bool) -> bool {
        self.jobs.iter().any(f)
    }

    /// Whether some corofuse configuration serves FUSE over io_uring.
    pub fn uses_uring(&self) -> bool {
        self.servers.iter().any(|s| match s {
            Server::Corofuse { variant, .. } => variant.uses_uring(),
            Server::Hp { .. } | Server::Source => false,
        })
    }

    /// Daemon starts in all (the metadata job mounts twice).
    pub fn mounts(&self) -> usize {
        let per_trial: usize = self
            .jobs
            .iter()
            .map(|j| if matches!(j, Job::Meta) { 2 } else { 1 })
            .sum();
        let mounting = self
            .servers
            .iter()
            .filter(|s| !matches!(s, Server::Source))
            .count();
        per_trial * mounting * self.trials
    }
}

/// The image rows' options that `--dir` has no use for, with whether each was given.
fn image_only(args: &LabArgs) -> [(&'static str, bool); 10] {
    [
        ("--only", !args.only.is_empty()),
        ("--workload", !args.workloads.is_empty()),
        ("--fio", args.fio),
        ("--jobs", args.jobs != 1),
        ("--compare-qsd", args.compare_qsd),
        ("--qsd", args.qsd.is_some()),
        ("--qsd-iothreads", args.qsd_iothreads.is_some()),
        ("--svg", args.svg.is_some()),
        ("--cpus", args.cpus.is_some()),
        ("--refill-image", args.refill_image),
    ]
}

/// `env_hp` is `$COROFUSE_PASSTHROUGH_HP`, used when `--passthrough-hp` is not given.
pub fn build(args: &LabArgs, env_hp: Option<OsString>) -> Result<DirPlan, String> {
    if let Some((name, _)) = image_only(args).into_iter().find(|(_, given)| *given) {
        return Err(format!(
            "{name} is an option of the image rows; --dir does not use it"
        ));
    }
    let common = crate::plan::common(args)?;
    let d = &args.dir;
    let mut entries = d.entries.clone();
    entries.sort_unstable();
    entries.dedup();
    if entries.first() == Some(&0) {
        return Err("--entries: a directory size must be at least 1".into());
    }
    let rows: Vec<RowSet> = if d.rows.is_empty() {
        RowSet::ALL.to_vec()
    } else {
        d.rows.clone()
    };
    let mut jobs = Vec::new();
    for set in RowSet::ALL.into_iter().filter(|s| rows.contains(s)) {
        match set {
            RowSet::Meta => jobs.extend([Job::Meta, Job::LsL, Job::Find]),
            RowSet::Readdir => jobs.extend(entries.iter().map(|&n| Job::Readdir(n))),
            RowSet::Fio => jobs.extend(FIO_ROWS.iter().map(|&f| Job::Fio(f))),
        }
    }
    let mut servers: Vec<Server> = (common.variants.iter())
        .map(|&variant| Server::Corofuse {
            variant,
            args: servers::corofuse_args(variant, &common.mount_opts),
        })
        .collect();
    let hp = d.passthrough_hp.clone().or(env_hp.map(PathBuf::from));
    let hp_absent = match hp {
        Some(path) => {
            let configs: Vec<Vec<String>> = if d.hp_opts.is_empty() {
                vec![
                    Vec::new(),
                    servers::HP_LIKE_FOR_LIKE
                        .iter()
                        .map(|s| s.to_string())
                        .collect(),
                ]
            } else {
                d.hp_opts
                    .iter()
                    .map(|o| o.split_whitespace().map(String::from).collect())
                    .collect()
            };
            servers.extend(configs.into_iter().map(|args| Server::Hp {
                path: path.clone(),
                args,
            }));
            None
        }
        None if !d.hp_opts.is_empty() => {
            return Err("--hp-opt needs passthrough_hp: --passthrough-hp PATH".into())
        }
        None => Some(
            "no passthrough_hp binary given (--passthrough-hp PATH or \
             COROFUSE_PASSTHROUGH_HP): the project does not build or ship peers, so the \
             passthrough_hp column is absent; build libfuse's example/passthrough_hp \
             yourself and pass its path"
                .into(),
        ),
    };
    if jobs.iter().any(|j| matches!(j, Job::Fio(_))) {
        servers.push(Server::Source);
    }
    Ok(DirPlan {
        trials: common.trials,
        seconds: common.seconds,
        files: d.files,
        file_size: d.file_mib << 20,
        entries,
        jobs,
        servers,
        hp_absent,
        storage_dir: args.storage_dir.clone(),
        scratch_dir: args.scratch_dir.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    fn plan(args: &[&str], env: Option<&str>) -> Result<DirPlan, String> {
        let args: Vec<&str> = std::iter::once("--dir")
            .chain(args.iter().copied())
            .collect();
        build(&crate::parse_lab(&args)?, env.map(OsString::from))
    }

    #[test]
    fn defaults_run_every_row_with_corofuse_alone_and_say_why() {
        let p = plan(&[], None).expect("plans");
        assert_eq!(p.files, 100_000);
        assert_eq!(p.entries, [1_000, 10_000, 100_000]);
        assert_eq!(p.file_size, 1 << 30);
        let rows: Vec<String> = p.jobs.iter().flat_map(|j| j.rows(&p)).collect();
        assert_eq!(
            rows,
            [
                "create 100000 files",
                "stat 100000 files",
                "unlink 100000 files",
                "ls -l 100000 entries",
                "find 100000 files",
                "readdir 1000",
                "readdir 10000",
                "readdir 100000",
                "randread 4k psync qd1",
                "randwrite 4k psync qd1",
                "randread 4k io_uring qd64",
                "randwrite 4k io_uring qd64",
                "randwrite 1m io_uring qd64 x16 jobs",
            ]
        );
        assert_eq!(p.servers.len(), 2);
        assert!(p
            .hp_absent
            .as_deref()
            .is_some_and(|w| w.contains("--passthrough-hp")));
        assert_eq!(p.servers[0].name(), "corofuse");
        assert_eq!(
            p.servers[1].name(),
            "source (no FUSE)",
            "the fio rows' ceiling"
        );
        assert_eq!(p.mounts(), 12, "11 jobs, the metadata one mounting twice");
        assert!(!p.uses_uring());
    }

    #[test]
    fn passthrough_hp_from_the_option_or_the_environment() {
        let p = plan(&["--passthrough-hp", "/opt/hp"], Some("/env/hp")).expect("plans");
        assert!(p.hp_absent.is_none());
        let (defaults, like) = (&p.servers[1], &p.servers[2]);
        assert_eq!(
            defaults.name(),
            "passthrough_hp (its defaults)",
            "as users run it"
        );
        assert_eq!(defaults.command_line(), "/opt/hp");
        assert_eq!(like.name(), "passthrough_hp");
        assert_eq!(like.command_line(), "/opt/hp --nopassthrough");
        let p = plan(&[], Some("/env/hp")).expect("plans");
        assert_eq!(p.servers[2].command_line(), "/env/hp --nopassthrough");
        let p = plan(
            &[
                "--passthrough-hp",
                "/hp",
                "--hp-opt",
                "--nopassthrough --nosplice",
                "--hp-opt",
                "",
            ],
            None,
        )
        .expect("plans");
        let names: Vec<String> = p.servers.iter().map(|s| s.name()).collect();
        assert_eq!(
            names,
            [
                "corofuse",
                "passthrough_hp --nopassthrough --nosplice",
                "passthrough_hp (its defaults)",
                "source (no FUSE)"
            ]
        );
        let e = plan(&["--hp-opt", "--nosplice"], None).err();
        assert!(e.is_some_and(|e| e.contains("--passthrough-hp")));
    }

    #[test]
    fn row_sets_sizes_and_variants() {
        let p = plan(
            &[
                "--rows",
                "readdir",
                "--entries",
                "500,20,500",
                "--files",
                "10",
            ],
            None,
        )
        .expect("plans");
        let rows: Vec<String> = p.jobs.iter().flat_map(|j| j.rows(&p)).collect();
        assert_eq!(rows, ["readdir 20", "readdir 500"]);
        let p = plan(
            &["--rows", "fio,meta", "--files", "10", "--entries", "7"],
            None,
        )
        .expect("plans");
        assert_eq!(
            p.jobs
                .iter()
                .filter(|j| j.section() == Section::Data)
                .count(),
            5
        );
        assert_eq!(
            p.jobs[0].rows(&p)[0],
            "create 10 files",
            "table order, whatever the order given"
        );
        assert_eq!(p.jobs[1].rows(&p), ["ls -l 7 entries"]);
        let p = plan(&["--queues", "1,2", "--trials", "3"], Some("/hp")).expect("plans");
        assert_eq!(
            p.servers.len(),
            5,
            "q1, q2, passthrough_hp twice, the source"
        );
        assert_eq!(p.mounts(), 12 * 4 * 3, "the source mounts nothing");
        assert!(plan(&["--entries", "0"], None).is_err());
    }

    #[test]
    fn image_row_options_are_refused() {
        for args in [
            &["--only", "null"][..],
            &["--compare-qsd"],
            &["--fio"],
            &["--jobs", "2"],
        ] {
            let e = plan(args, None).err().expect("refused");
            assert!(e.contains("--dir does not use it"), "{e}");
        }
        assert!(
            crate::parse_lab(&["--files", "10"]).is_err(),
            "--files needs --dir"
        );
    }
}
