//! The report as an aligned plain-text table, with a header saying how to read it.
//!
//! Why plain text: it is what people paste into an issue or BENCHMARKS.md; columns are
//! right-aligned numbers so that magnitudes line up, and values a server does not report
//! are "-" rather than a misleading zero. With the rows on real storage, a "vs device"
//! column puts each export's IOPS beside its ceiling; with the qcow2 rows, a "vs raw"
//! column puts them beside the disk row's (the raw export of the same data); with the
//! nbd row, a "vs limit" column puts its clients beside fio's nbd engine.

use comfy_table::{presets::NOTHING, CellAlignment};

use super::{CellReport, Report};
use crate::export::{ExportKind, Server};

/// Column-aligned text, two spaces between columns and no borders (comfy-table): the first
/// `left` columns are left-aligned, the rest right-aligned; no header line when there are
/// no headers (a key/value listing).
pub struct Table {
    pub headers: Vec<String>,
    pub rows: Vec<Vec<String>>,
    pub left: usize,
}

impl Table {
    pub fn render(&self) -> String {
        let mut t = comfy_table::Table::new();
        t.load_preset(NOTHING);
        if !self.headers.is_empty() {
            t.set_header(&self.headers);
        }
        t.add_rows(&self.rows);
        for (i, column) in t.column_iter_mut().enumerate() {
            column.set_padding((0, 2));
            column.set_cell_alignment(if i < self.left {
                CellAlignment::Left
            } else {
                CellAlignment::Right
            });
        }
        t.lines().map(|l| l.trim_end().to_owned() + "\n").collect()
    }
}

/// A latency or rate with as many decimals as it deserves.
pub fn num(v: f64) -> String {
    if !v.is_finite() {
        "-".into()
    } else if v >= 1000.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

pub fn opt(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), num)
}

fn ratio(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.2}x")
    } else {
        "-".into()
    }
}

/// "median of N interleaved trials", or "1 trial".
pub fn trials(n: usize) -> String {
    if n > 1 {
        format!("median of {n} interleaved trials")
    } else {
        "1 trial".into()
    }
}

/// The whole text output: header lines, then the table.
pub fn render(r: &Report) -> String {
    let mut out = header(r);
    out.push('\n');
    out.push_str(&table(r).render());
    out
}

fn header(r: &Report) -> String {
    let o = &r.options;
    let load = if o.load == "fio" {
        "fio"
    } else {
        "built-in load"
    };
    let load = if o.jobs > 1 {
        format!("{load}, {} jobs", o.jobs)
    } else {
        load.to_string()
    };
    let trials = trials(o.trials);
    let placement = match o.placement {
        Some(p) => match p.daemon {
            Some(d) => format!("daemon on CPU {d}, load on CPU {}", p.load),
            None => format!("load on CPU {}, daemon not pinned by the lab", p.load),
        },
        None => "left to the scheduler".into(),
    };
    let opts = if o.mount_opts.is_empty() {
        "(none)".into()
    } else {
        o.mount_opts.join(" ")
    };
    format!(
        "corofuse bench: {load} (O_DIRECT), {} s per run, {trials}; placement: {placement}\n\
         {}, extra mount options: {opts}\n\
         local = the same load on /dev/zero (reads) or /dev/null (writes), no FUSE: what \
         the load itself can drive, the ceiling of null and file.\n\
         cpu% = daemon CPU time / wall time (100 = one CPU); cpu us/req = daemon CPU \
         time per request (qsd's too); load% = the load's. Per-request columns: the \
         daemon's --stats, SIGUSR1 before and after the load, differenced.\n\
         co ns/req = sw/req x {:.1} ns: an ESTIMATE from the runtime_switch \
         micro-benchmark (one-way switch = half its round trip), not a measurement here.\n\
         sys/req = io_uring_enter calls + one writev per reply (unless --ring-replies) \
         + /dev/fuse reads when counted + the backend's own (NBD sends).\n{}{}",
        o.seconds,
        r.environment.line(),
        r.switch_one_way_ns,
        variants_header(r),
        storage_header(r)
    ) + &qcow2_header(r)
        + &nbd_header(r)
        + &runs_header(r)
}

