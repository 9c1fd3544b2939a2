//! Mountpoint checks: an existing regular file or directory, as the root is, that
//! is not a FUSE mount yet.
//!
//! The FUSE check runs first, from /proc/self/mountinfo and without touching
//! the path itself: stat(2) on a FUSE mount whose server is gone fails with
//! ENOTCONN, and on a live one it would ask that server. The same mountinfo
//! lookups serve `corofuse umount` ([`mount_at`], [`resolve`]).

use std::fs;
use std::io::{self, ErrorKind};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use crate::mountinfo::{self, MountEntry};

/// Validates `path` (a regular file, or a directory with `directory`) and returns
/// it absolute (symlinks resolved, as mount(2) does).
pub(super) fn check_mountpoint(path: &Path, directory: bool) -> io::Result<PathBuf> {
    let abs = resolve(path).map_err(|err| stat_error(err, path, directory))?;
    if let Some(mount) = fuse_mount_at(&abs)? {
        return Err(already_fuse(&abs, &mount));
    }
    let meta = fs::metadata(&abs).map_err(|err| stat_error(err, &abs, directory))?;
    if directory {
        return match file_kind(&meta.file_type()) {
            "directory" => Ok(abs),
            kind => Err(io::Error::new(
                ErrorKind::InvalidInput,
                format!(
                    "{} is a {kind}, not a directory; a directory export mounts over a directory",
                    abs.display()
                ),
            )),
        };
    }
    match file_kind(&meta.file_type()) {
        "regular file" => Ok(abs),
        "directory" => Err(io::Error::new(
            ErrorKind::InvalidInput,
            format!("{} is a directory; a FUSE image export mounts over a regular file", abs.display()),
        )),
        kind => Err(io::Error::new(
            ErrorKind::InvalidInput,
            format!("{} is a {kind}, not a regular file; a FUSE image export mounts over a regular file", abs.display()),
        )),
    }
}

/// The topmost mount of any type on `path` (absolute, symlinks resolved), if any.
pub fn mount_at(path: &Path) -> io::Result<Option<MountEntry>> {
    Ok(mountinfo::mounts_on(&mountinfo::read()?, path).pop())
}

/// The topmost FUSE mount on `path`, if any.
pub fn fuse_mount_at(path: &Path) -> io::Result<Option<MountEntry>> {
    let mounts = mountinfo::mounts_on(&mountinfo::read()?, path);
    Ok(mounts.into_iter().rfind(MountEntry::is_fuse))
}

/// True if /proc/self/mountinfo lists `path` with a `fuse` or `fuse.*` fstype.
pub fn is_fuse_mountpoint(path: &Path) -> io::Result<bool> {
    Ok(fuse_mount_at(path)?.is_some())
}

/// The device (`major:minor`, mountinfo field 3) of the topmost FUSE mount on `path`: it
/// tells our mount apart from one made later on the same path.
pub fn fuse_mount_device(path: &Path) -> io::Result<Option<String>> {
    Ok(fuse_mount_at(path)?.map(|mount| mount.device))
}

/// `path` as mount(2) and mountinfo name it: the parent canonicalized, the last component
/// kept unless it is a symlink. A path that mountinfo lists is never a symlink (mount(2)
/// follows them), so it is taken as it is: lstat(2) of a FUSE mountpoint would ask its
/// server, which may be gone (ENOTCONN) or not answering.
pub fn resolve(path: &Path) -> io::Result<PathBuf> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return fs::canonicalize(path);
    };
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let joined = fs::canonicalize(parent)?.join(name);
    if !mountinfo::mounts_on(&mountinfo::read()?, &joined).is_empty() {
        return Ok(joined);
    }
    match fs::symlink_metadata(&joined) {
        Ok(meta) if meta.file_type().is_symlink() => fs::canonicalize(&joined),
        _ => Ok(joined),
    }
}

fn file_kind(ty: &fs::FileType) -> &'static str {
    match ty {
        t if t.is_file() => "regular file",
        t if t.is_dir() => "directory",
        t if t.is_block_device() => "block device",
        t if t.is_char_device() => "character device",
        t if t.is_fifo() => "FIFO",
        t if t.is_socket() => "socket",
        _ => "special file",
    }
}

