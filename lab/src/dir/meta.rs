//! The client side of `--dir`'s metadata and readdir rows: plain system calls from the
//! lab's own process through the mount, timed as a whole and divided per operation.
//!
//! They run in a child of the lab (hidden `corofuse bench dir-client`, [`Args`]), which
//! times itself and prints one JSON line: a client stuck in a FUSE request (a daemon bug
//! is what the lab may find) is then killed at a timeout or Ctrl-C instead of hanging the
//! lab with its mount. Why our own calls, not `ls`/`find`/a script: the time is the
//! system calls' alone (no process start, no output formatting), identical for every
//! server, and a failure is one errno at one known file, which the report prints per row. `ls -l` is a listing
//! and an lstat of every entry (what `ls -l` does), `find` a recursive listing that
//! decides what to descend into by `d_type` (what `find` does with no predicate).
//!
//! A phase stops at its first error: with the directory export's one descriptor per
//! node the kernel holds, a run of 100,000 creates or stats can hit the open-file limit
//! (EMFILE), which the error names with the limit.

use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};

/// What a client run does (`bench dir-client --op`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Op {
    Create,
    Stat,
    Unlink,
    /// List and lstat every entry.
    LsL,
    Find,
    /// List, names only.
    List,
}

impl Op {
    pub fn name(self) -> &'static str {
        match self {
            Op::Create => "create",
            Op::Stat => "stat",
            Op::Unlink => "unlink",
            Op::LsL => "ls-l",
            Op::Find => "find",
            Op::List => "list",
        }
    }
}

/// `corofuse bench dir-client`: one timed phase, its [`Timed`] as a JSON line on stdout.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[arg(long, value_enum)]
    op: Op,
    /// The directory (through the mount)
    #[arg(long)]
    dir: PathBuf,
    /// Files `f0` .. `f{N-1}` (create, stat, unlink)
    #[arg(long, default_value_t = 0)]
    files: u64,
}

pub fn run(args: &Args) -> Result<(), String> {
    let t = phase(args.op, &args.dir, args.files);
    println!("{}", serde_json::to_string(&t).map_err(|e| e.to_string())?);
    Ok(())
}

/// Runs one phase here, in this process.
pub fn phase(op: Op, dir: &Path, files: u64) -> Timed {
    match op {
        Op::Create => create(dir, files),
        Op::Stat => stat(dir, files),
        Op::Unlink => unlink(dir, files),
        Op::LsL => ls_l(dir),
        Op::Find => find(dir),
        Op::List => list(dir),
    }
}

/// What one timed phase did.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Timed {
    /// Operations that succeeded.
    pub ops: u64,
    pub seconds: f64,
    /// Why it stopped early.
    pub error: Option<String>,
}

/// The file names the metadata rows use: `f0`, `f1`, ...
fn name(i: u64) -> String {
    format!("f{i}")
}

/// Runs `op` on `dir/f0` .. `dir/f{n-1}` in order, until the first error.
fn each(dir: &Path, n: u64, what: &str, op: impl Fn(&Path) -> io::Result<()>) -> Timed {
    let mut path = PathBuf::from(dir);
    let started = Instant::now();
    for i in 0..n {
        path.push(name(i));
        let result = op(&path);
        path.pop();
        if let Err(e) = result {
            return Timed {
                ops: i,
                seconds: started.elapsed().as_secs_f64(),
                error: Some(describe(&e, &format!("{what} of file {i} of {n}"))),
            };
        }
    }
    Timed {
        ops: n,
        seconds: started.elapsed().as_secs_f64(),
        error: None,
    }
}

/// Creates (and closes) `n` empty files in `dir`, mode 0644.
fn create(dir: &Path, n: u64) -> Timed {
    each(dir, n, "create", |p| {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(p)
            .map(drop)
    })
}

/// `stat` of the first `n` files.
fn stat(dir: &Path, n: u64) -> Timed {
    each(dir, n, "stat", |p| std::fs::metadata(p).map(drop))
}

/// `unlink` of the first `n` files.
fn unlink(dir: &Path, n: u64) -> Timed {
    each(dir, n, "unlink", |p| std::fs::remove_file(p))
}

