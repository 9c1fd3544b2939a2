//! The lab's rows: what is exported, where its bytes live, and who serves it.
//!
//! Why these eight: `local` is the load's own ceiling (the same load, same buffers, same
//! depth, on /dev/zero for reads and /dev/null for writes: no FUSE and no storage, so
//! whatever it reaches is what the load can drive, and a FUSE row near it would be
//! limited by the load, not the daemon), `null` is the daemon's own cost (no backend), `file` a raw image on
//! tmpfs (a backend that is nearly free), and the three storage rows are what users run:
//! one image, pre-filled, on a real file system ([`super::storage`]), exported buffered
//! (`disk`, `corofuse mount -w IMG`) and with O_DIRECT (`disk-direct`, `mount -w
//! --direct IMG`), plus `device`, the same workload with O_DIRECT straight on the same
//! image file with no FUSE at all: the ceiling every storage figure is divided by.
//! `disk-pt` and `disk-direct-pt` are the two with FUSE passthrough (`--passthrough`:
//! read-only opens go to the image file; qsd has no such thing, so no qsd run).
//!
//! Two opt-in rows (not in the default run: they need qemu-img, and `--only` names
//! them) export qcow2 images on the same file system ([`super::qcow2`]): `qcow2`, a fully
//! allocated image converted from the storage image, beside `disk` (its raw export: the
//! "vs raw" ratio), and `qcow2-alloc`, a freshly created empty image for every run, so
//! that every write allocates (write workloads only).
//!
//! One more opt-in row, `nbd`, exports the storage image through NBD ([`super::nbd`]):
//! qemu-nbd serves it on a unix socket, started for every run, and corofuse mounts
//! `nbd+unix:///?socket=SOCK` (qsd: `driver=nbd` on the same socket). Its ceiling is not
//! the device row but the server's own: fio's nbd engine straight at the same qemu-nbd,
//! no FUSE ([`Server::NbdLimit`], the "vs limit" ratio).

use serde::{Serialize, Serializer};

use super::variant::Variant;

/// What the daemon exports (or, for `device`, what the load opens itself).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum ExportKind {
    /// No FUSE, no storage: the load on /dev/zero (reads) or /dev/null (writes), opened
    /// without O_DIRECT (character devices refuse it and have no page cache): the
    /// load's own ceiling, for the null and file rows.
    Local,
    /// null:1G: reads return zeroes, writes are dropped (the daemon's own cost).
    Null,
    /// A 1 GiB raw image on tmpfs, filled with non-zero data.
    File,
    /// No FUSE: the load opens the image on real storage itself, with O_DIRECT (the
    /// ceiling of the two rows below).
    Device,
    /// The image on real storage, exported buffered (page cache).
    Disk,
    /// The image on real storage, exported with O_DIRECT (`--direct`, qsd
    /// `cache.direct=on`).
    DiskDirect,
    /// `disk` with FUSE passthrough (`--passthrough`): read-only opens go to the image
    /// file itself. corofuse only (no qsd run).
    DiskPt,
    /// `disk-direct` with FUSE passthrough (`--direct --passthrough`).
    DiskDirectPt,
    /// A fully allocated qcow2 image (64 KiB clusters) converted from the storage image
    /// and kept beside it, exported buffered; `disk` is its raw comparison.
    Qcow2,
    /// An empty qcow2 image of the same virtual size, created before every run, so that
    /// writes allocate clusters (write workloads only).
    Qcow2Alloc,
    /// The storage image served by qemu-nbd on a unix socket (buffered, io_uring), mounted
    /// as an NBD export (`nbd+unix:///?socket=SOCK`); fio's nbd engine is its limit.
    Nbd,
}

impl ExportKind {
    /// Table order.
    pub const ALL: [ExportKind; 11] = [
        ExportKind::Local,
        ExportKind::Null,
        ExportKind::File,
        ExportKind::Device,
        ExportKind::Disk,
        ExportKind::DiskDirect,
        ExportKind::DiskPt,
        ExportKind::DiskDirectPt,
        ExportKind::Qcow2,
        ExportKind::Qcow2Alloc,
        ExportKind::Nbd,
    ];

    /// The rows run when `--only` names none: all but the opt-in ones (the last three:
    /// the qcow2 rows and nbd).
    pub const DEFAULT: &'static [ExportKind] = Self::ALL.as_slice().split_at(8).0;

