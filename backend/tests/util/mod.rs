//! Shared test helpers: a matrix of (filesystem, buffered/direct, context) to run each file
//! test in, temp images, patterns and aligned buffers.
#![allow(dead_code)] // each test binary uses a different subset

use std::fs;
use std::io::{self, IoSlice, IoSliceMut};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use backend::{BlockBackend, Ctx, FileBackend, OpenOptions};
use corofuse_tests::require::report_skip;
use runtime::{Config, Runtime};
use tempfile::TempDir;

/// One cell of the matrix: where the images live and how they are opened.
#[derive(Clone)]
pub struct Setup {
    dir: Arc<TempDir>,
    pub direct: bool,
    pub label: String,
}

impl Setup {
    /// A new image file named after `name` holding `contents`.
    pub fn file(&self, name: &str, contents: &[u8]) -> PathBuf {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let path = self.dir.path().join(format!(
            "{name}-{}.img",
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        fs::write(&path, contents).unwrap();
        path
    }

    /// Opens `path` writable in this cell's mode.
    pub fn open(&self, path: &Path) -> Arc<FileBackend> {
        let opts = OpenOptions {
            writable: true,
            direct: self.direct,
            lock: false,
            format: backend::Format::Auto,
            snapshot: None,
        };
        Arc::new(FileBackend::open(path, &opts).unwrap())
    }
}

/// Where images can live: the default temp dir and tmpfs at /dev/shm (its cells are
/// skipped through `report_skip` where /dev/shm is not tmpfs).
fn places() -> Vec<(String, PathBuf)> {
    let mut places = vec![std::env::temp_dir()];
    match fs_type(Path::new("/dev/shm")) {
        Some(kind) if kind == "tmpfs" => places.push("/dev/shm".into()),
        other => report_skip(&format!(
            "the tmpfs cells: /dev/shm is {}, not tmpfs",
            other.as_deref().unwrap_or("missing")
        )),
    }
    places
        .into_iter()
        .map(|p| {
            (
                format!("{} ({})", p.display(), fs_type(&p).unwrap_or_default()),
                p,
            )
        })
        .collect()
}

/// The filesystem type of the mount holding `path`, from /proc/self/mounts.
pub fn fs_type(path: &Path) -> Option<String> {
    let path = path.canonicalize().ok()?;
    let mounts = fs::read_to_string("/proc/self/mounts").ok()?;
    let entries = mounts.lines().filter_map(|l| {
        let mut f = l.split(' ');
        let (_, dir, kind) = (f.next()?, f.next()?, f.next()?);
        path.starts_with(dir).then(|| (dir.len(), kind.to_owned()))
    });
    entries.max_by_key(|(len, _)| *len).map(|(_, kind)| kind)
}

/// Why O_DIRECT cannot be used in `dir`, if it cannot.
fn direct_refused(dir: &Path) -> Option<String> {
    let path = dir.join("probe-direct");
    fs::write(&path, [0u8; 4096]).unwrap();
    let opened = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path);
    opened.err().map(|e| format!("O_DIRECT open fails: {e}"))
}

/// Runs `test` in every cell: each filesystem, buffered and O_DIRECT, and each context
/// (Blocking, then in a coroutine). A cell that cannot run here (O_DIRECT refused, no
/// tmpfs) goes through `report_skip`: a note by default, a failure under
/// `COROFUSE_TEST_NO_SKIP=1` (as `.ci/run` sets it), where every cell runs.
pub fn matrix(name: &str, test: fn(&Setup, &Ctx<'_>)) {
    cells(name, &[false, true], test);
}

/// Runs `test` in the O_DIRECT cells only, for what only O_DIRECT does (block locks,
/// bounce buffers): there are no buffered cells for it to pass in untested.
pub fn direct_matrix(name: &str, test: fn(&Setup, &Ctx<'_>)) {
    cells(name, &[true], test);
}

fn cells(name: &str, modes: &[bool], test: fn(&Setup, &Ctx<'_>)) {
    for (place, root) in places() {
        for &direct in modes {
            let dir = Arc::new(tempfile::tempdir_in(&root).unwrap());
            if let Some(why) = direct.then(|| direct_refused(dir.path())).flatten() {
                report_skip(&format!("the O_DIRECT cells on {place}: {why}"));
                continue;
            }
            let mode = if direct { "direct" } else { "buffered" };
            let setup = Setup {
                dir,
                direct,
                label: format!("{place}, {mode}"),
            };
            eprintln!("{name}: {}, blocking", setup.label);
            test(&setup, &Ctx::Blocking);
            eprintln!("{name}: {}, coroutine", setup.label);
            in_coroutine(move |cx| test(&setup, cx));
        }
    }
}

/// Runs `f` in a coroutine of a fresh runtime, panicking if it panicked.
pub fn in_coroutine(f: impl FnOnce(&Ctx<'_>) + 'static) {
    let rt = Runtime::new(Config::default()).unwrap();
    rt.block_on(move |co| f(&Ctx::Coroutine(co))).unwrap();
}

/// Runs `f` once in each context.
pub fn each_ctx(f: fn(&Ctx<'_>)) {
    f(&Ctx::Blocking);
    in_coroutine(f);
}

/// Deterministic bytes that differ by `seed` and never repeat with a short period.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| ((i * 131 + i / 251) as u8).wrapping_add(seed) | 1)
        .collect()
}

/// Writes `data` at `offset` as iovecs of the given lengths (which must add up).
pub fn write_split(
    b: &dyn BlockBackend,
    cx: &Ctx<'_>,
    data: &[u8],
    lens: &[usize],
    offset: u64,
) -> io::Result<()> {
    let mut rest = data;
    let bufs: Vec<IoSlice<'_>> = lens
        .iter()
        .map(|&n| {
            let (head, tail) = rest.split_at(n);
            rest = tail;
            IoSlice::new(head)
        })
        .collect();
    assert!(rest.is_empty());
    b.writev(cx, &bufs, offset)
}

/// Reads `len` bytes at `offset` as iovecs of the given lengths; returns what was read.
pub fn read_split(b: &dyn BlockBackend, cx: &Ctx<'_>, lens: &[usize], offset: u64) -> Vec<u8> {
    let mut out = vec![0xAAu8; lens.iter().sum()];
    let mut rest = &mut out[..];
    let mut bufs = Vec::new();
    for &n in lens {
        let (head, tail) = rest.split_at_mut(n);
        bufs.push(IoSliceMut::new(head));
        rest = tail;
    }
    let n = b.readv(cx, &mut bufs, offset).unwrap();
    out.truncate(n);
    out
}

/// Reads `len` bytes at `offset` into one buffer.
pub fn read(b: &dyn BlockBackend, cx: &Ctx<'_>, len: usize, offset: u64) -> Vec<u8> {
    read_split(b, cx, &[len], offset)
}

/// Bytes allocated to `path`, as `stat` reports them.
pub fn allocated(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    fs::metadata(path).unwrap().blocks() * 512
}

/// The errno of an error.
pub fn errno(e: &io::Error) -> i32 {
    e.raw_os_error()
        .unwrap_or_else(|| panic!("not an OS error: {e}"))
}
