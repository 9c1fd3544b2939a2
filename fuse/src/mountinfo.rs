//! /proc/self/mountinfo: what is mounted where, as the kernel lists it.
//!
//! Why read the kernel's list rather than the path: stat(2) of a FUSE mount whose server
//! died fails (ENOTCONN), and of a live one asks the server, which may not answer; and a
//! pidfile only says a daemon got far enough to write it. The one parser here serves the
//! mount code (is a mountpoint already in use, is a mount ours), `corofuse umount`, the
//! lab (which file system holds its scratch files) and the tests (is the mount gone).

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// One mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// Where it is mounted (field 5, unescaped).
    pub mountpoint: PathBuf,
    /// `major:minor` (field 3): tells a mount from one made later on the same path.
    pub device: String,
    /// The file system type, e.g. `fuse.corofuse` (`fuse.<subtype>`) or `tmpfs`.
    pub fstype: String,
    /// The mount source (the first field after " - " and the type), e.g. `/dev/vda`.
    pub source: String,
}

impl MountEntry {
    /// A `fuse`, `fuseblk` or `fuse.*` mount.
    pub fn is_fuse(&self) -> bool {
        is_fuse(&self.fstype)
    }
}

/// Whether `fstype` is a FUSE type: `fuse`, `fuseblk` or `fuse.<subtype>`.
pub fn is_fuse(fstype: &str) -> bool {
    fstype == "fuse" || fstype == "fuseblk" || fstype.starts_with("fuse.")
}

/// Every mount of this process's namespace, in mount order (a later one on the same
/// mountpoint is on top).
pub fn read() -> io::Result<Vec<MountEntry>> {
    Ok(parse(&std::fs::read_to_string("/proc/self/mountinfo")?))
}

/// The mounts in mountinfo text; malformed lines are skipped.
pub fn parse(info: &str) -> Vec<MountEntry> {
    info.lines().filter_map(parse_line).collect()
}

/// The mounts whose mountpoint is exactly `path` (absolute, symlinks resolved, as the
/// kernel writes it), in mount order: the last one is on top.
pub fn mounts_on(mounts: &[MountEntry], path: &Path) -> Vec<MountEntry> {
    mounts
        .iter()
        .filter(|m| m.mountpoint == path)
        .cloned()
        .collect()
}

/// The mount holding `path` (absolute, symlinks resolved): the one whose mountpoint is the
/// longest prefix of it, by whole components, the topmost if stacked.
pub fn holding(mounts: &[MountEntry], path: &Path) -> Option<MountEntry> {
    let mut best: Option<(usize, &MountEntry)> = None;
    for m in mounts {
        let depth = m.mountpoint.components().count();
        // Later lines are mounted on top of earlier ones: `>=` lets them win.
        if path.starts_with(&m.mountpoint) && best.is_none_or(|(d, _)| depth >= d) {
            best = Some((depth, m));
        }
    }
    best.map(|(_, m)| m.clone())
}

/// One line: field 3 is the device, field 5 the mountpoint; after " - " come the type
/// and the source.
fn parse_line(line: &str) -> Option<MountEntry> {
    let (left, right) = line.split_once(" - ")?;
    let mut left = left.split(' ');
    let device = left.nth(2)?;
    let mountpoint = unescape(left.nth(1)?)?;
    let mut right = right.split(' ');
    let fstype = right.next().filter(|t| !t.is_empty())?;
    let source = right.next().unwrap_or("");
    Some(MountEntry {
        mountpoint: PathBuf::from(OsStr::from_bytes(&mountpoint)),
        device: device.to_string(),
        fstype: fstype.to_string(),
        source: unescape(source).map_or_else(
            || source.to_string(),
            |s| String::from_utf8_lossy(&s).into(),
        ),
    })
}

/// Undoes the kernel's `\ooo` octal escapes (of space, tab, newline and backslash);
/// `None` for a backslash not followed by three octal digits.
fn unescape(field: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(field.len());
    let mut bytes = field.bytes();
    while let Some(b) = bytes.next() {
        if b != b'\\' {
            out.push(b);
            continue;
        }
        let mut value: u32 = 0;
        for _ in 0..3 {
            let digit = bytes.next().filter(|d| (b'0'..=b'7').contains(d))?;
            value = value * 8 + u32::from(digit - b'0');
        }
        out.push(u8::try_from(value).ok()?);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 1 0:21 / / rw,relatime shared:1 - ext4 /dev/vda rw
23 22 0:22 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
98 22 0:50 / /tmp/img\\040one.raw rw,nosuid,nodev,relatime shared:60 - fuse.corofuse corofuse rw,user_id=0
99 22 0:51 / /srv/plain.img rw,relatime - ext4 /dev/sda1 rw
100 22 0:52 / /mnt/old rw,relatime - fuse sshfs rw
101 100 0:53 / /mnt/old rw - tmpfs tmpfs rw
garbage
1 2 3
 - fuse
102 22 0:54 / /bad\\04 rw - tmpfs tmpfs rw
";

    fn types_on(path: &str) -> Vec<String> {
        let on = mounts_on(&parse(MOUNTINFO), Path::new(path));
        on.into_iter().map(|m| m.fstype).collect()
    }

    #[test]
    fn finds_mounts_with_escaped_paths_in_mount_order() {
        assert_eq!(types_on("/tmp/img one.raw"), ["fuse.corofuse"]);
        assert!(types_on("/tmp/img").is_empty());
        assert_eq!(
            types_on("/mnt/old"),
            ["fuse", "tmpfs"],
            "stacked: the last is on top"
        );
        let mounts = parse(MOUNTINFO);
        let fuse = &mounts_on(&mounts, Path::new("/tmp/img one.raw"))[0];
        assert_eq!(
            (fuse.device.as_str(), fuse.source.as_str()),
            ("0:50", "corofuse")
        );
        assert!(fuse.is_fuse() && !mounts_on(&mounts, Path::new("/proc"))[0].is_fuse());
        assert!(is_fuse("fuseblk") && !is_fuse("fusectl"));
    }

    #[test]
    fn malformed_lines_are_skipped() {
        let mounts = parse(MOUNTINFO);
        assert_eq!(mounts.len(), 6, "{mounts:#?}");
        assert_eq!(unescape("/x\\134y"), Some(b"/x\\y".to_vec()));
        assert_eq!(unescape("/a\\999"), None);
    }

    #[test]
    fn finds_the_mount_holding_a_path() {
        let mounts = parse(MOUNTINFO);
        let holder = |p: &str| holding(&mounts, Path::new(p)).map(|m| m.fstype);
        assert_eq!(holder("/var/tmp/x").as_deref(), Some("ext4"));
        assert_eq!(
            holder("/mnt/old/a").as_deref(),
            Some("tmpfs"),
            "the top of a stack"
        );
        assert_eq!(holder("/tmp/img one.raw").as_deref(), Some("fuse.corofuse"));
        assert_eq!(
            holder("/tmp/img one.rawx").as_deref(),
            Some("ext4"),
            "components"
        );
    }
}
