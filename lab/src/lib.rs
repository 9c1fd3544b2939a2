//! The measurement lab, in its own binary `corofuse-lab` ([`Cli`]): `corofuse-lab bench`
//! (the built-in load over the lab's own exports), `corofuse-lab bench switch` (the
//! runtime's per-operation costs) and `corofuse-lab stats` (a `--stats` file). The shipped
//! `corofuse` links none of it: the lab runs the `corofuse` binary it is given
//! ([`daemon::program`]: `--corofuse PATH`, `$COROFUSE`, or the one beside it) for its
//! export daemons, and re-executes itself for its load processes (the hidden `bench load`)
//! and callgrind runs of `bench switch`.
//!
//! `corofuse-lab bench`: with no subcommand it mounts its own exports (null:1G, a 1 GiB
//! raw image on tmpfs, and a 2 GiB pre-filled image on real storage, buffered and with
//! O_DIRECT, each also with FUSE passthrough), drives each with a matrix of workloads from
//! a separate process, runs the same workloads on /dev/zero and /dev/null (the load's own
//! ceiling) and straight on the storage image (the disk's), and reports IOPS, bandwidth,
//! latency, the ratio to that ceiling, and what each request cost the daemon (coroutine
//! switches, SQEs, `io_uring_enter` calls, syscalls, CPU).
//!
//! Why a lab with a load of its own: the first run needs nothing but root and /dev/fuse
//! (no fio, no peer built), and never leaves a mount, a daemon or a stray image behind;
//! the one file it keeps on purpose is the storage image, reused by the next run
//! ([`storage`]). Comparisons with other servers and with corofuse's explicit
//! configurations are made with fio, the referee, by one script:
//! `benches/export/fio-servers.py` (BENCHMARKS.md names the suite of every table).
//!
//! Layout, one job per file:
//! - [`export`]: the rows; [`workload`]: the matrix's workloads; [`plan`]: the command
//!   line resolved into rows and workloads; [`load`] (hidden `bench load`): the load
//!   generator, with [`runtime::histogram`];
//! - [`lab`](mod@lab): scratch directory and tmpfs image; [`storage`]: the image on real
//!   storage (checked, filled, kept, evicted); [`fill`]: what both images hold;
//!   [`daemon`]: start, stats, stop of one export daemon; [`child`], [`interrupt`],
//!   [`mountinfo`]: process plumbing;
//! - [`matrix`]: runs the cells, in interleaved [`rounds`]; [`stats`]: per-request costs
//!   from `--stats`; [`median`]: every median, range and ratio; [`report`]: table
//!   (comfy-table) and JSON; [`env`](mod@env): environment and switch cost;
//! - [`stats_cmd`]: `corofuse-lab stats PATH`; [`bench_switch`] (`bench switch`): the
//!   runtime's per-operation costs, timed by the kernels of [`switch`]; [`setting`]: a
//!   kernel setting changed for one run.
//!
//! The micro-benchmark kernels ([`switch`]) are here, one copy each: `bench switch` runs
//! every one of them, every lab report turns switch counts into time with one of them
//! (`runtime_switch`, in [`env`](mod@env)), and `corofuse-benches` re-exports [`switch`]
//! for its criterion benches.

// The layout above names the lab's private modules: its docs are for who works on it.
#![allow(rustdoc::private_intra_doc_links)]

mod bench_switch;
mod child;
mod daemon;
mod env;
mod export;
mod fill;
mod interrupt;
mod lab;
mod load;
mod matrix;
mod median;
mod mountinfo;
mod plan;
mod report;
mod rounds;
mod setting;
mod stats;
pub mod stats_cmd;
mod storage;
pub mod switch;
mod workload;

use std::path::PathBuf;
use std::time::Instant;

use export::ExportKind;

/// `corofuse-lab`'s command line.
#[derive(clap::Parser)]
#[command(name = "corofuse-lab", version, about = "corofuse's measurement lab")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Top,
}

#[derive(clap::Subcommand)]
pub enum Top {
    /// Measure the default export against a matrix of workloads, or the runtime (`bench switch`).
    Bench(Box<Args>),
    /// Summarise a `corofuse mount --stats` JSON file.
    Stats(stats_cmd::Args),
}

/// Runs `corofuse-lab` as parsed.
pub fn main(cli: &Cli) -> Result<(), String> {
    match &cli.command {
        Top::Bench(args) => run(args),
        Top::Stats(args) => stats_cmd::run(args),
    }
}

