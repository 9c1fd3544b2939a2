//! `corofuse-lab bench load` (hidden): the lab's load generator, one process per cell.
//!
//! Why a separate process: the load must not share a scheduler position, a signal mask
//! or a page cache decision with the lab that starts and stops daemons, and it must be
//! pinnable on its own (`--cpus`). It opens the file with O_DIRECT (a character device
//! such as /dev/zero without: it has no page cache to bypass), runs `--jobs` threads for
//! `--seconds`, each with its own open file, ring and buffers, records every I/O's
//! latency in a preallocated [`Histogram`] per job, merges them and prints one JSON line
//! ([`LoadResult`]) on stdout. Nothing is allocated per I/O.

mod buffer;
mod psync;
mod uring;

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::workload::{Engine, Rw};
use runtime::histogram::Histogram;

pub use buffer::AlignedBuf;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The file to load (normally the mounted export)
    #[arg(long)]
    file: PathBuf,
    #[arg(long, value_enum)]
    rw: Rw,
    /// Bytes per I/O (a multiple of 512)
    #[arg(long, default_value_t = 4096)]
    bs: u64,
    #[arg(long, value_enum, default_value_t = Engine::Psync)]
    engine: Engine,
    /// Requests kept in flight (io_uring only)
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=4096))]
    iodepth: u32,
    /// How long to run
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Bytes of the file to use (default: its size)
    #[arg(long)]
    size: Option<u64>,
    /// Threads, each with its own open file, ring and buffers, and `--iodepth` in
    /// flight (as fio's numjobs); reported together
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    jobs: u32,
    /// Completions to wait for before resubmitting (io_uring; default iodepth/4, at
    /// least 1; 0 never sleeps)
    #[arg(long)]
    reap_min: Option<u32>,
    /// Plain reads and writes on the fd (io_uring; default: registered file and buffers)
    #[arg(long)]
    no_register: bool,
}

/// The one line the load prints; the lab parses it back.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LoadResult {
    pub ops: u64,
    pub bytes: u64,
    pub seconds: f64,
    pub iops: f64,
    pub mb_s: f64,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
    /// CPU time of the load process over its wall time, in percent of one CPU.
    #[serde(default)]
    pub cpu_pct: Option<f64>,
}

impl LoadResult {
    /// Parses the load's stdout: the last line that is a JSON object.
    pub fn parse(stdout: &str) -> Result<LoadResult, String> {
        let line = stdout
            .lines()
            .rev()
            .find(|l| l.trim_start().starts_with('{'))
            .ok_or_else(|| format!("no JSON line in the load's output: {stdout:?}"))?;
        serde_json::from_str(line).map_err(|e| format!("bad load result {line:?}: {e}"))
    }
}

/// What one run does, resolved from [`Args`].
pub struct Spec {
    pub rw: Rw,
    pub bs: u64,
    pub iodepth: usize,
    pub duration: Duration,
    pub blocks: u64,
    /// io_uring: completions to wait for before resubmitting.
    pub reap_min: usize,
    /// io_uring: use a registered file and registered buffers.
    pub registered: bool,
}

/// Running totals of one run.
#[derive(Default)]
pub struct Totals {
    pub ops: u64,
    pub bytes: u64,
}

