//! The qcow2 rows' images, made with QEMU's own `qemu-img` beside the storage image
//! (`--storage-dir`), so that corofuse and qemu-storage-daemon read the same container
//! on the same file system as the `disk` row's raw image.
//!
//! - `qcow2`: [`prepare_allocated`] converts the filled storage image into
//!   `corofuse-bench.qcow2` (`qemu-img convert -f raw -O qcow2`, 64 KiB clusters). The
//!   data has no zero block, so every cluster is allocated: reads and writes go to
//!   allocated clusters, and the runs' overwrites keep it so. It is kept like the raw
//!   image, and made again when missing or older than the raw image's fill marker (the
//!   raw image's own mtime changes with every write run, its marker only when it is
//!   written again). The conversion goes to a temporary name renamed when complete, so
//!   an interrupted one leaves nothing that looks finished.
//! - `qcow2-alloc`: [`Empty::create`] runs `qemu-img create -f qcow2` before every run
//!   (every daemon start), so every run allocates from an empty image; the guard removes
//!   it after the run. A run that writes more than the virtual size (1 MiB sequential
//!   writes on a fast disk: 2 GiB in a few seconds) wraps and overwrites for the rest.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Instant, SystemTime};

use serde::Serialize;

use super::{interrupt, lab};

/// The binary.
pub const PROGRAM: &str = "qemu-img";
/// Cluster size of both images: QEMU's default, said out loud.
pub const CLUSTER_SIZE: u64 = 64 << 10;

const ALLOCATED: &str = "corofuse-bench.qcow2";
const EMPTY: &str = "corofuse-bench-alloc.qcow2";

/// The `qcow2` row's image, ready to be measured.
#[derive(Clone, Debug, Serialize)]
pub struct Allocated {
    pub path: PathBuf,
    /// Kept from an earlier run (else converted by this one).
    pub reused: bool,
    /// How long the conversion took, when this run converted it.
    pub convert_seconds: Option<f64>,
}

/// An error saying how to install it, unless it runs.
pub fn version() -> Result<String, String> {
    crate::child::version_line(PROGRAM, |e| {
        format!(
            "{PROGRAM} cannot run ({e}), and the qcow2 rows need it: apt-get install qemu-utils"
        )
    })
}

/// The `qcow2` row's image beside `raw` (filled at `filled_at`): kept, or converted now.
pub fn prepare_allocated(
    raw: &Path,
    size: u64,
    filled_at: SystemTime,
) -> Result<Allocated, String> {
    let dir = raw.parent().unwrap_or(Path::new("."));
    let path = dir.join(ALLOCATED);
    let modified = std::fs::metadata(&path).and_then(|m| m.modified()).ok();
    let Some(why) = stale(modified, filled_at) else {
        return Ok(Allocated {
            path,
            reused: true,
            convert_seconds: None,
        });
    };
    let _ = std::fs::remove_file(&path);
    lab::check_space(
        dir,
        size,
        "free some space, pass another --storage-dir, or leave out the qcow2 rows",
    )?;
    eprintln!(
        "converting {} to qcow2 ({why}; it is kept for the next runs) ...",
        raw.display()
    );
    let partial = dir.join(format!("{ALLOCATED}.partial"));
    let started = Instant::now();
    let result = run(&mut convert_command(raw, &partial), "qemu-img convert")
        .and_then(|()| interrupt::check())
        .and_then(|()| {
            std::fs::rename(&partial, &path).map_err(|e| format!("{}: {e}", path.display()))
        });
    if let Err(e) = result {
        let _ = std::fs::remove_file(&partial);
        return Err(e);
    }
    let seconds = started.elapsed().as_secs_f64();
    eprintln!("wrote {} in {seconds:.1} s", path.display());
    Ok(Allocated {
        path,
        reused: false,
        convert_seconds: Some(seconds),
    })
}

/// Why the kept qcow2 image must be made again, if it must.
fn stale(modified: Option<SystemTime>, filled_at: SystemTime) -> Option<&'static str> {
    match modified {
        None => Some("none kept yet"),
        Some(m) if m < filled_at => Some("the raw image was written again since"),
        Some(_) => None,
    }
}

/// `qemu-img convert` of the raw image into a qcow2 image with 64 KiB clusters.
pub fn convert_command(raw: &Path, qcow2: &Path) -> Command {
    let mut cmd = Command::new(PROGRAM);
    cmd.args(["convert", "-q", "-f", "raw", "-O", "qcow2", "-o"])
        .arg(format!("cluster_size={CLUSTER_SIZE}"))
        .arg(raw)
        .arg(qcow2);
    cmd
}

/// `qemu-img create` of an empty qcow2 image of `size` bytes with 64 KiB clusters.
pub fn create_command(qcow2: &Path, size: u64) -> Command {
    let mut cmd = Command::new(PROGRAM);
    cmd.args(["create", "-q", "-f", "qcow2", "-o"])
        .arg(format!("cluster_size={CLUSTER_SIZE}"))
        .arg(qcow2)
        .arg(size.to_string());
    cmd
}

/// Where the `qcow2-alloc` row's image goes, beside `raw`.
pub fn empty_path(raw: &Path) -> PathBuf {
    raw.parent().unwrap_or(Path::new(".")).join(EMPTY)
}

/// A freshly created empty qcow2 image, removed when dropped.
pub struct Empty(PathBuf);

impl Empty {
    /// Creates `path` anew (removing an earlier one) as an empty qcow2 image of `size`.
    pub fn create(path: &Path, size: u64) -> Result<Empty, String> {
        let _ = std::fs::remove_file(path);
        let dir = path.parent().unwrap_or(Path::new("."));
        lab::check_space(
            dir,
            size,
            "the qcow2-alloc row may fill its image: free some space or leave it out",
        )?;
        let empty = Empty(path.to_path_buf());
        run(&mut create_command(path, size), "qemu-img create")?;
        Ok(empty)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Empty {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Runs a qemu-img command to its end; the error carries its stderr.
fn run(cmd: &mut Command, what: &str) -> Result<(), String> {
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run {what}: {e} (apt-get install qemu-utils)"))?;
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "{what} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use crate::child::args_of as args;

    #[test]
    fn command_lines() {
        let c = convert_command(Path::new("/s/i.raw"), Path::new("/s/i.qcow2"));
        assert_eq!(c.get_program(), PROGRAM);
        assert_eq!(
            args(&c),
            [
                "convert",
                "-q",
                "-f",
                "raw",
                "-O",
                "qcow2",
                "-o",
                "cluster_size=65536",
                "/s/i.raw",
                "/s/i.qcow2"
            ]
        );
        let c = create_command(Path::new("/s/e.qcow2"), 2 << 30);
        assert_eq!(
            args(&c),
            [
                "create",
                "-q",
                "-f",
                "qcow2",
                "-o",
                "cluster_size=65536",
                "/s/e.qcow2",
                "2147483648"
            ]
        );
        assert_eq!(
            empty_path(Path::new("/var/tmp/b/corofuse-bench.raw")),
            Path::new("/var/tmp/b/corofuse-bench-alloc.qcow2")
        );
    }

    #[test]
    fn kept_image_is_made_again_when_missing_or_older_than_the_fill() {
        let filled = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        assert!(stale(None, filled).is_some());
        let older = filled - Duration::from_secs(1);
        assert!(stale(Some(older), filled).is_some_and(|w| w.contains("written again")));
        assert_eq!(stale(Some(filled + Duration::from_secs(5)), filled), None);
    }
}
