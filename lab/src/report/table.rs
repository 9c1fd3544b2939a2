//! The report as an aligned plain-text table, with a header saying how to read it.
//!
//! Why plain text: it is what people paste into an issue; columns are right-aligned
//! numbers so that magnitudes line up, and values a row does not have are "-" rather than
//! a misleading zero. With the rows on real storage, a "vs device" column puts each
//! export's IOPS beside its ceiling.

use comfy_table::{presets::NOTHING, CellAlignment};

use super::{CellReport, Report, ABOVE_CEILING};
use crate::export::ExportKind;

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
    let load = if o.jobs > 1 {
        format!("built-in load, {} jobs", o.jobs)
    } else {
        "built-in load".to_string()
    };
    let opts = if o.mount_opts.is_empty() {
        "(none)".into()
    } else {
        o.mount_opts.join(" ")
    };
    format!(
        "corofuse-lab bench: {load} (O_DIRECT), {} s per run, {}\n\
         {}, extra mount options: {opts}\n\
         local = the same load on /dev/zero (reads) or /dev/null (writes), no FUSE: what \
         the load itself can drive, the ceiling of null and file.\n\
         cpu% = daemon CPU time / wall time (100 = one CPU); cpu us/req = daemon CPU \
         time per request; load% = the load's. Per-request columns: the daemon's \
         --stats, SIGUSR1 before and after the load, differenced.\n\
         co ns/req = sw/req x {:.1} ns: an ESTIMATE from the runtime_switch \
         micro-benchmark (one-way switch = half its round trip), not a measurement here.\n\
         sys/req = io_uring_enter calls + one writev per reply (unless --ring-replies) \
         + /dev/fuse reads when counted + the backend's own.\n{}",
        o.seconds,
        trials(o.trials),
        r.environment.line(),
        r.switch_one_way_ns,
        storage_header(r)
    ) + &runs_header(r)
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

/// What the storage rows ran on, and how to read "vs device".
fn storage_header(r: &Report) -> String {
    let Some(s) = &r.storage else {
        return String::new();
    };
    let history = match s.fill_seconds {
        Some(t) => format!("written by this run in {t:.1} s"),
        None => "kept from an earlier run (--refill-image writes it again)".into(),
    };
    let device = if r.cells.iter().any(|c| c.export == ExportKind::Device) {
        "device = the load straight on that file with O_DIRECT, no FUSE: the ceiling. \
         vs device = IOPS / the device row's, same workload; disk (buffered) can pass \
         1.00x where the page cache serves it.\n"
    } else {
        ""
    };
    let above = if r.cells.iter().any(CellReport::above_ceiling) {
        format!(
            "! = an O_DIRECT row above the device row by more than {:.0}%: the device row \
             was no ceiling in this run (it reads the same bytes, without FUSE), so its \
             ratios say nothing; run again.\n",
            (ABOVE_CEILING - 1.0) * 100.0
        )
    } else {
        String::new()
    };
    format!(
        "storage rows: {} ({} MiB, {} on {}), {history}, read once before the rows in \
         {:.1} s; each run starts with it out of the page cache.\n{device}{above}",
        s.path.display(),
        s.size >> 20,
        s.fs_type,
        s.fs_source,
        s.read_seconds
    )
}

/// Every column the table can have; [`table`] leaves out the optional ones (IOPS min-max
/// and vs device) that say nothing in a run.
const HEADERS: [&str; 16] = [
    "export",
    "workload",
    "IOPS",
    "IOPS min-max",
    "vs device",
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
    let shown = [
        true,
        true,
        true,
        r.options.trials > 1,
        r.cells.iter().any(|c| c.export.on_storage()),
    ];
    let keep = |row: Vec<String>| -> Vec<String> {
        let shown = shown.iter().chain(std::iter::repeat(&true));
        row.into_iter()
            .zip(shown)
            .filter_map(|(cell, &s)| s.then_some(cell))
            .collect()
    };
    // A last column says which cells' runs disagree, if any do.
    let noted = r.cells.iter().any(|c| c.outlier_note().is_some());
    let rows = (r.cells.iter())
        .map(|c| {
            let mut row = keep(row(c));
            if noted {
                row.push(c.outlier_note().unwrap_or_default());
            }
            row
        })
        .collect();
    let mut headers = keep(HEADERS.map(String::from).to_vec());
    if noted {
        headers.push("runs".into());
    }
    Table {
        headers,
        rows,
        left: 2,
    }
}

