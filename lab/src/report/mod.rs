//! The lab's results: medians per cell, ratios against qsd, against the device row
//! (the ceiling of the rows on real storage) and, for the qcow2 rows, against the disk
//! row (the raw export of the same data), for the nbd row against its limit (fio's nbd
//! engine at the same qemu-nbd), and the three renderings (aligned table on
//! stdout, one JSON document with `--json`, a bar chart with `--svg`).
//!
//! Why one [`Report`] value for all three: they must agree, and the JSON one is the
//! complete record (environment, options, every run), from which the others can be
//! redrawn.

pub mod svg;
pub mod table;

use serde::Serialize;

use super::affinity::{Cpus, Placement};
use super::env::Environment;
use super::export::{ExportKind, Server};
use super::matrix::{Cell, Run};
use super::median::{median, median_of_all, outliers, ratio, Spread};
use super::storage::Image;
use super::variant::Variant;

/// The command-line choices that shaped the numbers.
#[derive(Debug, Serialize)]
pub struct Options {
    pub seconds: f64,
    pub trials: usize,
    /// "builtin" or "fio".
    pub load: &'static str,
    /// Load jobs per run (threads or fio jobs).
    pub jobs: u32,
    pub compare_qsd: bool,
    /// The corofuse configurations each mounted cell ran with.
    pub variants: Vec<Variant>,
    pub exports: Vec<ExportKind>,
    pub workloads: Vec<&'static str>,
    pub mount_opts: Vec<String>,
    pub cpus: Option<Cpus>,
    pub placement: Option<Placement>,
}

/// Medians over a cell's runs (each field separately).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Summary {
    pub iops: f64,
    pub iops_min: f64,
    pub iops_max: f64,
    pub mb_s: f64,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
    pub daemon_cpu_pct: Option<f64>,
    /// Daemon CPU time per request, microseconds (its CPU time over the requests the
    /// load completed): what each request cost, whatever the IOPS.
    pub daemon_cpu_us_per_request: Option<f64>,
    pub load_cpu_pct: Option<f64>,
    pub switches_per_request: Option<f64>,
    /// Estimate: switches per request times the measured one-way switch cost.
    pub coroutine_ns_per_request: Option<f64>,
    pub sqes_per_request: Option<f64>,
    pub enters_per_request: Option<f64>,
    pub syscalls_per_request: Option<f64>,
}

/// corofuse over qsd for one (export, workload).
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Ratios {
    pub iops: f64,
    pub mb_s: f64,
    pub mean_us: f64,
    pub p99_us: f64,
}

#[derive(Debug, Serialize)]
pub struct CellReport {
    pub export: ExportKind,
    pub workload: &'static str,
    pub label: String,
    pub server: Server,
    pub median: Summary,
    /// Set on corofuse cells when qsd ran the same cell.
    pub vs_qsd: Option<Ratios>,
    /// IOPS over the device row's for the same workload: set on the exports of the
    /// image on real storage when the device row ran that workload.
    pub vs_device: Option<f64>,
    /// IOPS over the disk row's (the raw export of the same data) for the same workload
    /// and server: set on the qcow2 rows when the disk row ran that cell. Issue 12's
    /// target for allocated reads is >= 0.8.
    pub vs_raw: Option<f64>,
    /// IOPS over the nbd row's limit (fio's nbd engine at the same qemu-nbd) for the same
    /// workload: set on the nbd row's FUSE cells when the limit ran. Issue 24's target
    /// for corofuse is >= 0.9.
    pub vs_limit: Option<f64>,
    /// With several corofuse variants: IOPS over the first variant's, same cell.
    pub vs_base: Option<f64>,
    /// With several corofuse variants: this one had the most IOPS in its cell.
    pub best: bool,
    /// The runs whose IOPS disagree with the cell's other runs ([`outliers`]), by index.
    pub outliers: Vec<usize>,
    pub runs: Vec<Run>,
}

