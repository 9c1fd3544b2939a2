//! The lab's scratch space: one directory on tmpfs holding the mount point, the raw
//! image of the `file` row, pidfiles, statistics and logs, removed when the lab ends.
//! (The image on real storage is elsewhere and kept: [`super::storage`].)
//!
//! Why tmpfs: the file export should measure the daemon, not a disk; an image in RAM
//! makes the backend nearly free, like CONTEXT.md's reference runs. The image is filled
//! with non-zero data so that reads copy real bytes and no layer can short-cut zeroes.
//!
//! # Cleanup contract
//! `Drop` lazy-unmounts the mount point if anything is still mounted there, then removes
//! the directory. [`Lab::new`] also removes directories left by labs that were killed
//! (their PID is gone and nothing is mounted in them).

use std::fs::File;
use std::path::{Path, PathBuf};

use super::export::EXPORT_SIZE;
use super::{fill, mountinfo};

const PREFIX: &str = "corofuse-bench-";

pub struct Lab {
    dir: PathBuf,
    image: Option<PathBuf>,
}

impl Lab {
    /// Creates `<parent>/corofuse-bench-<pid>/` with an empty mount point file.
    pub fn new(parent: &Path) -> Result<Lab, String> {
        remove_stale(parent, PREFIX);
        let dir = parent.join(format!("{PREFIX}{}", std::process::id()));
        std::fs::create_dir(&dir).map_err(|e| {
            format!(
                "cannot create {}: {e} (is {} writable?)",
                dir.display(),
                parent.display()
            )
        })?;
        let lab = Lab { dir, image: None };
        File::create(lab.mountpoint())
            .map_err(|e| format!("{}: {e}", lab.mountpoint().display()))?;
        Ok(lab)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn mountpoint(&self) -> PathBuf {
        self.dir.join("mnt")
    }

    /// A file in the lab's directory.
    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The raw image, once [`Lab::create_image`] made it.
    pub fn image(&self) -> Option<&Path> {
        self.image.as_deref()
    }

    /// Writes a 1 GiB image of non-zero pseudo-random data ([`fill`]).
    pub fn create_image(&mut self) -> Result<(), String> {
        let path = self.dir.join("image.raw");
        check_space(
            &self.dir,
            EXPORT_SIZE,
            "free some space, use --scratch-dir, or run only the null export (--only null)",
        )?;
        let f = File::create(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        fill::write_image(&f, &path, EXPORT_SIZE)?;
        self.image = Some(path);
        Ok(())
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        let mnt = self.mountpoint();
        if mountinfo::fuse_mounted(&mnt) {
            if let Err(e) = mountinfo::lazy_unmount(&mnt) {
                eprintln!("corofuse-lab bench: cannot unmount {}: {e}", mnt.display());
            }
        }
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            eprintln!(
                "corofuse-lab bench: cannot remove {}: {e}; remove it by hand",
                self.dir.display()
            );
        }
    }
}

/// An error naming `hint` unless `dir`'s file system has `need` bytes (and 64 MiB) free.
pub fn check_space(dir: &Path, need: u64, hint: &str) -> Result<(), String> {
    let c =
        std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: statvfs is plain data, filled by the call.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid path and `st` a writable statvfs.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Ok(()); // cannot tell: let the write fail with its own error
    }
    let free = st.f_bavail as u64 * st.f_frsize as u64;
    if free < need + (64 << 20) {
        return Err(format!(
            "{} has {} MiB free, the image needs {} MiB: {hint}",
            dir.display(),
            free >> 20,
            need >> 20
        ));
    }
    Ok(())
}

/// Removes `<prefix><pid>` directories in `parent` whose lab is gone and has no mount
/// left (the lab's scratch directories).
pub fn remove_stale(parent: &Path, prefix: &str) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_prefix(prefix)) else {
            continue;
        };
        let alive = Path::new("/proc").join(pid).exists();
        let mounted = mountinfo::fstype_at(&entry.path().join("mnt")).is_some();
        if pid.parse::<u32>().is_err() || alive || mounted {
            continue;
        }
        if std::fs::remove_dir_all(entry.path()).is_ok() {
            eprintln!(
                "corofuse-lab bench: removed {} left by an earlier run",
                entry.path().display()
            );
        }
    }
}
