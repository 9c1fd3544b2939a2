//! Crash states replayed from a write log (`corofuse crash-check BASE LOG`), checked.
//!
//! Why: killing the daemon loses nothing the page cache holds, so it cannot show an
//! ordering bug; power loss can. From the image as it was before the log (BASE) and a log
//! taken with `--record-writes` ([`crate::record`]), this builds the states a power loss
//! may leave ([`plan`] says which: the image at every flush, and random subsets of each
//! window's unflushed writes, in random order, torn at sector boundaries) and checks each
//! one:
//! - a qcow2 image passes `qemu-img check` (leaked clusters allowed: exit 0 or 3), which
//!   opens it in QEMU;
//! - corofuse opens it writable (repairing it if dirty), and every guest write acknowledged
//!   before the last completed flush reads back as written ([`model`]);
//! - after corofuse closed it, `qemu-img check` again (for every `recheck_every`-th state).
//!
//! Everything is drawn from one seed: the same seed, log and base give the same states.
//! A failing state is shrunk (records removed while it still fails) and reported with the
//! seed. Images are built beside BASE (a backing file named relative to it is found).

pub mod model;
pub mod plan;
mod verify;

pub use verify::{is_qcow2, StateError};

use std::fmt;
use std::fs;
use std::io::{self, IoSliceMut};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::record::format::{self, Record};
use crate::{Ctx, Format, OpenOptions};
use model::{Expect, Model};
use plan::{State, Window};

/// How many states and which.
#[derive(Clone, Debug)]
pub struct Options {
    /// Random states per window (besides the state with every write of it).
    pub states: u32,
    /// The seed everything is drawn from.
    pub seed: u64,
    /// Torn writes are cut at multiples of this (512 or 4096).
    pub sector: u64,
    /// Run `qemu-img check` again after corofuse opened and closed the state, for every
    /// this many states (1: each; 0: never). The state with every write of a window is
    /// always rechecked when this is not 0.
    pub recheck_every: u32,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            states: 20,
            seed: 0,
            sector: 512,
            recheck_every: 1,
        }
    }
}

/// What a run checked.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Records in the log.
    pub records: usize,
    /// Windows (image-level flushes, plus the tail).
    pub windows: usize,
    /// Crash states checked.
    pub states: u64,
    /// Time taken.
    pub elapsed: Duration,
    /// Why the log ended early, if it did (a cut-short log).
    pub truncated: Option<String>,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} crash states of {} windows ({} records) passed in {:.1} s",
            self.states,
            self.windows,
            self.records,
            self.elapsed.as_secs_f64()
        )?;
        match &self.truncated {
            Some(why) => write!(f, "; the log ends early: {why}"),
            None => Ok(()),
        }
    }
}

/// A state that failed, shrunk.
#[derive(Debug)]
pub struct Failure {
    /// The run's seed.
    pub seed: u64,
    /// The window's number (from 0) and the state's within it (0: every write).
    pub window: usize,
    /// The state's number within the window.
    pub state: u32,
    /// The smallest failing state found.
    pub shrunk: State,
    /// What failed (for the shrunk state).
    pub why: StateError,
    /// The records it keeps, described.
    pub kept: Vec<String>,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let w = self.shrunk.window;
        writeln!(
            f,
            "crash state {}:{} (seed {}) fails: {}",
            self.window, self.state, self.seed, self.why
        )?;
        writeln!(
            f,
            "  durable: records below #{}, and the durable writes below #{}; crash before #{}",
            w.start, w.end, w.end
        )?;
        writeln!(
            f,
            "  kept besides ({} records, in this order):",
            self.kept.len()
        )?;
        for k in &self.kept {
            writeln!(f, "    {k}")?;
        }
        Ok(())
    }
}