/// Every column of [`HEADERS`] for one cell. A cell whose runs disagree ([`CellReport::
/// undecided`]) has "?" for its ratio: its median is no verdict.
fn row(c: &CellReport) -> Vec<String> {
    let m = &c.median;
    let ratio = |v: f64| if c.undecided() { "?".into() } else { ratio(v) };
    let vs_device = match (c.export, c.vs_device) {
        (ExportKind::Device, _) => "ceiling".into(),
        (_, Some(v)) if c.above_ceiling() => format!("{}!", ratio(v)),
        (_, Some(v)) => ratio(v),
        (e, None) if e.under_device() => "-".into(),
        _ => String::new(),
    };
    vec![
        c.export.name().to_string(),
        c.label.clone(),
        format!("{:.0}", m.iops),
        format!("{:.0}-{:.0}", m.iops_min, m.iops_max),
        vs_device,
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
            if !l.trim().is_empty() {
                assert_eq!(&l[iops_end..iops_end + 2], "  ", "misaligned: {l:?}");
            }
        }
        lines
    }

    #[test]
    fn renders_a_plain_report() {
        let text = render(&sample::report());
        assert!(
            text.contains("ESTIMATE from the runtime_switch micro-benchmark"),
            "{text}"
        );
        assert!(text.contains("median of 3 interleaved trials"));
        let lines = check_alignment(&text);
        assert!(lines[0].contains("co ns/req") && !lines[0].contains("vs device"));
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

    /// The first table line of `export` (its first word).
    fn line_of<'a>(lines: &[&'a str], export: &str, text: &str) -> &'a str {
        lines
            .iter()
            .find(|l| l.split_whitespace().next() == Some(export))
            .unwrap_or_else(|| panic!("no {export} row in\n{text}"))
    }

    #[test]
    fn renders_storage_rows_beside_their_ceiling() {
        let text = render(&sample::with_storage());
        assert!(
            text.contains("storage rows: /var/tmp/corofuse-bench/corofuse-bench.raw (2048 MiB, ext4 on /dev/vda), written by this run in 1.4 s"),
            "{text}"
        );
        let lines = check_alignment(&text);
        assert!(lines[0].contains("vs device"), "{}", lines[0]);
        let find = |export: &str| line_of(&lines, export, &text);
        assert!(find("device").contains("ceiling"));
        assert!(find("disk").contains("0.75x"));
        assert!(find("disk-direct").contains("0.50x"));
        // null, file and local leave the column empty: their IOPS is followed by MB/s.
        for export in ["null", "local"] {
            let line = find(export);
            assert!(!line.contains('x') && !line.contains("ceiling"), "{line}");
        }
        // 3 workloads on 6 rows.
        assert_eq!(lines.len(), 1 + 6 * 3);
        assert!(!text.contains("! = "), "no row above its ceiling: {text}");
    }

    /// The main job once showed disk-direct at 1.84x "the device": the device row was
    /// no ceiling that run, and the table says so instead of a verdict.
    #[test]
    fn a_direct_row_above_the_device_row_is_marked() {
        let mut r = sample::with_storage();
        let cell = r
            .cells
            .iter_mut()
            .find(|c| c.export == ExportKind::DiskDirect);
        cell.expect("a disk-direct cell").vs_device = Some(1.84);
        let text = render(&r);
        let lines = check_alignment(&text);
        assert!(
            line_of(&lines, "disk-direct", &text).contains("1.84x!"),
            "{text}"
        );
        assert!(
            text.contains("! = an O_DIRECT row above the device row by more than 25%"),
            "{text}"
        );
    }

    /// Issue 37: a cell whose runs disagree says so; with no majority among them its
    /// ratios are "?", not a verdict such as 0.12x.
    #[test]
    fn says_which_runs_are_outliers_instead_of_a_verdict() {
        let mut r = sample::with_storage();
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
}