impl CellReport {
    /// Whether the cell's median is no verdict: its runs disagree and no majority of
    /// them agrees (two runs apart, or outliers among half the runs or more).
    pub fn undecided(&self) -> bool {
        !self.outliers.is_empty() && self.outliers.len() * 2 >= self.runs.len()
    }

    /// What the table says of the cell's outliers: "run 2 of 3: 368 IOPS, an outlier"
    /// or "runs disagree: 368, 3457 IOPS"; `None` when the runs agree.
    pub fn outlier_note(&self) -> Option<String> {
        let iops = |i: &usize| format!("{:.0}", self.runs[*i].load.iops);
        let listed: Vec<String> = self.outliers.iter().map(iops).collect();
        match self.outliers.as_slice() {
            [] => None,
            _ if self.undecided() => Some(format!("runs disagree: {} IOPS", listed.join(", "))),
            [i] => Some(format!(
                "run {} of {}: {} IOPS, an outlier",
                i + 1,
                self.runs.len(),
                listed[0]
            )),
            _ => Some(format!(
                "{} of {} runs outliers: {} IOPS",
                listed.len(),
                self.runs.len(),
                listed.join(", ")
            )),
        }
    }
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub environment: Environment,
    pub options: Options,
    /// One-way switch (half a `runtime_switch` round trip), measured at start.
    pub switch_one_way_ns: f64,
    /// The image on real storage, when a storage row ran.
    pub storage: Option<Image>,
    pub cells: Vec<CellReport>,
}

impl Report {
    pub fn new(
        env: Environment,
        options: Options,
        switch_ns: f64,
        storage: Option<Image>,
        cells: Vec<Cell>,
    ) -> Report {
        let mut out: Vec<CellReport> = cells
            .into_iter()
            .map(|c| CellReport {
                export: c.export,
                workload: c.workload.name,
                label: c.workload.label(),
                server: c.server,
                median: summarise(&c.runs, switch_ns),
                vs_qsd: None,
                vs_device: None,
                vs_raw: None,
                vs_limit: None,
                vs_base: None,
                best: false,
                outliers: outliers(&c.runs.iter().map(|r| r.load.iops).collect::<Vec<_>>()),
                runs: c.runs,
            })
            .collect();
        let compare_variants = options.variants.len() > 1;
        for i in 0..out.len() {
            let qsd = out.iter().find(|q| {
                q.server == Server::Qsd
                    && q.export == out[i].export
                    && q.workload == out[i].workload
            });
            let ratios = match (out[i].server, qsd) {
                (Server::Corofuse(_), Some(q)) => Some(ratios(&out[i].median, &q.median)),
                _ => None,
            };
            out[i].vs_qsd = ratios;
            out[i].vs_device = vs_device(&out, &out[i]);
            out[i].vs_raw = vs_raw(&out, &out[i]);
            out[i].vs_limit = vs_limit(&out, &out[i]);
        }
        if compare_variants {
            mark_variants(&mut out);
        }
        Report {
            environment: env,
            options,
            switch_one_way_ns: switch_ns,
            storage,
            cells: out,
        }
    }
}

/// `cell`'s IOPS over those of the device row for the same workload, for an export of
/// the image on real storage (NaN when the device row did no I/O).
fn vs_device(cells: &[CellReport], cell: &CellReport) -> Option<f64> {
    if !cell.export.under_device() {
        return None;
    }
    let device = cells
        .iter()
        .find(|d| d.export == ExportKind::Device && d.workload == cell.workload)?;
    Some(ratios(&cell.median, &device.median).iops)
}

/// `cell`'s IOPS over those of the disk row for the same workload and server, for a
/// qcow2 row (NaN when the disk row did no I/O).
fn vs_raw(cells: &[CellReport], cell: &CellReport) -> Option<f64> {
    if !cell.export.qcow2() || cell.server == Server::Bare {
        return None;
    }
    let raw = cells.iter().find(|d| {
        d.export == ExportKind::Disk && d.workload == cell.workload && d.server == cell.server
    })?;
    Some(ratios(&cell.median, &raw.median).iops)
}