/// Runs the checker (see the module doc) on the image BASE was before `log`.
pub fn check(base: &Path, log: &Path, opts: &Options) -> Result<Report, Box<CheckError>> {
    let started = Instant::now();
    let file =
        fs::File::open(log).map_err(|e| setup(format!("cannot open {}: {e}", log.display())))?;
    let read = format::read_log(io::BufReader::new(file), &log.display().to_string())
        .map_err(|e| setup(e.to_string()))?;
    let records = read.records;
    let qcow2 = verify::is_qcow2(base).map_err(|e| setup(format!("{}: {e}", base.display())))?;
    let initial =
        guest_bytes(base, qcow2).map_err(|e| setup(format!("{}: {e}", base.display())))?;
    let work = Work::new(base).map_err(|e| setup(format!("{}: {e}", base.display())))?;
    let mut model = Model::new(initial, &records);
    let windows = plan::windows(&records);
    let mut report = Report {
        records: records.len(),
        windows: windows.len(),
        truncated: read.truncated,
        ..Report::default()
    };
    let mut durable_upto = 0;
    let durable = fs::OpenOptions::new()
        .write(true)
        .open(&work.durable)
        .map_err(|e| setup(e.to_string()))?;
    for (k, &w) in windows.iter().enumerate() {
        for r in &records[durable_upto..w.start.max(durable_upto)] {
            if plan::modifies(r) && !r.head.failed() {
                crate::record::replay::apply(&durable, r, 0, r.head.len)
                    .map_err(|e| setup(e.to_string()))?;
            }
        }
        durable_upto = durable_upto.max(w.start);
        let expect = model.at(&records, w.end);
        let mut rng = plan::Rng::new(opts.seed ^ (k as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        for j in 0..=opts.states {
            let state = match j {
                0 => plan::everything(&records, w),
                _ => plan::random(&records, w, opts.sector, &mut rng),
            };
            report.states += 1;
            let recheck = opts.recheck_every != 0 && j % opts.recheck_every == 0;
            let run = |s: &State| work.run(&records, s, qcow2, recheck, &expect);
            if let Err(why) = run(&state) {
                let (shrunk, why) = shrink(state, why, run);
                let kept = describe(&records, &shrunk);
                return Err(Box::new(CheckError::Failed(Failure {
                    seed: opts.seed,
                    window: k,
                    state: j,
                    shrunk,
                    why,
                    kept,
                })));
            }
        }
    }
    report.elapsed = started.elapsed();
    Ok(report)
}

/// Why [`check`] did not pass.
#[derive(Debug)]
pub enum CheckError {
    /// A crash state failed.
    Failed(Failure),
    /// The run could not be made (a file, the log).
    Setup(String),
}

impl fmt::Display for CheckError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CheckError::Failed(failure) => failure.fmt(f),
            CheckError::Setup(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for CheckError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CheckError::Failed(failure) => Some(&failure.why),
            CheckError::Setup(_) => None,
        }
    }
}

fn setup(why: String) -> Box<CheckError> {
    Box::new(CheckError::Setup(why))
}

/// Drops kept records one at a time while the state still fails.
fn shrink(
    mut state: State,
    mut why: StateError,
    run: impl Fn(&State) -> Result<(), StateError>,
) -> (State, StateError) {
    let mut i = 0;
    while i < state.kept.len() {
        let mut smaller = state.clone();
        smaller.kept.remove(i);
        match run(&smaller) {
            Err(e) => (state, why) = (smaller, e),
            Ok(()) => i += 1,
        }
    }
    (state, why)
}

fn describe(records: &[Record], state: &State) -> Vec<String> {
    state
        .kept
        .iter()
        .map(|k| {
            let r = &records[k.index];
            let whole = k.pieces.len() == 1 && k.pieces[0] == (0..r.head.len);
            match whole {
                true => format!("{r}"),
                false => format!("{r}, torn: kept {:?}", k.pieces),
            }
        })
        .collect()
}

/// The guest's bytes in the image at `path` (read-only, through corofuse), in the format
/// the checker found it in (named, so that a qcow2 image's backing file is followed:
/// the checker's user owns the images it is given).
fn guest_bytes(path: &Path, qcow2: bool) -> io::Result<Vec<u8>> {
    let opts = OpenOptions {
        lock: false,
        format: if qcow2 { Format::Qcow2 } else { Format::Raw },
        ..OpenOptions::default()
    };
    let disk = crate::open(path.to_str().unwrap_or_default(), &opts)?;
    let mut bytes = vec![0u8; disk.len() as usize];
    let n = disk.readv(&Ctx::Blocking, &mut [IoSliceMut::new(&mut bytes)], 0)?;
    bytes.truncate(n);
    Ok(bytes)
}

/// The files a run builds, beside the base image; removed at the end.
struct Work {
    durable: PathBuf,
    state: PathBuf,
}

impl Work {
    fn new(base: &Path) -> io::Result<Work> {
        let name = base.file_name().unwrap_or_default().to_string_lossy();
        let dir = base.parent().unwrap_or(Path::new("."));
        let work = Work {
            durable: dir.join(format!(".{name}.crash-durable")),
            state: dir.join(format!(".{name}.crash-state")),
        };
        fs::copy(base, &work.durable)?;
        Ok(work)
    }

    fn run(
        &self,
        records: &[Record],
        state: &State,
        qcow2: bool,
        recheck: bool,
        expect: &Expect,
    ) -> Result<(), StateError> {
        verify::build(records, &self.durable, state, &self.state).map_err(StateError::Build)?;
        verify::check(&self.state, qcow2, recheck, expect)
    }
}

impl Drop for Work {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.durable);
        let _ = fs::remove_file(&self.state);
    }
}

/// The window a state belongs to, for messages.
impl fmt::Display for Window {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "records #{}..#{}", self.start, self.end)
    }
}
