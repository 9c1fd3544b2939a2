//! `--pidfile`: written once the mount is live, removed when the daemon ends, and its
//! directory checked before anything starts, as qemu-storage-daemon does with its own.
//!
//! Why removed: a pidfile left behind names a PID the system will give to another process,
//! and a script that signals it signals a stranger. Only a file that still holds this
//! daemon's PID is removed: one replaced by someone else since is left alone.

use std::path::{Path, PathBuf};

/// The pidfile this daemon wrote; removing it on drop (every exit path after the mount).
pub struct PidFile {
    path: PathBuf,
    contents: String,
}

impl PidFile {
    /// Writes this process's PID to `path` (a new file renamed over it: `out_file`); the
    /// caller words the error (`mount` and qsd word it differently).
    pub fn write(path: &Path) -> std::io::Result<PidFile> {
        let contents = format!("{}\n", std::process::id());
        crate::out_file::replace(path, contents.as_bytes())?;
        Ok(PidFile {
            path: path.to_owned(),
            contents,
        })
    }
}

impl Drop for PidFile {
    fn drop(&mut self) {
        let ours = std::fs::symlink_metadata(&self.path).is_ok_and(|m| m.is_file())
            && std::fs::read_to_string(&self.path).is_ok_and(|text| text == self.contents);
        if !ours {
            log::debug!(
                "pidfile {} no longer holds this daemon's PID: left as it is",
                self.path.display()
            );
            return;
        }
        if let Err(e) = std::fs::remove_file(&self.path) {
            log::warn!("cannot remove pidfile {}: {e}", self.path.display());
        }
    }
}

/// Checks, before anything is opened or mounted, that a file can be made at `path`
/// (`what` names the option in the message): its directory exists and takes new files,
/// and the path is not a directory.
pub fn check_writable(what: &str, path: &Path) -> Result<(), String> {
    if path.is_dir() {
        return Err(format!("{what} {}: is a directory", path.display()));
    }
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    tempfile::Builder::new()
        .prefix(".corofuse-check-")
        .tempfile_in(dir)
        .map(drop)
        .map_err(|e| format!("cannot write {what} {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pidfile_is_removed_on_drop_unless_someone_replaced_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.pid");
        let pid = PidFile::write(&path).unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            format!("{}\n", std::process::id())
        );
        drop(pid);
        assert!(!path.exists(), "removed at exit");
        let pid = PidFile::write(&path).unwrap();
        std::fs::write(&path, "1\n").unwrap();
        drop(pid);
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "1\n",
            "another's kept"
        );
    }

    #[test]
    fn unwritable_paths_are_refused_with_the_option_named() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("no/such/dir/stats.json");
        let e = check_writable("--stats", &missing).unwrap_err();
        assert!(
            e.starts_with("cannot write --stats ") && e.contains("No such file"),
            "{e}"
        );
        let e = check_writable("--pidfile", dir.path()).unwrap_err();
        assert!(e.ends_with("is a directory"), "{e}");
        check_writable("--stats", &dir.path().join("ok.json")).unwrap();
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "no file left"
        );
    }
}
