//! `--compare-qsd`: qemu-storage-daemon's FUSE export, the reference corofuse is measured
//! against, started on the same mount point and image with the options CONTEXT.md gives.
//!
//! Why this configuration: `null-co` with `read-zeroes=on` matches `null:1G` (reads
//! return zeroes, writes are dropped), and `driver=file,aio=io_uring` is QEMU's fastest
//! path to a raw image. qsd writes no statistics, so its per-request columns are "-".

use std::path::Path;
use std::process::Command;

use super::daemon::Paths;
use super::workload::{ExportKind, EXPORT_SIZE};

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

/// The `--blockdev` argument for an export.
pub fn blockdev(export: ExportKind, image: &Path) -> String {
    match export {
        ExportKind::Null => {
            format!("node-name=f,driver=null-co,size={EXPORT_SIZE},read-zeroes=on")
        }
        ExportKind::File => format!(
            "node-name=f,driver=file,filename={},aio=io_uring",
            escape(image)
        ),
    }
}

/// The whole command line.
pub fn command(export: ExportKind, image: &Path, paths: &Paths) -> Command {
    let mut cmd = Command::new(PROGRAM);
    cmd.arg("--blockdev")
        .arg(blockdev(export, image))
        .arg("--export")
        .arg(format!(
            "type=fuse,id=e,node-name=f,mountpoint={},writable=on",
            escape(paths.mountpoint)
        ))
        .arg("--pidfile")
        .arg(paths.pidfile);
    cmd
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
        assert_eq!(
            blockdev(ExportKind::Null, Path::new("unused")),
            "node-name=f,driver=null-co,size=1073741824,read-zeroes=on"
        );
        assert_eq!(
            blockdev(ExportKind::File, Path::new("/dev/shm/a,b/image.raw")),
            "node-name=f,driver=file,filename=/dev/shm/a,,b/image.raw,aio=io_uring"
        );
    }
}