/// How to read the "runs" column, when a cell's runs disagree.
fn runs_header(r: &Report) -> String {
    if r.cells.iter().all(|c| c.outliers.is_empty()) {
        return String::new();
    }
    "runs = runs whose IOPS is below half or above twice their cell's median (of two \
     runs: one twice the other); where they are half the cell's runs or more, its ratios \
     are ? (no verdict: run again, or with more --trials).\n"
        .into()
}

/// What the nbd row ran, and how to read "vs limit"; or that it had no limit.
fn nbd_header(r: &Report) -> String {
    if !r.cells.iter().any(|c| c.export == ExportKind::Nbd) {
        return String::new();
    }
    let limit = if r.cells.iter().any(|c| c.server == Server::NbdLimit) {
        "fio nbd = fio's nbd engine (libnbd) straight at the same qemu-nbd, the workload's \
         iodepth in flight, no FUSE: the limit. vs limit = IOPS / fio nbd's, same workload; \
         the target for corofuse is >= 0.90x."
    } else {
        "No limit: this machine's fio has no nbd engine (fio --enghelp=nbd), so the row \
         ran without one."
    };
    format!(
        "nbd = the storage image served by qemu-nbd (-f raw --cache=writeback --aio=io_uring \
         --persistent --shared=0, started for every run) on a unix socket, mounted by \
         corofuse mount -w nbd+unix:///?socket=SOCK and by qsd's driver=nbd \
         (server.type=unix, one connection). {limit}\n"
    )
}

/// What the qcow2 rows ran on, and how to read "vs raw".
fn qcow2_header(r: &Report) -> String {
    if !r.cells.iter().any(|c| c.export.qcow2()) {
        return String::new();
    }
    let image = match r.storage.as_ref().and_then(|s| s.qcow2.as_ref()) {
        Some(q) => {
            let history = match q.convert_seconds {
                Some(t) => format!("converted by this run in {t:.1} s"),
                None => "kept from an earlier run".into(),
            };
            format!("{}, {history}", q.path.display())
        }
        None => "(this row did not run)".into(),
    };
    format!(
        "qcow2 = a fully allocated qcow2 image (qemu-img convert of the storage image, 64 KiB \
         clusters): {image}; qcow2-alloc = an empty qcow2 image made by qemu-img create \
         before every run (writes allocate; no reads). Both buffered, as disk.\n\
         vs raw = IOPS / the disk row's (the raw export of the same data), same workload \
         and server; the target for allocated reads is >= 0.80x.\n"
    )
}

/// How to read the variant columns, when several corofuse configurations ran.
fn variants_header(r: &Report) -> String {
    let v = &r.options.variants;
    if v.len() < 2 {
        return String::new();
    }
    let names: Vec<String> = v.iter().map(|v| v.label()).collect();
    format!(
        "corofuse variants, interleaved in every cell: {} (qN = mount --queues N, dev/uring \
         = --transport). vs base = IOPS / {}'s, same cell; (best) = the variant with the \
         most IOPS in its cell, whose ratio to qsd is the best/qsd row.\n",
        names.join(", "),
        names[0]
    )
}

/// What the storage rows ran on, and how to read "vs device".
fn storage_header(r: &Report) -> String {
    let Some(s) = &r.storage else {
        return String::new();
    };
    let history = match s.fill_seconds {
        Some(t) => format!("written by this run in {t:.1} s"),
        None => "kept from an earlier run (--refill-image writes it again)".into(),
    };
    // The nbd row alone has its limit, not the device row.
    let device = if r.cells.iter().any(|c| c.export == ExportKind::Device) {
        "device = the load straight on that file with O_DIRECT, no FUSE: the ceiling. \
         vs device = IOPS / the device row's, same workload; disk (buffered) can pass \
         1.00x where the page cache serves it.\n"
    } else {
        ""
    };
    format!(
        "storage rows: {} ({} MiB, {} on {}), {history}; each run starts with it out of \
         the page cache.\n{device}",
        s.path.display(),
        s.size >> 20,
        s.fs_type,
        s.fs_source
    )
}

