//! Readdir at 1,000 / 10,000 / 100,000 entries through a real mount: whether the time per
//! entry stays flat (the listing is linear), with the three times side by side that the
//! 9p n-square bug needed before anyone saw it: the driver's own time (getdents64 on the
//! source), the whole requests' time (READDIR/READDIRPLUS in the daemon) and the client's.
//!
//! `cargo bench -p corofuse-dir --bench readdir` (root and /dev/fuse; the tree is made in
//! `$TMPDIR`, on a real file system by default). Each size is listed `ROUNDS` times, both
//! as `ls` (names only: READDIR, or READDIRPLUS without stats) and as `ls -l` (names and a
//! stat each: READDIRPLUS fills the attributes); medians are printed.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::time::Instant;

use std::sync::Arc;

use dir_export::{DirFs, DirOptions, ListingStats};
use server::{Background, Dispatch, ServeOptions, Target};

const ROUNDS: usize = 5;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    if let Some(why) = fuse::mount::mount_unavailable() {
        eprintln!("readdir bench: it mounts, and cannot here: {why}");
        std::process::exit(2);
    }
    println!("entries  listing  client ns/entry  daemon ns/entry  getdents ns/entry  requests  getdents calls");
    for n in [1_000usize, 10_000, 100_000] {
        let source = tempfile::tempdir().expect("temp dir");
        let dir = source.path().join("d");
        fs::create_dir(&dir).unwrap();
        for i in 0..n {
            fs::File::create(dir.join(format!("entry-{i:06}"))).unwrap();
        }
        let mnt = tempfile::tempdir().expect("mountpoint");
        // Caching off in effect: each round is a fresh mount, so every listing reaches the
        // daemon.
        for stat in [false, true] {
            let (mut client, mut daemon, mut driver) = (Vec::new(), Vec::new(), Vec::new());
            let (mut requests, mut calls) = (0, 0);
            for _ in 0..ROUNDS {
                let fs = DirFs::new(source.path(), DirOptions::default()).expect("source");
                let target = Target {
                    mountpoint: mnt.path().to_path_buf(),
                    name: source.path().display().to_string(),
                    directory: true,
                    read_only: false,
                };
                let options = ServeOptions {
                    dispatch: Dispatch::Threads(2),
                    ..ServeOptions::default()
                };
                let mounted = Background::start(Arc::new(fs), &target, &options).expect("mount");
                let started = Instant::now();
                let (mut seen, mut failed) = (0usize, None);
                for e in fs::read_dir(mounted.path().join("d")).unwrap() {
                    let e = e.unwrap();
                    if stat {
                        match e.metadata() {
                            Ok(m) => drop(std::hint::black_box(m.ino())),
                            Err(err) => failed = failed.or(Some(err)),
                        }
                    }
                    seen += 1;
                }
                let took = started.elapsed().as_nanos() as f64;
                assert_eq!(seen, n);
                if let Some(err) = failed {
                    println!("{n:>7}  ls -l    failed: {err} (a descriptor per node held; the open-file limit is below {n})");
                    break;
                }
                let l: ListingStats = {
                    // RELEASEDIR has reached the daemon once read_dir's handle closed;
                    // give the worker a moment to account it.
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    mounted.fs().listing_stats()
                };
                client.push(took / n as f64);
                daemon.push(l.request_ns as f64 / n as f64);
                driver.push(l.streams.getdents_ns as f64 / n as f64);
                (requests, calls) = (l.requests, l.streams.getdents);
            }
            if client.is_empty() {
                continue;
            }
            println!(
                "{n:>7}  {:<7}  {:>15.0}  {:>15.0}  {:>17.0}  {requests:>8}  {calls:>14}",
                if stat { "ls -l" } else { "ls" },
                median(client),
                median(daemon),
                median(driver),
            );
        }
    }
}
