//! The `--stats` document: what `corofuse mount` and `corofuse mount-dir` write (at exit
//! and on SIGUSR1) and what the lab (`corofuse-lab stats`, `corofuse-lab bench`) reads back.
//!
//! Why a crate of its own: one definition for the writer and every reader, so a field the
//! daemon adds is a field the readers see, by type, instead of each reader guessing at
//! JSON shapes. The serving layers' sections are typed here (the runtime's counters, the
//! queues', the per-opcode accounting), defined where they are kept; the file system's own
//! sections (an image export's backend, fault injection and passthrough counters, a
//! directory export's nodes and listings) are named JSON sections that the file system
//! writes and its readers parse with their own types ([`Stats::section`]), so this crate
//! names no file system.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use serde::de::DeserializeOwned;

pub use runtime::CounterSnapshot;
pub use transport::placement::ControllerStats as PlacementStats;
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
    /// The file system's own sections, by name, at the top level of the document (e.g.
    /// `backend`, `inject`, `passthrough` for an image export, `dir` for a directory).
    #[serde(flatten)]
    pub sections: BTreeMap<String, serde_json::Value>,
    /// Heap allocations made by the whole process so far.
    pub allocations: u64,
    /// Per-opcode accounting, by opcode name ("READ", "WRITE", ...).
    pub ops: BTreeMap<String, OpReport>,
    /// Each event loop's own queue counters, in loop order (empty with `threads:N`).
    pub per_queue: Vec<QueueStats>,
    /// What the adaptive loop placement did: trials, moves kept, idle measurements and
    /// the time spent with each number of loops paused (null where it does not run).
    #[serde(default)]
    pub placement: Option<PlacementStats>,
}

impl Stats {
    /// Parses a snapshot.
    pub fn parse(text: &str) -> Result<Stats, serde_json::Error> {
        serde_json::from_str(text)
    }

    /// Reads the snapshot at `path`, with an error that names the file.
    pub fn read(path: &Path) -> Result<Stats, ReadError> {
        let text = std::fs::read_to_string(path).map_err(|e| ReadError::Read {
            path: path.to_path_buf(),
            error: e,
        })?;
        Stats::parse(&text).map_err(|e| ReadError::Parse {
            path: path.to_path_buf(),
            error: e,
        })
    }

    /// The file system's section `name`, parsed as `T`; `None` if absent or of another
    /// shape.
    pub fn section<T: DeserializeOwned>(&self, name: &str) -> Option<T> {
        serde_json::from_value(self.sections.get(name)?.clone()).ok()
    }

    /// Sets the file system's section `name` to `value`.
    pub fn set_section(&mut self, name: &str, value: &impl Serialize) {
        let value = serde_json::to_value(value).expect("a section serialises");
        self.sections.insert(name.to_string(), value);
    }

    /// The snapshot as the daemon writes it: pretty JSON and a newline.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("stats serialise") + "\n"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Section {
        bounces: u64,
    }

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
        stats.set_section("backend", &Section { bounces: 3 });
        stats.per_queue = vec![QueueStats::default(); 2];
        let back = Stats::parse(&stats.to_json()).unwrap();
        assert_eq!(back, stats);
        assert_eq!(
            back.section::<Section>("backend"),
            Some(Section { bounces: 3 })
        );
        assert!(
            stats.to_json().contains("\n  \"backend\": {"),
            "a top-level section"
        );
        // A file without the section.
        let mut json: serde_json::Value = serde_json::from_str(&stats.to_json()).unwrap();
        json.as_object_mut().unwrap().remove("backend");
        let back = Stats::parse(&json.to_string()).unwrap();
        assert_eq!(back.section::<Section>("backend"), None);
        let err = Stats::parse("{\"image\": 3}").unwrap_err().to_string();
        assert!(err.contains("invalid type"), "{err}");
    }

    #[test]
    fn the_runtime_counters_are_written_by_name_and_read_without_the_newer_ones() {
        let mut stats = Stats::default();
        stats.runtime.switches = 12;
        stats.runtime.enter_calls = 2;
        stats.runtime.chained = 1;
        let mut json: serde_json::Value = serde_json::from_str(&stats.to_json()).unwrap();
        assert_eq!(json["runtime"]["switches"], 12);
        assert_eq!(json["runtime"]["enter_calls"], 2);
        // A file written before `chained` was counted.
        json["runtime"].as_object_mut().unwrap().remove("chained");
        let back = Stats::parse(&json.to_string()).unwrap();
        assert_eq!(back.runtime.chained, 0);
        assert_eq!(back.runtime.switches, 12);
    }
}

/// Why a `--stats` file could not be read: its text names the file.
#[derive(Debug)]
pub enum ReadError {
    /// The file could not be read.
    Read {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// It is not a `--stats` document (or one half written).
    Parse {
        /// The file.
        path: std::path::PathBuf,
        /// Where the JSON went wrong.
        error: serde_json::Error,
    },
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Read { path, error } => write!(f, "cannot read {}: {error}", path.display()),
            ReadError::Parse { path, error } => write!(
                f,
                "{} is not a corofuse --stats file ({error}); if the daemon is still writing \
                 it, try again",
                path.display()
            ),
        }
    }
}

impl std::error::Error for ReadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ReadError::Read { error, .. } => Some(error),
            ReadError::Parse { error, .. } => Some(error),
        }
    }
}
