//! Image locking that QEMU understands: QEMU's own scheme (block/file-posix.c), so that
//! qemu-img, qemu-io, qemu-storage-daemon, QEMU itself and other corofuse exports see an
//! exported image as in use, and corofuse sees theirs.
//!
//! Why QEMU's scheme and no other: two writers that do not know of each other corrupt an
//! image silently, and QEMU (since 2.10) already keeps its own processes apart with these
//! locks. Taking the same bytes makes corofuse one more QEMU user of the file.
//!
//! # The scheme
//! Every open of an image holds QEMU block permissions (`BLK_PERM_*` in
//! include/block/block-common.h, numbered by bit: consistent read 0, write 1, write
//! unchanged 2, resize 3) and shares some of them with others. With open file
//! description (OFD) locks, all shared (`F_RDLCK`), on single bytes of the image:
//! - byte `100 + p` for each permission `p` it holds;
//! - byte `200 + p` for each permission `p` it does *not* share.
//!
//! It takes its bytes first, then tests (`F_OFD_GETLK` with `F_WRLCK`, which any other
//! lock on the byte conflicts with) that nobody else has `200 + p` for a `p` it holds, and
//! nobody has `100 + p` for a `p` it does not share. Taking before testing means two
//! openers racing each other both see the other and both fail, never both succeed.
//!
//! # What corofuse takes
//! - A writable export holds consistent read, write and resize (a writable export can
//!   always shrink the image by truncation, growable or not, as qemu-storage-daemon's own
//!   writable FUSE export also holds resize), and shares only consistent read: bytes 100,
//!   101, 103, 201, 202, 203. So QEMU writers (qemu-io, `qemu-img resize`, a writable
//!   qemu-storage-daemon export) are refused while it serves, and QEMU readers are not.
//! - A read-only export takes what qemu-io `-r`, `qemu-img check` and `qemu-img map` take:
//!   consistent read, sharing everything: byte 100 alone. So, as in QEMU, readers do not
//!   keep writers out, and a read-only export starts next to a QEMU writer (QEMU's
//!   writers share consistent read).
//! - `qemu-img info` takes no permission at all, so it works against either.
//!
//! - A qcow2 image's backing file gets what QEMU takes on one: consistent read, sharing
//!   everything but write and resize (bytes 100, 201, 203). So readers of the backing
//!   file are let in, and writers (which would change what the image reads as) are not.
//!
//! The locks belong to the open file description of the backend's one fd, so they last
//! exactly as long as the export keeps the image open, whatever the dispatch or number of
//! queues, and the kernel drops them when the process dies. `F_OFD_GETLK` reports no
//! owner (`l_pid` is -1), so a conflict names the holder by scanning the `lock:` lines of
//! /proc/PID/fdinfo for fds on the same file.

use std::fmt;
use std::fs::{self, File};
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::sys;

/// Byte `PERM_BASE + p`: permission `p` is held (QEMU's `RAW_LOCK_PERM_BASE`).
const PERM_BASE: u64 = 100;
/// Byte `SHARED_BASE + p`: permission `p` is not shared (`RAW_LOCK_SHARED_BASE`).
const SHARED_BASE: u64 = 200;

/// QEMU's block permissions by bit number, and what a holder of each does to the image.
const PERMS: [(u32, &str); 4] = [
    (0, "consistent reads"),
    (1, "writing"),
    (2, "unchanging writes"),
    (3, "resizing"),
];

/// Permissions as QEMU's bit mask (`BLK_PERM_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Perms(u8);

impl Perms {
    const CONSISTENT_READ: Perms = Perms(1 << 0);
    /// Consistent read and unchanging writes.
    const UNCHANGING: Perms = Perms(0b0101);
    const ALL: Perms = Perms(0b1111);
    /// Consistent read, write and resize.
    const WRITER: Perms = Perms(0b1011);

    fn has(self, bit: u32) -> bool {
        self.0 & (1 << bit) != 0
    }
}

