//! From the command line to what the lab runs: which rows (exports), which workloads on
//! each, and who serves each; checked before anything is mounted or written.
//!
//! Why a separate step: the rules have grown past one line each (the storage rows run a
//! shorter default list, a storage export never runs without its `device` ceiling, the
//! `qcow2` row never without `disk`, its raw export, `qcow2-alloc` runs writes only,
//! and `nbd` has its own limit instead of `device`), and they are easier to trust with
//! tests that need no root and no mount.

use super::affinity::Placement;
use super::export::{ExportKind, Server};
use super::variant::Variant;
use super::workload::{self, Workload};
use super::LabArgs;

/// What to run, resolved from the command line.
pub struct Plan {
    pub seconds: f64,
    /// Bytes of the image on real storage (and of the qcow2 images' virtual disk).
    pub storage_size: u64,
    pub trials: usize,
    /// The rows in table order, each with the workloads it runs.
    pub rows: Vec<Row>,
    pub compare_qsd: bool,
    /// Which qemu-storage-daemon, and how it is started.
    pub qsd: super::qsd::Qsd,
    /// The corofuse configurations, each run through every cell (at least one).
    pub variants: Vec<Variant>,
    pub mount_opts: Vec<String>,
    pub placement: Option<Placement>,
    pub fio: bool,
    /// Load jobs (threads or fio jobs), each with `iodepth` in flight.
    pub jobs: u32,
    /// `--ring-replies` is among the mount options: replies are not syscalls.
    pub ring_replies: bool,
    /// Whether the nbd row runs its limit (fio's nbd engine): the lab clears it where
    /// fio has no such engine.
    pub nbd_limit: bool,
}

/// One export and its workloads.
pub struct Row {
    pub export: ExportKind,
    pub workloads: Vec<Workload>,
}

impl Plan {
    pub fn exports(&self) -> Vec<ExportKind> {
        self.rows.iter().map(|r| r.export).collect()
    }

    /// Whether some variant serves FUSE over io_uring.
    pub fn uses_uring(&self) -> bool {
        self.variants.iter().any(|v| v.uses_uring())
    }

    /// Whether the table compares corofuse configurations with each other.
    pub fn compares_variants(&self) -> bool {
        self.variants.len() > 1
    }

    /// A warning when the table compares servers or configurations with one load only:
    /// decisions are made with fio (what users measure with), and the built-in load,
    /// which spends less CPU per I/O, can rank them differently on a small machine.
    pub fn one_load_warning(&self) -> Option<String> {
        if !(self.compares_variants() || self.compare_qsd) {
            return None;
        }
        Some(if self.fio {
            "warning: this comparison was made with fio only; the built-in load (without --fio) \
             drives the same exports with less CPU per I/O: run it too before calling a \
             difference a property of the servers"
                .to_string()
        } else {
            "warning: this comparison was made with the built-in load only; users measure with \
             fio: run it again with --fio before deciding anything from it"
                .to_string()
        })
    }

    /// Whether some row needs the image on real storage.
    pub fn on_storage(&self) -> bool {
        self.rows.iter().any(|r| r.export.on_storage())
    }

    /// Whether some row exports a qcow2 image (the lab then needs qemu-img).
    pub fn uses_qcow2(&self) -> bool {
        self.rows.iter().any(|r| r.export.qcow2())
    }

    /// Whether the nbd row runs (the lab then needs qemu-nbd).
    pub fn uses_nbd(&self) -> bool {
        self.rows.iter().any(|r| r.export == ExportKind::Nbd)
    }

    /// Who runs `export`'s cells: [`ExportKind::servers`], without the nbd limit when
    /// fio cannot run it.
    pub fn servers(&self, export: ExportKind) -> Vec<Server> {
        let mut servers = export.servers(&self.variants, self.compare_qsd);
        servers.retain(|&s| s != Server::NbdLimit || self.nbd_limit);
        servers
    }

    /// Runs in all, over every trial.
    pub fn runs(&self) -> usize {
        let per_trial: usize = self
            .rows
            .iter()
            .map(|r| r.workloads.len() * self.servers(r.export).len())
            .sum();
        per_trial * self.trials
    }
}

/// What both labs read alike from the command line.
pub struct Common {
    pub seconds: f64,
    pub trials: usize,
    /// `--mount-opt`, split into words.
    pub mount_opts: Vec<String>,
    /// The corofuse configurations (`--queues` times `--transport`), at least one.
    pub variants: Vec<Variant>,
}

