//! The image on real storage (`--storage-dir`): where it goes, when it is written, when
//! it is kept, and the page-cache reset before every run on it.
//!
//! Why a pre-filled image: users run images on disks, and a sparse file is not one.
//! Holes and unwritten extents send O_DIRECT writes down the file system's allocation
//! path (slower, and different from a guest's steady state) and let reads of holes
//! return zeroes without touching the medium. So the image is written in full
//! ([`fill::write_image`], O_DIRECT) before anything measures it.
//!
//! Why keep it: writing [`STORAGE_SIZE`](super::export::STORAGE_SIZE) costs about a
//! second at 2 GB/s but 10-15 s on a hard disk, every run. The image stays in the storage
//! directory as `corofuse-bench.raw` next to a marker, `corofuse-bench.raw.filled`,
//! written only after the whole image reached the disk; a later run reuses the image
//! when the marker names the same size, the file has that size and no holes
//! (`st_blocks`). Runs overwrite blocks in place, so it stays filled. `--refill-image`
//! writes it again; `rm -r DIR` reclaims the space.
//!
//! Why never tmpfs: the storage rows exist to measure a disk next to its ceiling; tmpfs
//! or ramfs is RAM, which the `file` row already measures.
//!
//! Why [`read_once`] before the rows: below a VM's disk the host keeps a cache of its
//! own, which the guest cannot drop. A kept image idle for hours is out of it, and the
//! first row to read it (the `device` row, the ceiling) paid for that alone: the main job
//! measured the device at 6.9k IOPS at qd1 and 9.6k at qd64, then the exports behind it
//! at up to 2.2x and 8.9x "the device". fio on an image idle for 1.5 hours: 8.2k,
//! 14.9k, 21.1k random reads at qd64 in three 3 s runs; one sequential O_DIRECT pass
//! (186 MB/s, 11.5 s) and then 91k and 96k. So every run reads the image once, front
//! to back, before any row measures it: about a second when it is warm. It is not the
//! whole story: in the main job right after this change the device row, which runs
//! after the CPU-bound null and file rows, still made 8.5k and 20.1k, and the disk rows
//! after it 1.1-3.8x that, where the device row run alone after the read makes 20k and
//! 87k. What holds it back there is not found yet (not the cache forgetting the image
//! within a minute: fio 60 s after the read finds it warm). The table marks an O_DIRECT
//! row above the device row (`report::ABOVE_CEILING`) instead of printing its ratio as
//! a verdict.
//!
//! Why [`evict`] before each run: a buffered run leaves dirty and cached pages; without
//! a reset the next run would write them back in its own window, or read from RAM. Each
//! run on the image starts with none of it in the page cache.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

use super::load::AlignedBuf;
use super::{fill, interrupt, lab, mountinfo};

/// The default `--storage-dir`: on the root file system, which survives reboots and is
/// rarely tmpfs (unlike /tmp on many distributions).
pub const DEFAULT_DIR: &str = "/var/tmp/corofuse-bench";

const IMAGE: &str = "corofuse-bench.raw";
const MARKER: &str = "corofuse-bench.raw.filled";

/// `statfs` magic numbers of the file systems that live in RAM.
const TMPFS_MAGIC: u64 = 0x0102_1994;
const RAMFS_MAGIC: u64 = 0x8584_58f6;

/// The image, ready to be measured.
#[derive(Clone, Debug, Serialize)]
pub struct Image {
    pub path: PathBuf,
    pub size: u64,
    /// The file system holding it, from /proc/self/mountinfo ("ext4", "/dev/vda").
    pub fs_type: String,
    pub fs_source: String,
    /// Kept from an earlier run (else written by this one).
    pub reused: bool,
    /// How long writing it took, when this run wrote it.
    pub fill_seconds: Option<f64>,
    /// How long reading it once took ([`read_once`]).
    pub read_seconds: f64,
}

impl Image {
    /// When the image was last completely written: its marker's mtime (the image's own
    /// changes with every write run).
    #[cfg(test)]
    pub fn filled_at(&self) -> Result<std::time::SystemTime, String> {
        let marker = self.path.with_file_name(MARKER);
        std::fs::metadata(&marker)
            .and_then(|m| m.modified())
            .map_err(|e| format!("{}: {e}", marker.display()))
    }
}