    pub fn name(self) -> &'static str {
        match self {
            ExportKind::Local => "local",
            ExportKind::Null => "null",
            ExportKind::File => "file",
            ExportKind::Device => "device",
            ExportKind::Disk => "disk",
            ExportKind::DiskDirect => "disk-direct",
            ExportKind::DiskPt => "disk-pt",
            ExportKind::DiskDirectPt => "disk-direct-pt",
            ExportKind::Qcow2 => "qcow2",
            ExportKind::Qcow2Alloc => "qcow2-alloc",
            ExportKind::Nbd => "nbd",
        }
    }

    /// Whether it exports a qcow2 image.
    pub fn qcow2(self) -> bool {
        matches!(self, ExportKind::Qcow2 | ExportKind::Qcow2Alloc)
    }

    /// Whether it exports a raw image file (on tmpfs or real storage).
    pub fn raw_file(self) -> bool {
        matches!(
            self,
            ExportKind::File
                | ExportKind::Disk
                | ExportKind::DiskDirect
                | ExportKind::DiskPt
                | ExportKind::DiskDirectPt
        )
    }

    /// Whether it runs read workloads: not on `qcow2-alloc`, whose image is empty.
    pub fn reads(self) -> bool {
        self != ExportKind::Qcow2Alloc
    }

    /// Whether its bytes are on real storage (`--storage-dir`): the storage image (also
    /// behind qemu-nbd), or a qcow2 image beside it.
    pub fn on_storage(self) -> bool {
        matches!(
            self,
            ExportKind::Device
                | ExportKind::Disk
                | ExportKind::DiskDirect
                | ExportKind::DiskPt
                | ExportKind::DiskDirectPt
                | ExportKind::Qcow2
                | ExportKind::Qcow2Alloc
                | ExportKind::Nbd
        )
    }

    /// Whether the device row is its ceiling: every export of the storage file itself,
    /// not `nbd`, whose ceiling is its server's ([`Server::NbdLimit`]).
    pub fn under_device(self) -> bool {
        self.on_storage() && self.mounted() && self != ExportKind::Nbd
    }

    /// Whether corofuse exports it with FUSE passthrough (qsd has none: no qsd run).
    pub fn passthrough(self) -> bool {
        matches!(self, ExportKind::DiskPt | ExportKind::DiskDirectPt)
    }

    /// Whether corofuse opens the image with O_DIRECT (`--direct`).
    pub fn direct(self) -> bool {
        matches!(self, ExportKind::DiskDirect | ExportKind::DiskDirectPt)
    }

    /// Whether a FUSE export sits between the load and the bytes.
    pub fn mounted(self) -> bool {
        !matches!(self, ExportKind::Device | ExportKind::Local)
    }

    /// Bytes the load spreads its I/O over, with `storage` bytes on real storage.
    pub fn size(self, storage: u64) -> u64 {
        if self.on_storage() {
            storage
        } else {
            EXPORT_SIZE
        }
    }

    /// Who runs this row: the device and local rows have no server; the others run each
    /// corofuse variant, and qemu-storage-daemon too with `--compare-qsd`; `nbd` ends with
    /// its limit, fio's nbd engine (left out by the plan where fio has none).
    pub fn servers(self, variants: &[Variant], compare_qsd: bool) -> Vec<Server> {
        if !self.mounted() {
            return vec![Server::Bare];
        }
        let mut servers: Vec<Server> = variants.iter().map(|&v| Server::Corofuse(v)).collect();
        if compare_qsd && !self.passthrough() {
            servers.push(Server::Qsd);
        }
        if self == ExportKind::Nbd {
            servers.push(Server::NbdLimit);
        }
        servers
    }
}

/// Who serves the export.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Server {
    /// corofuse in one configuration.
    Corofuse(Variant),
    Qsd,
    /// Nobody: the load opens its target itself (the device and local rows).
    Bare,
    /// No FUSE on the nbd row: fio's nbd engine (libnbd) speaks NBD to qemu-nbd itself,
    /// the limit of the row's clients.
    NbdLimit,
}

impl Server {
    /// The default corofuse configuration.
    #[cfg(test)]
    pub const COROFUSE: Server = Server::Corofuse(Variant {
        queues: None,
        transport: None,
    });

    /// As the table and the JSON report spell it: `corofuse`, `corofuse q2 uring`, `qsd`.
    pub fn name(self) -> String {
        match self {
            Server::Corofuse(v) => v.label(),
            Server::Qsd => "qsd".into(),
            Server::Bare => "no FUSE".into(),
            Server::NbdLimit => "fio nbd".into(),
        }
    }

