//! `corofuse stats PATH`: a readable summary of a `corofuse mount --stats` JSON file.
//!
//! Why tolerant: the stats document grows as the daemon does (per-opcode latency
//! histograms are coming under "ops"). Known sections get names and per-request ratios;
//! any other field is printed as found; "ops" is read in the shapes a histogram is
//! likely to take (precomputed p50/p99/max, a percentile map, or buckets) and skipped
//! with a note when none fits.

use std::path::PathBuf;

use serde_json::{Map, Value};

use super::report::table::{num, Table};
use super::stats::{num as at, PerRequest};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// A file written by `corofuse mount --stats PATH` (at exit or on SIGUSR1)
    path: PathBuf,
    /// The daemon ran with --ring-replies (its replies were not writev calls)
    #[arg(long)]
    ring_replies: bool,
}

pub fn run(args: &Args) -> Result<(), String> {
    let text = std::fs::read_to_string(&args.path)
        .map_err(|e| format!("cannot read {}: {e}", args.path.display()))?;
    let stats: Value = serde_json::from_str(&text).map_err(|e| {
        format!(
            "{} is not JSON ({e}); if the daemon is still writing it, try again",
            args.path.display()
        )
    })?;
    print!(
        "{}",
        summary(&args.path.display().to_string(), &stats, args.ring_replies)
    );
    Ok(())
}

/// The whole summary as text.
pub fn summary(name: &str, stats: &Value, ring_replies: bool) -> String {
    let mut out = String::new();
    let image = stats.get("image").and_then(Value::as_str).unwrap_or("?");
    out.push_str(&format!("{name}: export of {image}\n"));
    let Some(obj) = stats.as_object() else {
        out.push_str("(not a JSON object)\n");
        return out;
    };
    for section in ["runtime", "queue"] {
        if let Some(v) = obj.get(section) {
            out.push_str(&format!("\n{section}\n"));
            out.push_str(&fields(v));
        }
    }
    out.push_str(&per_request(stats, ring_replies));
    // Fields this summary does not know: objects as sections, scalars together.
    let unknown = obj
        .iter()
        .filter(|(k, _)| !["image", "runtime", "queue", "ops"].contains(&k.as_str()));
    let (sections, scalars): (Vec<_>, Vec<_>) = unknown.partition(|(_, v)| v.is_object());
    for (k, v) in sections {
        out.push_str(&format!("\n{k}\n"));
        out.push_str(&fields(v));
    }
    if !scalars.is_empty() {
        let rest: Map<String, Value> = scalars
            .into_iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        out.push_str("\nother\n");
        out.push_str(&fields(&Value::Object(rest)));
    }
    if let Some(ops) = obj.get("ops") {
        out.push_str(&ops_tables(ops));
    }
    out
}

/// Every leaf of `v` as "  a.b  value", aligned.
fn fields(v: &Value) -> String {
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
    t.render()
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
        Value::String(s) => rows.push((prefix.into(), s.clone())),
        other => rows.push((prefix.into(), other.to_string())),
    }
}

fn per_request(stats: &Value, ring_replies: bool) -> String {
    let Some(p) = PerRequest::from_stats(stats, ring_replies) else {
        return "\nper request: no requests counted (queue.requests missing or 0)\n".into();
    };
    let r = p.requests as f64;
    let per = |path: &str| at(stats, path).map_or_else(|| "-".into(), |n| num(n / r));
    let syscalls_note = if ring_replies {
        "enter calls (+ queue.reads): replies went through the ring"
    } else {
        "enter calls + 1 writev per reply (+ queue.reads)"
    };
    let rows: Vec<[String; 3]> = vec![
        [
            "coroutine switches".into(),
            num(p.switches),
            "runtime.switches / queue.requests".into(),
        ],
        [
            "  resumes".into(),
            per("runtime/resumes"),
            "runtime.resumes".into(),
        ],
        [
            "  suspends".into(),
            per("runtime/suspends"),
            "runtime.suspends".into(),
        ],
        [
            "coroutines spawned".into(),
            per("runtime/spawned"),
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
            per("runtime/cqes_reaped"),
            "runtime.cqes_reaped".into(),
        ],
        ["system calls".into(), num(p.syscalls), syscalls_note.into()],
        [
            "empty /dev/fuse reads".into(),
            per("queue/empty_reads"),
            "queue.empty_reads".into(),
        ],
    ];
    let mut out = format!("\nper request ({} requests)\n", p.requests);
    for [name, value, note] in rows {
        out.push_str(&format!("  {name:<22} {value:>7}   {note}\n"));
    }
    out
}