/// Checks `dir`'s file system, creates `dir` if needed, and returns a filled image of
/// `size` bytes in it: the kept one if [`reusable`], else a freshly written one.
pub fn prepare(dir: &Path, size: u64, refill: bool) -> Result<Image, String> {
    refuse_memory_fs(dir, fs_magic(&nearest_existing(dir))?)?;
    std::fs::create_dir_all(dir).map_err(|e| {
        format!(
            "cannot create --storage-dir {}: {e} (pass a writable directory)",
            dir.display()
        )
    })?;
    // `dir` may itself be a mount point: check what it really is now that it exists.
    refuse_memory_fs(dir, fs_magic(dir)?)?;
    let (image, marker) = (dir.join(IMAGE), dir.join(MARKER));
    let why_not = if refill {
        Err("--refill-image".to_string())
    } else {
        reusable(size, std::fs::metadata(&image).ok(), marker_text(&marker))
    };
    let fill_seconds = match why_not {
        Ok(()) => {
            eprintln!(
                "reusing {} (filled by an earlier run; --refill-image writes it again)",
                image.display()
            );
            None
        }
        Err(why) => Some(write(&image, &marker, size, &why)?),
    };
    // Its O_DIRECT open also says up front when the file system refuses O_DIRECT.
    let (read, read_seconds) = read_once(&image)?;
    eprintln!(
        "read {} once in {read_seconds:.1} s ({:.0} MB/s), so that the first row on it \
         does not pay alone for a cold cache below it",
        image.display(),
        read as f64 / read_seconds / 1e6
    );
    let (fs_type, fs_source) =
        mountinfo::fs_of(dir).unwrap_or_else(|| ("unknown".into(), "unknown".into()));
    Ok(Image {
        path: image,
        size,
        fs_type,
        fs_source,
        reused: fill_seconds.is_none(),
        fill_seconds,
        read_seconds,
    })
}

/// Reads the whole image once, front to back, with O_DIRECT (the guest's page cache is
/// left as it was): the bytes read and the seconds it took. Stops on Ctrl-C.
fn read_once(image: &Path) -> Result<(u64, f64), String> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(image)
        .map_err(|e| direct_error(image, &e))?;
    let mut buf = AlignedBuf::new(1, fill::CHUNK)?;
    let chunk = buf.as_mut_slice();
    let started = Instant::now();
    let mut read = 0u64;
    loop {
        interrupt::check()?;
        match file.read_at(chunk, read) {
            Ok(0) => break,
            Ok(n) => read += n as u64,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("reading {}: {e}", image.display())),
        }
    }
    Ok((read, started.elapsed().as_secs_f64()))
}

/// Whether the kept image can be measured as it is; the error says why not.
pub fn reusable(
    size: u64,
    image: Option<std::fs::Metadata>,
    marker: Option<String>,
) -> Result<(), String> {
    let meta = image.ok_or("no image yet")?;
    decide(
        size,
        meta.len(),
        meta.blocks().saturating_mul(512),
        marker.as_deref(),
    )
}

/// [`reusable`] on plain numbers: `len` and `allocated` bytes of the image file.
fn decide(size: u64, len: u64, allocated: u64, marker: Option<&str>) -> Result<(), String> {
    match marker {
        None => Err("no marker: it was never completely written".into()),
        Some(m) if m != marker_line(size) => {
            Err(format!("its marker says {:?}, not this size", m.trim()))
        }
        Some(_) if len != size => Err(format!("it has {len} bytes, not {size}")),
        Some(_) if allocated < size => Err(format!(
            "it has holes ({} MiB of {} allocated)",
            allocated >> 20,
            size >> 20
        )),
        Some(_) => Ok(()),
    }
}

fn marker_line(size: u64) -> String {
    format!("corofuse bench image: {size} bytes written, no holes\n")
}