pub fn run(args: &Args) -> Result<(), String> {
    if args.bs == 0 || args.bs % 512 != 0 {
        return Err(format!("--bs {} is not a multiple of 512", args.bs));
    }
    if !(args.seconds > 0.0 && args.seconds.is_finite()) {
        return Err("--seconds must be positive".into());
    }
    let file = open(args)?;
    let size = match args.size {
        Some(s) => s,
        None => file
            .metadata()
            .map_err(|e| format!("{}: {e}", args.file.display()))?
            .len(),
    };
    let blocks = size / args.bs;
    if blocks == 0 {
        return Err(format!(
            "{} has {size} bytes, less than one block of {}: pass --size",
            args.file.display(),
            args.bs
        ));
    }
    let spec = Spec {
        rw: args.rw,
        bs: args.bs,
        iodepth: args.iodepth as usize,
        duration: Duration::from_secs_f64(args.seconds),
        blocks,
        reap_min: args
            .reap_min
            .map_or((args.iodepth as usize / 4).max(1), |n| n as usize),
        registered: !args.no_register,
    };
    // Every job opens the file itself (its own FUSE file handle, as fio's jobs).
    let mut files = vec![file];
    for _ in 1..args.jobs {
        files.push(open(args)?);
    }
    let cpu0 = cpu_seconds();
    let started = std::time::Instant::now();
    let (totals, hist) = run_jobs(args.engine, &files, &spec)
        .map_err(|e| format!("{} on {}: {e}", args.rw.name(), args.file.display()))?;
    let seconds = started.elapsed().as_secs_f64();
    let cpu_pct = cpu0
        .zip(cpu_seconds())
        .map(|(a, b)| (b - a) / seconds * 100.0);
    let result = summarise(&totals, seconds, &hist, cpu_pct);
    println!(
        "{}",
        serde_json::to_string(&result).map_err(|e| e.to_string())?
    );
    Ok(())
}

