//! A private temp directory per test: images, mountpoints, pidfiles never collide between
//! tests running in parallel.

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use tempfile::TempDir;

/// statfs(2)'s `f_type` of ramfs (linux/magic.h; the libc crate does not name it).
const RAMFS_MAGIC: u64 = 0x8584_58f6;

/// A temp directory removed at the end of the test.
pub struct Sandbox {
    dir: TempDir,
}

impl Sandbox {
    /// A directory under the default temp dir (`$TMPDIR` or /tmp).
    pub fn new() -> Sandbox {
        Self::new_in(std::env::temp_dir())
    }

    /// A directory on tmpfs (/dev/shm), if there is one: hole punching and
    /// `SEEK_DATA`/`SEEK_HOLE` work there on every kernel, with page granularity.
    pub fn on_tmpfs() -> Option<Sandbox> {
        let shm = Path::new("/dev/shm");
        let mounts = fs::read_to_string("/proc/self/mounts").ok()?;
        let tmpfs = mounts.lines().any(|l| {
            let mut fields = l.split(' ').skip(1);
            fields.next() == Some("/dev/shm") && fields.next() == Some("tmpfs")
        });
        tmpfs.then(|| Self::new_in(shm))
    }

    /// A directory on a disk-backed file system, for an image that must live on real
    /// storage: O_DIRECT there reaches the device, with the device's alignment rules (512
    /// bytes on a virtio disk), where on tmpfs it is a copy to or from the page cache that
    /// statx reports no alignment for. Tried in order: /var/tmp
    /// (the FHS place for temp files that need not fit in memory, where /tmp may be
    /// tmpfs), then the build's `target/` directory (always on the disk the sources are
    /// on). A candidate counts if statfs(2) says it is not tmpfs or ramfs and a file there
    /// opens with O_DIRECT. Otherwise `Err` says why each was refused: a test should
    /// skip, visibly, with that.
    pub fn on_real_fs() -> Result<Sandbox, String> {
        let mut candidates = vec![PathBuf::from("/var/tmp")];
        if let Some(target) = crate::bin::profile_dir().parent() {
            candidates.push(target.to_path_buf());
        }
        let mut refused = Vec::new();
        for dir in candidates {
            match Self::real_fs_at(&dir) {
                Ok(sandbox) => return Ok(sandbox),
                Err(why) => refused.push(format!("{}: {why}", dir.display())),
            }
        }
        Err(format!(
            "no disk-backed directory for the image ({})",
            refused.join("; ")
        ))
    }

    fn real_fs_at(dir: &Path) -> Result<Sandbox, String> {
        let magic = crate::sys::fs_type(dir).map_err(|e| format!("statfs: {e}"))?;
        if magic == libc::TMPFS_MAGIC as u64 || magic == RAMFS_MAGIC {
            return Err(format!("in memory (f_type {magic:#x})"));
        }
        let sandbox = tempfile::Builder::new()
            .prefix("corofuse-test-")
            .tempdir_in(dir)
            .map(|dir| Sandbox { dir })
            .map_err(|e| format!("cannot create a directory: {e}"))?;
        let probe = sandbox.path("o_direct-probe");
        File::create(&probe).map_err(|e| format!("cannot create a file: {e}"))?;
        open_direct(&probe, true).map_err(|e| format!("no O_DIRECT: {e}"))?;
        fs::remove_file(&probe).map_err(|e| format!("remove the probe: {e}"))?;
        Ok(sandbox)
    }

    fn new_in(parent: impl AsRef<Path>) -> Sandbox {
        let dir = tempfile::Builder::new()
            .prefix("corofuse-test-")
            .tempdir_in(parent)
            .expect("create a temp dir");
        Sandbox { dir }
    }

    /// `name` inside the sandbox (not created).
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A file `name` holding `contents`.
    pub fn file(&self, name: &str, contents: &[u8]) -> PathBuf {
        let path = self.path(name);
        fs::write(&path, contents).expect("write a test file");
        path
    }

    /// A sparse file `name` of `len` bytes (all hole).
    pub fn sparse(&self, name: &str, len: u64) -> PathBuf {
        let path = self.path(name);
        File::create(&path)
            .and_then(|f| f.set_len(len))
            .expect("create a sparse file");
        path
    }

    /// An empty regular file to mount over.
    pub fn mountpoint(&self, name: &str) -> PathBuf {
        self.file(name, b"")
    }
}

impl Default for Sandbox {
    fn default() -> Self {
        Sandbox::new()
    }
}

/// Opens `path` read-write (`writable`) or read-only, with `O_DIRECT`.
pub fn open_direct(path: &Path, writable: bool) -> io::Result<File> {
    fs::OpenOptions::new()
        .read(true)
        .write(writable)
        .custom_flags(libc::O_DIRECT)
        .open(path)
}

/// Opens `path` read-write, buffered.
pub fn open_rw(path: &Path) -> io::Result<File> {
    fs::OpenOptions::new().read(true).write(true).open(path)
}