/// Known latency kinds in the order a request lives them; others after, as found.
fn kind_rank(kind: &str) -> usize {
    let base = kind.split([' ', '_']).next().unwrap_or(kind);
    ["wait", "queue", "io", "backend", "cpu", "service", "total"]
        .iter()
        .position(|k| *k == base)
        .unwrap_or(usize::MAX)
}

/// Integers as integers (nanoseconds), the rest with [`num`]'s precision.
fn whole_or_num(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.0}")
    } else {
        num(v)
    }
}

/// `key`, plus the unit its fields carry when the key itself has none: "wait (ns)" for
/// `"wait": {"p50_ns": ..}`.
fn with_unit(key: &str, v: &Value) -> String {
    const UNITS: [&str; 3] = ["ns", "us", "ms"];
    if UNITS.iter().any(|u| key.ends_with(&format!("_{u}"))) {
        return key.to_string();
    }
    let unit = v.as_object().and_then(|m| {
        m.keys()
            .find_map(|k| UNITS.iter().find(|u| k.ends_with(&format!("_{u}"))))
    });
    unit.map_or_else(|| key.to_string(), |u| format!("{key} ({u})"))
}

/// p50, p99 and max of one latency kind.
#[derive(Debug, PartialEq)]
struct Latency {
    p50: Option<f64>,
    p99: Option<f64>,
    max: Option<f64>,
}

fn ops_tables(ops: &Value) -> String {
    let entries: Vec<(String, &Value)> = match ops {
        Value::Object(m) => m.iter().map(|(k, v)| (k.clone(), v)).collect(),
        Value::Array(a) => a
            .iter()
            .map(|v| {
                let name = ["op", "opcode", "name"]
                    .iter()
                    .find_map(|k| {
                        v.get(k)
                            .map(|n| n.as_str().map_or(n.to_string(), String::from))
                    })
                    .unwrap_or_else(|| "?".into());
                (name, v)
            })
            .collect(),
        _ => return "\nops: not an object or array; skipped\n".into(),
    };
    // The field holding an opcode's request count, and its value.
    let count_of = |entry: &Value| {
        ["count", "requests", "n", "total"]
            .into_iter()
            .find_map(|k| Some((k, entry.get(k)?.as_f64()?)))
    };
    let count = |entry: &Value| count_of(entry).map_or(0.0, |(_, c)| c);
    let mut entries = entries;
    // Busiest opcodes first.
    entries.sort_by(|a, b| count(b.1).total_cmp(&count(a.1)));
    let mut out = String::from("\nops (per opcode)\n");
    for (name, entry) in entries {
        let count = count_of(entry);
        // Other scalar figures of the opcode (e.g. switches_per_request).
        let extras: String = entry
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(k, _)| count.is_none_or(|(ck, _)| ck != k.as_str()))
            .filter_map(|(k, v)| Some(format!(", {k} {}", num(v.as_f64()?))))
            .collect();
        out.push_str(&format!(
            "  {name}: {} requests{extras}\n",
            count.map_or("?".into(), |(_, c)| format!("{c:.0}"))
        ));
        let kinds: Vec<(String, Latency)> = match entry {
            Value::Object(m) => m
                .iter()
                .filter_map(|(k, v)| latency(v).map(|l| (with_unit(k, v), l)))
                .collect(),
            _ => vec![],
        };
        let kinds = if kinds.is_empty() {
            latency(entry)
                .map(|l| vec![("latency".to_string(), l)])
                .unwrap_or_default()
        } else {
            kinds
        };
        if kinds.is_empty() {
            out.push_str("    (no latency figures in a known shape)\n");
            continue;
        }
        let mut kinds = kinds;
        kinds.sort_by_key(|(k, _)| kind_rank(k));
        let o = |v: Option<f64>| v.map_or_else(|| "-".into(), whole_or_num);
        let t = Table {
            headers: ["    latency", "p50", "p99", "max"]
                .map(String::from)
                .to_vec(),
            rows: kinds
                .into_iter()
                .map(|(k, l)| vec![format!("    {k}"), o(l.p50), o(l.p99), o(l.max)])
                .collect(),
            left: 1,
        };
        out.push_str(&t.render());
    }
    out
}