/// One thread per file, all started together; their totals added, histograms merged.
fn run_jobs(engine: Engine, files: &[File], spec: &Spec) -> std::io::Result<(Totals, Histogram)> {
    let results: Vec<std::io::Result<(Totals, Histogram)>> = std::thread::scope(|s| {
        let handles: Vec<_> = files
            .iter()
            .enumerate()
            .map(|(job, file)| {
                s.spawn(move || {
                    let mut hist = Histogram::new();
                    let totals = match engine {
                        Engine::Psync => psync::run(file, spec, job, &mut hist),
                        Engine::IoUring => uring::run(file, spec, job, &mut hist),
                    }?;
                    Ok((totals, hist))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(std::io::Error::other("a load job panicked")))
            })
            .collect()
    });
    let mut totals = Totals::default();
    let mut hist = Histogram::new();
    for r in results {
        let (t, h) = r?;
        totals.ops += t.ops;
        totals.bytes += t.bytes;
        hist.merge(&h);
    }
    Ok((totals, hist))
}

/// Opens the target with O_DIRECT, or without it if it is a character device
/// (/dev/zero, /dev/null: no page cache to bypass, and they refuse the flag).
fn open(args: &Args) -> Result<File, String> {
    use std::os::unix::fs::FileTypeExt;
    let char_device = std::fs::metadata(&args.file)
        .map(|m| m.file_type().is_char_device())
        .unwrap_or(false);
    let flags = if char_device { 0 } else { libc::O_DIRECT };
    OpenOptions::new()
        .read(true)
        .write(args.rw.writes())
        .custom_flags(flags)
        .open(&args.file)
        .map_err(|e| format!("cannot open {} with O_DIRECT: {e}", args.file.display()))
}

fn summarise(t: &Totals, seconds: f64, h: &Histogram, cpu_pct: Option<f64>) -> LoadResult {
    let us = |ns: u64| ns as f64 / 1000.0;
    LoadResult {
        ops: t.ops,
        bytes: t.bytes,
        seconds,
        iops: t.ops as f64 / seconds,
        mb_s: t.bytes as f64 / seconds / 1e6,
        mean_us: h.mean() / 1000.0,
        p50_us: us(h.quantile(0.50)),
        p99_us: us(h.quantile(0.99)),
        max_us: us(h.max()),
        cpu_pct,
    }
}

/// User plus system CPU time of this process.
fn cpu_seconds() -> Option<f64> {
    // SAFETY: rusage is plain data, filled by getrusage.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable rusage.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return None;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Some(tv(ru.ru_utime) + tv(ru.ru_stime))
}

/// Offsets of successive I/Os: random aligned blocks from xorshift64*, or sequential
/// blocks wrapping at the end.
pub struct Offsets {
    state: u64,
    next_seq: u64,
    blocks: u64,
    bs: u64,
    random: bool,
}

impl Offsets {
    /// Job `job`'s offsets: its own random sequence, and sequential jobs start spread
    /// over the file.
    pub fn new(spec: &Spec, job: usize) -> Offsets {
        let seed = u64::from(std::process::id()) ^ ((job as u64 + 1) << 32);
        Offsets {
            // xorshift never leaves 0; the constant keeps the state non-zero.
            state: 0x9E37_79B9_7F4A_7C15 ^ seed.wrapping_mul(0xBF58_476D_1CE4_E5B9),
            next_seq: (job as u64).wrapping_mul(spec.blocks / 8 + 1) % spec.blocks,
            blocks: spec.blocks,
            bs: spec.bs,
            random: spec.rw.random(),
        }
    }

    #[inline]
    pub fn next(&mut self) -> u64 {
        let block = if self.random {
            self.state ^= self.state >> 12;
            self.state ^= self.state << 25;
            self.state ^= self.state >> 27;
            self.state.wrapping_mul(0x2545_F491_4F6C_DD1D) % self.blocks
        } else {
            let b = self.next_seq;
            self.next_seq = (b + 1) % self.blocks;
            b
        };
        block * self.bs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(rw: Rw, blocks: u64) -> Spec {
        Spec {
            rw,
            bs: 4096,
            iodepth: 1,
            duration: Duration::from_secs(1),
            blocks,
            reap_min: 1,
            registered: true,
        }
    }

    #[test]
    fn random_offsets_are_aligned_in_range_and_spread() {
        let mut o = Offsets::new(&spec(Rw::Randread, 1000), 0);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..10_000 {
            let off = o.next();
            assert_eq!(off % 4096, 0);
            assert!(off < 1000 * 4096);
            seen.insert(off);
        }
        assert!(seen.len() > 990, "only {} distinct blocks", seen.len());
    }

    #[test]
    fn sequential_offsets_wrap() {
        for rw in [Rw::Write, Rw::Read] {
            let mut o = Offsets::new(&spec(rw, 3), 0);
            let got: Vec<u64> = (0..5).map(|_| o.next() / 4096).collect();
            assert_eq!(got, [0, 1, 2, 0, 1], "{rw:?}");
        }
    }

    #[test]
    fn parses_the_load_line() {
        let out = "warming up\n{\"ops\":363000,\"bytes\":1486848000,\"seconds\":3.0001,\
                   \"iops\":120996.0,\"mb_s\":495.6,\"mean_us\":7.94,\"p50_us\":5.02,\
                   \"p99_us\":21.4,\"max_us\":5193.7,\"cpu_pct\":41.5}\n";
        let r = LoadResult::parse(out).expect("parses");
        assert_eq!(r.ops, 363_000);
        assert_eq!(r.p99_us, 21.4);
        assert_eq!(r.cpu_pct, Some(41.5));
        // Without the optional field, and with garbage.
        let r = LoadResult::parse(
            "{\"ops\":1,\"bytes\":4096,\"seconds\":1,\"iops\":1,\"mb_s\":0.004,\
             \"mean_us\":1,\"p50_us\":1,\"p99_us\":1,\"max_us\":1}",
        )
        .expect("parses");
        assert_eq!(r.cpu_pct, None);
        assert!(LoadResult::parse("error: no such file").is_err());
        assert!(LoadResult::parse("{\"ops\":1}").is_err());
    }

    #[test]
    fn summary_units() {
        let mut h = Histogram::new();
        for _ in 0..10 {
            h.record(20_000);
        }
        let r = summarise(
            &Totals {
                ops: 10,
                bytes: 40960,
            },
            2.0,
            &h,
            None,
        );
        assert_eq!((r.iops, r.mb_s), (5.0, 0.02048));
        assert_eq!(
            (r.mean_us, r.p50_us, r.p99_us, r.max_us),
            (20.0, 20.0, 20.0, 20.0)
        );
    }
}
