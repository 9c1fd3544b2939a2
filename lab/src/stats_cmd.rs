//! `corofuse-lab stats PATH`: a readable summary of a `--stats` file.
//!
//! The file is read as the typed [`Stats`] the daemon wrote (`daemon_stats`, one
//! definition for both), so a file that is not one is refused with the field that does not
//! fit, and every section is printed under the names the daemon gives it: the loops'
//! counters, the queues', the costs per request, the export's own sections (backend, fault
//! injection, directory) and each opcode's latencies.

use std::path::PathBuf;

use daemon_stats::{OpReport, PlacementStats, Stats};
use runtime::histogram::Summary;
use serde_json::Value;

use super::report::table::{num, Table};
use super::stats::{num as num_at, ring_replies as replies_in_ring, PerRequest};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// A file written by `corofuse mount --stats PATH` (at exit or on SIGUSR1)
    path: PathBuf,
    /// The daemon ran with --ring-replies (its replies were not writev calls)
    #[arg(long)]
    ring_replies: bool,
}

pub fn run(args: &Args) -> Result<(), String> {
    let stats = Stats::read(&args.path).map_err(|e| e.to_string())?;
    print!(
        "{}",
        summary(&args.path.display().to_string(), &stats, args.ring_replies)
    );
    Ok(())
}

/// The whole summary as text.
pub fn summary(name: &str, stats: &Stats, ring_replies: bool) -> String {
    let mut out = format!(
        "{name}: export of {} ({} dispatch)\n",
        stats.image, stats.dispatch
    );
    let json = serde_json::to_value(stats).expect("stats serialise");
    section(&mut out, "runtime", &json["runtime"]);
    section(&mut out, "queue", &json["queue"]);
    out.push_str(&per_request(stats, &json, ring_replies));
    for (name, value) in &stats.sections {
        if !value.is_null() {
            section(&mut out, name, value);
        }
    }
    if stats.per_queue.len() > 1 {
        out.push_str(&per_queue(stats));
    }
    if let Some(p) = &stats.placement {
        out.push_str(&placement(p));
    }
    out.push_str(&format!(
        "\nheap allocations by the daemon so far: {}\n",
        stats.allocations
    ));
    if !stats.ops.is_empty() {
        out.push_str(&ops_tables(stats));
    }
    out
}

/// A section's fields, "  a.b  value", aligned.
fn section(out: &mut String, name: &str, v: &Value) {
    let mut rows = Vec::new();
    flatten("", v, &mut rows);
    let t = Table {
        headers: vec![],
        rows: rows
            .into_iter()
            .map(|(k, v)| vec![format!("  {k}"), v])
            .collect(),
        left: 1,
    };
    out.push_str(&format!("\n{name}\n{}", t.render()));
}

fn flatten(prefix: &str, v: &Value, rows: &mut Vec<(String, String)>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, v, rows);
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                flatten(&format!("{prefix}[{i}]"), v, rows);
            }
        }
        Value::String(s) => rows.push((prefix.into(), s.clone())),
        other => rows.push((prefix.into(), other.to_string())),
    }
}

fn per_request(stats: &Stats, json: &Value, ring_replies: bool) -> String {
    let Some(p) = PerRequest::from_stats(json, ring_replies) else {
        return "\nper request: no requests counted (queue.requests is 0)\n".into();
    };
    let r = p.requests as f64;
    let per = |n: u64| num(n as f64 / r);
    let rt = &stats.runtime;
    let syscalls_note = if replies_in_ring(json, ring_replies) {
        "enter calls: replies went through the ring"
    } else {
        "enter calls + 1 writev per reply"
    };
    let syscalls_note = if num_at(json, "backend/direct_syscalls").unwrap_or(0.0) > 0.0 {
        format!("{syscalls_note} + the backend's own")
    } else {
        syscalls_note.to_string()
    };
    let rows: Vec<[String; 3]> = vec![
        [
            "coroutine switches".into(),
            num(p.switches),
            "runtime.switches / queue.requests".into(),
        ],
        [
            "  resumes".into(),
            per(rt.resumes),
            "runtime.resumes".into(),
        ],
        [
            "  suspends".into(),
            per(rt.suspends),
            "runtime.suspends".into(),
        ],
        [
            "coroutines spawned".into(),
            per(rt.spawned),
            "runtime.spawned".into(),
        ],
        [
            "io_uring SQEs".into(),
            num(p.sqes),
            "runtime.sqes_submitted".into(),
        ],
        [
            "io_uring_enter calls".into(),
            num(p.enters),
            "runtime.enter_calls".into(),
        ],
        [
            "CQEs reaped".into(),
            per(rt.cqes_reaped),
            "runtime.cqes_reaped".into(),
        ],
        ["system calls".into(), num(p.syscalls), syscalls_note],
        [
            "empty /dev/fuse reads".into(),
            per(stats.queue.empty_reads),
            "queue.empty_reads".into(),
        ],
        [
            "read ahead (backlog)".into(),
            per(stats.queue.backlogged),
            "queue.backlogged: served by turns".into(),
        ],
    ];
    let mut out = format!("\nper request ({} requests)\n", p.requests);
    for [name, value, note] in rows {
        out.push_str(&format!("  {name:<22} {value:>7}   {note}\n"));
    }
    out
}

