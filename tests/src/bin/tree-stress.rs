//! `tree-stress ROOT SEED MILLIS`: one worker of the concurrent tree stress
//! (tests/tests/mount_dir_stress.rs): for MILLIS milliseconds, random creates, appends,
//! renames, unlinks, hard links, mkdirs, rmdirs, stats and listings on a small shared
//! namespace under ROOT, which other workers change at the same time.
//!
//! The namespace keeps kinds apart, so that the only errors a correct file system can
//! give are the races' own: `ROOT/d0`..`d3` are directories the test made (never
//! removed), `dN/s0`..`s2` directories that come and go, and `f0`..`f7` in any of these
//! regular files. So ENOENT (a name or its directory gone), EEXIST (a name taken) and
//! ENOTEMPTY (a directory with files) are expected; any other errno is a failure.
//!
//! Prints one line, `ops N enoent N eexist N enotempty N`, then one line per unexpected
//! error (the first 20), and exits 1 if there was any.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use corofuse_tests::Rng;

const TOP: u64 = 4;
const SUBS: u64 = 3;
const FILES: u64 = 8;

/// A directory that may hold files: a top directory or one of its subdirectories.
fn dir(root: &Path, rng: &mut Rng) -> PathBuf {
    let top = root.join(format!("d{}", rng.below(TOP)));
    match rng.below(3) {
        0 => top,
        _ => top.join(format!("s{}", rng.below(SUBS))),
    }
}

fn sub(root: &Path, rng: &mut Rng) -> PathBuf {
    root.join(format!("d{}/s{}", rng.below(TOP), rng.below(SUBS)))
}

fn file(root: &Path, rng: &mut Rng) -> PathBuf {
    dir(root, rng).join(format!("f{}", rng.below(FILES)))
}

/// One random operation; returns what it did, for an error message.
fn step(root: &Path, rng: &mut Rng) -> (String, io::Result<()>) {
    match rng.below(10) {
        0 => {
            let p = file(root, rng);
            let len = rng.below(4096) as usize;
            let r = OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&p)
                .and_then(|mut f| f.write_all(&vec![b'c'; len]));
            (format!("create {}", p.display()), r)
        }
        1 => {
            let p = file(root, rng);
            let len = 1 + rng.below(512) as usize;
            let r = OpenOptions::new()
                .append(true)
                .open(&p)
                .and_then(|mut f| f.write_all(&vec![b'a'; len]));
            (format!("append to {}", p.display()), r)
        }
        2 => {
            let (from, to) = (file(root, rng), file(root, rng));
            let r = fs::rename(&from, &to);
            (format!("rename {} {}", from.display(), to.display()), r)
        }
        3 => {
            let p = file(root, rng);
            (format!("unlink {}", p.display()), fs::remove_file(&p))
        }
        4 => {
            let (from, to) = (file(root, rng), file(root, rng));
            let r = fs::hard_link(&from, &to);
            (format!("link {} {}", from.display(), to.display()), r)
        }
        5 => {
            let p = sub(root, rng);
            (format!("mkdir {}", p.display()), fs::create_dir(&p))
        }
        6 => {
            let p = sub(root, rng);
            (format!("rmdir {}", p.display()), fs::remove_dir(&p))
        }
        7 => {
            let (from, to) = (sub(root, rng), sub(root, rng));
            let r = fs::rename(&from, &to);
            (format!("rename dir {} {}", from.display(), to.display()), r)
        }
        8 => {
            let p = file(root, rng);
            (
                format!("stat {}", p.display()),
                fs::symlink_metadata(&p).map(drop),
            )
        }
        _ => {
            let p = dir(root, rng);
            let r = fs::read_dir(&p).and_then(|entries| {
                for e in entries {
                    e?;
                }
                Ok(())
            });
            (format!("list {}", p.display()), r)
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, root, seed, millis] = &args[..] else {
        eprintln!("usage: tree-stress ROOT SEED MILLIS");
        std::process::exit(2);
    };
    let root = Path::new(root);
    let (Ok(seed), Ok(millis)) = (seed.parse::<u64>(), millis.parse::<u64>()) else {
        eprintln!("tree-stress: SEED and MILLIS are numbers");
        std::process::exit(2);
    };
    let mut rng = Rng::new(seed);
    let until = Instant::now() + Duration::from_millis(millis);
    let (mut ops, mut enoent, mut eexist, mut enotempty) = (0u64, 0u64, 0u64, 0u64);
    let mut unexpected = Vec::new();
    while Instant::now() < until {
        let (what, result) = step(root, &mut rng);
        ops += 1;
        match result.as_ref().map_err(io::Error::raw_os_error) {
            Ok(()) => {}
            Err(Some(libc::ENOENT)) => enoent += 1,
            Err(Some(libc::EEXIST)) => eexist += 1,
            Err(Some(libc::ENOTEMPTY)) => enotempty += 1,
            Err(_) => unexpected.push(format!("{what}: {}", result.unwrap_err())),
        }
    }
    println!("ops {ops} enoent {enoent} eexist {eexist} enotempty {enotempty}");
    for line in unexpected.iter().take(20) {
        println!("unexpected: {line}");
    }
    if !unexpected.is_empty() {
        println!("{} unexpected errors", unexpected.len());
        std::process::exit(1);
    }
}
