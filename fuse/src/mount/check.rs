//! Mountpoint checks: an existing regular file that is not a FUSE mount yet.
//!
//! The FUSE check runs first, from /proc/self/mountinfo and without touching
//! the path itself: stat(2) on a FUSE mount whose server is gone fails with
//! ENOTCONN, and on a live one it would ask that server.

use std::fs;
use std::io::{self, ErrorKind};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

/// Validates `path` and returns it absolute (symlinks resolved, as mount(2) does).
pub(super) fn check_mountpoint(path: &Path) -> io::Result<PathBuf> {
    let abs = absolute(path)?;
    if is_fuse_mountpoint(&abs)? {
        return Err(already_fuse(&abs));
    }
    let meta = fs::metadata(&abs).map_err(|err| stat_error(err, &abs))?;
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

/// True if /proc/self/mountinfo lists `path` with a `fuse` or `fuse.*` fstype.
pub fn is_fuse_mountpoint(path: &Path) -> io::Result<bool> {
    let info = fs::read_to_string("/proc/self/mountinfo")?;
    Ok(mountinfo_has_fuse(&info, path.as_os_str().as_bytes()))
}

/// The device (`major:minor`, mountinfo field 3) of the topmost FUSE mount on `path`: it
/// tells our mount apart from one made later on the same path.
pub fn fuse_mount_device(path: &Path) -> io::Result<Option<String>> {
    let info = fs::read_to_string("/proc/self/mountinfo")?;
    let path = path.as_os_str().as_bytes();
    Ok(info
        .lines()
        .filter(|line| {
            parse_line(line).is_some_and(|(mnt, fstype)| unescape_eq(mnt, path) && is_fuse(fstype))
        })
        .filter_map(|line| line.split(' ').nth(2))
        .next_back()
        .map(str::to_string))
}

fn is_fuse(fstype: &str) -> bool {
    fstype == "fuse" || fstype == "fuseblk" || fstype.starts_with("fuse.")
}

/// The parent canonicalized, the last component kept unless it is a symlink.
fn absolute(path: &Path) -> io::Result<PathBuf> {
    let is_link = fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
    let (parent, name) = match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) if !is_link => (parent, name),
        _ => return fs::canonicalize(path).map_err(|err| stat_error(err, path)),
    };
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let parent = fs::canonicalize(parent).map_err(|err| stat_error(err, path))?;
    Ok(parent.join(name))
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

fn stat_error(err: io::Error, path: &Path) -> io::Error {
    let path = path.display();
    let msg = match err.raw_os_error() {
        Some(libc::ENOENT) => {
            format!("mountpoint {path} does not exist; create the file to mount over first")
        }
        Some(libc::ENOTCONN) => format!(
            "{path} is a FUSE mountpoint whose server is gone; unmount it first (umount -l {path})"
        ),
        _ => format!("cannot stat mountpoint {path}: {err}"),
    };
    io::Error::new(err.kind(), msg)
}

fn already_fuse(path: &Path) -> io::Error {
    let path = path.display();
    let msg = format!("{path} is already a FUSE mountpoint; unmount it first (umount -l {path} or fusermount3 -u -z {path})");
    io::Error::new(ErrorKind::ResourceBusy, msg)
}

/// Scans mountinfo text: field 5 is the mountpoint, the fstype follows " - ".
fn mountinfo_has_fuse(info: &str, path: &[u8]) -> bool {
    info.lines()
        .filter_map(parse_line)
        .any(|(mnt, fstype)| unescape_eq(mnt, path) && is_fuse(fstype))
}

/// (mountpoint, fstype) of one mountinfo line.
fn parse_line(line: &str) -> Option<(&str, &str)> {
    let (left, right) = line.split_once(" - ")?;
    let mountpoint = left.split(' ').nth(4)?;
    let fstype = right.split(' ').next()?;
    Some((mountpoint, fstype))
}

/// Compares a mountinfo field, where the kernel writes ' ', '\t', '\n' and '\\'
/// as `\ooo` octal escapes, with raw path bytes.
fn unescape_eq(field: &str, path: &[u8]) -> bool {
    let mut bytes = field.bytes();
    let mut out = path.iter();
    while let Some(b) = bytes.next() {
        let b = match b {
            b'\\' => match octal(&mut bytes) {
                Some(b) => b,
                None => return false,
            },
            b => b,
        };
        if out.next() != Some(&b) {
            return false;
        }
    }
    out.next().is_none()
}

/// Three octal digits after a backslash.
fn octal(bytes: &mut impl Iterator<Item = u8>) -> Option<u8> {
    let mut value: u32 = 0;
    for _ in 0..3 {
        let digit = bytes.next().filter(|d| (b'0'..=b'7').contains(d))?;
        value = value * 8 + u32::from(digit - b'0');
    }
    u8::try_from(value).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 1 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
98 29 0:50 / /tmp/img\\040one.raw rw,nosuid,nodev,relatime shared:60 - fuse.corofuse corofuse rw,user_id=0,group_id=0
99 29 0:51 / /srv/plain.img rw,relatime - ext4 /dev/sda1 rw
100 29 0:52 / /mnt/old rw,relatime - fuse sshfs rw
";

    #[test]
    fn finds_fuse_mounts_with_escaped_paths() {
        assert!(mountinfo_has_fuse(MOUNTINFO, b"/tmp/img one.raw"));
        assert!(mountinfo_has_fuse(MOUNTINFO, b"/mnt/old"));
        assert!(!mountinfo_has_fuse(MOUNTINFO, b"/tmp/img"));
        assert!(
            !mountinfo_has_fuse(MOUNTINFO, b"/srv/plain.img"),
            "not FUSE"
        );
        assert!(!mountinfo_has_fuse(MOUNTINFO, b"/proc"));
    }

    #[test]
    fn malformed_lines_are_ignored() {
        assert!(!mountinfo_has_fuse("garbage\n1 2 3\n - fuse\n", b"/x"));
        assert!(!unescape_eq("/a\\04", b"/a "));
        assert!(!unescape_eq("/a\\999", b"/a"));
    }

    #[test]
    fn missing_and_directory_mountpoints_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.img");
        let err = check_mountpoint(&missing).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotFound);
        assert!(err
            .to_string()
            .starts_with(&format!("mountpoint {} does not exist", missing.display())));
        let err = check_mountpoint(dir.path()).unwrap_err();
        assert!(
            err.to_string()
                .ends_with("is a directory; a FUSE image export mounts over a regular file"),
            "{err}"
        );
        let err = check_mountpoint(Path::new("/dev/null")).unwrap_err();
        assert!(
            err.to_string()
                .contains("is a character device, not a regular file"),
            "{err}"
        );
    }

    #[test]
    fn regular_files_pass_and_come_back_absolute() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let abs = check_mountpoint(file.path()).unwrap();
        assert!(abs.is_absolute());
        assert_eq!(fs::canonicalize(file.path()).unwrap(), abs);
    }
}
