//! `--compare-qsd`: qemu-storage-daemon's FUSE export, the reference corofuse is measured
//! against, started on the same mount point and image with the options CONTEXT.md gives.
//!
//! Why this configuration: `null-co` with `read-zeroes=on` matches `null:1G` (reads
//! return zeroes, writes are dropped), and `driver=file,aio=io_uring` is QEMU's fastest
//! path to a raw image. The cache mode matches corofuse's export of the same row: the
//! default (page cache) for `file` and `disk`, `cache.direct=on` (O_DIRECT) for
//! `disk-direct`, as `corofuse mount --direct`. qsd writes no statistics, so its
//! per-request columns are "-"; the `device` row has no qsd run.

use std::path::Path;
use std::process::Command;

use super::daemon::Paths;
use super::export::{ExportKind, EXPORT_SIZE};

/// The binary.
pub const PROGRAM: &str = "qemu-storage-daemon";

/// An error saying how to install it, unless it runs.
pub fn version() -> Result<String, String> {
    let out = Command::new(PROGRAM)
        .arg("--version")
        .output()
        .map_err(|e| {
            format!("{PROGRAM} cannot run ({e}); install it: apt-get install qemu-utils")
        })?;
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text.lines().next().unwrap_or("unknown").trim().to_string())
}

/// The `--blockdev` argument for an export (none for the device row).
pub fn blockdev(export: ExportKind, image: &Path) -> Option<String> {
    let file = format!(
        "node-name=f,driver=file,filename={},aio=io_uring",
        escape(image)
    );
    match export {
        ExportKind::Null => Some(format!(
            "node-name=f,driver=null-co,size={EXPORT_SIZE},read-zeroes=on"
        )),
        ExportKind::File | ExportKind::Disk => Some(file),
        ExportKind::DiskDirect => Some(file + ",cache.direct=on"),
        ExportKind::Device | ExportKind::Local => None,
    }
}

/// The whole command line.
pub fn command(export: ExportKind, image: &Path, paths: &Paths) -> Result<Command, String> {
    let blockdev = blockdev(export, image)
        .ok_or_else(|| format!("the {} row has no qsd run", export.name()))?;
    let mut cmd = Command::new(PROGRAM);
    cmd.arg("--blockdev")
        .arg(blockdev)
        .arg("--export")
        .arg(format!(
            "type=fuse,id=e,node-name=f,mountpoint={},writable=on",
            escape(paths.mountpoint)
        ))
        .arg("--pidfile")
        .arg(paths.pidfile);
    Ok(cmd)
}

/// QEMU's option syntax doubles commas inside values.
fn escape(path: &Path) -> String {
    path.display().to_string().replace(',', ",,")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blockdevs() {
        let b = |e, p| blockdev(e, Path::new(p));
        assert_eq!(
            b(ExportKind::Null, "unused").as_deref(),
            Some("node-name=f,driver=null-co,size=1073741824,read-zeroes=on")
        );
        assert_eq!(
            b(ExportKind::File, "/dev/shm/a,b/image.raw").as_deref(),
            Some("node-name=f,driver=file,filename=/dev/shm/a,,b/image.raw,aio=io_uring")
        );
        assert_eq!(
            b(ExportKind::Disk, "/var/tmp/i.raw").as_deref(),
            Some("node-name=f,driver=file,filename=/var/tmp/i.raw,aio=io_uring"),
            "buffered, as `corofuse mount` without --direct"
        );
        assert_eq!(
            b(ExportKind::DiskDirect, "/var/tmp/i.raw").as_deref(),
            Some("node-name=f,driver=file,filename=/var/tmp/i.raw,aio=io_uring,cache.direct=on")
        );
        assert_eq!(b(ExportKind::Device, "/var/tmp/i.raw"), None);
    }
}
