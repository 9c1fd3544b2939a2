//! The `--stats` document: what `corofuse mount` and `corofuse mount-dir` write (at exit
//! and on SIGUSR1) and what `corofuse stats` and the lab read back.
//!
//! Why a crate of its own: one definition for the writer and every reader, so a field the
//! daemon adds is a field the readers see, by type, instead of each reader guessing at
//! JSON shapes. The sections are the counters each layer keeps, defined where they are
//! kept (the runtime's, the queues', the per-opcode accounting, the backend's, fault
//! injection's, the directory export's); this crate only puts them together.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

pub use backend::{BackendStats, InjectStats};
pub use dir_export::DirStats;
pub use fuse::backing::PassthroughStats;
pub use runtime::CounterSnapshot;
pub use transport::{OpReport, QueueStats};

/// One `--stats` snapshot.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// The image (or, for a directory export, the source directory).
    pub image: String,
    /// How requests were served, as `corofuse mount` options would say it (e.g.
    /// "coroutine --queues 2 --transport uring", "threads:4").
    pub dispatch: String,
    /// The event loops' counters, summed.
    pub runtime: CounterSnapshot,
    /// The queues' counters, summed.
    pub queue: QueueStats,
    /// Bounces, read-modify-writes and waits for blocks in the backend (image exports).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<BackendStats>,
    /// What `--inject` rules did (only with `--inject`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inject: Option<InjectStats>,
    /// Nodes, open files, the node descriptor budget and listings (directory exports).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir: Option<DirStats>,
    /// FUSE passthrough: whether it is on, backing files registered, opens passed
    /// through (exports that asked for it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub passthrough: Option<PassthroughStats>,
    /// Heap allocations made by the whole process so far.
    pub allocations: u64,
    /// Per-opcode accounting, by opcode name ("READ", "WRITE", ...).
    pub ops: BTreeMap<String, OpReport>,
    /// Each event loop's own queue counters, in loop order (empty with `threads:N`).
    pub per_queue: Vec<QueueStats>,
}

impl Stats {
    /// Parses a snapshot.
    pub fn parse(text: &str) -> Result<Stats, serde_json::Error> {
        serde_json::from_str(text)
    }

    /// Reads the snapshot at `path`, with an error that names the file.
    pub fn read(path: &Path) -> Result<Stats, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        Stats::parse(&text).map_err(|e| {
            format!(
                "{} is not a corofuse --stats file ({e}); if the daemon is still writing it, \
                 try again",
                path.display()
            )
        })
    }

    /// The snapshot as the daemon writes it: pretty JSON and a newline.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("stats serialise") + "\n"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_survives_the_round_trip_and_old_files_without_sections_parse() {
        let mut stats = Stats {
            image: "null:1G".into(),
            dispatch: "coroutine --queues 2".into(),
            allocations: 12,
            ..Stats::default()
        };
        stats.runtime.spawned = 5;
        stats.queue.requests = 7;
        stats.backend = Some(BackendStats::default());
        stats.per_queue = vec![QueueStats::default(); 2];
        let back = Stats::parse(&stats.to_json()).unwrap();
        assert_eq!(back, stats);
        // A file from before the dir and inject sections existed.
        let mut json: serde_json::Value = serde_json::from_str(&stats.to_json()).unwrap();
        json.as_object_mut().unwrap().remove("backend");
        assert_eq!(Stats::parse(&json.to_string()).unwrap().backend, None);
        let err = Stats::parse("{\"image\": 3}").unwrap_err().to_string();
        assert!(err.contains("invalid type"), "{err}");
    }
}
