//! The daemon's side of `--dir`'s readdir rows: what corofuse's `--stats` says the
//! listing cost, beside the client's time (the 9p lesson: QEMU's n-square readdir only
//! showed when the driver's own time, the whole request's and the client's were printed
//! side by side).
//!
//! The driver's time is `getdents64` on the source (`listing.getdents_ns`), the
//! handler's the file system's READDIR/READDIRPLUS code (`listing.request_ns`: the
//! driver's time, encoding and READDIRPLUS's lookups), the whole requests' time from
//! read to reply written (the per-opcode accounting under `ops`, whose count times mean
//! is the sum). A stream's counts reach the stats when its directory is
//! released, which the kernel sends after the client's `closedir` returns: [`settle`]
//! asks again until they are in.

use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;

use crate::daemon::Daemon;
use crate::stats;

/// What one listing cost the daemon (a difference of two `--stats` snapshots).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Listing {
    /// Entries the daemon read from the source (`.` and `..` included).
    pub entries: u64,
    pub getdents: u64,
    pub getdents_ns: u64,
    /// READDIR and READDIRPLUS requests, and the file system's time in them.
    pub requests: u64,
    pub request_ns: u64,
    /// Their whole time, read to reply written (`None` without per-opcode accounting).
    pub whole_ns: Option<u64>,
}

impl Listing {
    /// From a stats document (or a difference of two); `None` without a `dir.listing`
    /// section (`dir_export::ListingStats`).
    pub fn from_stats(v: &Value) -> Option<Listing> {
        let n = |k: &str| stats::num(v, &format!("dir/listing/{k}")).map(|x| x as u64);
        Some(Listing {
            entries: n("streams/entries")?,
            getdents: n("streams/getdents")?,
            getdents_ns: n("streams/getdents_ns")?,
            requests: n("requests")?,
            request_ns: n("request_ns")?,
            whole_ns: None,
        })
    }
}

/// Nanoseconds READDIR and READDIRPLUS took from read to reply, in all, by the
/// per-opcode accounting of a stats document (count times the exact mean).
fn whole_ns(v: &Value) -> f64 {
    ["READDIR", "READDIRPLUS"]
        .iter()
        .map(|op| {
            let total = |k: &str| stats::num(v, &format!("ops/{op}/total/{k}"));
            // An opcode never seen has no entry: it took no time.
            total("count")
                .zip(total("mean_ns"))
                .map_or(0.0, |(c, m)| c * m)
        })
        .sum()
}

/// How long [`settle`] waits for the release to be counted.
const SETTLE: Duration = Duration::from_secs(2);

/// The listing since `before`, once at least `entries` entries are counted (or after
/// [`SETTLE`], with what is counted by then).
pub fn settle(daemon: &mut Daemon, before: &Value, entries: u64) -> Result<Listing, String> {
    let deadline = Instant::now() + SETTLE;
    loop {
        let after = daemon.snapshot()?;
        let mut listing = Listing::from_stats(&stats::diff(before, &after))
            .ok_or("corofuse's --stats has no listing counts")?;
        let ops = |v: &Value| v.get("ops").map(|_| whole_ns(v));
        listing.whole_ns = ops(&after)
            .zip(ops(before))
            .map(|(a, b)| (a - b).max(0.0).round() as u64);
        if listing.entries >= entries || Instant::now() >= deadline {
            return Ok(listing);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_listing_counts() {
        // Snapshots as the daemon writes them: the typed --stats document.
        let snapshot = |entries, getdents, getdents_ns, requests, request_ns| {
            let streams = dir_export::StreamStats {
                entries,
                getdents,
                getdents_ns,
                seeks: 0,
            };
            let listing = dir_export::ListingStats {
                streams,
                requests,
                request_ns,
            };
            let mut stats = daemon_stats::Stats::default();
            let dir = dir_export::DirStats {
                listing,
                ..Default::default()
            };
            stats.set_section("dir", &dir);
            serde_json::to_value(&stats).unwrap()
        };
        let before = snapshot(2, 1, 1000, 1, 5000);
        let after = snapshot(1004, 3, 91_000, 4, 405_000);
        let l = Listing::from_stats(&stats::diff(&before, &after)).expect("listing");
        assert_eq!(
            l,
            Listing {
                entries: 1002,
                getdents: 2,
                getdents_ns: 90_000,
                requests: 3,
                request_ns: 400_000,
                whole_ns: None,
            }
        );
        let ops = serde_json::json!({"ops": {"READDIRPLUS": {"count": 3,
            "total": {"count": 3, "mean_ns": 1500}}, "READDIR": {"count": 1,
            "total": {"count": 1, "mean_ns": 500}}}});
        assert_eq!(whole_ns(&ops), 5000.0);
        assert!(Listing::from_stats(&serde_json::json!({"queue": {}})).is_none());
    }
}