/// `directory`: the mountpoint of a directory export, which must be a directory.
fn stat_error(err: io::Error, path: &Path, directory: bool) -> io::Error {
    let path = path.display();
    let what = if directory {
        "directory (mkdir it)"
    } else {
        "regular file (touch it)"
    };
    let msg = match err.raw_os_error() {
        Some(libc::ENOENT) => {
            format!("mountpoint {path} does not exist; create the {what} to mount over first")
        }
        Some(libc::ENOTCONN) => format!(
            "{path} is on a FUSE mount whose server is gone; unmount that first \
             (`corofuse umount MOUNTPOINT` for a corofuse mount, else umount -l MOUNTPOINT)"
        ),
        _ => format!("cannot stat mountpoint {path}: {err}"),
    };
    io::Error::new(err.kind(), msg)
}

/// A FUSE mount is in the way: how to remove it. Ours (dead or live) goes with
/// `corofuse umount`, which refuses any other.
fn already_fuse(path: &Path, mount: &MountEntry) -> io::Error {
    let path = path.display();
    let how = if mount.fstype == super::MountOptions::default().fstype() {
        format!("corofuse umount {path}; it also cleans up a mount whose server is gone")
    } else {
        format!(
            "{}: umount -l {path} or fusermount3 -u -z {path}",
            mount.fstype
        )
    };
    let msg = format!("{path} is already a FUSE mountpoint; unmount it first ({how})");
    io::Error::new(ErrorKind::ResourceBusy, msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_corofuse_mount_in_the_way_points_to_corofuse_umount() {
        let ours = MountEntry {
            mountpoint: "/x.img".into(),
            device: "0:50".into(),
            fstype: "fuse.corofuse".into(),
            source: "/img".into(),
        };
        let msg = already_fuse(Path::new("/x.img"), &ours).to_string();
        assert!(
            msg.contains("unmount it first (corofuse umount /x.img;"),
            "{msg}"
        );
        let sshfs = MountEntry {
            fstype: "fuse.sshfs".into(),
            ..ours
        };
        let msg = already_fuse(Path::new("/x.img"), &sshfs).to_string();
        assert!(
            msg.contains("(fuse.sshfs: umount -l /x.img or fusermount3"),
            "{msg}"
        );
    }

    #[test]
    fn missing_and_directory_mountpoints_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.img");
        let err = check_mountpoint(&missing, false).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotFound);
        let want = format!(
            "mountpoint {} does not exist; create the regular file (touch it)",
            missing.display()
        );
        assert!(err.to_string().starts_with(&want), "{err}");
        let err = check_mountpoint(&missing, true).unwrap_err().to_string();
        assert!(
            err.ends_with("create the directory (mkdir it) to mount over first"),
            "{err}"
        );
        let err = check_mountpoint(dir.path(), false).unwrap_err();
        assert!(
            err.to_string()
                .ends_with("is a directory; a FUSE image export mounts over a regular file"),
            "{err}"
        );
        let err = check_mountpoint(Path::new("/dev/null"), false).unwrap_err();
        assert!(
            err.to_string()
                .contains("is a character device, not a regular file"),
            "{err}"
        );
    }

    #[test]
    fn a_directory_export_mounts_over_a_directory_only() {
        let dir = tempfile::tempdir().unwrap();
        let abs = check_mountpoint(dir.path(), true).unwrap();
        assert_eq!(fs::canonicalize(dir.path()).unwrap(), abs);
        let file = tempfile::NamedTempFile::new().unwrap();
        let err = check_mountpoint(file.path(), true).unwrap_err();
        assert!(
            err.to_string().ends_with(
                "is a regular file, not a directory; a directory export mounts over a directory"
            ),
            "{err}"
        );
    }

    #[test]
    fn regular_files_pass_and_come_back_absolute() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let abs = check_mountpoint(file.path(), false).unwrap();
        assert!(abs.is_absolute());
        assert_eq!(fs::canonicalize(file.path()).unwrap(), abs);
    }
}
