//! `rounds PATH BASE SLOTS CHUNK PACE_MS`: a load of its own process on one file (the
//! NBD reconnect test, tests/tests/mount_nbd.rs, runs several through a mount, so that the
//! test process itself holds no descriptor on it). Round r (from 1) writes
//! `pattern(r, offset, CHUNK)` at `offset = BASE + ((r - 1) % SLOTS) * CHUNK`, reads it back
//! and compares, prints `r` (flushed), then sleeps PACE_MS.
//!
//! It stops at EOF on stdin: fsync, close, `done N` (N rounds), exit 0. Any failure prints
//! `error ...` and exits 1.

use std::fs::OpenOptions;
use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use corofuse_tests::pattern;

fn say(line: &str) {
    let mut out = io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn fail(what: &str, e: impl std::fmt::Display) -> ! {
    say(&format!("error {what}: {e}"));
    std::process::exit(1)
}

fn arg(args: &[String], i: usize, name: &str) -> u64 {
    args[i].parse().unwrap_or_else(|e| fail(name, e))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() != 5 {
        eprintln!("usage: rounds PATH BASE SLOTS CHUNK PACE_MS");
        std::process::exit(64);
    }
    let (base, slots) = (arg(&args, 1, "BASE"), arg(&args, 2, "SLOTS"));
    let (chunk, pace) = (arg(&args, 3, "CHUNK"), arg(&args, 4, "PACE_MS"));
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&args[0])
        .unwrap_or_else(|e| fail("open", e));
    let stop = Arc::new(AtomicBool::new(false));
    let stopper = Arc::clone(&stop);
    std::thread::spawn(move || {
        let _ = io::stdin().read_to_end(&mut Vec::new());
        stopper.store(true, Ordering::Relaxed);
    });
    let mut round = 0u64;
    let mut back = vec![0u8; chunk as usize];
    while !stop.load(Ordering::Relaxed) {
        round += 1;
        let offset = base + ((round - 1) % slots) * chunk;
        let data = pattern(round, offset, chunk as usize);
        let at = |op: &str| format!("round {round}: {op} at {offset}");
        file.write_all_at(&data, offset)
            .unwrap_or_else(|e| fail(&at("write"), e));
        file.read_exact_at(&mut back, offset)
            .unwrap_or_else(|e| fail(&at("read"), e));
        if back != data {
            fail(&at("read back"), "not what was written");
        }
        say(&round.to_string());
        std::thread::sleep(Duration::from_millis(pace));
    }
    file.sync_all().unwrap_or_else(|e| fail("fsync", e));
    drop(file);
    say(&format!("done {round}"));
}