fn marker_text(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// Writes the image with O_DIRECT, then its marker; returns the seconds it took. On any
/// error (Ctrl-C included) the partial image is removed.
fn write(image: &Path, marker: &Path, size: u64, why: &str) -> Result<f64, String> {
    let _ = std::fs::remove_file(marker);
    let _ = std::fs::remove_file(image);
    let dir = image.parent().unwrap_or(Path::new("."));
    lab::check_space(
        dir,
        size,
        "free some space, pass another --storage-dir, or leave out the storage rows \
         (--only null,file)",
    )?;
    eprintln!(
        "writing a {} MiB image in {} ({why}; it is kept for the next runs) ...",
        size >> 20,
        dir.display()
    );
    let started = Instant::now();
    let result = (|| {
        let f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_DIRECT)
            .open(image)
            .map_err(|e| direct_error(image, &e))?;
        fill::write_image(&f, image, size)?;
        f.sync_all()
            .map_err(|e| format!("fsync {}: {e}", image.display()))?;
        let mut m = File::create(marker).map_err(|e| format!("{}: {e}", marker.display()))?;
        m.write_all(marker_line(size).as_bytes())
            .and_then(|()| m.sync_all())
            .map_err(|e| format!("writing {}: {e}", marker.display()))
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(marker);
        let _ = std::fs::remove_file(image);
        return Err(e);
    }
    let seconds = started.elapsed().as_secs_f64();
    eprintln!(
        "wrote {} in {seconds:.1} s ({:.0} MB/s)",
        image.display(),
        size as f64 / seconds / 1e6
    );
    Ok(seconds)
}

fn direct_error(image: &Path, e: &std::io::Error) -> String {
    if e.raw_os_error() == Some(libc::EINVAL) {
        format!(
            "{}: this file system does not support O_DIRECT, which the device and \
             disk-direct rows need: pass a --storage-dir on another one",
            image.display()
        )
    } else {
        format!("{}: {e}", image.display())
    }
}

/// Writes back the image's dirty pages and drops its cached ones (fdatasync, then
/// `POSIX_FADV_DONTNEED`), so that the next run starts from the disk.
pub fn evict(image: &Path) -> Result<(), String> {
    let f = File::open(image).map_err(|e| format!("{}: {e}", image.display()))?;
    f.sync_data()
        .map_err(|e| format!("fdatasync {}: {e}", image.display()))?;
    // SAFETY: posix_fadvise takes an open descriptor and a range; it touches no memory.
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        return Err(format!(
            "posix_fadvise(DONTNEED) on {}: {}",
            image.display(),
            std::io::Error::from_raw_os_error(rc)
        ));
    }
    Ok(())
}

/// The refusal, when `magic` (from statfs) is a file system in RAM.
fn refuse_memory_fs(dir: &Path, magic: u64) -> Result<(), String> {
    let name = match magic {
        TMPFS_MAGIC => "tmpfs",
        RAMFS_MAGIC => "ramfs",
        _ => return Ok(()),
    };
    Err(format!(
        "--storage-dir {} is on {name}, which is RAM: the storage rows measure a disk; \
         pass --storage-dir DIR on a disk file system (default {DEFAULT_DIR}), or \
         leave them out with --only null,file",
        dir.display()
    ))
}

/// `statfs(path).f_type`, the file system's magic number.
fn fs_magic(path: &Path) -> Result<u64, String> {
    let c =
        std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: statfs is plain data, filled by the call.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `st` a writable statfs.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(format!("--storage-dir {}: {e}", path.display()));
    }
    // f_type is signed on some targets: keep the 32 bits the magic numbers use.
    Ok(st.f_type as u64 & 0xffff_ffff)
}

