//! The lab's matrix: which exports and which I/O patterns, named once.
//!
//! Why these five: iodepth 1 with psync measures one request's round trip (wakeups
//! dominate it, see CONTEXT.md), iodepth 64 with io_uring measures throughput when the
//! daemon has many requests to overlap, and 1 MiB sequential writes measure the large-
//! request path (spill-over buffers, `max_write`). Reads and writes differ in where the
//! payload is copied.

use serde::Serialize;

/// The access pattern of the load.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Rw {
    /// Random reads at `bs`-aligned offsets.
    Randread,
    /// Random writes at `bs`-aligned offsets.
    Randwrite,
    /// Sequential writes, wrapping at the end of the file.
    Write,
}

impl Rw {
    pub fn name(self) -> &'static str {
        match self {
            Rw::Randread => "randread",
            Rw::Randwrite => "randwrite",
            Rw::Write => "write",
        }
    }

    pub fn writes(self) -> bool {
        self != Rw::Randread
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

const fn wl(name: &'static str, rw: Rw, bs: u64, engine: Engine, iodepth: u32) -> Workload {
    Workload {
        name,
        rw,
        bs,
        engine,
        iodepth,
    }
}

/// Every workload, in table order.
pub const WORKLOADS: [Workload; 5] = [
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
];

/// The names accepted by `--workload`.
pub const NAMES: [&str; 5] = [
    WORKLOADS[0].name,
    WORKLOADS[1].name,
    WORKLOADS[2].name,
    WORKLOADS[3].name,
    WORKLOADS[4].name,
];

/// What the daemon exports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ExportKind {
    /// null:1G: reads return zeroes, writes are dropped (the daemon's own cost).
    Null,
    /// A 1 GiB raw image on tmpfs, filled with non-zero data.
    File,
}

impl ExportKind {
    pub fn name(self) -> &'static str {
        match self {
            ExportKind::Null => "null",
            ExportKind::File => "file",
        }
    }
}

/// Who serves the export.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Server {
    Corofuse,
    Qsd,
}

impl Server {
    pub fn name(self) -> &'static str {
        match self {
            Server::Corofuse => "corofuse",
            Server::Qsd => "qsd",
        }
    }
}

/// Size of both exports: 1 GiB.
pub const EXPORT_SIZE: u64 = 1 << 30;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_and_labels_read_well() {
        for (w, n) in WORKLOADS.iter().zip(NAMES) {
            assert_eq!(w.name, n);
        }
        assert_eq!(WORKLOADS[0].label(), "randread 4k psync qd1");
        assert_eq!(WORKLOADS[4].label(), "write 1m io_uring qd4");
    }
}
