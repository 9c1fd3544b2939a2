//! Can this process mount FUSE file systems with mount(2)? The one probe that the lab,
//! the benches and the tests ask before they mount, so that each says the same precise
//! thing when it cannot.

use std::fs;

use crate::dev::DEV_FUSE;

/// `CAP_SYS_ADMIN`'s bit in the capability sets of /proc/self/status.
const CAP_SYS_ADMIN: u32 = 21;

/// True when running with euid 0.
pub fn is_root() -> bool {
    super::privileged::is_root()
}

/// Why this process cannot mount a FUSE file system with mount(2), if it cannot: that
/// needs euid 0, CAP_SYS_ADMIN and a /dev/fuse it can open. (Without root, corofuse
/// mounts through fusermount3 instead, which this does not probe.)
pub fn mount_unavailable() -> Option<String> {
    if !is_root() {
        return Some("not root (mount(2) of a FUSE file system needs euid 0)".into());
    }
    if let Err(e) = fs::OpenOptions::new().read(true).write(true).open(DEV_FUSE) {
        return Some(format!("cannot open {DEV_FUSE}: {e} (try `modprobe fuse`)"));
    }
    match effective_caps() {
        Some(caps) if caps & (1 << CAP_SYS_ADMIN) != 0 => None,
        Some(_) => Some("CAP_SYS_ADMIN is not in the effective capability set".into()),
        None => Some("cannot read CapEff from /proc/self/status".into()),
    }
}

/// The effective capability set, from /proc/self/status.
fn effective_caps() -> Option<u64> {
    let status = fs::read_to_string("/proc/self/status").ok()?;
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
    u64::from_str_radix(hex.trim(), 16).ok()
}
