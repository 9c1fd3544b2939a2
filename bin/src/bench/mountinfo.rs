//! Is a path a mount point right now, and which file system holds a path? Read from
//! /proc/self/mountinfo, the kernel's own list (a pidfile only says that the daemon got
//! far enough to write it).

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// The filesystem type mounted on `path`, if any (the last mount wins when stacked).
pub fn fstype_at(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    fstype_in(&text, path.as_os_str().as_bytes())
}

/// Whether a FUSE filesystem (`fuse`, `fuse.NAME`, `fuseblk`) is mounted on `path`.
pub fn fuse_mounted(path: &Path) -> bool {
    fstype_at(path).is_some_and(|t| t.starts_with("fuse"))
}

/// The file system holding `path` (which must exist): its type and source, e.g.
/// ("ext4", "/dev/vda"), from the mount whose mount point is the longest prefix.
pub fn fs_of(path: &Path) -> Option<(String, String)> {
    let path = std::fs::canonicalize(path).ok()?;
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    fs_in(&text, &path)
}

fn fs_in(mountinfo: &str, path: &Path) -> Option<(String, String)> {
    let mut best: Option<(usize, String, String)> = None;
    for line in mountinfo.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(sep) = fields.iter().position(|f| *f == "-") else {
            continue;
        };
        let (Some(point), Some(fstype), Some(source)) =
            (fields.get(4), fields.get(sep + 1), fields.get(sep + 2))
        else {
            continue;
        };
        let point = unescape(point);
        let point = Path::new(std::ffi::OsStr::from_bytes(&point));
        let depth = point.components().count();
        // Later lines are mounted on top of earlier ones: `>=` lets them win.
        if path.starts_with(point) && best.as_ref().is_none_or(|b| depth >= b.0) {
            best = Some((depth, fstype.to_string(), source.to_string()));
        }
    }
    best.map(|(_, t, s)| (t, s))
}

fn fstype_in(mountinfo: &str, path: &[u8]) -> Option<String> {
    mountinfo.lines().rev().find_map(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        let sep = fields.iter().position(|f| *f == "-")?;
        let point = unescape(fields.get(4)?);
        (point == path).then(|| fields.get(sep + 1).map(|s| s.to_string()))?
    })
}

/// Undoes mountinfo's octal escapes (`\040` for a space, `\011`, `\012`, `\134`).
fn unescape(field: &str) -> Vec<u8> {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], octal) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

/// `umount2(path, MNT_DETACH)`: the last resort when a daemon did not unmount.
pub fn lazy_unmount(path: &Path) -> io::Result<()> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
    // SAFETY: `c` is a valid NUL-terminated path that outlives the call.
    if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
22 1 0:21 / / rw,relatime shared:1 - ext4 /dev/vda rw
42 27 0:39 / /dev/shm/corofuse-bench-7/mnt rw,nosuid,nodev,relatime - fuse.corofuse null:1G rw,user_id=0
43 27 0:40 / /tmp/a\\040b rw,nosuid,nodev - fuse f rw,user_id=0";

    #[test]
    fn finds_fuse_mounts_and_unescapes() {
        assert_eq!(
            fstype_in(SAMPLE, b"/dev/shm/corofuse-bench-7/mnt").as_deref(),
            Some("fuse.corofuse")
        );
        assert_eq!(fstype_in(SAMPLE, b"/tmp/a b").as_deref(), Some("fuse"));
        assert_eq!(fstype_in(SAMPLE, b"/dev/shm/corofuse-bench-7"), None);
        assert_eq!(fstype_in(SAMPLE, b"/").as_deref(), Some("ext4"));
    }

    #[test]
    fn finds_the_file_system_holding_a_path() {
        let fs = |p: &str| fs_in(SAMPLE, Path::new(p)).map(|(t, s)| format!("{t} {s}"));
        assert_eq!(
            fs("/var/tmp/corofuse-bench").as_deref(),
            Some("ext4 /dev/vda")
        );
        assert_eq!(
            fs("/dev/shm/corofuse-bench-7/mnt").as_deref(),
            Some("fuse.corofuse null:1G")
        );
        assert_eq!(fs("/tmp/a b/c").as_deref(), Some("fuse f"));
        assert_eq!(
            fs("/tmp/a bc").as_deref(),
            Some("ext4 /dev/vda"),
            "components, not string prefixes"
        );
    }
}