/// Reads a latency distribution from the shapes it is likely to have; `None` if `v` is
/// none of them.
fn latency(v: &Value) -> Option<Latency> {
    let m = v.as_object()?;
    let field = |names: &[&str]| {
        m.iter().find_map(|(k, v)| {
            let base = ["_ns", "_us", "_ms"]
                .iter()
                .fold(k.as_str(), |k, s| k.trim_end_matches(s));
            names.contains(&base).then(|| v.as_f64()).flatten()
        })
    };
    let mut l = Latency {
        p50: field(&["p50", "median"]),
        p99: field(&["p99"]),
        max: field(&["max"]),
    };
    if let Some(p) = m
        .get("percentiles")
        .or_else(|| m.get("percentile"))
        .and_then(Value::as_object)
    {
        let q = |want: f64| {
            p.iter().find_map(|(k, v)| {
                let k = k.trim_start_matches('p').parse::<f64>().ok()?;
                ((k - want).abs() < 1e-9).then(|| v.as_f64()).flatten()
            })
        };
        l.p50 = l.p50.or(q(50.0));
        l.p99 = l.p99.or(q(99.0));
    }
    if let Some(b) = buckets(m) {
        l.p50 = l.p50.or(bucket_quantile(&b, 0.50));
        l.p99 = l.p99.or(bucket_quantile(&b, 0.99));
        l.max = l
            .max
            .or(b.iter().rev().find(|(_, n)| *n > 0.0).map(|(x, _)| *x));
    }
    (l.p50.is_some() || l.p99.is_some()).then_some(l)
}

/// `(upper bound, count)` pairs from `buckets: [[bound, count], ...]`,
/// `buckets: [{"le"|"upper"|"bound"|"lo"|"low": x, "count": n}, ...]`, or parallel
/// `bounds`/`counts` arrays; sorted by bound.
fn buckets(m: &Map<String, Value>) -> Option<Vec<(f64, f64)>> {
    let mut out: Vec<(f64, f64)> = if let Some(arr) = m.get("buckets").and_then(Value::as_array) {
        arr.iter()
            .map(|b| match b {
                Value::Array(p) => Some((p.first()?.as_f64()?, p.get(1)?.as_f64()?)),
                Value::Object(o) => {
                    let bound = ["le", "upper", "bound", "hi", "high", "lo", "low"]
                        .iter()
                        .find_map(|k| o.get(*k).and_then(Value::as_f64))?;
                    Some((bound, o.get("count")?.as_f64()?))
                }
                _ => None,
            })
            .collect::<Option<_>>()?
    } else {
        let bounds = m.get("bounds").and_then(Value::as_array)?;
        let counts = m.get("counts").and_then(Value::as_array)?;
        bounds
            .iter()
            .zip(counts)
            .map(|(b, c)| Some((b.as_f64()?, c.as_f64()?)))
            .collect::<Option<_>>()?
    };
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    (!out.is_empty()).then_some(out)
}