/// `cell`'s IOPS over those of the nbd row's limit for the same workload, for the nbd
/// row's FUSE cells (NaN when the limit did no I/O).
fn vs_limit(cells: &[CellReport], cell: &CellReport) -> Option<f64> {
    if cell.export != ExportKind::Nbd || cell.server == Server::NbdLimit {
        return None;
    }
    let limit = cells.iter().find(|d| {
        d.export == ExportKind::Nbd && d.workload == cell.workload && d.server == Server::NbdLimit
    })?;
    Some(ratios(&cell.median, &limit.median).iops)
}

/// Sets `vs_base` (over the first variant of the same cell) and `best` on every corofuse
/// cell.
fn mark_variants(cells: &mut [CellReport]) {
    for i in 0..cells.len() {
        if !cells[i].server.is_corofuse() {
            continue;
        }
        let (export, workload) = (cells[i].export, cells[i].workload);
        let same_cell =
            |c: &CellReport| c.server.is_corofuse() && c.export == export && c.workload == workload;
        let base = cells.iter().find(|c| same_cell(c)).map(|c| c.median.iops);
        let top = cells
            .iter()
            .filter(|c| same_cell(c))
            .map(|c| c.median.iops)
            .fold(f64::NEG_INFINITY, f64::max);
        // The first of equals wins, so exactly one cell is marked.
        let first_top = cells
            .iter()
            .position(|c| same_cell(c) && c.median.iops == top);
        let me = cells[i].median.iops;
        cells[i].vs_base = base.map(|b| if b > 0.0 { me / b } else { f64::NAN });
        cells[i].best = first_top == Some(i);
    }
}

fn ratios(a: &Summary, b: &Summary) -> Ratios {
    Ratios {
        iops: ratio(a.iops, b.iops),
        mb_s: ratio(a.mb_s, b.mb_s),
        mean_us: ratio(a.mean_us, b.mean_us),
        p99_us: ratio(a.p99_us, b.p99_us),
    }
}

fn summarise(runs: &[Run], switch_ns: f64) -> Summary {
    let m = |f: fn(&Run) -> f64| median(runs.iter().map(f));
    let all = |f: &dyn Fn(&Run) -> Option<f64>| median_of_all(runs.iter().map(f));
    let iops = Spread::of(runs.iter().map(|r| r.load.iops));
    let switches = all(&|r| r.per_request.map(|p| p.switches));
    Summary {
        iops: iops.median,
        iops_min: iops.min,
        iops_max: iops.max,
        mb_s: m(|r| r.load.mb_s),
        mean_us: m(|r| r.load.mean_us),
        p50_us: m(|r| r.load.p50_us),
        p99_us: m(|r| r.load.p99_us),
        max_us: m(|r| r.load.max_us),
        daemon_cpu_pct: all(&|r| r.daemon_cpu_pct),
        daemon_cpu_us_per_request: all(&|r| {
            r.daemon_cpu_pct
                .filter(|_| r.load.iops > 0.0)
                .map(|pct| pct / 100.0 / r.load.iops * 1e6)
        }),
        load_cpu_pct: all(&|r| r.load.cpu_pct),
        switches_per_request: switches,
        coroutine_ns_per_request: switches.map(|s| s * switch_ns),
        sqes_per_request: all(&|r| r.per_request.map(|p| p.sqes)),
        enters_per_request: all(&|r| r.per_request.map(|p| p.enters)),
        syscalls_per_request: all(&|r| r.per_request.map(|p| p.syscalls)),
    }
}

#[cfg(test)]
pub(crate) mod sample {
    //! A small report for the rendering tests.
    use super::*;
    use crate::load::LoadResult;
    use crate::stats::PerRequest;
    use crate::workload::ALL as WORKLOADS;

