//! The lab's matrix: which exports and which I/O patterns, named once.
//!
//! Why these five by default: iodepth 1 with psync measures one request's round trip
//! (wakeups dominate it, see CONTEXT.md), iodepth 64 with io_uring measures throughput
//! when the daemon has many requests to overlap, and 1 MiB sequential writes measure the
//! large-request path (spill-over buffers, `max_write`). Reads and writes differ in where
//! the payload is copied.
//!
//! Five more are opt-in (`--workload NAME`), so the default run stays short: sequential
//! 4 KiB reads and writes at psync iodepth 1 and io_uring iodepth 64, which complete the
//! matrix QEMU's coroutine series measured (null/file x read/write x sequential/random x
//! the two engines), and 1 MiB random writes at iodepth 16, the vectored write path
//! (virtiofsd's pwritev lesson, CONTEXT.md).
//!
//! The rows on real storage run four of the five by default ([`STORAGE_DEFAULT`]): each
//! of their workloads costs three runs (device, buffered, direct), and iodepth 1 is
//! covered by the reads, whose round trip through a disk is what differs from tmpfs.

use serde::Serialize;

/// The access pattern of the load.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Rw {
    /// Random reads at `bs`-aligned offsets.
    Randread,
    /// Sequential reads, wrapping at the end of the file.
    Read,
    /// Random writes at `bs`-aligned offsets.
    Randwrite,
    /// Sequential writes, wrapping at the end of the file.
    Write,
}

impl Rw {
    pub fn name(self) -> &'static str {
        match self {
            Rw::Randread => "randread",
            Rw::Read => "read",
            Rw::Randwrite => "randwrite",
            Rw::Write => "write",
        }
    }

    pub fn writes(self) -> bool {
        matches!(self, Rw::Randwrite | Rw::Write)
    }

    /// Random offsets (else sequential, wrapping at the end).
    pub fn random(self) -> bool {
        matches!(self, Rw::Randread | Rw::Randwrite)
    }
}

/// How the load submits I/O.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Engine {
    /// One blocking pread/pwrite at a time.
    Psync,
    /// io_uring, keeping `iodepth` requests in flight.
    #[value(name = "io_uring")]
    IoUring,
}

impl Engine {
    /// The name fio uses for it, and ours.
    pub fn name(self) -> &'static str {
        match self {
            Engine::Psync => "psync",
            Engine::IoUring => "io_uring",
        }
    }
}

/// One column of the matrix.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Workload {
    pub name: &'static str,
    pub rw: Rw,
    pub bs: u64,
    pub engine: Engine,
    pub iodepth: u32,
}

impl Workload {
    /// Short label for progress lines and tables: "randread 4k psync qd1".
    pub fn label(&self) -> String {
        let bs = if self.bs >= 1 << 20 {
            format!("{}m", self.bs >> 20)
        } else {
            format!("{}k", self.bs >> 10)
        };
        format!(
            "{} {bs} {} qd{}",
            self.rw.name(),
            self.engine.name(),
            self.iodepth
        )
    }
}

/// A workload, spelt as a table row.
pub const fn wl(name: &'static str, rw: Rw, bs: u64, engine: Engine, iodepth: u32) -> Workload {
    Workload {
        name,
        rw,
        bs,
        engine,
        iodepth,
    }
}

/// How many workloads run when no `--workload` is given: the first five of [`ALL`].
pub const DEFAULT_COUNT: usize = 5;

/// Every workload, in table order: the default matrix, then the opt-in ones.
pub const ALL: [Workload; 11] = [
    wl("randread-psync-qd1", Rw::Randread, 4096, Engine::Psync, 1),
    wl("randwrite-psync-qd1", Rw::Randwrite, 4096, Engine::Psync, 1),
    wl(
        "randread-uring-qd64",
        Rw::Randread,
        4096,
        Engine::IoUring,
        64,
    ),
    wl(
        "randwrite-uring-qd64",
        Rw::Randwrite,
        4096,
        Engine::IoUring,
        64,
    ),
    wl("write1m-uring-qd4", Rw::Write, 1 << 20, Engine::IoUring, 4),
    // Opt-in from here on (`--workload NAME`).
    wl("seqread-psync-qd1", Rw::Read, 4096, Engine::Psync, 1),
    wl("seqwrite-psync-qd1", Rw::Write, 4096, Engine::Psync, 1),
    wl("seqread-uring-qd64", Rw::Read, 4096, Engine::IoUring, 64),
    wl("seqwrite-uring-qd64", Rw::Write, 4096, Engine::IoUring, 64),
    wl(
        "randwrite1m-uring-qd16",
        Rw::Randwrite,
        1 << 20,
        Engine::IoUring,
        16,
    ),
    wl("read1m-uring-qd4", Rw::Read, 1 << 20, Engine::IoUring, 4),
];