fn bucket_quantile(b: &[(f64, f64)], q: f64) -> Option<f64> {
    let total: f64 = b.iter().map(|(_, n)| n).sum();
    if total <= 0.0 {
        return None;
    }
    let mut seen = 0.0;
    b.iter().find_map(|(x, n)| {
        seen += n;
        (seen >= (q * total).ceil()).then_some(*x)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn real() -> Value {
        json!({
          "image": "null:1G",
          "runtime": {"spawned": 121115, "completed": 121111, "switches": 484591,
                      "resumes": 242296, "suspends": 121184, "sqes_submitted": 121183,
                      "enter_calls": 121153, "cqes_reaped": 121181},
          "queue": {"requests": 121111, "replies": 121111, "empty_reads": 35}
        })
    }

    #[test]
    fn summarises_a_real_stats_file() {
        let s = summary("stats.json", &real(), false);
        assert!(s.contains("export of null:1G"));
        assert!(s.contains("per request (121111 requests)"));
        let line = |want: &str| s.lines().find(|l| l.contains(want)).map(String::from);
        let sw = line("coroutine switches").expect("switches line");
        assert!(sw.contains("4.00"), "{sw}");
        let sys = line("system calls").expect("syscalls line");
        assert!(sys.contains("2.00"), "{sys}");
        assert!(line("enter_calls").expect("raw counter").contains("121153"));
        assert!(!s.contains("ops (per opcode)"));
    }

    #[test]
    fn tolerates_extra_fields_and_odd_documents() {
        let mut v = real();
        v["transport"] = json!({"kind": "uring", "queues": 2});
        v["allocations"] = json!(1234);
        let s = summary("x", &v, true);
        assert!(s.contains("transport") && s.contains("kind") && s.contains("uring"));
        let other = &s[s.find("\nother\n").expect("other section")..];
        assert!(other.contains("allocations  1234"), "{other}");
        assert!(s.contains("replies went through the ring"));
        let s = summary("x", &json!([1, 2]), false);
        assert!(s.contains("not a JSON object"));
        let s = summary("x", &json!({"queue": {"requests": 0}}), false);
        assert!(s.contains("no requests counted"));
    }

    #[test]
    fn ops_in_several_shapes() {
        let mut v = real();
        v["ops"] = json!({
            "READ": {"count": 1000,
                     "total_ns": {"p50_ns": 4200, "p99_ns": 9000, "max_ns": 51000},
                     "backend_ns": {"percentiles": {"50": 1000, "99.0": 3000}, "max": 7000}},
            "WRITE": {"count": 10,
                      "service_us": {"buckets": [[1, 5], [2, 3], [8, 1], [16, 1], [32, 0]]}},
            "GETATTR": {"count": 3},
        });
        let s = summary("x", &v, false);
        let ops = &s[s.find("ops (per opcode)").expect("ops section")..];
        assert!(ops.contains("READ: 1000 requests"), "{ops}");
        let row = |k: &str| {
            ops.lines()
                .find(|l| l.trim_start().starts_with(k))
                .expect(k)
                .to_string()
        };
        let total: Vec<String> = row("total_ns")
            .split_whitespace()
            .map(String::from)
            .collect();
        assert_eq!(total, ["total_ns", "4200", "9000", "51000"]);
        let backend: Vec<String> = row("backend_ns")
            .split_whitespace()
            .map(String::from)
            .collect();
        assert_eq!(backend, ["backend_ns", "1000", "3000", "7000"]);
        let service: Vec<String> = row("service_us")
            .split_whitespace()
            .map(String::from)
            .collect();
        assert_eq!(service, ["service_us", "1", "16", "16"]);
        assert!(ops.contains("GETATTR: 3 requests") && ops.contains("no latency figures"));
    }

    /// The shape `transport::accounting::OpReport` serialises to.
    #[test]
    fn ops_from_the_server_accounting() {
        let summary = |p50: u64| {
            json!({"count": 7, "mean_ns": p50, "p50_ns": p50,
                                        "p99_ns": p50 * 3, "max_ns": p50 * 9})
        };
        let mut v = real();
        v["ops"] = json!({
            "GETATTR": {"count": 7, "wait": summary(100), "io": summary(0), "cpu": summary(300),
                        "total": summary(400), "switches_per_request": 2.0,
                        "sqes_per_request": 1.0, "syscalls_per_request": 1.0},
            "READ": {"count": 1000, "wait": summary(1000), "io": summary(2000),
                     "cpu": summary(500), "total": summary(4000),
                     "switches_per_request": 4.0, "sqes_per_request": 2.0,
                     "syscalls_per_request": 1.0}
        });
        let s = summary_text(&v);
        let ops = &s[s.find("ops (per opcode)").expect("ops section")..];
        let read = ops.find("READ: 1000 requests").expect("READ first");
        assert!(
            read < ops.find("GETATTR: 7 requests").expect("GETATTR"),
            "{ops}"
        );
        assert!(ops.contains("switches_per_request 4.00"), "{ops}");
        let row = |k: &str| -> Vec<String> {
            let line = ops[read..]
                .lines()
                .find(|l| l.trim_start().starts_with(k))
                .expect(k);
            line.split_whitespace().map(String::from).collect()
        };
        assert_eq!(
            row("total (ns)"),
            ["total", "(ns)", "4000", "12000", "36000"]
        );
        assert_eq!(row("wait (ns)"), ["wait", "(ns)", "1000", "3000", "9000"]);
    }

    fn summary_text(v: &Value) -> String {
        summary("x", v, false)
    }

    #[test]
    fn ops_as_an_array_with_parallel_bounds() {
        let ops = json!([{"op": "READ", "requests": 4,
                          "latency_ns": {"bounds": [100, 200, 400], "counts": [2, 1, 1]}}]);
        let s = ops_tables(&ops);
        assert!(s.contains("READ: 4 requests"), "{s}");
        assert!(s.contains("latency_ns"), "{s}");
        assert_eq!(
            latency(&json!({"bounds": [100, 200, 400], "counts": [2, 1, 1]})),
            Some(Latency {
                p50: Some(100.0),
                p99: Some(400.0),
                max: Some(400.0)
            })
        );
        assert_eq!(latency(&json!({"count": 3})), None);
    }
}
