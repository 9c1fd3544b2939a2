//! A private temp directory per test: images, mountpoints, pidfiles never collide between
//! tests running in parallel.

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use tempfile::TempDir;

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