/// The names accepted by `--workload`: every workload.
pub const NAMES: [&str; ALL.len()] = {
    let mut names = [""; ALL.len()];
    let mut i = 0;
    while i < ALL.len() {
        names[i] = ALL[i].name;
        i += 1;
    }
    names
};

/// What the rows on real storage run when no `--workload` is given: the default five
/// but randwrite-psync-qd1.
pub const STORAGE_DEFAULT: [&str; 4] = [
    "randread-psync-qd1",
    "randread-uring-qd64",
    "randwrite-uring-qd64",
    "write1m-uring-qd4",
];

/// The default matrix: the first [`DEFAULT_COUNT`] of [`ALL`].
pub fn matrix_default() -> &'static [&'static str] {
    &NAMES[..DEFAULT_COUNT]
}

/// The workloads a row runs: those named with `--workload`, in table order, or when
/// none is named the row's `defaults` (the default matrix or [`STORAGE_DEFAULT`]).
pub fn select<S: AsRef<str>>(names: &[S], defaults: &[&str]) -> Vec<Workload> {
    let chosen = |name: &str| {
        if names.is_empty() {
            defaults.contains(&name)
        } else {
            names.iter().any(|n| n.as_ref() == name)
        }
    };
    ALL.iter().filter(|w| chosen(w.name)).copied().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_and_labels_read_well() {
        assert_eq!(NAMES.len(), ALL.len());
        for (w, n) in ALL.iter().zip(NAMES) {
            assert_eq!(w.name, n);
        }
        let mut unique = NAMES.to_vec();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), NAMES.len(), "names are unique");
        assert_eq!(ALL[0].label(), "randread 4k psync qd1");
        assert_eq!(ALL[4].label(), "write 1m io_uring qd4");
        assert_eq!(ALL[5].label(), "read 4k psync qd1");
        assert_eq!(ALL[8].label(), "write 4k io_uring qd64");
        assert_eq!(ALL[9].label(), "randwrite 1m io_uring qd16");
        assert_eq!(ALL[10].label(), "read 1m io_uring qd4");
    }

    fn select(names: &[&str]) -> Vec<&'static str> {
        super::select(names, matrix_default())
            .into_iter()
            .map(|w| w.name)
            .collect()
    }

    #[test]
    fn no_workload_named_runs_the_default_five() {
        assert_eq!(select(&[]), NAMES[..DEFAULT_COUNT]);
        assert_eq!(
            select(&["write1m-uring-qd4", "randread-psync-qd1"]),
            ["randread-psync-qd1", "write1m-uring-qd4"],
            "table order"
        );
        assert_eq!(select(&["seqread-psync-qd1"]), ["seqread-psync-qd1"]);
        assert_eq!(select(&NAMES), NAMES, "naming all of them runs all of them");
    }

    #[test]
    fn storage_rows_default_to_four_and_follow_named_workloads() {
        let storage = |names: &[&str]| -> Vec<&str> {
            super::select(names, &STORAGE_DEFAULT)
                .into_iter()
                .map(|w| w.name)
                .collect()
        };
        assert_eq!(storage(&[]), STORAGE_DEFAULT);
        for name in STORAGE_DEFAULT {
            assert!(
                NAMES[..DEFAULT_COUNT].contains(&name),
                "{name} is a default"
            );
        }
        assert_eq!(
            storage(&["randwrite-psync-qd1"]),
            ["randwrite-psync-qd1"],
            "a named workload runs on every row"
        );
    }

    #[test]
    fn access_patterns() {
        assert!(!Rw::Read.writes() && !Rw::Read.random());
        assert!(Rw::Write.writes() && !Rw::Write.random());
        assert!(!Rw::Randread.writes() && Rw::Randread.random());
        assert!(Rw::Randwrite.writes() && Rw::Randwrite.random());
    }
}