/// What one open holds and shares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Claim {
    held: Perms,
    shared: Perms,
}

impl Claim {
    /// A writable export's claim, or a read-only one's (module docs).
    fn of_export(writable: bool) -> Claim {
        match writable {
            true => Claim {
                held: Perms::WRITER,
                shared: Perms::CONSISTENT_READ,
            },
            false => Claim {
                held: Perms::CONSISTENT_READ,
                shared: Perms::ALL,
            },
        }
    }

    /// A backing file's claim (module docs).
    const BACKING: Claim = Claim {
        held: Perms::CONSISTENT_READ,
        shared: Perms::UNCHANGING,
    };

    /// The bytes this claim locks: `100 + p` held, `200 + p` not shared.
    fn bytes(self) -> impl Iterator<Item = u64> {
        bytes_of(self.held, true, PERM_BASE).chain(bytes_of(self.shared, false, SHARED_BASE))
    }

    /// The bytes nobody else may hold: `100 + p` for what it does not share, then `200 + p`
    /// for what it holds (the order a conflict is reported in: a holder before a refuser).
    fn forbidden(self) -> impl Iterator<Item = u64> {
        bytes_of(self.shared, false, PERM_BASE).chain(bytes_of(self.held, true, SHARED_BASE))
    }
}

/// Byte `base + p` for each permission `p` that `perms` has (`present`) or lacks.
fn bytes_of(perms: Perms, present: bool, base: u64) -> impl Iterator<Item = u64> {
    PERMS
        .iter()
        .filter(move |(p, _)| perms.has(*p) == present)
        .map(move |(p, _)| base + u64::from(*p))
}

/// Takes a writable (`writable`) or read-only export's locks on `file`, the image at
/// `path`, and checks that nobody else's conflict with them. On error the caller closes
/// `file`, which drops whatever was taken.
pub(crate) fn lock(file: &File, path: &Path, writable: bool) -> Result<(), LockError> {
    lock_as(file, path, writable, Claim::of_export(writable))
}

/// Takes a backing file's locks on `file` (read-only), as [`lock`] does an export's.
pub(crate) fn lock_backing(file: &File, path: &Path) -> Result<(), LockError> {
    lock_as(file, path, false, Claim::BACKING)
}

/// Drops every lock byte this open of the image holds (an export's or a backing file's),
/// before the fd closes. Nobody else's locks change: OFD locks belong to one open file
/// description.
pub(crate) fn release(file: &File) -> io::Result<()> {
    let len = SHARED_BASE + PERMS.len() as u64 - PERM_BASE;
    sys::ofd_unlock(file.as_fd(), PERM_BASE, len)
}

fn lock_as(file: &File, path: &Path, writable: bool, claim: Claim) -> Result<(), LockError> {
    let failed = |error| LockError::Failed {
        image: path.to_owned(),
        writable,
        error,
    };
    for byte in claim.bytes() {
        match sys::ofd_lock(file.as_fd(), libc::F_OFD_SETLK, byte, libc::F_RDLCK) {
            Ok(_) => {}
            // Someone holds a write lock there: not QEMU, but in the way all the same.
            Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EACCES)) => {
                return Err(conflict(file, path, writable, byte))
            }
            Err(e) => return Err(failed(e)),
        }
    }
    for byte in claim.forbidden() {
        let found = sys::ofd_lock(file.as_fd(), libc::F_OFD_GETLK, byte, libc::F_WRLCK);
        if found.map_err(failed)? != libc::F_UNLCK {
            return Err(conflict(file, path, writable, byte));
        }
    }
    Ok(())
}

fn conflict(file: &File, path: &Path, writable: bool, byte: u64) -> LockError {
    LockError::Conflict {
        image: path.to_owned(),
        writable,
        byte,
        holders: holders(file, byte),
    }
}

