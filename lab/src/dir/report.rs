//! `--dir`'s results: medians per (row, server) over the runs that succeeded, corofuse
//! over passthrough_hp, readdir's time per entry against the smallest directory's, and
//! the text (two tables under a header naming both servers' flags) or one JSON document.
//!
//! Why ratios as speed (corofuse ops/s over passthrough_hp's, > 1 when corofuse is
//! faster) on every row, time rows included: the issue's targets read "1.2x
//! passthrough_hp on every row", one direction for all. A row that failed in some runs
//! keeps the error beside the median of the others; one that failed in all shows only
//! the error, and the other rows go on.

use serde::Serialize;

use super::plan::Section;
use super::runner::{Cell, Measure, Outcome};
use crate::env::Environment;
use crate::median::{median, median_of_all, ratio as divide, Spread};
use crate::report::table::{num, opt, trials, Table};

/// The choices that shaped the numbers.
#[derive(Debug, Serialize)]
pub struct Options {
    pub trials: usize,
    pub seconds: f64,
    pub files: u64,
    pub entries: Vec<u64>,
    pub file_mib: u64,
    /// Each server's name and command line (options; paths left out).
    pub servers: Vec<(String, String)>,
    /// Why there is no passthrough_hp column, when there is none.
    pub hp_absent: Option<String>,
    /// The source tree and the file system under it ("ext4 on /dev/vda").
    pub tree: String,
    pub tree_fs: String,
}

/// Medians over the successful runs of one (row, server).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Summary {
    pub ops: f64,
    pub ops_per_second: f64,
    pub ops_per_second_min: f64,
    pub ops_per_second_max: f64,
    pub us_per_op: f64,
    pub mb_s: Option<f64>,
    pub p99_us: Option<f64>,
    pub daemon_cpu_us_per_op: Option<f64>,
    /// Readdir rows, corofuse, per entry the client listed: getdents64 on the source
    /// (the driver), the file system's READDIR(PLUS) code (the handler), and the
    /// requests from read to reply (whole).
    pub driver_ns_per_entry: Option<f64>,
    pub handler_ns_per_entry: Option<f64>,
    pub whole_ns_per_entry: Option<f64>,
    pub requests: Option<f64>,
    pub getdents_calls: Option<f64>,
}

#[derive(Debug, Serialize)]
pub struct RowReport {
    pub row: String,
    pub section: Section,
    pub server: String,
    pub corofuse: bool,
    /// `None` when every run failed.
    pub median: Option<Summary>,
    pub failed_runs: usize,
    pub first_error: Option<String>,
    /// corofuse rows: ops/s over the first passthrough_hp server's, same row.
    pub vs_hp: Option<f64>,
    /// Readdir rows: time per entry over the smallest directory's, same server (1.00 =
    /// flat).
    pub vs_smallest: Option<f64>,
    pub runs: Vec<Outcome>,
}

#[derive(Debug, Serialize)]
pub struct DirReport {
    pub environment: Environment,
    pub options: Options,
    pub rows: Vec<RowReport>,
}

fn summarise(runs: &[Outcome]) -> Option<Summary> {
    let ok: Vec<&Measure> = runs
        .iter()
        .filter_map(|o| match o {
            Outcome::Ok(m) => Some(m),
            Outcome::Failed(_) | Outcome::NotRun => None,
        })
        .collect();
    if ok.is_empty() {
        return None;
    }
    let m = |f: &dyn Fn(&Measure) -> f64| median(ok.iter().map(|x| f(x)));
    let opt = |f: &dyn Fn(&Measure) -> Option<f64>| median_of_all(ok.iter().map(|x| f(x)));
    let rate = Spread::of(ok.iter().map(|x| x.ops_per_second()));
    let per_entry = |ns: fn(&super::readdir::Listing) -> Option<u64>| {
        move |x: &Measure| {
            x.listing
                .filter(|_| x.ops > 0)
                .and_then(|l| ns(&l))
                .map(|ns| ns as f64 / x.ops as f64)
        }
    };
    Some(Summary {
        ops: m(&|x| x.ops as f64),
        ops_per_second: rate.median,
        ops_per_second_min: rate.min,
        ops_per_second_max: rate.max,
        us_per_op: m(&|x| x.us_per_op()),
        mb_s: opt(&|x| x.fio.as_ref().map(|f| f.mb_s)),
        p99_us: opt(&|x| x.fio.as_ref().map(|f| f.p99_us)),
        daemon_cpu_us_per_op: opt(&|x| x.daemon_cpu_us_per_op()),
        driver_ns_per_entry: opt(&per_entry(|l| Some(l.getdents_ns))),
        handler_ns_per_entry: opt(&per_entry(|l| Some(l.request_ns))),
        whole_ns_per_entry: opt(&per_entry(|l| l.whole_ns)),
        requests: opt(&|x| x.listing.map(|l| l.requests as f64)),
        getdents_calls: opt(&|x| x.listing.map(|l| l.getdents as f64)),
    })
}

