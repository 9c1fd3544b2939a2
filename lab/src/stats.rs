//! The daemon's `--stats` JSON, turned into per-request costs.
//!
//! Why per request: the question the lab answers is "what does one FUSE request cost the
//! daemon", in coroutine switches, io_uring SQEs, `io_uring_enter` calls and system calls
//! overall (CONTEXT.md: the first coroutine port of QEMU's export lost its gain to extra
//! switches and syscalls). Snapshots are read as untyped JSON so that new fields added by
//! the daemon never break the lab; [`diff`] subtracts two snapshots leaf by leaf.

use serde::Serialize;
use serde_json::{Map, Value};

/// Per-request costs from one stats snapshot (or the difference of two).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct PerRequest {
    /// `queue.requests`: FUSE requests read from /dev/fuse.
    pub requests: u64,
    /// `runtime.switches / queue.requests` (one-way transfers of control).
    pub switches: f64,
    /// `runtime.sqes_submitted / queue.requests`.
    pub sqes: f64,
    /// `runtime.enter_calls / queue.requests`.
    pub enters: f64,
    /// System calls per request: `io_uring_enter` calls, plus one writev per reply unless
    /// replies go through the ring, plus `queue.reads` when the daemon reports it, plus
    /// the backend's own (`backend.direct_syscalls`: NBD commands sent at once).
    pub syscalls: f64,
}

/// Reads a number at a `/`-separated path.
pub fn num(v: &Value, path: &str) -> Option<f64> {
    path.split('/').try_fold(v, |v, k| v.get(k))?.as_f64()
}

/// Whether replies went through io_uring: with FUSE over io_uring (the stats' `dispatch`
/// says `--transport uring`) they always do (committed by ring commands); else the stats'
/// own `ring_replies` flag when it has one, else what the caller knows from the command
/// line (`--ring-replies`).
pub fn ring_replies(stats: &Value, from_options: bool) -> bool {
    let uring = stats["dispatch"]
        .as_str()
        .is_some_and(|d| d.contains("--transport uring"));
    uring
        || ["queue/ring_replies", "ring_replies", "config/ring_replies"]
            .iter()
            .find_map(|p| p.split('/').try_fold(stats, |v, k| v.get(k))?.as_bool())
            .unwrap_or(from_options)
}

impl PerRequest {
    /// `None` when the snapshot has no requests (or is not a corofuse stats document).
    pub fn from_stats(stats: &Value, ring_replies_option: bool) -> Option<PerRequest> {
        let requests = num(stats, "queue/requests")?;
        if requests <= 0.0 {
            return None;
        }
        let per = |path: &str| num(stats, path).map(|n| n / requests);
        let enters = per("runtime/enter_calls")?;
        let replies = if ring_replies(stats, ring_replies_option) {
            0.0
        } else {
            per("queue/replies").unwrap_or(0.0)
        };
        let reads = per("queue/reads").unwrap_or(0.0);
        let backend = per("backend/direct_syscalls").unwrap_or(0.0);
        Some(PerRequest {
            requests: requests as u64,
            switches: per("runtime/switches")?,
            sqes: per("runtime/sqes_submitted")?,
            enters,
            syscalls: enters + replies + reads + backend,
        })
    }
}

/// `after - before` for every number present in both, recursively; other values are
/// taken from `after`. Counters only grow, so a negative result means the daemon
/// restarted: it is kept as is, for the reader to notice.
pub fn diff(before: &Value, after: &Value) -> Value {
    match (before, after) {
        (Value::Object(b), Value::Object(a)) => {
            let mut out = Map::new();
            for (k, av) in a {
                let v = b.get(k).map_or_else(|| av.clone(), |bv| diff(bv, av));
                out.insert(k.clone(), v);
            }
            Value::Object(out)
        }
        (Value::Number(b), Value::Number(a)) => match (b.as_u64(), a.as_u64()) {
            (Some(b), Some(a)) if a >= b => Value::from(a - b),
            _ => match (b.as_f64(), a.as_f64()) {
                (Some(b), Some(a)) => {
                    serde_json::Number::from_f64(a - b).map_or(Value::Null, Value::Number)
                }
                _ => after.clone(),
            },
        },
        _ => after.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn snapshot(requests: u64, switches: u64, sqes: u64, enters: u64) -> Value {
        json!({
            "image": "null:1G",
            "runtime": {"switches": switches, "sqes_submitted": sqes, "enter_calls": enters,
                        "peak_live": 5},
            "queue": {"requests": requests, "replies": requests, "empty_reads": 3},
            "ops": {"READ": {"count": requests}}
        })
    }

    #[test]
    fn diff_subtracts_numbers_and_keeps_the_rest() {
        let d = diff(&snapshot(10, 40, 10, 10), &snapshot(110, 440, 111, 105));
        assert_eq!(num(&d, "queue/requests"), Some(100.0));
        assert_eq!(num(&d, "runtime/switches"), Some(400.0));
        assert_eq!(num(&d, "ops/READ/count"), Some(100.0));
        assert_eq!(d["image"], "null:1G");
    }

    #[test]
    fn per_request_ratios() {
        let d = diff(&snapshot(10, 40, 10, 10), &snapshot(110, 440, 111, 105));
        let p = PerRequest::from_stats(&d, false).expect("has requests");
        assert_eq!(p.requests, 100);
        assert_eq!((p.switches, p.sqes, p.enters), (4.0, 1.01, 0.95));
        assert!((p.syscalls - 1.95).abs() < 1e-9, "writev per reply counted");
        let p = PerRequest::from_stats(&d, true).expect("has requests");
        assert!(
            (p.syscalls - 0.95).abs() < 1e-9,
            "ring replies are not syscalls"
        );
        assert_eq!(
            PerRequest::from_stats(&json!({"queue": {"requests": 0}}), false),
            None
        );
        assert_eq!(PerRequest::from_stats(&json!({"other": 1}), false), None);
        let mut sent = snapshot(100, 400, 100, 100);
        sent["backend"] = json!({"direct_syscalls": 50});
        let p = PerRequest::from_stats(&sent, false).expect("has requests");
        assert!(
            (p.syscalls - 2.5).abs() < 1e-9,
            "the backend's own syscalls count"
        );
    }

    #[test]
    fn the_stats_own_flag_wins() {
        let s = json!({"queue": {"ring_replies": true}});
        assert!(ring_replies(&s, false));
        assert!(!ring_replies(&json!({}), false));
        let uring = json!({"dispatch": "coroutine --queues 2 --transport uring"});
        assert!(
            ring_replies(&uring, false),
            "FUSE over io_uring commits on the ring"
        );
        assert!(!ring_replies(
            &json!({"dispatch": "coroutine --queues 2"}),
            false
        ));
    }
}
