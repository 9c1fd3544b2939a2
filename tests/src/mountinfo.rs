//! Whether a path is a corofuse mount, from /proc/self/mountinfo (never by touching the
//! path: stat(2) on a mount whose server died fails, and on a live one it asks the server).

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// The fstype corofuse mounts with.
pub const FSTYPE: &str = "fuse.corofuse";

/// How many mounts of any `fuse`/`fuse.*` type sit on `path` (an absolute path, symlinks
/// resolved, as the kernel writes it).
pub fn fuse_mounts_at(path: &Path) -> usize {
    fstypes_at(path).iter().filter(|t| is_fuse(t)).count()
}

/// Whether `path` has a [`FSTYPE`] mount on it.
pub fn is_corofuse_mount(path: &Path) -> bool {
    fstypes_at(path).iter().any(|t| t == FSTYPE)
}

/// The fstype of each mount on `path`, in mount order (the last one is on top).
pub fn fstypes_at(path: &Path) -> Vec<String> {
    let info = fs::read_to_string("/proc/self/mountinfo").expect("read /proc/self/mountinfo");
    let path = path.as_os_str().as_bytes();
    info.lines()
        .filter_map(parse_line)
        .filter(|(mnt, _)| unescape(mnt) == path)
        .map(|(_, fstype)| fstype.to_string())
        .collect()
}

fn is_fuse(fstype: &str) -> bool {
    fstype == "fuse" || fstype == "fuseblk" || fstype.starts_with("fuse.")
}

/// (mountpoint, fstype): field 5, and the first field after " - ".
fn parse_line(line: &str) -> Option<(&str, &str)> {
    let (left, right) = line.split_once(" - ")?;
    Some((left.split(' ').nth(4)?, right.split(' ').next()?))
}

/// Undoes the kernel's `\ooo` escapes of space, tab, newline and backslash.
fn unescape(field: &str) -> Vec<u8> {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).filter(|_| bytes[i] == b'\\');
        match octal.and_then(|d| u8::from_str_radix(std::str::from_utf8(d).ok()?, 8).ok()) {
            Some(b) => {
                out.push(b);
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_escaped_mountpoints() {
        let line = "43 27 0:40 / /tmp/a\\040b.img rw,nosuid - fuse.corofuse img rw,user_id=0";
        let (mnt, fstype) = parse_line(line).unwrap();
        assert_eq!(
            (unescape(mnt).as_slice(), fstype),
            (&b"/tmp/a b.img"[..], FSTYPE)
        );
        assert_eq!(unescape("/x\\134y\\0"), b"/x\\y\\0");
        assert!(parse_line("garbage").is_none());
    }
}