impl DirReport {
    pub fn new(environment: Environment, options: Options, cells: Vec<Cell>) -> DirReport {
        let hp = options
            .servers
            .iter()
            .map(|(name, _)| name)
            .find(|n| n.starts_with("passthrough_hp"))
            .cloned();
        let mut rows: Vec<RowReport> = cells
            .into_iter()
            .map(|c| {
                let failed: Vec<&String> = c
                    .runs
                    .iter()
                    .filter_map(|o| match o {
                        Outcome::Failed(e) => Some(e),
                        Outcome::Ok(_) | Outcome::NotRun => None,
                    })
                    .collect();
                RowReport {
                    median: summarise(&c.runs),
                    failed_runs: failed.len(),
                    first_error: failed.first().map(|e| e.to_string()),
                    row: c.row,
                    section: c.section,
                    server: c.server,
                    corofuse: c.corofuse,
                    vs_hp: None,
                    vs_smallest: None,
                    runs: c.runs,
                }
            })
            .collect();
        let rate = |r: &RowReport| r.median.as_ref().map(|m| m.ops_per_second);
        let time = |r: &RowReport| r.median.as_ref().map(|m| m.us_per_op);
        for i in 0..rows.len() {
            let peer = rows
                .iter()
                .find(|p| Some(&p.server) == hp.as_ref() && p.row == rows[i].row);
            if rows[i].corofuse {
                rows[i].vs_hp = rate(&rows[i])
                    .zip(peer.and_then(rate))
                    .map(|(a, b)| divide(a, b));
            }
            if rows[i].section == Section::Readdir {
                let smallest = rows
                    .iter()
                    .find(|p| p.section == Section::Readdir && p.server == rows[i].server);
                rows[i].vs_smallest = time(&rows[i])
                    .zip(smallest.and_then(time))
                    .map(|(a, b)| divide(a, b));
            }
        }
        DirReport {
            environment,
            options,
            rows,
        }
    }
}

fn ratio(v: Option<f64>) -> String {
    v.filter(|v| v.is_finite())
        .map_or_else(String::new, |v| format!("{v:.2}x"))
}