#[derive(clap::Args)]
#[command(
    args_conflicts_with_subcommands = true,
    after_help = "With no subcommand: run the lab (needs root and /dev/fuse). Its rows \
    (--only):\n  \
    local           no FUSE: the same load on /dev/zero (reads) or /dev/null (writes), \
    without O_DIRECT (they refuse it; no page cache): what the load itself can drive, \
    the ceiling of null and file (--only local,null)\n  \
    null            null:1G, the daemon's own cost\n  \
    file            a 1 GiB raw image on tmpfs (--scratch-dir)\n  \
    device          a 2 GiB pre-filled image on real storage (--storage-dir), loaded \
    straight with O_DIRECT, no FUSE: the ceiling of the four below\n  \
    disk            that image exported buffered (corofuse mount -w IMG)\n  \
    disk-direct     that image exported with O_DIRECT (corofuse mount -w --direct IMG)\n  \
    disk-pt, disk-direct-pt   the same two with --passthrough\n\
    Each export runs on a fresh daemon; the load runs in a separate process with \
    O_DIRECT:\n  \
    randread-psync-qd1, randwrite-psync-qd1   4 KiB, one blocking I/O at a time\n  \
    randread-uring-qd64, randwrite-uring-qd64 4 KiB, io_uring, 64 in flight\n  \
    write1m-uring-qd4                         1 MiB sequential writes, io_uring, 4 in flight\n\
    By default local, null and file run these five and the storage rows all but \
    randwrite-psync-qd1: 35 runs, about 125 s. --workload NAME runs exactly the named \
    workloads on every row; --only null,file leaves the storage rows out (~35 s).\n\n\
    The built-in load (io_uring) submits in batches: one io_uring_enter submits every \
    I/O reaped since the last and waits for iodepth/4 completions (DEFER_TASKRUN), with \
    a registered file and buffers; --jobs N runs N threads, each with its own file, \
    ring and iodepth, reported as one row. load% is the load's CPU time / wall time.\n\n\
    The storage image is written once (about a second at 2 GB/s, 10-15 s on a hard \
    disk) and kept as DIR/corofuse-bench.raw with a .filled marker, reused while its \
    size matches; --refill-image writes it again, rm -r DIR removes it. tmpfs and \
    ramfs are refused. Every run on it starts with it out of the page cache.\n\n\
    The table gives IOPS, the ratio to the device row (vs device), MB/s, mean and p99 \
    latency, the daemon's CPU, and from its --stats: coroutine switches, io_uring SQEs, \
    io_uring_enter calls and syscalls per request; cpu us/req is the daemon's CPU time \
    per request. Progress goes to stderr. Ctrl-C stops the lab and cleans up.\n\n\
    Against other servers (qemu-storage-daemon, QEMU's multi-threaded FUSE series, \
    passthrough_hp, NBD, qcow2) and corofuse's explicit configurations, with fio: \
    benches/export/fio-servers.py SUITE (BENCHMARKS.md).\n\n\
    Examples:\n  corofuse-lab bench\n  corofuse-lab bench --trials 3 --seconds 5 --json\n  \
    corofuse-lab bench --only disk-direct --storage-dir /mnt/nvme/bench --workload randwrite-uring-qd64\n  \
    corofuse-lab bench --only null --workload randread-psync-qd1 --mount-opt \"--poll-us 50\""
)]
pub struct Args {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    lab: LabArgs,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Coroutine switch, spawn and io_uring round-trip costs against their floors (JSON).
    Switch(bench_switch::Args),
    /// The load generator the lab runs in a child process (one JSON line on stdout).
    #[command(hide = true)]
    Load(load::Args),
}

#[derive(clap::Args)]
struct LabArgs {
    /// The corofuse binary that serves the exports. Default: $COROFUSE, else the
    /// `corofuse` beside this binary
    #[arg(long, value_name = "PATH")]
    corofuse: Option<PathBuf>,
    /// Seconds of load per run
    #[arg(long, default_value_t = 3.0, value_name = "S")]
    seconds: f64,
    /// Runs per cell, interleaved across cells; medians are reported
    #[arg(long, default_value_t = 1, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    trials: u32,
    /// Only these rows (repeatable or comma-separated). The rows on real storage bring
    /// the device row along (their ceiling). Default: all
    #[arg(long, value_enum, value_delimiter = ',', value_name = "ROW")]
    only: Vec<ExportKind>,
    /// Only this workload, on every row (repeatable; default: the five, four on the
    /// storage rows)
    #[arg(long = "workload", value_name = "NAME",
          value_parser = clap::builder::PossibleValuesParser::new(workload::NAMES))]
    workloads: Vec<String>,
    /// Extra options for `corofuse mount`, e.g. "--readers 4" (repeatable)
    #[arg(long = "mount-opt", value_name = "OPTS", allow_hyphen_values = true)]
    mount_opts: Vec<String>,
    /// Load jobs per run, threads each with their own ring and the workload's iodepth in
    /// flight, reported as one row
    #[arg(long, default_value_t = 1, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=64))]
    jobs: u32,
    /// Print one JSON document (cells, runs, environment, options) instead of the table
    #[arg(long)]
    json: bool,
    /// Where the lab's scratch directory (mount point, the file row's 1 GiB image, logs)
    /// goes
    #[arg(long, value_name = "DIR", default_value = "/dev/shm")]
    scratch_dir: PathBuf,
    /// Directory on the file system the storage rows measure (not tmpfs). The 2 GiB image
    /// written there is kept for the next runs
    #[arg(long, value_name = "DIR", default_value = storage::DEFAULT_DIR)]
    storage_dir: PathBuf,
    /// Write the storage image again even if a filled one is kept
    #[arg(long)]
    refill_image: bool,
}

