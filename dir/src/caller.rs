//! What the daemon must decide about a request's caller that the kernel does not tell it:
//! whether the caller holds a capability, or belongs to a group.
//!
//! The source's kernel checks capabilities against the credentials of whoever makes the
//! call, and that is the daemon (root), not the process behind the request. Where the
//! FUSE kernel module has already decided for the caller it says so (a write's
//! `FUSE_WRITE_KILL_SUIDGID`); where it leaves it to the server (clearing set-user-ID
//! after `fallocate` and `copy_file_range` under HANDLE_KILLPRIV_V2, hiding `trusted.*`
//! names from LISTXATTR) the daemon decides here.
//!
//! The request names the caller's fsuid, fsgid and thread; a capability is read from that
//! thread's `/proc/PID/status` (`CapEff`), and only for a caller whose uid is 0: every
//! other caller is taken to lack it. Supplementary groups come from the same file
//! (`Groups`). Every doubt (a thread gone, a PID of another PID
//! namespace, which the kernel sends as 0, a status file that does not parse) answers
//! "does not hold it" ("not a member"), the answer that keeps a privilege from being
//! granted by mistake:
//! at worst a privileged caller outside our PID namespace sees what an unprivileged one
//! would. Nothing here allocates: the path and the file's text live on the stack.

use std::io::Read;
use std::os::unix::ffi::OsStrExt;

/// `CAP_FSETID`: keep set-user-ID and set-group-ID bits when changing a file.
pub const CAP_FSETID: u32 = 4;
/// `CAP_SYS_ADMIN`: among much else, see and change `trusted.*` extended attributes.
pub const CAP_SYS_ADMIN: u32 = 21;

/// Whether the caller (fsuid `uid`, thread `pid` as the request gives them) holds `cap`
/// in its effective set, as far as the daemon can tell; see the module doc.
pub fn has_capability(uid: u32, pid: u32, cap: u32) -> bool {
    uid == 0 && pid != 0 && effective_caps(pid).is_some_and(|caps| caps & (1u64 << cap) != 0)
}

/// Whether the caller (fsgid `gid`, thread `pid`) is a member of group `group`: its
/// fsgid, or one of its supplementary groups (`Groups:` in `/proc/PID/status`).
pub fn in_group(gid: u32, pid: u32, group: u32) -> bool {
    gid == group
        || (pid != 0 && with_status(pid, |text| supplementary(text, group)).unwrap_or(false))
}

/// The caller's supplementary groups (`Groups:` in `/proc/PID/status`), at most
/// `out.len()` of them, into `out`; how many. None if the thread cannot be read.
pub fn groups(pid: u32, out: &mut [u32]) -> Option<usize> {
    if pid == 0 {
        return None;
    }
    with_status(pid, |text| {
        let mut n = 0;
        let listed = field(text, b"Groups:").unwrap_or("");
        for g in listed
            .split_ascii_whitespace()
            .filter_map(|g| g.parse().ok())
        {
            if n == out.len() {
                break;
            }
            out[n] = g;
            n += 1;
        }
        n
    })
}

/// The `CapEff` mask of thread `pid`, from `/proc/PID/status`.
fn effective_caps(pid: u32) -> Option<u64> {
    with_status(pid, cap_eff).flatten()
}

/// `f` of the text of `/proc/PID/status` (its first 4 KiB).
fn with_status<T>(pid: u32, f: impl FnOnce(&[u8]) -> T) -> Option<T> {
    let mut path = [0u8; 32];
    let len = status_path(pid, &mut path);
    let path = std::path::Path::new(std::ffi::OsStr::from_bytes(&path[..len]));
    let mut file = std::fs::File::open(path).ok()?;
    let mut text = [0u8; 4096];
    let mut filled = 0;
    while filled < text.len() {
        match file.read(&mut text[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    Some(f(&text[..filled]))
}

/// Writes `/proc/PID/status` into `buf`, returning its length.
fn status_path(pid: u32, buf: &mut [u8; 32]) -> usize {
    let (prefix, suffix) = (b"/proc/", b"/status");
    buf[..prefix.len()].copy_from_slice(prefix);
    let mut len = prefix.len();
    let digits = pid.checked_ilog10().unwrap_or(0) as usize + 1;
    let mut n = pid;
    for slot in buf[len..len + digits].iter_mut().rev() {
        *slot = b'0' + (n % 10) as u8;
        n /= 10;
    }
    len += digits;
    buf[len..len + suffix.len()].copy_from_slice(suffix);
    len + suffix.len()
}

/// The rest of the line of a status file's text that starts with `key`.
fn field<'t>(text: &'t [u8], key: &[u8]) -> Option<&'t str> {
    let line = text
        .split(|&b| b == b'\n')
        .find_map(|line| line.strip_prefix(key))?;
    std::str::from_utf8(line).ok().map(str::trim)
}

/// The hexadecimal mask on the `CapEff:` line of a status file's text.
fn cap_eff(text: &[u8]) -> Option<u64> {
    u64::from_str_radix(field(text, b"CapEff:")?, 16).ok()
}

/// Whether `group` is on the `Groups:` line of a status file's text.
fn supplementary(text: &[u8], group: u32) -> bool {
    field(text, b"Groups:").is_some_and(|groups| {
        groups
            .split_ascii_whitespace()
            .any(|g| g.parse() == Ok(group))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_path_names_the_thread() {
        let mut buf = [0u8; 32];
        for (pid, want) in [
            (1, "/proc/1/status"),
            (4194304, "/proc/4194304/status"),
            (u32::MAX, "/proc/4294967295/status"),
        ] {
            let len = status_path(pid, &mut buf);
            assert_eq!(std::str::from_utf8(&buf[..len]).unwrap(), want);
        }
    }

    #[test]
    fn cap_eff_is_read_from_its_line() {
        let text = b"Name:\tsh\nCapInh:\t0000000000000000\nCapPrm:\t000001ffffffffff\n\
                     CapEff:\t0000000000200010\nCapBnd:\t000001ffffffffff\n";
        assert_eq!(cap_eff(text), Some(0x200010));
        assert_eq!(cap_eff(b"Name:\tsh\n"), None);
        assert_eq!(cap_eff(b"CapEff:\tnot hex\n"), None);
    }

    #[test]
    fn supplementary_groups_are_read_from_their_line() {
        let text = b"Gid:\t0\t0\t0\t0\nGroups:\t4 24 1000 \nNStgid:\t1\n";
        assert!(supplementary(text, 24));
        assert!(supplementary(text, 1000));
        assert!(!supplementary(text, 100), "100 is not 1000's prefix");
        assert!(!supplementary(b"Groups:\t\n", 0));
        assert!(in_group(7, 0, 7), "the fsgid itself");
        assert!(!in_group(7, 0, 8), "no thread to read");
    }

    #[test]
    fn only_uid_0_with_the_bit_holds_a_capability() {
        let me = std::process::id();
        let caps = effective_caps(me).expect("our own status file");
        for cap in [CAP_FSETID, CAP_SYS_ADMIN] {
            assert_eq!(has_capability(0, me, cap), caps & (1 << cap) != 0);
            assert!(!has_capability(65534, me, cap), "uid 65534");
            assert!(
                !has_capability(0, 0, cap),
                "a caller of another PID namespace"
            );
        }
        assert!(!has_capability(0, u32::MAX, CAP_FSETID), "no such thread");
    }
}
