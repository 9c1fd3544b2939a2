//! From the command line to what the lab runs: which rows (exports) and which workloads
//! on each; checked before anything is mounted or written.
//!
//! Why a separate step: the rules are more than one line each (the storage rows run a
//! shorter default list, a storage export never runs without its `device` ceiling), and
//! they are easier to trust with tests that need no root and no mount.

use std::path::PathBuf;

use super::export::{ExportKind, STORAGE_SIZE};
use super::workload::{self, Workload};
use super::LabArgs;

/// What to run, resolved from the command line.
pub struct Plan {
    /// The `corofuse` binary that serves the exports.
    pub corofuse: PathBuf,
    pub seconds: f64,
    /// Bytes of the image on real storage.
    pub storage_size: u64,
    pub trials: usize,
    /// The rows in table order, each with the workloads it runs.
    pub rows: Vec<Row>,
    pub mount_opts: Vec<String>,
    /// Load jobs (threads), each with `iodepth` in flight.
    pub jobs: u32,
    /// `--ring-replies` is among the mount options: replies are not syscalls.
    pub ring_replies: bool,
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

    /// Whether some row needs the image on real storage.
    pub fn on_storage(&self) -> bool {
        self.rows.iter().any(|r| r.export.on_storage())
    }

    /// Runs in all, over every trial.
    pub fn runs(&self) -> usize {
        self.rows.iter().map(|r| r.workloads.len()).sum::<usize>() * self.trials
    }
}

/// The plan for `args`, its exports served by the `corofuse` binary `corofuse`.
pub fn build(args: &LabArgs, corofuse: PathBuf) -> Result<Plan, String> {
    if !(args.seconds > 0.0 && args.seconds.is_finite()) {
        return Err("--seconds must be a positive number".into());
    }
    let mount_opts: Vec<String> = (args.mount_opts.iter())
        .flat_map(|o| o.split_whitespace().map(String::from))
        .collect();
    let rows = exports(&args.only)
        .into_iter()
        .map(|export| {
            let defaults: &[&str] = if export.on_storage() {
                &workload::STORAGE_DEFAULT
            } else {
                workload::matrix_default()
            };
            let workloads = workload::select(&args.workloads, defaults);
            Row { export, workloads }
        })
        .collect();
    Ok(Plan {
        corofuse,
        seconds: args.seconds,
        storage_size: STORAGE_SIZE,
        trials: args.trials as usize,
        rows,
        ring_replies: mount_opts.iter().any(|o| o == "--ring-replies"),
        mount_opts,
        jobs: args.jobs,
    })
}

/// The rows for `--only`, in table order: every row when none is named, and the `device`
/// row whenever an export of the file on real storage runs (their ratios divide by it).
pub fn exports(only: &[ExportKind]) -> Vec<ExportKind> {
    if only.is_empty() {
        return ExportKind::ALL.to_vec();
    }
    let needs_device = only.iter().any(|e| e.under_device());
    ExportKind::ALL
        .into_iter()
        .filter(|e| only.contains(e) || (*e == ExportKind::Device && needs_device))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_lab as parse;
    use crate::storage;
    use std::path::Path;

    fn plan(args: &[&str]) -> Plan {
        build(&parse(args).expect("parses"), "corofuse".into()).expect("plans")
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
        assert_eq!(plan(&["--trials", "3"]).runs(), 3 * (3 * 5 + 5 * 4));
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
        assert!(
            parse(&["--only", "qcow2"]).is_err(),
            "peers are fio-servers.py's"
        );
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
    fn rejects_bad_arguments() {
        let e = build(
            &parse(&["--seconds", "0"]).expect("parses"),
            "corofuse".into(),
        )
        .err();
        assert!(e.is_some_and(|e| e.contains("--seconds")));
        assert!(parse(&["--trials", "0"]).is_err());
        assert!(parse(&["--workload", "randread"]).is_err());
        assert!(
            parse(&["--compare-qsd"]).is_err(),
            "peers are fio-servers.py's"
        );
        let p = plan(&["--mount-opt", "--readers 4 --ring-replies"]);
        assert_eq!(p.mount_opts, ["--readers", "4", "--ring-replies"]);
        assert!(p.ring_replies);
    }
}
