//! Mounting without privileges through `fusermount3` (libfuse's setuid helper).
//!
//! The protocol (libfuse `lib/mount.c`): create a socketpair, pass one end to
//! `fusermount3 -o OPTS -- MOUNTPOINT` as the fd number in `_FUSE_COMMFD`;
//! fusermount3 opens /dev/fuse, mounts (computing `rootmode`, `user_id` and
//! `group_id` itself; it opens a file mountpoint O_WRONLY to check access),
//! sends the fd back as SCM_RIGHTS with one byte of data, and exits.
//! Unmount with `fusermount3 -u -z -- MOUNTPOINT`.

use super::{MountOptions, Unmounted};
use crate::dev::FuseDev;
use crate::sys::{cvt, explain};
use std::io;
use std::mem::{size_of, MaybeUninit};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};

/// The helper's name, looked up on PATH.
const FUSERMOUNT: &str = "fusermount3";
/// Environment variable carrying our socket's fd number.
const COMMFD_ENV: &str = "_FUSE_COMMFD";

/// The first executable `fusermount3` on PATH.
pub(super) fn find() -> io::Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).map(|dir| dir.join(FUSERMOUNT)).find(|p| is_executable(p)).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            "not running as root and fusermount3 is not on PATH: install fuse3 (it ships fusermount3) or run as root",
        )
    })
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// `fsname=..,subtype=..[,ro][,allow_other][,default_permissions][,max_read=N]`
fn options(opts: &MountOptions) -> String {
    let ro = if opts.read_only { ",ro" } else { "" };
    format!(
        "fsname={},subtype={}{ro}{}",
        opts.fsname,
        opts.subtype,
        opts.common_options()
    )
}

/// Mounts over `path` with the helper at `bin`; returns the /dev/fuse fd.
pub(super) fn mount(bin: &Path, path: &Path, opts: &MountOptions) -> io::Result<FuseDev> {
    let (ours, theirs) = UnixStream::pair()?;
    let child_fd = theirs.as_raw_fd();
    let mut cmd = Command::new(bin);
    cmd.arg("-o")
        .arg(options(opts))
        .arg("--")
        .arg(path)
        .env(COMMFD_ENV, child_fd.to_string());
    // SAFETY: the hook runs between fork and exec and only calls fcntl(2),
    // which is async-signal-safe, on an fd that is open in the child.
    unsafe { cmd.pre_exec(move || cvt(libc::fcntl(child_fd, libc::F_SETFD, 0)).map(drop)) };
    let mut child = cmd
        .spawn()
        .map_err(|err| explain(err, format!("cannot run {}", bin.display())))?;
    drop(theirs); // so that recvmsg sees EOF if the helper dies
    let fd = receive_fd(&ours);
    let status = child.wait()?;
    match (fd, status.success()) {
        (Ok(fd), true) => Ok(FuseDev::from(fd)),
        (fd, _) => Err(helper_failed(bin, path, status, fd.err())),
    }
}

fn helper_failed(bin: &Path, path: &Path, status: ExitStatus, err: Option<io::Error>) -> io::Error {
    let why = err.map_or(String::new(), |e| format!(", {e}"));
    let msg = format!(
        "{} could not mount over {} ({status}{why}); see its message above",
        bin.display(),
        path.display()
    );
    io::Error::other(msg)
}

/// Control buffer for one `int` of SCM_RIGHTS, aligned for `cmsghdr`.
#[repr(C)]
struct FdControl {
    header: libc::cmsghdr,
    fd: [u8; 8],
}

/// Receives one fd sent with SCM_RIGHTS (plus one byte of data).
fn receive_fd(sock: &UnixStream) -> io::Result<OwnedFd> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    let mut control = MaybeUninit::<FdControl>::zeroed();
    // SAFETY: msghdr is plain data; all-zero is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = size_of::<FdControl>();
    let n = loop {
        // SAFETY: `msg` points to `iov` and `control`, both live and writable
        // for their stated lengths during the call.
        match cvt(unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) }) {
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            other => break other?,
        }
    };
    if n == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "fusermount3 sent no fd",
        ));
    }
    take_fd(&msg)
}