/// Each loop's share of the requests (`--queues N`).
fn per_queue(stats: &Stats) -> String {
    let t = Table {
        headers: [
            "  loop",
            "requests",
            "replies",
            "empty reads",
            "stream errors",
        ]
        .map(String::from)
        .to_vec(),
        rows: stats
            .per_queue
            .iter()
            .enumerate()
            .map(|(i, q)| {
                vec![
                    format!("  {i}"),
                    q.requests.to_string(),
                    q.replies.to_string(),
                    q.empty_reads.to_string(),
                    q.stream_errors.to_string(),
                ]
            })
            .collect(),
        left: 1,
    };
    format!("\nper loop\n{}", t.render())
}

/// What the adaptive loop placement did, and how long each state held.
fn placement(p: &PlacementStats) -> String {
    let mut out = format!(
        "\nloop placement: {} trials ({} started early by a change of rate, {} by a shallow \
         client beside a deep one), {} moves kept, {} pauses moved after the shallow \
         client, {} idle measurements, {} ms in trials\n",
        p.trials, p.shifts, p.shallow, p.kept, p.follows, p.idle, p.trial_ms
    );
    for (paused, ms) in p.ms_with_paused.iter().enumerate() {
        out.push_str(&format!("  {paused} loop(s) paused: {ms} ms\n"));
    }
    out
}