/// Every column the table can have; [`table`] leaves out the optional ones (server, IOPS
/// min-max and the ratios) that say nothing in a run.
const HEADERS: [&str; 20] = [
    "export",
    "workload",
    "server",
    "IOPS",
    "IOPS min-max",
    "vs device",
    "vs raw",
    "vs limit",
    "vs base",
    "MB/s",
    "mean us",
    "p99 us",
    "cpu%",
    "cpu us/req",
    "load%",
    "sw/req",
    "co ns/req",
    "sqe/req",
    "enter/req",
    "sys/req",
];

fn table(r: &Report) -> Table {
    let variants = r.options.variants.len() > 1;
    // The server column: qsd ran, or several corofuse variants did.
    let server = r.options.compare_qsd || variants;
    let shown = [
        true,
        true,
        server,
        true,
        r.options.trials > 1,
        (r.cells.iter()).any(|c| c.export.on_storage() && c.export != ExportKind::Nbd),
        r.cells.iter().any(|c| c.export.qcow2()),
        r.cells.iter().any(|c| c.export == ExportKind::Nbd),
        variants,
    ];
    let keep = |row: Vec<String>| -> Vec<String> {
        let shown = shown.iter().chain(std::iter::repeat(&true));
        row.into_iter()
            .zip(shown)
            .filter_map(|(cell, &s)| s.then_some(cell))
            .collect()
    };
    let mut rows = Vec::new();
    // A last column says which cells' runs disagree, if any do.
    let noted = r.cells.iter().any(|c| c.outlier_note().is_some());
    let note = |c: &CellReport, mut row: Vec<String>| {
        if noted {
            row.push(c.outlier_note().unwrap_or_default());
        }
        row
    };
    // Cells of one (export, workload) are adjacent: print them, then their ratio row.
    for group in r
        .cells
        .chunk_by(|a, b| a.export == b.export && a.workload == b.workload)
    {
        rows.extend(group.iter().map(|c| note(c, keep(row(c)))));
        // The ratio to qsd of the one variant, or of the best of several.
        let vs_qsd = group
            .iter()
            .filter(|c| c.best || !variants)
            .find_map(|c| Some((c.vs_qsd?, c.undecided())));
        if let Some((v, undecided)) = vs_qsd {
            let label = if variants { "best/qsd" } else { "corofuse/qsd" };
            let ratio = |v: f64| if undecided { "?".into() } else { ratio(v) };
            let mut ratio_row = vec![String::new(); 9];
            (ratio_row[2], ratio_row[3]) = (label.into(), ratio(v.iops));
            ratio_row.extend([ratio(v.mb_s), ratio(v.mean_us), ratio(v.p99_us)]);
            let mut ratio_row = keep(ratio_row);
            ratio_row.resize(rows.last().map_or(0, Vec::len), String::new());
            rows.push(ratio_row);
        }
    }
    let mut headers = keep(HEADERS.map(String::from).to_vec());
    if noted {
        headers.push("runs".into());
    }
    Table {
        headers,
        rows,
        left: if server { 3 } else { 2 },
    }
}