/// Times `f`, which counts what it does in its argument, until done or its error.
fn counted(f: impl FnOnce(&mut u64) -> Result<(), String>) -> Timed {
    let started = Instant::now();
    let mut ops = 0;
    let result = f(&mut ops);
    Timed {
        ops,
        seconds: started.elapsed().as_secs_f64(),
        error: result.err(),
    }
}

/// Lists `dir`, calling `each` on every entry (`.` and `..` are not listed).
fn listing(
    dir: &Path,
    ops: &mut u64,
    mut each: impl FnMut(&std::fs::DirEntry, &mut u64) -> Result<(), String>,
) -> Result<(), String> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| describe(&e, &format!("opendir {}", dir.display())))?;
    for entry in entries {
        let entry = entry.map_err(|e| describe(&e, &format!("readdir after {ops} entries")))?;
        *ops += 1;
        each(&entry, ops)?;
    }
    Ok(())
}

/// Lists `dir` (names only).
fn list(dir: &Path) -> Timed {
    counted(|ops| listing(dir, ops, |_, _| Ok(())))
}

/// `ls -l`: list `dir`, lstat each entry.
fn ls_l(dir: &Path) -> Timed {
    counted(|ops| {
        listing(dir, ops, |entry, ops| {
            std::fs::symlink_metadata(entry.path())
                .map(drop)
                .map_err(|e| describe(&e, &format!("lstat of entry {ops}")))
        })
    })
}

/// `find dir`: every entry below `dir`, directories descended by `d_type`.
fn find(dir: &Path) -> Timed {
    fn walk(dir: &Path, ops: &mut u64) -> Result<(), String> {
        listing(dir, ops, |entry, ops| {
            let kind = entry
                .file_type()
                .map_err(|e| describe(&e, &format!("type of entry {ops}")))?;
            if kind.is_dir() {
                walk(&entry.path(), ops)?;
            }
            Ok(())
        })
    }
    counted(|ops| walk(dir, ops))
}

/// `what: error`, and for EMFILE/ENFILE why a passthrough hits it.
pub fn describe(e: &io::Error, what: &str) -> String {
    match e.raw_os_error() {
        Some(libc::EMFILE | libc::ENFILE) => format!(
            "{what}: {e} (the daemon holds a descriptor per node the kernel keeps; the \
             open-file hard limit here is {})",
            nofile_hard_limit().map_or_else(|| "unknown".into(), |n| n.to_string())
        ),
        _ => format!("{what}: {e}"),
    }
}

fn nofile_hard_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the limits into `limit`, a valid rlimit.
    (unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0).then_some(limit.rlim_max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_on_a_plain_directory() {
        let dir = tempfile::tempdir().expect("temp dir");
        let d = dir.path();
        let c = create(d, 50);
        assert_eq!((c.ops, c.error.as_deref()), (50, None));
        assert_eq!(stat(d, 50).ops, 50);
        assert_eq!(ls_l(d).ops, 50);
        assert_eq!(list(d).ops, 50);
        std::fs::create_dir(d.join("sub")).expect("mkdir");
        std::fs::write(d.join("sub/x"), b"").expect("write");
        assert_eq!(find(d).ops, 52, "50 files, sub and sub/x");
        let again = create(d, 3);
        assert_eq!(again.ops, 0);
        let e = again.error.expect("exists");
        assert!(e.starts_with("create of file 0 of 3: "), "{e}");
        assert_eq!(unlink(d, 50).ops, 50);
        let gone = stat(d, 1);
        assert!(gone
            .error
            .is_some_and(|e| e.contains("stat of file 0 of 1")));
        assert!(list(&d.join("missing")).error.is_some());
    }

    #[test]
    fn emfile_names_the_limit() {
        let e = describe(
            &io::Error::from_raw_os_error(libc::EMFILE),
            "create of file 9",
        );
        assert!(e.contains("a descriptor per node"), "{e}");
        assert!(e.contains("open-file hard limit here is"), "{e}");
        let e = describe(&io::Error::from_raw_os_error(libc::ENOENT), "stat");
        assert!(!e.contains("descriptor"), "{e}");
    }
}