/// The fd in the first control message, if it is SCM_RIGHTS.
fn take_fd(msg: &libc::msghdr) -> io::Result<OwnedFd> {
    // SAFETY: `msg` was filled by recvmsg; CMSG_FIRSTHDR checks msg_controllen
    // and returns null when there is no complete header.
    let cmsg = unsafe { libc::CMSG_FIRSTHDR(msg) };
    // SAFETY: a non-null `cmsg` points into our control buffer.
    let Some(cmsg) = (unsafe { cmsg.as_ref() }) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "fusermount3 sent no control message",
        ));
    };
    if cmsg.cmsg_level != libc::SOL_SOCKET || cmsg.cmsg_type != libc::SCM_RIGHTS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "fusermount3 sent an unexpected control message",
        ));
    }
    // SAFETY: an SCM_RIGHTS message carries at least one int after the header;
    // read_unaligned copes with any alignment of CMSG_DATA.
    let fd = unsafe { libc::CMSG_DATA(cmsg).cast::<libc::c_int>().read_unaligned() };
    // SAFETY: the kernel installed `fd` in our table for us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Lazily unmounts `path` with `fusermount3 -u -z`.
pub(super) fn unmount(bin: &Path, path: &Path) -> io::Result<()> {
    let status = Command::new(bin)
        .args(["-u", "-z", "--"])
        .arg(path)
        .status()?;
    if status.success() {
        return Ok(());
    }
    Err(io::Error::other(format!(
        "{} -u -z {} failed: {status}",
        bin.display(),
        path.display()
    )))
}

/// `fusermount3 -u`, then `-u -z` if it reports the mount busy. fusermount3 itself refuses
/// a mount that another user made.
pub(super) fn unmount_or_detach(bin: &Path, path: &Path) -> io::Result<Unmounted> {
    let out = Command::new(bin)
        .args(["-u", "--"])
        .arg(path)
        .stderr(Stdio::piped())
        .output()?;
    if out.status.success() {
        return Ok(Unmounted::Now);
    }
    let said = String::from_utf8_lossy(&out.stderr);
    if !said.contains("busy") {
        let (bin, path, said) = (bin.display(), path.display(), said.trim());
        let msg = format!("{bin} -u {path} failed ({}): {said}", out.status);
        return Err(io::Error::other(msg));
    }
    unmount(bin, path).map(|()| Unmounted::Lazily)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helper_options() {
        let opts = MountOptions {
            read_only: true,
            ..MountOptions::default()
        };
        assert_eq!(
            options(&opts),
            "fsname=corofuse,subtype=corofuse,ro,default_permissions"
        );
    }

    /// The SCM_RIGHTS receiver, against a sender in this process.
    #[test]
    fn receives_an_fd() {
        let (a, b) = UnixStream::pair().unwrap();
        let file = std::fs::File::open("/proc/self/status").unwrap();
        send_fd(&a, file.as_raw_fd());
        let fd = receive_fd(&b).unwrap();
        assert!(std::fs::File::from(fd).metadata().unwrap().is_file());
        drop(a);
        assert_eq!(
            receive_fd(&b).unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
    }

    fn send_fd(sock: &UnixStream, fd: i32) {
        let mut byte = [0u8; 1];
        let mut iov = libc::iovec {
            iov_base: byte.as_mut_ptr().cast(),
            iov_len: 1,
        };
        let mut control = MaybeUninit::<FdControl>::zeroed();
        // SAFETY: test-only sendmsg with a buffer sized for one fd, as above.
        unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = libc::CMSG_SPACE(4) as usize;
            let cmsg = &mut *libc::CMSG_FIRSTHDR(&msg);
            cmsg.cmsg_level = libc::SOL_SOCKET;
            cmsg.cmsg_type = libc::SCM_RIGHTS;
            cmsg.cmsg_len = libc::CMSG_LEN(4) as usize;
            libc::CMSG_DATA(cmsg).cast::<i32>().write_unaligned(fd);
            assert_eq!(libc::sendmsg(sock.as_raw_fd(), &msg, 0), 1);
        }
    }
}