/// `dir`, or its closest ancestor that exists (where `dir` would be created).
fn nearest_existing(dir: &Path) -> PathBuf {
    let absolute = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
    absolute
        .ancestors()
        .find(|p| p.exists())
        .unwrap_or(Path::new("/"))
        .to_path_buf()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Prints `SKIPPED <test>: <why>` past libtest's capture and lets the test pass;
    /// panics instead where `COROFUSE_TEST_NO_SKIP` is set to anything but empty or `0`
    /// (as `.ci/run` sets it), where every test runs. The same words as
    /// `corofuse_tests::require::report_skip`, which this crate does not depend on.
    fn skip(why: &str) {
        use std::io::Write;
        let thread = std::thread::current();
        let test = thread.name().unwrap_or("a test");
        let strict =
            std::env::var("COROFUSE_TEST_NO_SKIP").is_ok_and(|v| !v.is_empty() && v != "0");
        assert!(
            !strict,
            "{test} cannot run: {why}; with COROFUSE_TEST_NO_SKIP=1 (as .ci/run sets it) \
             that is a failure, not a skip"
        );
        let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {why}");
    }

    const MIB: u64 = 1 << 20;

    #[test]
    fn refuses_memory_file_systems_in_one_line() {
        let e = refuse_memory_fs(Path::new("/dev/shm/x"), TMPFS_MAGIC).expect_err("tmpfs");
        assert!(
            e.contains("tmpfs") && e.contains("--storage-dir DIR"),
            "{e}"
        );
        assert!(!e.contains('\n'));
        assert!(refuse_memory_fs(Path::new("/r"), RAMFS_MAGIC).is_err());
        const EXT4_MAGIC: u64 = 0xef53;
        assert!(refuse_memory_fs(Path::new("/var/tmp"), EXT4_MAGIC).is_ok());
    }

    #[test]
    fn refuses_a_real_tmpfs_directory() {
        let shm = Path::new("/dev/shm");
        if fs_magic(shm) != Ok(TMPFS_MAGIC) {
            return skip("/dev/shm is not tmpfs here");
        }
        let dir = shm.join(format!("corofuse-storage-test-{}", std::process::id()));
        let e = prepare(&dir.join("sub"), MIB, false).expect_err("refused");
        assert!(e.contains("is on tmpfs"), "{e}");
        assert!(!dir.exists(), "nothing is created on a refused file system");
    }

    #[test]
    fn decides_when_a_kept_image_is_reusable() {
        let size = 4 * MIB;
        let m = marker_line(size);
        assert_eq!(decide(size, size, size, Some(&m)), Ok(()));
        assert!(decide(size, size, size, None).is_err(), "no marker");
        let other = marker_line(size * 2);
        let e = decide(size, size, size, Some(&other)).expect_err("other size");
        assert!(e.contains("marker"), "{e}");
        assert!(
            decide(size, size / 2, size / 2, Some(&m)).is_err(),
            "length"
        );
        let e = decide(size, size, size / 4, Some(&m)).expect_err("sparse");
        assert!(e.contains("holes"), "{e}");
    }

    #[test]
    fn nearest_existing_ancestor() {
        assert_eq!(
            nearest_existing(Path::new("/proc/no/such/dir")),
            Path::new("/proc")
        );
        assert_eq!(nearest_existing(Path::new("/")), Path::new("/"));
    }

    /// A directory for the fill tests on a file system with O_DIRECT, removed at the end.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Option<Scratch> {
            let base = std::env::temp_dir();
            let dir = base.join(format!("corofuse-{name}-{}", std::process::id()));
            std::fs::create_dir_all(&dir).ok()?;
            let probe = dir.join("probe");
            let direct = OpenOptions::new()
                .write(true)
                .create(true)
                .custom_flags(libc::O_DIRECT)
                .open(&probe)
                .is_ok();
            let _ = std::fs::remove_file(&probe);
            let s = Scratch(dir);
            direct.then_some(s)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn fills_once_then_reuses_and_refills_on_request() {
        let tmp = std::env::temp_dir();
        let Some(s) = Scratch::new("storage") else {
            return skip(&format!("no O_DIRECT in {} (TMPDIR)", tmp.display()));
        };
        let magic = fs_magic(&s.0).expect("statfs of the scratch directory");
        if refuse_memory_fs(&s.0, magic).is_err() {
            return skip(&format!(
                "{} (TMPDIR) is in RAM, and prepare() refuses RAM",
                tmp.display()
            ));
        }
        let size = 9 * MIB; // a whole chunk and a 1 MiB tail
        let first = prepare(&s.0, size, false).expect("fills");
        assert!(!first.reused && first.fill_seconds.is_some());
        let meta = std::fs::metadata(&first.path).expect("image");
        assert_eq!(meta.len(), size);
        assert!(meta.blocks() * 512 >= size, "no holes");
        let data = std::fs::read(&first.path).expect("reads");
        assert!(
            data.iter().all(|&b| b != 0),
            "every byte written, none zero"
        );

        assert_eq!(
            read_once(&first.path).expect("reads").0,
            size,
            "read once: every byte"
        );

        let filled = first.filled_at().expect("marker");
        let second = prepare(&s.0, size, false).expect("reuses");
        assert_eq!(second.filled_at(), Ok(filled), "reuse leaves the marker");
        assert!(second.reused && second.fill_seconds.is_none());
        let third = prepare(&s.0, size, true).expect("refills");
        assert!(!third.reused, "--refill-image writes it again");
        let other = prepare(&s.0, 2 * MIB, false).expect("another size");
        assert!(!other.reused, "a size change rewrites it");
        assert_eq!(
            std::fs::metadata(&other.path).expect("image").len(),
            2 * MIB
        );

        std::fs::remove_file(s.0.join(MARKER)).expect("marker");
        assert!(!prepare(&s.0, 2 * MIB, false).expect("fills").reused);
        evict(&other.path).expect("evicts");
    }
}