/// Why an image could not be locked. As the inner error of an [`io::Error`] from
/// [`FileBackend::open`](crate::FileBackend::open) (kind `ResourceBusy` for a conflict);
/// one line, e.g. "cannot lock image /img for writing: qemu-storage-daemon (pid 812) has
/// it open for writing (QEMU lock byte 101)".
#[derive(Debug)]
#[non_exhaustive]
pub enum LockError {
    /// Another open of the image holds a permission this export does not share, or does
    /// not share one it needs.
    Conflict {
        /// The image.
        image: PathBuf,
        /// Whether the export was to be writable.
        writable: bool,
        /// The first lock byte in the way: `100 + p` (someone holds permission `p`) or
        /// `200 + p` (someone does not share `p`).
        byte: u64,
        /// The processes with a lock on that byte, as far as /proc tells.
        holders: Vec<Holder>,
    },
    /// The file system refused the locks themselves (e.g. no OFD locks).
    Failed {
        /// The image.
        image: PathBuf,
        /// Whether the export was to be writable.
        writable: bool,
        /// What `fcntl(2)` said.
        error: io::Error,
    },
}

impl LockError {
    /// Whether another process is in the way (rather than the file system refusing locks).
    pub fn is_conflict(&self) -> bool {
        matches!(self, LockError::Conflict { .. })
    }

    fn kind(&self) -> io::ErrorKind {
        match self {
            LockError::Conflict { .. } => io::ErrorKind::ResourceBusy,
            LockError::Failed { error, .. } => error.kind(),
        }
    }
}

impl fmt::Display for LockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (LockError::Conflict {
            image, writable, ..
        }
        | LockError::Failed {
            image, writable, ..
        }) = self;
        let mode = if *writable { "writing" } else { "reading" };
        write!(f, "cannot lock image {} for {mode}: ", image.display())?;
        match self {
            LockError::Failed { error, .. } => write!(f, "{error}"),
            LockError::Conflict { byte, holders, .. } => {
                let who = match holders.as_slice() {
                    [] => "another process".to_owned(),
                    list => list
                        .iter()
                        .map(Holder::to_string)
                        .collect::<Vec<_>>()
                        .join(", "),
                };
                let (perm, what) = match byte.checked_sub(SHARED_BASE) {
                    Some(p) => (p, "does not share"),
                    None => (byte - PERM_BASE, "has it open for"),
                };
                let perm = PERMS.get(perm as usize).map_or("?", |(_, name)| name);
                write!(f, "{who} {what} {perm} (QEMU lock byte {byte})")
            }
        }
    }
}

impl std::error::Error for LockError {}

impl From<LockError> for io::Error {
    fn from(e: LockError) -> io::Error {
        io::Error::new(e.kind(), e)
    }
}

/// A process with a lock on the image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    /// Its PID.
    pub pid: u32,
    /// Its program: the file name of argv\[0\], else its `comm`.
    pub name: String,
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (pid {})", self.name, self.pid)
    }
}

/// The processes with an fd that holds a lock covering `byte` on `file`'s inode, by the
/// `lock:` lines of /proc/PID/fdinfo/FD (they list the locks of that open file, naming
/// the inode as the kernel does: "MAJOR:MINOR:INODE", device numbers in hex); our own
/// `file` aside. Only fdinfo is read, never the files themselves, so a hung file system
/// elsewhere cannot stall this. Empty where /proc cannot tell (another PID namespace, no
/// permission, or a file system whose `st_dev` is not its superblock's, as on btrfs).
fn holders(file: &File, byte: u64) -> Vec<Holder> {
    let Ok(meta) = file.metadata() else {
        return Vec::new();
    };
    let (dev, ino) = (meta.dev(), meta.ino());
    let inode = format!("{:02x}:{:02x}:{ino}", libc::major(dev), libc::minor(dev));
    let (me, our_fd) = (std::process::id(), file.as_raw_fd().to_string());
    let Ok(procs) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let pids = procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok());
    let holds = |pid: u32| {
        let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
            return false;
        };
        fds.flatten().any(|fd| {
            let ours = pid == me && fd.file_name().to_str() == Some(&our_fd);
            let info = fs::read_to_string(fd.path()).unwrap_or_default();
            !ours && info.lines().any(|line| locks_byte(line, &inode, byte))
        })
    };
    let name = |pid| Holder {
        pid,
        name: program(pid),
    };
    pids.filter(|&pid| holds(pid)).map(name).collect()
}

