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
//! Comparisons with other servers (qemu-storage-daemon, libfuse's passthrough_hp, NBD and
//! qcow2 peers) and with corofuse's explicit configurations are fio's, in
//! `benches/export/fio-servers.py`: the lab measures the default alone, against the
//! ceilings above.

use serde::Serialize;

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
}

impl ExportKind {
    /// Table order.
    pub const ALL: [ExportKind; 8] = [
        ExportKind::Local,
        ExportKind::Null,
        ExportKind::File,
        ExportKind::Device,
        ExportKind::Disk,
        ExportKind::DiskDirect,
        ExportKind::DiskPt,
        ExportKind::DiskDirectPt,
    ];

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
        }
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

    /// Whether its bytes are on real storage (`--storage-dir`): the storage image.
    pub fn on_storage(self) -> bool {
        matches!(
            self,
            ExportKind::Device
                | ExportKind::Disk
                | ExportKind::DiskDirect
                | ExportKind::DiskPt
                | ExportKind::DiskDirectPt
        )
    }

    /// Whether the device row is its ceiling: every export of the storage file.
    pub fn under_device(self) -> bool {
        self.on_storage() && self.mounted()
    }

    /// Whether corofuse exports it with FUSE passthrough.
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
    fn rows() {
        let storage: Vec<_> = ExportKind::ALL
            .iter()
            .filter(|e| e.on_storage())
            .map(|e| e.name())
            .collect();
        assert_eq!(
            storage,
            ["device", "disk", "disk-direct", "disk-pt", "disk-direct-pt"]
        );
        assert!(ExportKind::Disk.under_device() && !ExportKind::Device.under_device());
        assert!(!ExportKind::Local.on_storage() && !ExportKind::Local.mounted());
        assert!(ExportKind::DiskDirectPt.direct() && ExportKind::DiskDirectPt.passthrough());
        assert_eq!(ExportKind::Disk.size(STORAGE_SIZE), STORAGE_SIZE);
        assert_eq!(ExportKind::File.size(8 << 20), EXPORT_SIZE);
        let json = serde_json::to_string(&ExportKind::DiskDirect).expect("serialises");
        assert_eq!(json, "\"disk-direct\"", "JSON and --only spell it alike");
    }
}