pub fn common(args: &LabArgs) -> Result<Common, String> {
    if !(args.seconds > 0.0 && args.seconds.is_finite()) {
        return Err("--seconds must be a positive number".into());
    }
    Ok(Common {
        seconds: args.seconds,
        trials: args.trials as usize,
        mount_opts: (args.mount_opts.iter())
            .flat_map(|o| o.split_whitespace().map(String::from))
            .collect(),
        variants: Variant::all(&args.queues, &args.transports),
    })
}

pub fn build(args: &LabArgs) -> Result<Plan, String> {
    let Common {
        seconds,
        trials,
        mount_opts,
        variants,
    } = common(args)?;
    let exports = exports(&args.only);
    let qcow2 = exports.contains(&ExportKind::Qcow2);
    let rows: Vec<Row> = exports
        .into_iter()
        .map(|export| {
            let defaults: &[&str] = match export {
                // The nbd row runs the same six: 4 KiB at qd1 and qd64, 1 MiB both ways.
                _ if export.qcow2() || export == ExportKind::Nbd => &workload::QCOW2_DEFAULT,
                // Beside the qcow2 row: its raw export and their ceiling run its cells.
                ExportKind::Device | ExportKind::Disk if qcow2 => &workload::QCOW2_DEFAULT,
                _ if export.on_storage() => &workload::STORAGE_DEFAULT,
                _ => workload::matrix_default(),
            };
            let mut workloads = workload::select(&args.workloads, defaults);
            workloads.retain(|w| export.reads() || w.rw.writes());
            Row { export, workloads }
        })
        .collect();
    let idle = |r: &Row| r.export == ExportKind::Qcow2Alloc && r.workloads.is_empty();
    if rows.iter().any(idle) {
        return Err(format!(
            "nothing to run: the qcow2-alloc row runs write workloads only, and --workload \
             names none (it has {})",
            workload::NAMES
                .iter()
                .filter(|n| n.contains("write"))
                .copied()
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    for (lab_opt, given) in [
        ("--queues", !args.queues.is_empty()),
        ("--transport", !args.transports.is_empty()),
    ] {
        if given && mount_opts.iter().any(|o| o == lab_opt) {
            return Err(format!(
                "{lab_opt} is given to the lab (one variant per value) and in --mount-opt: keep one"
            ));
        }
    }
    Ok(Plan {
        seconds,
        storage_size: args.storage_mib << 20,
        trials,
        rows,
        compare_qsd: args.compare_qsd || args.qsd.is_some() || args.qsd_iothreads.is_some(),
        qsd: super::qsd::Qsd {
            program: args
                .qsd
                .clone()
                .unwrap_or_else(|| super::qsd::PROGRAM.into()),
            iothreads: args.qsd_iothreads.unwrap_or(0),
        },
        variants,
        ring_replies: mount_opts.iter().any(|o| o == "--ring-replies"),
        nbd_limit: true,
        mount_opts,
        placement: args.cpus.map(Placement::choose).transpose()?,
        fio: args.fio,
        jobs: args.jobs,
    })
}

/// The rows for `--only`, in table order: [`ExportKind::DEFAULT`] when none is named
/// (the qcow2 and nbd rows are opt-in), the `device` row whenever an export of the file
/// on real storage runs (their ratios divide by it; not `nbd`, whose limit is its
/// server's), the `disk` row whenever `qcow2` runs (its "vs raw" divides by it). The `local` row (the load's own ceiling) runs by default and when
/// named: `--only local,null`.
pub fn exports(only: &[ExportKind]) -> Vec<ExportKind> {
    if only.is_empty() {
        return ExportKind::DEFAULT.to_vec();
    }
    let needs_device = only.iter().any(|e| e.under_device());
    let needs_disk = only.contains(&ExportKind::Qcow2);
    ExportKind::ALL
        .into_iter()
        .filter(|e| {
            only.contains(e)
                || (*e == ExportKind::Device && needs_device)
                || (*e == ExportKind::Disk && needs_disk)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_lab as parse;
    use crate::storage;
    use std::path::Path;

    fn plan(args: &[&str]) -> Plan {
        build(&parse(args).expect("parses")).expect("plans")
    }

    fn names(plan: &Plan) -> Vec<(&'static str, Vec<&'static str>)> {
        plan.rows
            .iter()
            .map(|r| {
                (
                    r.export.name(),
                    r.workloads.iter().map(|w| w.name).collect(),
                )
            })
            .collect()
    }

    #[test]
    fn default_runs_every_row_with_its_default_workloads() {
        let p = plan(&[]);
        let n = names(&p);
        let rows: Vec<&str> = n.iter().map(|r| r.0).collect();
        assert_eq!(
            rows,
            [
                "local",
                "null",
                "file",
                "device",
                "disk",
                "disk-direct",
                "disk-pt",
                "disk-direct-pt"
            ]
        );
        assert_eq!(n[0].1.len(), workload::DEFAULT_COUNT);
        for r in &n[3..] {
            assert_eq!(r.1, workload::STORAGE_DEFAULT, "{}", r.0);
        }
        assert!(p.on_storage());
        assert_eq!(p.runs(), 3 * 5 + 5 * 4);
        assert_eq!(
            plan(&["--compare-qsd", "--trials", "3"]).runs(),
            3 * (5 + 2 * 5 * 2 + 4 + 2 * 4 * 2 + 2 * 4),
            "the passthrough rows have no qsd run"
        );
        assert_eq!(p.jobs, 1);
        assert_eq!(plan(&["--jobs", "2"]).jobs, 2);
        let defaults = parse(&[]).expect("parses");
        assert_eq!(defaults.storage_dir, Path::new(storage::DEFAULT_DIR));
        assert!(!defaults.refill_image);
    }

    #[test]
    fn only_selects_rows_and_storage_exports_bring_their_ceiling() {
        let rows = |args: &[&str]| -> Vec<&str> {
            plan(args).rows.iter().map(|r| r.export.name()).collect()
        };
        assert_eq!(rows(&["--only", "null"]), ["null"]);
        assert_eq!(rows(&["--only", "null,local"]), ["local", "null"]);
        assert!(!plan(&["--only", "null,file"]).on_storage());
        assert_eq!(rows(&["--only", "disk-direct"]), ["device", "disk-direct"]);
        assert_eq!(
            rows(&["--only", "disk", "--only", "null"]),
            ["null", "device", "disk"],
            "table order, whatever the order given"
        );
        assert_eq!(rows(&["--only", "device"]), ["device"]);
        assert!(parse(&["--only", "tmpfs"]).is_err());
    }

    #[test]
    fn qcow2_rows_are_opt_in_and_bring_their_comparisons() {
        let p = plan(&["--only", "qcow2,qcow2-alloc", "--compare-qsd"]);
        let n = names(&p);
        let rows: Vec<&str> = n.iter().map(|r| r.0).collect();
        assert_eq!(rows, ["device", "disk", "qcow2", "qcow2-alloc"]);
        for r in &n[..3] {
            assert_eq!(r.1, workload::QCOW2_DEFAULT, "{}", r.0);
        }
        assert_eq!(
            n[3].1,
            [
                "randwrite-psync-qd1",
                "randwrite-uring-qd64",
                "write1m-uring-qd4"
            ],
            "no reads from an empty image"
        );
        assert!(p.uses_qcow2() && p.on_storage());
        assert!(!plan(&[]).uses_qcow2(), "not in the default run");
        assert_eq!(p.runs(), 6 + 2 * 6 * 2 + 2 * 3);
        assert_eq!(p.storage_size, crate::export::STORAGE_SIZE);
        let alone = plan(&["--only", "qcow2-alloc"]);
        let rows: Vec<&str> = alone.rows.iter().map(|r| r.export.name()).collect();
        assert_eq!(rows, ["device", "qcow2-alloc"], "its ceiling only");
        assert_eq!(
            alone.rows[0].workloads.len(),
            workload::STORAGE_DEFAULT.len()
        );
        let named = plan(&[
            "--only",
            "qcow2,qcow2-alloc",
            "--workload",
            "randread-psync-qd1",
            "--workload",
            "randwrite-uring-qd64",
        ]);
        assert_eq!(
            names(&named)[3],
            ("qcow2-alloc", vec!["randwrite-uring-qd64"])
        );
        let e = build(
            &parse(&["--only", "qcow2-alloc", "--workload", "randread-psync-qd1"]).expect("parses"),
        )
        .err();
        assert!(
            e.is_some_and(|e| e.contains("write workloads only")),
            "a run with nothing to do is refused"
        );
        let tiny = plan(&["--only", "qcow2", "--storage-mib", "8"]);
        assert_eq!(tiny.storage_size, 8 << 20);
        assert!(parse(&["--storage-mib", "0"]).is_err());
    }

    #[test]
    fn nbd_row_is_opt_in_runs_six_workloads_and_ends_with_its_limit() {
        assert!(!plan(&[]).uses_nbd(), "not in the default run");
        let mut p = plan(&["--only", "nbd", "--compare-qsd"]);
        assert_eq!(
            names(&p),
            [("nbd", workload::QCOW2_DEFAULT.to_vec())],
            "no device row: its ceiling is the server's"
        );
        assert!(p.uses_nbd() && p.on_storage() && !p.uses_qcow2());
        assert_eq!(
            p.servers(ExportKind::Nbd),
            [Server::COROFUSE, Server::Qsd, Server::NbdLimit]
        );
        assert_eq!(p.runs(), 6 * 3);
        p.nbd_limit = false;
        assert_eq!(
            p.servers(ExportKind::Nbd),
            [Server::COROFUSE, Server::Qsd],
            "fio without its nbd engine"
        );
        assert_eq!(p.runs(), 6 * 2);
        let rows = |args: &[&str]| -> Vec<&str> {
            plan(args).rows.iter().map(|r| r.export.name()).collect()
        };
        assert_eq!(rows(&["--only", "nbd,disk"]), ["device", "disk", "nbd"]);
        let one = plan(&["--only", "nbd", "--workload", "randread-uring-qd64"]);
        assert_eq!(names(&one), [("nbd", vec!["randread-uring-qd64"])]);
        assert_eq!(one.runs(), 2);
    }

    #[test]
    fn a_comparison_with_one_load_is_warned_about_and_qsd_can_be_another_build() {
        assert!(plan(&[]).one_load_warning().is_none(), "no comparison");
        let builtin = plan(&["--queues", "1,2"]).one_load_warning().unwrap();
        assert!(builtin.contains("built-in load only") && builtin.contains("--fio"));
        let fio = plan(&["--compare-qsd", "--fio"])
            .one_load_warning()
            .unwrap();
        assert!(fio.contains("fio only"), "{fio}");
        let p = plan(&[
            "--qsd",
            "/opt/q/qemu-storage-daemon",
            "--qsd-iothreads",
            "2",
        ]);
        assert!(p.compare_qsd, "--qsd implies the comparison");
        assert_eq!(
            p.qsd.program,
            std::path::Path::new("/opt/q/qemu-storage-daemon")
        );
        assert_eq!(p.qsd.iothreads, 2);
        assert!(plan(&["--qsd-iothreads", "1"]).compare_qsd);
    }

    #[test]
    fn named_workloads_run_on_every_row() {
        let p = plan(&["--workload", "randwrite-psync-qd1", "--only", "file,disk"]);
        assert_eq!(
            names(&p),
            [
                ("file", vec!["randwrite-psync-qd1"]),
                ("device", vec!["randwrite-psync-qd1"]),
                ("disk", vec!["randwrite-psync-qd1"]),
            ]
        );
    }

    #[test]
    fn servers_per_row() {
        let p = plan(&["--compare-qsd", "--only", "null,disk,local"]);
        let servers: Vec<_> = p
            .rows
            .iter()
            .map(|r| (r.export, r.export.servers(&p.variants, p.compare_qsd)))
            .collect();
        assert_eq!(
            servers,
            [
                (ExportKind::Local, vec![Server::Bare]),
                (ExportKind::Null, vec![Server::COROFUSE, Server::Qsd]),
                (ExportKind::Device, vec![Server::Bare]),
                (ExportKind::Disk, vec![Server::COROFUSE, Server::Qsd]),
            ]
        );
    }

    #[test]
    fn queues_and_transports_are_variants_of_every_mounted_row() {
        let p = plan(&[
            "--queues",
            "1,2",
            "--transport",
            "dev,uring",
            "--compare-qsd",
            "--only",
            "local,null",
        ]);
        assert_eq!(p.variants.len(), 4);
        assert!(p.uses_uring() && p.compares_variants());
        assert_eq!(p.runs(), 5 + 5 * (4 + 1));
        let q = plan(&["--queues", "2"]);
        assert!(!q.uses_uring() && !q.compares_variants());
        assert!(!plan(&[]).compares_variants());
        let e = build(&parse(&["--queues", "2", "--mount-opt", "--queues 1"]).expect("parses"));
        assert!(e.err().is_some_and(|e| e.contains("keep one")));
        assert!(
            parse(&["--transport", "auto"]).is_err(),
            "a variant is one transport"
        );
        assert!(parse(&["--queues", "0"]).is_err());
    }

    #[test]
    fn rejects_bad_arguments() {
        let e = build(&parse(&["--seconds", "0"]).expect("parses")).err();
        assert!(e.is_some_and(|e| e.contains("--seconds")));
        assert!(parse(&["--trials", "0"]).is_err());
        assert!(parse(&["--workload", "randread"]).is_err());
        let p = plan(&["--mount-opt", "--readers 4 --ring-replies"]);
        assert_eq!(p.mount_opts, ["--readers", "4", "--ring-replies"]);
        assert!(p.ring_replies);
    }
}