/// Runs `corofuse-lab bench` as parsed: the lab, or one of its subcommands.
pub fn run(args: &Args) -> Result<(), String> {
    match &args.command {
        Some(Command::Switch(a)) => bench_switch::run(a),
        Some(Command::Load(a)) => load::run(a),
        None => lab(&args.lab),
    }
}

fn lab(args: &LabArgs) -> Result<(), String> {
    let started = Instant::now();
    let plan = plan::build(args, daemon::program(args.corofuse.as_deref())?)?;
    let environment = begin()?;
    interrupt::install()?;
    let page_reporting = setting::hold_page_reporting();
    if page_reporting
        .as_ref()
        .is_some_and(setting::Setting::changed)
    {
        setting::warm_free_memory();
    }
    let storage = if plan.on_storage() {
        Some(storage::prepare(
            &args.storage_dir,
            plan.storage_size,
            args.refill_image,
        )?)
    } else {
        None
    };
    let runs = plan.runs();
    eprintln!(
        "corofuse-lab bench: {runs} runs of {} s (about {:.0} s with setup), exports served by \
         {}; Ctrl-C stops and cleans up",
        plan.seconds,
        runs as f64 * (plan.seconds + 0.3) + 2.0,
        plan.corofuse.display()
    );
    eprintln!("measuring the one-way coroutine switch (runtime_switch micro-benchmark) ...");
    let switch_ns = env::one_way_switch_ns()?;
    let mut lab = lab::Lab::new(&args.scratch_dir)?;
    if plan.exports().contains(&ExportKind::File) {
        eprintln!("writing a 1 GiB image in {} ...", lab.dir().display());
        lab.create_image()?;
    }
    let cells = matrix::run(&plan, &lab, storage.as_ref())?;
    drop(lab);
    let report = report::Report::new(environment, options(&plan), switch_ns, storage, cells);
    emit(&report, args.json, report::table::render)?;
    eprintln!("done in {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

fn options(plan: &plan::Plan) -> report::Options {
    // Every workload some row ran, in table order.
    let workloads = workload::ALL
        .iter()
        .filter(|w| {
            plan.rows
                .iter()
                .any(|r| r.workloads.iter().any(|x| x.name == w.name))
        })
        .map(|w| w.name)
        .collect();
    report::Options {
        seconds: plan.seconds,
        trials: plan.trials,
        jobs: plan.jobs,
        exports: plan.exports(),
        workloads,
        mount_opts: plan.mount_opts.clone(),
    }
}

/// Before a lab plans its runs' setup: checks that it can mount (mount(2) needs euid 0 and
/// a usable /dev/fuse) and probes the environment its report records.
fn begin() -> Result<env::Environment, String> {
    if let Some(why) = fuse::mount::mount_unavailable() {
        return Err(format!(
            "corofuse-lab bench mounts its own exports with mount(2), and cannot here: {why} \
             (run it as root)"
        ));
    }
    Ok(env::Environment::probe())
}

/// `corofuse-lab bench ARGS` parsed into the lab's options (the plans' tests).
#[cfg(test)]
fn parse_lab(args: &[&str]) -> Result<LabArgs, String> {
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        lab: LabArgs,
    }
    let args = std::iter::once("bench").chain(args.iter().copied());
    <Cli as clap::Parser>::try_parse_from(args)
        .map(|c| c.lab)
        .map_err(|e| e.to_string())
}

/// A lab's report on stdout: one JSON document with `--json`, else its `text`.
fn emit<R: serde::Serialize>(report: &R, json: bool, text: fn(&R) -> String) -> Result<(), String> {
    if json {
        let doc = serde_json::to_string_pretty(report).map_err(|e| e.to_string())?;
        println!("{doc}");
    } else {
        print!("{}", text(report));
    }
    Ok(())
}