    pub fn is_corofuse(self) -> bool {
        matches!(self, Server::Corofuse(_))
    }
}

/// A server is recorded by its name (the JSON keeps one string per cell).
impl Serialize for Server {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.name())
    }
}

/// The local row's target: what the load opens instead of a mount.
pub fn local_target(writes: bool) -> &'static str {
    if writes {
        "/dev/null"
    } else {
        "/dev/zero"
    }
}

/// Size of the null export and of the tmpfs image (and the local row's offsets): 1 GiB.
pub const EXPORT_SIZE: u64 = 1 << 30;

/// Size of the image on real storage: 2 GiB. Larger than the caches that could still
/// answer O_DIRECT I/O (a drive's DRAM, most RAID controllers' write cache), small
/// enough to fill in about a second at 2 GB/s (10-15 s on a hard disk), once: the image
/// is kept for the next runs.
pub const STORAGE_SIZE: u64 = 2 << 30;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_and_their_servers() {
        let storage: Vec<_> = ExportKind::ALL
            .iter()
            .filter(|e| e.on_storage())
            .map(|e| e.name())
            .collect();
        let one = [Variant::default()];
        assert_eq!(
            storage,
            [
                "device",
                "disk",
                "disk-direct",
                "disk-pt",
                "disk-direct-pt",
                "qcow2",
                "qcow2-alloc",
                "nbd"
            ]
        );
        assert_eq!(ExportKind::DiskPt.servers(&one, true), [Server::COROFUSE]);
        assert!(ExportKind::DEFAULT.iter().all(|e| !e.qcow2()));
        let opt_in = &ExportKind::ALL[ExportKind::DEFAULT.len()..];
        assert!(opt_in[..2].iter().all(|e| e.qcow2()));
        assert_eq!(opt_in[2..], [ExportKind::Nbd]);
        assert_eq!(
            ExportKind::Nbd.servers(&one, true),
            [Server::COROFUSE, Server::Qsd, Server::NbdLimit],
            "the limit after the clients"
        );
        assert_eq!(
            ExportKind::Nbd.servers(&one, false),
            [Server::COROFUSE, Server::NbdLimit]
        );
        assert!(ExportKind::Nbd.on_storage() && !ExportKind::Nbd.under_device());
        assert!(ExportKind::Disk.under_device() && !ExportKind::Device.under_device());
        assert_eq!(Server::NbdLimit.name(), "fio nbd");
        assert!(ExportKind::Qcow2.reads() && !ExportKind::Qcow2Alloc.reads());
        assert_eq!(
            ExportKind::Qcow2Alloc.servers(&one, true),
            [Server::COROFUSE, Server::Qsd]
        );
        assert_eq!(ExportKind::Device.servers(&one, true), [Server::Bare]);
        assert_eq!(ExportKind::Local.servers(&one, true), [Server::Bare]);
        assert!(!ExportKind::Local.on_storage() && !ExportKind::Local.mounted());
        assert_eq!(
            ExportKind::DiskDirect.servers(&one, true),
            [Server::COROFUSE, Server::Qsd]
        );
        assert_eq!(ExportKind::Null.servers(&one, false), [Server::COROFUSE]);
        let two = Variant::all(&[1, 2], &[]);
        let names: Vec<String> = ExportKind::Null
            .servers(&two, true)
            .iter()
            .map(|s| s.name())
            .collect();
        assert_eq!(names, ["corofuse q1", "corofuse q2", "qsd"]);
        assert_eq!(
            serde_json::to_string(&Server::Corofuse(two[1])).expect("serialises"),
            "\"corofuse q2\""
        );
        assert_eq!(ExportKind::Disk.size(STORAGE_SIZE), STORAGE_SIZE);
        assert_eq!(ExportKind::Qcow2Alloc.size(8 << 20), 8 << 20);
        assert_eq!(ExportKind::File.size(8 << 20), EXPORT_SIZE);
        let json = serde_json::to_string(&ExportKind::DiskDirect).expect("serialises");
        assert_eq!(json, "\"disk-direct\"", "JSON and --only spell it alike");
        let json = serde_json::to_string(&ExportKind::Qcow2Alloc).expect("serialises");
        assert_eq!(json, "\"qcow2-alloc\"");
    }
}