/// Whether an fdinfo line is a lock on `inode` covering `byte`, as
/// "lock:\t1: OFDLCK ADVISORY  READ -1 fe:00:10010710 100 101" (start and end inclusive,
/// the end may be "EOF").
fn locks_byte(line: &str, inode: &str, byte: u64) -> bool {
    let mut fields = line.split_whitespace().rev();
    let (Some(end), Some(start), Some(on)) = (fields.next(), fields.next(), fields.next()) else {
        return false;
    };
    let end = match end {
        "EOF" => Some(u64::MAX),
        end => end.parse().ok(),
    };
    match (
        line.starts_with("lock:") && on == inode,
        start.parse::<u64>(),
        end,
    ) {
        (true, Ok(start), Some(end)) => (start..=end).contains(&byte),
        _ => false,
    }
}

/// The file name of argv\[0\] of `pid` (comm is cut at 15 bytes: "qemu-storage-da"),
/// else its comm.
fn program(pid: u32) -> String {
    let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let argv0 = cmdline.split(|&b| b == 0).next().unwrap_or_default();
    let name = Path::new(std::str::from_utf8(argv0).unwrap_or_default()).file_name();
    match name.and_then(|n| n.to_str()) {
        Some(name) if !name.is_empty() => name.to_owned(),
        _ => fs::read_to_string(format!("/proc/{pid}/comm"))
            .map_or_else(|_| "?".to_owned(), |c| c.trim().to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_lock_what_qemu_would() {
        let bytes = |writable| Claim::of_export(writable).bytes().collect::<Vec<_>>();
        let forbidden = |writable| Claim::of_export(writable).forbidden().collect::<Vec<_>>();
        // Writer: holds read, write, resize; unshares write, write-unchanged, resize.
        assert_eq!(bytes(true), [100, 101, 103, 201, 202, 203]);
        assert_eq!(forbidden(true), [101, 102, 103, 200, 201, 203]);
        // Reader (qemu-io -r): holds consistent read, shares everything.
        assert_eq!(bytes(false), [100]);
        assert_eq!(forbidden(false), [200]);
    }

    #[test]
    fn lock_lines_cover_their_ranges() {
        let inode = "fe:00:1007";
        let line = "lock:\t1: OFDLCK ADVISORY  READ -1 fe:00:1007 100 101";
        assert!(locks_byte(line, inode, 100) && locks_byte(line, inode, 101));
        assert!(!locks_byte(line, inode, 99) && !locks_byte(line, inode, 102));
        assert!(!locks_byte(line, "fe:01:1007", 100), "another device");
        let posix = "lock:\t2: POSIX  ADVISORY  WRITE 376 fe:00:1007 0 EOF";
        assert!(locks_byte(posix, inode, 203));
        assert!(!locks_byte("lock:", inode, 100));
        assert!(!locks_byte("pos:\t0 1 2", inode, 1));
    }

    #[test]
    fn conflict_message_is_one_line_naming_who_and_why() {
        let e = LockError::Conflict {
            image: "/img".into(),
            writable: true,
            byte: 101,
            holders: vec![Holder {
                pid: 812,
                name: "qemu-storage-daemon".into(),
            }],
        };
        assert_eq!(
            e.to_string(),
            "cannot lock image /img for writing: qemu-storage-daemon (pid 812) has it open \
             for writing (QEMU lock byte 101)"
        );
        let e = LockError::Conflict {
            image: "/img".into(),
            writable: false,
            byte: 200,
            holders: Vec::new(),
        };
        assert_eq!(
            e.to_string(),
            "cannot lock image /img for reading: another process does not share consistent \
             reads (QEMU lock byte 200)"
        );
    }
}
