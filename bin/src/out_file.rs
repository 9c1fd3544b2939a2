//! The files the daemon writes for others to read (`--pidfile`, `--stats`), written so that
//! a path in a directory other users can write to is safe for a root daemon.
//!
//! A plain `open(O_TRUNC)` of the path would follow a symlink planted there and truncate
//! its target, any file root may write. Instead each write makes a new file beside the
//! path (`O_CREAT | O_EXCL`, a random name, so nothing planted is opened) and renames it
//! over the path: rename(2) replaces a symlink itself, not what it points to, and a file
//! someone else left there is unlinked whole, never truncated or written. Readers see the
//! old contents or the new, never half a file, which also suits `--stats` being rewritten
//! on every SIGUSR1.

use std::io::{self, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// Replaces `path` with a `--stats` document; an error is logged (the daemon goes on).
pub fn write_stats(path: &Path, stats: &daemon_stats::Stats) {
    if let Err(e) = replace(path, stats.to_json().as_bytes()) {
        log::error!("cannot write stats to {}: {e}", path.display());
    }
}

/// Replaces `path` with a new file holding `contents`, mode 0644.
pub fn replace(path: &Path, contents: &[u8]) -> io::Result<()> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let mut file = tempfile::Builder::new()
        .prefix(".corofuse-")
        .tempfile_in(dir)?;
    file.write_all(contents)?;
    file.as_file()
        .set_permissions(std::fs::Permissions::from_mode(0o644))?;
    file.persist(path).map_err(|e| e.error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn a_symlink_at_the_path_is_replaced_and_its_target_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("precious");
        std::fs::write(&target, b"keep me").unwrap();
        let link = dir.path().join("daemon.pid");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        replace(&link, b"42\n").unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"keep me");
        let meta = std::fs::symlink_metadata(&link).unwrap();
        assert!(meta.is_file(), "the link itself was replaced by a file");
        assert_eq!(meta.mode() & 0o7777, 0o644);
        assert_eq!(std::fs::read(&link).unwrap(), b"42\n");
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 2, "no temporary file left behind: {names:?}");
    }

    #[test]
    fn an_existing_file_is_replaced_not_written_through() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stats.json");
        std::fs::write(&path, b"old contents, longer than the new").unwrap();
        let other = dir.path().join("hard-link");
        std::fs::hard_link(&path, &other).unwrap();
        replace(&path, b"{}").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"{}");
        assert_eq!(
            std::fs::read(&other).unwrap(),
            b"old contents, longer than the new",
            "the old inode was not truncated"
        );
    }

    #[test]
    fn a_missing_directory_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let err = replace(&dir.path().join("no/such/dir/pid"), b"1").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
    }
}