/// A count (a median of counts may end in .5).
fn count(v: f64) -> String {
    if !v.is_finite() {
        "-".into()
    } else if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// The errors of a table's rows, numbered, printed under it.
#[derive(Default)]
struct Notes(Vec<String>);

impl Notes {
    /// The error column of `r`: `FAILED [n]` when every run failed, `k/N failed [n]`
    /// when some did, nothing otherwise; the error itself becomes note `n`.
    fn error(&mut self, r: &RowReport) -> String {
        let Some(e) = &r.first_error else {
            return String::new();
        };
        self.0.push(format!("{}, {}: {e}", r.row, r.server));
        let n = self.0.len();
        if r.median.is_some() {
            format!("{}/{} failed [{n}]", r.failed_runs, r.runs.len())
        } else {
            format!("FAILED [{n}]")
        }
    }

    fn render(&self) -> String {
        self.0
            .iter()
            .enumerate()
            .map(|(i, e)| format!("[{}] {e}\n", i + 1))
            .collect()
    }
}

/// The whole text output: header, the metadata and data table, the readdir table, each
/// with its errors under it.
pub fn render(r: &DirReport) -> String {
    let mut out = header(r);
    let trials = r.options.trials > 1;
    let (readdir, main): (Vec<&RowReport>, Vec<&RowReport>) =
        r.rows.iter().partition(|x| x.section == Section::Readdir);
    let mut notes = Notes::default();
    if !main.is_empty() {
        out.push('\n');
        out.push_str(&main_table(&main, trials, &mut notes).render());
        out.push_str(&notes.render());
    }
    if !readdir.is_empty() {
        let mut notes = Notes::default();
        out.push_str(&format!(
            "\nreaddir (corofuse's --stats, the 9p lesson): client = the listing's time \
             through the mount; whole = READDIR(PLUS) from read to reply written; handler = \
             the file system's code in them (driver, encoding, READDIRPLUS's lookups); \
             driver = getdents64 on the source; vs {} = time per entry over the smallest \
             directory's (1.00x = flat).\n",
            r.options.entries.first().copied().unwrap_or(0)
        ));
        out.push_str(&readdir_table(&readdir, &r.options, &mut notes).render());
        out.push_str(&notes.render());
    }
    out
}

fn header(r: &DirReport) -> String {
    let o = &r.options;
    let trials = trials(o.trials);
    let width = o.servers.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
    let servers: String = o
        .servers
        .iter()
        .map(|(name, cmd)| format!("  {name:<width$}  {cmd}\n"))
        .collect();
    let hp = match &o.hp_absent {
        Some(why) => format!("passthrough_hp: ABSENT: {why}.\n"),
        None => format!(
            "like-for-like by default: passthrough_hp --nopassthrough (every READ and \
             WRITE through its daemon; by its own defaults 86400 s timeouts, page cache \
             kept, writeback cache on) against corofuse --timeout 86400 --cache always \
             --writeback. Still different: {}.\n",
            super::servers::DIFFERENCES
        ),
    };
    format!(
        "corofuse bench --dir: {trials}, every row on a fresh mount, servers interleaved; \
         fio {} s per run on a {} MiB file, O_DIRECT\n\
         {}\n\
         source tree: {} ({})\n\
         servers:\n{servers}{hp}\
         ops/s = the client's operations (files, entries, I/Os) per second; us/op = its \
         time per operation (fio: mean latency); cpu us/op = the daemon's CPU time (all \
         threads) per operation; vs hp = corofuse's ops/s / passthrough_hp's, same row \
         (> 1.00x: corofuse is faster).\n\
         create runs on one mount, stat and unlink on the next (LOOKUPs reach the daemon), \
         over the files create made (ops) if it stopped early; \
         ls -l = list and lstat each entry; find = recursive listing by d_type. CPU \
         times are clock ticks: a row shorter than a few ticks reads 0.\n",
        fmt_seconds(o.seconds),
        o.file_mib,
        r.environment.line(),
        o.tree,
        o.tree_fs,
    )
}

fn fmt_seconds(s: f64) -> String {
    let t = format!("{s:.2}");
    t.trim_end_matches('0').trim_end_matches('.').to_string()
}

fn main_table(rows: &[&RowReport], trials: bool, notes: &mut Notes) -> Table {
    let mut headers = vec!["row", "server", "ops", "ops/s"];
    if trials {
        headers.push("ops/s min-max");
    }
    headers.extend(["us/op", "MB/s", "p99 us", "cpu us/op", "vs hp", "error"]);
    let body = rows
        .iter()
        .map(|r| {
            let m = r.median.clone().unwrap_or_else(|| Summary {
                ops: f64::NAN,
                ops_per_second: f64::NAN,
                us_per_op: f64::NAN,
                ..Summary::default()
            });
            let mut row = vec![r.row.clone(), r.server.clone()];
            row.push(count(m.ops));
            row.push(num(m.ops_per_second));
            if trials {
                row.push(if r.median.is_some() {
                    format!("{:.0}-{:.0}", m.ops_per_second_min, m.ops_per_second_max)
                } else {
                    "-".into()
                });
            }
            row.extend([
                num(m.us_per_op),
                opt(m.mb_s),
                opt(m.p99_us),
                opt(m.daemon_cpu_us_per_op),
                ratio(r.vs_hp),
                notes.error(r),
            ]);
            row
        })
        .collect();
    Table {
        headers: headers.into_iter().map(String::from).collect(),
        rows: body,
        left: 2,
    }
}

fn readdir_table(rows: &[&RowReport], o: &Options, notes: &mut Notes) -> Table {
    let smallest = format!("vs {}", o.entries.first().copied().unwrap_or(0));
    let headers = [
        "readdir",
        "server",
        "client ns/entry",
        "whole ns/entry",
        "handler ns/entry",
        "driver ns/entry",
        "requests",
        "getdents",
        "cpu ns/entry",
        "vs hp",
        smallest.as_str(),
        "error",
    ];
    let body = rows
        .iter()
        .map(|r| {
            let m = r.median.clone().unwrap_or_default();
            let has = r.median.is_some();
            vec![
                r.row.trim_start_matches("readdir ").to_string(),
                r.server.clone(),
                if has {
                    num(m.us_per_op * 1000.0)
                } else {
                    "-".into()
                },
                opt(m.whole_ns_per_entry),
                opt(m.handler_ns_per_entry),
                opt(m.driver_ns_per_entry),
                m.requests.map_or_else(|| "-".into(), count),
                m.getdents_calls.map_or_else(|| "-".into(), count),
                opt(m.daemon_cpu_us_per_op.map(|us| us * 1000.0)),
                ratio(r.vs_hp),
                ratio(r.vs_smallest),
                notes.error(r),
            ]
        })
        .collect();
    Table {
        headers: headers.into_iter().map(String::from).collect(),
        rows: body,
        left: 2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dir::readdir::Listing;

    fn measure(ops: u64, seconds: f64, listing: bool) -> Outcome {
        Outcome::Ok(Measure {
            ops,
            seconds,
            daemon_cpu_seconds: Some(seconds / 2.0),
            listing: listing.then_some(Listing {
                entries: ops + 2,
                getdents: ops / 1000 + 1,
                getdents_ns: ops * 200,
                requests: ops / 100,
                request_ns: ops * 700,
                whole_ns: Some(ops * 900),
            }),
            fio: None,
        })
    }

    fn cell(row: &str, section: Section, server: &str, runs: Vec<Outcome>) -> Cell {
        Cell {
            row: row.into(),
            section,
            server: server.into(),
            corofuse: server == "corofuse",
            runs,
        }
    }

    fn sample() -> DirReport {
        let cf = "corofuse";
        let hp = "passthrough_hp";
        let cells = vec![
            cell(
                "create 100 files",
                Section::Metadata,
                cf,
                vec![measure(100, 0.01, false); 3],
            ),
            cell(
                "create 100 files",
                Section::Metadata,
                hp,
                vec![measure(100, 0.02, false); 3],
            ),
            cell(
                "stat 100 files",
                Section::Metadata,
                cf,
                vec![
                    Outcome::Failed("stat of file 7 of 100: Too many open files".into()),
                    measure(100, 0.001, false),
                    measure(100, 0.003, false),
                ],
            ),
            cell(
                "stat 100 files",
                Section::Metadata,
                hp,
                vec![measure(100, 0.002, false); 3],
            ),
            cell(
                "ls -l 100 entries",
                Section::Metadata,
                cf,
                vec![Outcome::Failed("lstat of entry 5: EMFILE".into()); 3],
            ),
            cell(
                "ls -l 100 entries",
                Section::Metadata,
                hp,
                vec![measure(100, 0.01, false); 3],
            ),
            cell(
                "readdir 1000",
                Section::Readdir,
                cf,
                vec![measure(1000, 0.001, true); 3],
            ),
            cell(
                "readdir 1000",
                Section::Readdir,
                hp,
                vec![measure(1000, 0.002, false); 3],
            ),
            cell(
                "readdir 10000",
                Section::Readdir,
                cf,
                vec![measure(10000, 0.012, true); 3],
            ),
            cell(
                "readdir 10000",
                Section::Readdir,
                hp,
                vec![measure(10000, 0.02, false); 3],
            ),
        ];
        let options = Options {
            trials: 3,
            seconds: 0.5,
            files: 100,
            entries: vec![1000, 10000],
            file_mib: 8,
            servers: vec![
                (cf.into(), "corofuse mount-dir --timeout 86400".into()),
                (hp.into(), "/hp --nopassthrough".into()),
            ],
            hp_absent: None,
            tree: "/var/tmp/t".into(),
            tree_fs: "ext4 on /dev/vda".into(),
        };
        DirReport::new(Environment::probe(), options, cells)
    }

    fn line<'a>(text: &'a str, starts: &str, server: &str) -> &'a str {
        text.lines()
            .find(|l| l.starts_with(starts) && l.contains(server))
            .unwrap_or_else(|| panic!("no {starts:?} {server} line in\n{text}"))
    }

    #[test]
    fn medians_ratios_and_errors_per_row() {
        let r = sample();
        let create = &r.rows[0];
        assert_eq!(
            create.median.as_ref().expect("ran").ops_per_second,
            10_000.0
        );
        assert_eq!(create.vs_hp, Some(2.0), "twice as fast as passthrough_hp");
        assert_eq!(r.rows[1].vs_hp, None, "the peer has no ratio to itself");
        let stat = &r.rows[2];
        assert_eq!(stat.failed_runs, 1);
        assert_eq!(stat.median.as_ref().expect("two ran").ops, 100.0);
        let ls = &r.rows[4];
        assert!(ls.median.is_none() && ls.vs_hp.is_none());
        let rd = &r.rows[8];
        let m = rd.median.as_ref().expect("ran");
        assert_eq!(m.driver_ns_per_entry, Some(200.0));
        assert_eq!(m.handler_ns_per_entry, Some(700.0));
        assert_eq!(m.whole_ns_per_entry, Some(900.0));
        assert!((rd.vs_smallest.expect("flatness") - 1.2).abs() < 1e-9);
        let json = serde_json::to_value(&r).expect("serialises");
        assert_eq!(
            json["rows"][4]["runs"][0]["failed"],
            "lstat of entry 5: EMFILE"
        );
        assert_eq!(json["rows"][0]["runs"][0]["ok"]["ops"], 100);
    }

    #[test]
    fn renders_both_tables_with_flags_and_errors() {
        let text = render(&sample());
        assert!(text.contains("like-for-like by default"), "{text}");
        assert!(text.contains("corofuse mount-dir --timeout 86400"));
        assert!(text.contains("/hp --nopassthrough"));
        assert!(line(&text, "create 100 files", "corofuse").contains("2.00x"));
        let stat = line(&text, "stat 100 files", "corofuse");
        assert!(stat.trim_end().ends_with("1/3 failed [1]"), "{stat}");
        let ls = line(&text, "ls -l 100 entries", "corofuse");
        assert!(ls.trim_end().ends_with("FAILED [2]"), "{ls}");
        assert!(text.contains("\n[1] stat 100 files, corofuse: stat of file 7 of 100: Too many"));
        assert!(text.contains("\n[2] ls -l 100 entries, corofuse: lstat of entry 5: EMFILE\n"));
        let hdr = line(&text, "readdir ", "driver ns/entry");
        assert!(
            hdr.contains("vs 1000") && hdr.contains("whole ns/entry"),
            "{hdr}"
        );
        let cf = line(&text, "10000 ", "corofuse");
        let cols: Vec<&str> = cf.split_whitespace().collect();
        assert_eq!(
            &cols[..6],
            ["10000", "corofuse", "1200", "900.0", "700.0", "200.0"],
            "{cf}"
        );
        assert!(cf.contains("1.67x") && cf.contains("1.20x"), "{cf}");
        let hp = line(&text, "10000 ", "passthrough_hp");
        assert!(hp.contains(" - "), "no driver time for the peer: {hp}");
    }

    #[test]
    fn says_why_the_peer_is_absent() {
        let mut r = sample();
        r.options.hp_absent = Some("no passthrough_hp binary given".into());
        let text = render(&r);
        assert!(text.contains("passthrough_hp: ABSENT: no passthrough_hp binary given"));
        assert!(!text.contains("like-for-like by default"));
    }
}