/// Per opcode, busiest first: its count and costs, then where its time went.
fn ops_tables(stats: &Stats) -> String {
    let mut ops: Vec<(&String, &OpReport)> = stats.ops.iter().collect();
    ops.sort_by(|a, b| b.1.count.cmp(&a.1.count).then(a.0.cmp(b.0)));
    let mut out = String::from("\nops (per opcode; times in ns)\n");
    for (name, op) in ops {
        out.push_str(&format!(
            "  {name}: {} requests, {} switches, {} SQEs, {} syscalls per request\n",
            op.count,
            num(op.switches_per_request),
            num(op.sqes_per_request),
            num(op.syscalls_per_request)
        ));
        let row = |kind: &str, s: &Summary| {
            vec![
                format!("    {kind}"),
                s.mean_ns.to_string(),
                s.p50_ns.to_string(),
                s.p99_ns.to_string(),
                s.max_ns.to_string(),
            ]
        };
        let t = Table {
            headers: ["    latency", "mean", "p50", "p99", "max"]
                .map(String::from)
                .to_vec(),
            rows: vec![
                row("wait", &op.wait),
                row("io", &op.io),
                row("cpu", &op.cpu),
                row("total", &op.total),
            ],
            left: 1,
        };
        out.push_str(&t.render());
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use backend::BackendStats;
    use daemon_stats::QueueStats;
    use dir_export::DirStats;
    use transport::accounting::{Accounting, Sample};

    use super::*;

    /// A snapshot as the daemon builds it: real counters and a real accounting's report,
    /// serialised and read back the way `corofuse-lab stats` reads a file.
    fn real() -> Stats {
        let mut accounting = Accounting::default();
        for i in 0..1000u64 {
            accounting.record(&Sample {
                opcode: fuse::abi::FUSE_READ,
                wait: Duration::from_nanos(100),
                io: Duration::from_nanos(2000 + i),
                total: Duration::from_nanos(4000 + i),
                switches: 4,
                sqes: 2,
                syscalls: 1,
            });
        }
        accounting.record(&Sample {
            opcode: fuse::abi::FUSE_GETATTR,
            total: Duration::from_nanos(900),
            switches: 2,
            sqes: 1,
            syscalls: 1,
            ..Sample::default()
        });
        let queue = QueueStats {
            requests: 1001,
            replies: 1001,
            empty_reads: 5,
            backlogged: 500,
            ..QueueStats::default()
        };
        let mut stats = Stats {
            image: "null:1G".into(),
            dispatch: "coroutine --queues 2".into(),
            queue,
            allocations: 321,
            ops: accounting.report(),
            per_queue: vec![queue, QueueStats::default()],
            placement: Some(PlacementStats {
                trials: 7,
                kept: 2,
                idle: 1,
                ms_with_paused: vec![4000, 1500],
                trial_ms: 900,
                shifts: 3,
                shallow: 1,
                follows: 2,
            }),
            ..Stats::default()
        };
        stats.set_section("backend", &BackendStats::default());
        stats.runtime.switches = 4004;
        stats.runtime.resumes = 2002;
        stats.runtime.spawned = 1001;
        stats.runtime.enter_calls = 1001;
        Stats::parse(&stats.to_json()).expect("a snapshot reads back")
    }

    fn line(text: &str, want: &str) -> String {
        let found = text.lines().find(|l| l.contains(want));
        found
            .unwrap_or_else(|| panic!("no {want:?} in\n{text}"))
            .into()
    }

    #[test]
    fn summarises_a_snapshot_the_daemon_writes() {
        let s = summary("stats.json", &real(), false);
        assert!(s.starts_with("stats.json: export of null:1G (coroutine --queues 2 dispatch)"));
        assert!(s.contains("per request (1001 requests)"), "{s}");
        assert!(line(&s, "coroutine switches").contains("4.00"));
        assert!(line(&s, "system calls").contains("2.00"), "{s}");
        assert!(line(&s, "enter_calls").contains("1001"));
        assert!(line(&s, "read ahead (backlog)").contains("0.50"), "{s}");
        assert!(s.contains("\nbackend\n") && !s.contains("\ndir\n"), "{s}");
        assert!(s.contains("per loop"), "{s}");
        assert!(
            s.contains(
                "loop placement: 7 trials (3 started early by a change of rate, 1 by a shallow \
                 client beside a deep one), 2 moves kept, 2 pauses moved after the shallow \
                 client, 1 idle measurements, 900 ms"
            ),
            "{s}"
        );
        assert!(s.contains("  1 loop(s) paused: 1500 ms"), "{s}");
        assert!(s.contains("heap allocations by the daemon so far: 321"));
        let ops = &s[s.find("ops (per opcode").expect("ops")..];
        assert!(ops.find("READ: 1000").unwrap() < ops.find("GETATTR: 1").unwrap());
        let total_line = line(ops, "    total");
        let total: Vec<&str> = total_line.split_whitespace().collect();
        assert_eq!(total[0], "total");
        let p50: u64 = total[2].parse().unwrap();
        assert!((4400..=4600).contains(&p50), "{total:?}");
    }

    #[test]
    fn a_directory_export_shows_its_section() {
        let mut stats = real();
        stats.sections.remove("backend");
        let dir = DirStats {
            nodes: 3002,
            ..DirStats::default()
        };
        stats.set_section("dir", &dir);
        let s = summary("x", &stats, true);
        assert!(line(&s, "nodes").contains("3002"), "{s}");
        assert!(s.contains("replies went through the ring"));
    }

    #[test]
    fn no_requests_and_files_that_are_not_stats() {
        let s = summary("x", &Stats::default(), false);
        assert!(s.contains("no requests counted"));
        assert!(!s.contains("ops (per opcode"));
        let path = std::env::temp_dir().join(format!("stats-cmd-{}.json", std::process::id()));
        std::fs::write(&path, "{\"image\": 3}").unwrap();
        let err = Stats::read(&path).unwrap_err().to_string();
        std::fs::remove_file(&path).unwrap();
        assert!(err.contains("is not a corofuse --stats file"), "{err}");
        assert!(err.contains("invalid type"), "{err}");
    }
}