/// Every column of [`HEADERS`] for one cell. A cell whose runs disagree ([`CellReport::
/// undecided`]) has "?" for its ratios: its median is no verdict.
fn row(c: &CellReport) -> Vec<String> {
    let m = &c.median;
    let ratio = |v: f64| if c.undecided() { "?".into() } else { ratio(v) };
    let server = if c.best {
        format!("{} (best)", c.server.name())
    } else {
        c.server.name()
    };
    let vs_device = match (c.export, c.vs_device) {
        (ExportKind::Device, _) => "ceiling".into(),
        (_, Some(v)) => ratio(v),
        (e, None) if e.under_device() => "-".into(),
        _ => String::new(),
    };
    let vs_limit = match (c.export, c.server, c.vs_limit) {
        (ExportKind::Nbd, Server::NbdLimit, _) => "limit".into(),
        (ExportKind::Nbd, _, Some(v)) => ratio(v),
        (ExportKind::Nbd, _, None) => "-".into(),
        _ => String::new(),
    };
    let vs_raw = match (c.export.qcow2(), c.vs_raw) {
        (true, Some(v)) => ratio(v),
        (true, None) => "-".into(),
        (false, _) => String::new(),
    };
    vec![
        c.export.name().to_string(),
        c.label.clone(),
        server,
        format!("{:.0}", m.iops),
        format!("{:.0}-{:.0}", m.iops_min, m.iops_max),
        vs_device,
        vs_raw,
        vs_limit,
        c.vs_base.map(ratio).unwrap_or_default(),
        num(m.mb_s),
        num(m.mean_us),
        num(m.p99_us),
        opt(m.daemon_cpu_pct),
        opt(m.daemon_cpu_us_per_request),
        opt(m.load_cpu_pct),
        opt(m.switches_per_request),
        opt(m.coroutine_ns_per_request),
        opt(m.sqes_per_request),
        opt(m.enters_per_request),
        opt(m.syscalls_per_request),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::sample;

    #[test]
    fn aligns_columns() {
        let t = Table {
            headers: vec!["name".into(), "IOPS".into()],
            rows: vec![
                vec!["a".into(), "5".into()],
                vec!["longer".into(), "123456".into()],
            ],
            left: 1,
        };
        assert_eq!(
            t.render(),
            "name      IOPS\na            5\nlonger  123456\n"
        );
    }

    #[test]
    fn numbers() {
        assert_eq!(num(123_456.7), "123457");
        assert_eq!(num(21.44), "21.4");
        assert_eq!(num(4.0), "4.00");
        assert_eq!(num(f64::NAN), "-");
        assert_eq!(opt(None), "-");
        assert_eq!(ratio(1.234), "1.23x");
    }

    /// Every line of the table has its columns at the same places as the header.
    fn check_alignment(text: &str) -> Vec<&str> {
        let lines: Vec<&str> = text
            .lines()
            .skip_while(|l| !l.starts_with("export"))
            .collect();
        let header = lines[0];
        let iops_end = header.find("IOPS").expect("IOPS column") + 4;
        for l in &lines[1..] {
            if !l.trim().is_empty() && !l.contains("/qsd") {
                assert_eq!(&l[iops_end..iops_end + 2], "  ", "misaligned: {l:?}");
            }
        }
        lines
    }

    #[test]
    fn renders_a_plain_report() {
        let text = render(&sample::report(false));
        assert!(
            text.contains("ESTIMATE from the runtime_switch micro-benchmark"),
            "{text}"
        );
        assert!(text.contains("median of 3 interleaved trials"));
        let lines = check_alignment(&text);
        assert!(lines[0].contains("co ns/req") && !lines[0].contains("server"));
        let first = lines[1].split_whitespace().collect::<Vec<_>>();
        // export, then the 4-word label, then IOPS and its range.
        assert_eq!(
            &first[..7],
            [
                "null",
                "randread",
                "4k",
                "psync",
                "qd1",
                "120000",
                "108000-132000"
            ]
        );
        assert!(lines[1].trim_end().ends_with("2.00"), "{}", lines[1]);
        assert_eq!(lines.len(), 1 + 6);
    }

    #[test]
    fn renders_qsd_comparison_with_ratio_rows() {
        let text = render(&sample::report(true));
        let lines = check_alignment(&text);
        assert!(lines[0].contains("server"));
        assert!(lines[1].contains("corofuse") && lines[2].contains("qsd"));
        assert!(
            lines[3].contains("corofuse/qsd") && lines[3].contains("2.00x"),
            "{}",
            lines[3]
        );
        // qsd reports no per-request counters.
        assert!(lines[2].trim_end().ends_with("-"), "{}", lines[2]);
        assert_eq!(lines.len(), 1 + 6 * 3);
        assert!(!text.contains("vs device") && !text.contains("storage rows"));
    }

    #[test]
    fn renders_variants_with_their_ratio_to_the_first_and_the_best() {
        let text = render(&sample::with_variants());
        assert!(
            text.contains("corofuse variants, interleaved in every cell: corofuse q1, corofuse q2"),
            "{text}"
        );
        let lines = check_alignment(&text);
        assert!(lines[0].contains("vs base") && lines[0].contains("cpu us/req"));
        assert!(lines[1].contains("corofuse q1") && lines[1].contains("1.00x"));
        assert!(
            lines[2].contains("corofuse q2 (best)") && lines[2].contains("1.50x"),
            "{}",
            lines[2]
        );
        assert!(lines[3].contains("qsd") && !lines[3].contains("best"));
        assert!(
            lines[4].contains("best/qsd") && lines[4].contains("3.00x"),
            "{}",
            lines[4]
        );
        // 3 workloads: q1, q2, qsd and one ratio row each.
        assert_eq!(lines.len(), 1 + 3 * 4);
    }

    /// The first table line of `export` (its first word) served by `server`.
    fn line_of<'a>(lines: &[&'a str], export: &str, server: &str, text: &str) -> &'a str {
        lines
            .iter()
            .find(|l| l.split_whitespace().next() == Some(export) && l.contains(server))
            .unwrap_or_else(|| panic!("no {export} {server} row in\n{text}"))
    }

    #[test]
    fn renders_storage_rows_beside_their_ceiling() {
        let text = render(&sample::with_storage(true));
        assert!(
            text.contains("storage rows: /var/tmp/corofuse-bench/corofuse-bench.raw (2048 MiB, ext4 on /dev/vda), written by this run in 1.4 s"),
            "{text}"
        );
        let lines = check_alignment(&text);
        assert!(lines[0].contains("vs device"), "{}", lines[0]);
        let find = |export: &str, server: &str| line_of(&lines, export, server, &text);
        assert!(find("device", "no FUSE").contains("ceiling"));
        assert!(find("disk", "corofuse").contains("0.75x"));
        assert!(find("disk-direct", "qsd").contains("0.25x"));
        // null and file rows leave the column empty: their IOPS is followed by MB/s.
        let null = find("null", "corofuse");
        assert!(!null.contains('x'), "{null}");
        // The local row has no ratio to the device row.
        let local = find("local", "no FUSE");
        assert!(
            !local.contains('x') && !local.contains("ceiling"),
            "{local}"
        );
        // 3 workloads: null, file, disk and disk-direct with corofuse, qsd and a ratio
        // row each, local and device with one row.
        assert_eq!(lines.len(), 1 + 4 * 3 * 3 + 3 + 3);
    }

    /// Issue 37: a cell whose runs disagree says so; with no majority among them its
    /// ratios are "?", not a verdict such as 0.12x.
    #[test]
    fn says_which_runs_are_outliers_instead_of_a_verdict() {
        let mut r = sample::with_storage(false);
        fn disk(r: &mut Report, k: usize) -> &mut CellReport {
            let mut cells = r.cells.iter_mut().filter(|c| c.export == ExportKind::Disk);
            cells.nth(k).expect("a disk cell")
        }
        let set = |c: &mut CellReport, iops: &[f64]| {
            c.runs.truncate(iops.len());
            for (run, &v) in c.runs.iter_mut().zip(iops) {
                run.load.iops = v;
            }
            let runs: Vec<f64> = c.runs.iter().map(|r| r.load.iops).collect();
            c.outliers = crate::median::outliers(&runs);
        };
        set(disk(&mut r, 0), &[3457.0, 368.0, 4099.0]);
        set(disk(&mut r, 1), &[368.0, 3457.0]);
        let text = render(&r);
        let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("disk ")).collect();
        assert!(
            text.contains("  runs\n") && text.contains("ratios are ?"),
            "{text}"
        );
        assert!(
            lines[0].ends_with("run 2 of 3: 368 IOPS, an outlier"),
            "{text}"
        );
        assert!(
            lines[0].contains("0.75x"),
            "one outlier of three: the median holds"
        );
        assert!(
            lines[1].ends_with("runs disagree: 368, 3457 IOPS"),
            "{text}"
        );
        assert!(
            lines[1].contains(" ? ") && !lines[1].contains('x'),
            "{}",
            lines[1]
        );
        assert!(
            !lines[2].contains("runs"),
            "agreeing runs say nothing: {}",
            lines[2]
        );
    }

    #[test]
    fn renders_the_nbd_row_beside_its_limit() {
        let text = render(&sample::with_nbd(true));
        assert!(
            text.contains("qemu-nbd (-f raw --cache=writeback"),
            "{text}"
        );
        assert!(text.contains("vs limit = IOPS / fio nbd's"), "{text}");
        assert!(!text.contains("device ="), "no device row: {text}");
        let lines = check_alignment(&text);
        assert!(lines[0].contains("IOPS min-max  vs limit"), "{}", lines[0]);
        assert!(
            !lines[0].contains("vs device"),
            "no device row: {}",
            lines[0]
        );
        let find = |server: &str| line_of(&lines, "nbd", server, &text);
        let c: Vec<&str> = find("corofuse").split_whitespace().collect();
        // nbd, the 4-word label, server, IOPS, IOPS min-max, vs limit.
        assert_eq!(c[5..9], ["corofuse", "27000", "24300-29700", "0.90x"]);
        assert!(find("qsd").contains("0.45x"));
        let limit: Vec<&str> = find("fio nbd").split_whitespace().collect();
        assert_eq!(
            limit[5..10],
            ["fio", "nbd", "30000", "30000-30000", "limit"]
        );
        // 3 workloads: corofuse, qsd, the ratio row and the limit each.
        assert_eq!(lines.len(), 1 + 3 * 4);
        let mut r = sample::with_nbd(false);
        // As Report::new leaves them without a limit cell (report::tests checks it).
        r.cells.retain(|c| c.server != Server::NbdLimit);
        r.cells.iter_mut().for_each(|c| c.vs_limit = None);
        let text = render(&r);
        assert!(
            text.contains("No limit: this machine's fio has no nbd engine"),
            "{text}"
        );
        assert!(!text.contains("0.90x"), "{text}");
    }

    #[test]
    fn renders_qcow2_rows_beside_their_raw_export() {
        let text = render(&sample::with_qcow2(true));
        assert!(text.contains("vs raw = IOPS / the disk row's"), "{text}");
        let lines = check_alignment(&text);
        assert!(lines[0].contains("vs device  vs raw"), "{}", lines[0]);
        let find = |export: &str, server: &str| line_of(&lines, export, server, &text);
        let q: Vec<&str> = find("qcow2", "corofuse").split_whitespace().collect();
        assert_eq!(q[8..10], ["0.60x", "0.80x"], "vs device, then vs raw");
        assert!(find("qcow2-alloc", "qsd").contains("0.20x"), "{text}");
        let disk = find("disk", "corofuse");
        assert!(disk.contains("0.75x") && !disk.contains("0.80x"), "{disk}");
        // 3 workloads: disk, qcow2, qcow2-alloc with corofuse, qsd and a ratio row,
        // device with one row.
        assert_eq!(lines.len(), 1 + 3 * 3 * 3 + 3);
        let plain = render(&sample::with_storage(false));
        assert!(!plain.contains("vs raw"), "{plain}");
    }
}