    fn run(iops: f64, per_request: bool) -> Run {
        Run {
            load: LoadResult {
                ops: (iops * 3.0) as u64,
                bytes: (iops * 3.0 * 4096.0) as u64,
                seconds: 3.0,
                iops,
                mb_s: iops * 4096.0 / 1e6,
                mean_us: 1e6 / iops,
                p50_us: 1e6 / iops * 0.9,
                p99_us: 1e6 / iops * 3.0,
                max_us: 5000.0,
                cpu_pct: Some(80.0),
            },
            daemon_cpu_pct: Some(55.5),
            per_request: per_request.then_some(PerRequest {
                requests: (iops * 3.0) as u64,
                switches: 4.0,
                sqes: 1.02,
                enters: 1.0,
                syscalls: 2.0,
            }),
        }
    }

    /// null and file, three workloads each, three runs per cell.
    pub fn report(compare: bool) -> Report {
        with_exports(compare, &[ExportKind::Null, ExportKind::File])
    }

    /// The same with the local row (400k IOPS) and the storage rows too (device 40k
    /// IOPS, disk 30k, disk-direct 20k).
    pub fn with_storage(compare: bool) -> Report {
        with_exports(compare, &ExportKind::DEFAULT[..6])
    }

    /// device, disk (30k IOPS), qcow2 (24k) and qcow2-alloc (6k).
    pub fn with_qcow2(compare: bool) -> Report {
        let exports = [
            ExportKind::Device,
            ExportKind::Disk,
            ExportKind::Qcow2,
            ExportKind::Qcow2Alloc,
        ];
        with_exports(compare, &exports)
    }

    /// nbd only: corofuse (27k IOPS), qsd (13.5k) and its limit, fio nbd (30k).
    pub fn with_nbd(compare: bool) -> Report {
        with_exports(compare, &[ExportKind::Nbd])
    }

    /// null only, with the variants q1 (120k IOPS) and q2 (180k), and qsd.
    pub fn with_variants() -> Report {
        let variants = Variant::all(&[1, 2], &[]);
        with(true, &[ExportKind::Null], &variants)
    }

    fn with_exports(compare: bool, exports: &[ExportKind]) -> Report {
        with(compare, exports, &[Variant::default()])
    }

    fn with(compare: bool, exports: &[ExportKind], variants: &[Variant]) -> Report {
        let mut cells = Vec::new();
        for &export in exports {
            for w in &WORKLOADS[..3] {
                let base = match export {
                    ExportKind::Local => 400_000.0,
                    ExportKind::Null => 120_000.0,
                    ExportKind::File => 60_000.0,
                    ExportKind::Device => 40_000.0,
                    ExportKind::Disk => 30_000.0,
                    ExportKind::DiskDirect => 20_000.0,
                    ExportKind::DiskPt | ExportKind::DiskDirectPt => 38_000.0,
                    ExportKind::Qcow2 => 24_000.0,
                    ExportKind::Qcow2Alloc => 6_000.0,
                    ExportKind::Nbd => 27_000.0,
                };
                if !export.mounted() {
                    cells.push(Cell {
                        export,
                        workload: *w,
                        server: Server::Bare,
                        runs: vec![run(base, false); 3],
                    });
                    continue;
                }
                for (k, &v) in variants.iter().enumerate() {
                    // Each further variant does 1.5x the one before.
                    let base = base * 1.5f64.powi(k as i32);
                    cells.push(Cell {
                        export,
                        workload: *w,
                        server: Server::Corofuse(v),
                        runs: vec![
                            run(base, true),
                            run(base * 1.1, true),
                            run(base * 0.9, true),
                        ],
                    });
                }
                if compare && !export.passthrough() {
                    cells.push(Cell {
                        export,
                        workload: *w,
                        server: Server::Qsd,
                        runs: vec![run(base / 2.0, false); 3],
                    });
                }
                if export == ExportKind::Nbd {
                    cells.push(Cell {
                        export,
                        workload: *w,
                        server: Server::NbdLimit,
                        runs: vec![run(30_000.0, false); 3],
                    });
                }
            }
        }
        let options = Options {
            seconds: 3.0,
            trials: 3,
            load: "builtin",
            jobs: 1,
            compare_qsd: compare,
            variants: variants.to_vec(),
            exports: exports.to_vec(),
            workloads: WORKLOADS[..3].iter().map(|w| w.name).collect(),
            mount_opts: vec![],
            cpus: None,
            placement: None,
        };
        let storage = exports.contains(&ExportKind::Device).then(|| Image {
            path: "/var/tmp/corofuse-bench/corofuse-bench.raw".into(),
            size: 2 << 30,
            fs_type: "ext4".into(),
            fs_source: "/dev/vda".into(),
            reused: false,
            fill_seconds: Some(1.4),
            qcow2: None,
        });
        Report::new(Environment::probe(), options, 20.0, storage, cells)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries_and_ratios() {
        let r = sample::report(true);
        let c = &r.cells[0];
        assert_eq!(
            (c.server, c.workload),
            (Server::COROFUSE, "randread-psync-qd1")
        );
        assert_eq!(c.median.iops, 120_000.0);
        assert_eq!(
            (c.median.iops_min, c.median.iops_max),
            (108_000.0, 132_000.0)
        );
        assert_eq!(c.median.coroutine_ns_per_request, Some(80.0));
        let v = c.vs_qsd.expect("qsd ran this cell");
        assert_eq!(v.iops, 2.0);
        let q = &r.cells[1];
        assert_eq!(q.server, Server::Qsd);
        assert!(q.vs_qsd.is_none() && q.median.switches_per_request.is_none());
        let json = serde_json::to_value(&r).expect("serialises");
        assert_eq!(json["cells"][0]["vs_qsd"]["iops"], 2.0);
        assert!(json["environment"]["kernel"].is_string());
        assert!(
            r.cells.iter().all(|c| c.vs_device.is_none()),
            "no storage rows"
        );
        assert!(json["storage"].is_null());
    }

    #[test]
    fn variants_are_divided_by_the_first_and_the_best_is_marked() {
        let r = sample::with_variants();
        let cell: Vec<&CellReport> = r
            .cells
            .iter()
            .filter(|c| c.workload == "randread-psync-qd1")
            .collect();
        let names: Vec<String> = cell.iter().map(|c| c.server.name()).collect();
        assert_eq!(names, ["corofuse q1", "corofuse q2", "qsd"]);
        assert_eq!(cell[0].vs_base, Some(1.0));
        assert_eq!(cell[1].vs_base, Some(1.5));
        assert_eq!(
            (cell[0].best, cell[1].best, cell[2].best),
            (false, true, false)
        );
        assert_eq!(cell[1].vs_qsd.expect("qsd ran").iops, 3.0);
        assert!(cell[2].vs_base.is_none());
        // 55.5% of a CPU at 120k IOPS: 4.625 us per request.
        let us = cell[0]
            .median
            .daemon_cpu_us_per_request
            .expect("cpu per request");
        assert!((us - 4.625).abs() < 1e-9, "{us}");
        let json = serde_json::to_value(&r).expect("serialises");
        assert_eq!(json["cells"][1]["server"], "corofuse q2");
        assert_eq!(json["cells"][1]["best"], true);
        assert_eq!(json["options"]["variants"][1]["queues"], 2);
        // One variant: nothing compared, nothing marked.
        let plain = sample::report(true);
        assert!(plain.cells.iter().all(|c| c.vs_base.is_none() && !c.best));
    }

    /// The randread-psync-qd1 cell of `export` served by `server`.
    fn first_read(r: &Report, export: ExportKind, server: Server) -> &CellReport {
        r.cells
            .iter()
            .find(|c| {
                c.export == export && c.server == server && c.workload == "randread-psync-qd1"
            })
            .expect("cell")
    }

    #[test]
    fn storage_rows_are_divided_by_the_device_row() {
        let r = sample::with_storage(true);
        let find = |e: ExportKind, s: Server| first_read(&r, e, s);
        let device = find(ExportKind::Device, Server::Bare);
        assert_eq!(device.vs_device, None, "the ceiling itself");
        assert!(device.vs_qsd.is_none());
        assert_eq!(
            find(ExportKind::Disk, Server::COROFUSE).vs_device,
            Some(0.75)
        );
        assert_eq!(
            find(ExportKind::DiskDirect, Server::COROFUSE).vs_device,
            Some(0.5)
        );
        assert_eq!(
            find(ExportKind::DiskDirect, Server::Qsd).vs_device,
            Some(0.25)
        );
        assert_eq!(find(ExportKind::File, Server::COROFUSE).vs_device, None);
        let json = serde_json::to_value(&r).expect("serialises");
        assert_eq!(json["storage"]["fs_type"], "ext4");
        assert!(json["cells"]
            .as_array()
            .expect("cells")
            .iter()
            .any(|c| c["export"] == "disk-direct" && c["vs_device"] == 0.5));
    }

    #[test]
    fn qcow2_rows_are_divided_by_the_raw_export_of_the_same_server() {
        let r = sample::with_qcow2(true);
        let find = |e: ExportKind, s: Server| first_read(&r, e, s);
        let q = find(ExportKind::Qcow2, Server::COROFUSE);
        assert_eq!(q.vs_raw, Some(0.8));
        assert_eq!(q.vs_device, Some(0.6));
        assert_eq!(find(ExportKind::Qcow2, Server::Qsd).vs_raw, Some(0.8));
        assert_eq!(
            find(ExportKind::Qcow2Alloc, Server::COROFUSE).vs_raw,
            Some(0.2)
        );
        assert_eq!(find(ExportKind::Disk, Server::COROFUSE).vs_raw, None);
        assert_eq!(find(ExportKind::Device, Server::Bare).vs_raw, None);
        let json = serde_json::to_value(&r).expect("serialises");
        assert!(json["cells"]
            .as_array()
            .expect("cells")
            .iter()
            .any(|c| c["export"] == "qcow2" && c["vs_raw"] == 0.8));
        let plain = sample::with_storage(true);
        assert!(plain.cells.iter().all(|c| c.vs_raw.is_none()));
    }

    #[test]
    fn nbd_row_is_divided_by_its_limit_not_the_device() {
        let r = sample::with_nbd(true);
        let find = |s: Server| first_read(&r, ExportKind::Nbd, s);
        let c = find(Server::COROFUSE);
        assert_eq!(c.vs_limit, Some(0.9));
        assert_eq!(c.vs_device, None);
        assert_eq!(c.vs_qsd.expect("qsd ran").iops, 2.0);
        assert_eq!(find(Server::Qsd).vs_limit, Some(0.45));
        let limit = find(Server::NbdLimit);
        assert!(limit.vs_limit.is_none() && limit.vs_qsd.is_none());
        let json = serde_json::to_value(&r).expect("serialises");
        assert!(json["cells"]
            .as_array()
            .expect("cells")
            .iter()
            .any(|c| c["server"] == "fio nbd" && c["export"] == "nbd"));
        let plain = sample::with_storage(true);
        assert!(plain.cells.iter().all(|c| c.vs_limit.is_none()));
        let clients: Vec<_> = r
            .cells
            .into_iter()
            .filter(|c| c.server != Server::NbdLimit)
            .collect();
        assert_eq!(vs_limit(&clients, &clients[0]), None, "no limit ran");
    }

    #[test]
    fn ratio_to_a_device_row_that_did_nothing_is_not_a_number() {
        let mut r = sample::with_storage(false);
        for c in r
            .cells
            .iter_mut()
            .filter(|c| c.export == ExportKind::Device)
        {
            c.median.iops = 0.0;
        }
        let disk = r
            .cells
            .iter()
            .find(|c| c.export == ExportKind::Disk)
            .expect("disk");
        assert!(vs_device(&r.cells, disk)
            .expect("has a device row")
            .is_nan());
        let only_disk: Vec<_> = r
            .cells
            .drain(..)
            .filter(|c| c.export == ExportKind::Disk)
            .collect();
        assert_eq!(
            vs_device(&only_disk, &only_disk[0]),
            None,
            "no device row ran"
        );
    }
}
