//! `corofuse bench` (the measurement lab) and `corofuse stats`, as a library: the
//! `corofuse` command parses its command line with [`Args`] and [`stats_cmd::Args`] and
//! calls [`run`] and [`stats_cmd::run`]. The lab's child processes (export daemons, the
//! hidden `bench load` and `bench dir-client`, callgrind runs of `bench switch`)
//! re-execute that binary (`std::env::current_exe()`), so these entry points are meant
//! to run inside `corofuse` only.
//!
//! `corofuse bench`: with no subcommand it mounts its own exports
//! (null:1G, a 1 GiB raw image on tmpfs, and a 2 GiB pre-filled image on real storage,
//! buffered and with O_DIRECT), drives each with a matrix of workloads from a separate
//! process, runs the same workloads on /dev/zero and /dev/null (the load's own ceiling)
//! and straight on the storage image (the disk's), and
//! reports IOPS, bandwidth, latency, the ratio to that ceiling, and what each request
//! cost the daemon (coroutine switches, SQEs, `io_uring_enter` calls, syscalls, CPU).
//!
//! Why a lab inside the binary: the figures that matter (CONTEXT.md) are ratios within
//! one run on one noisy machine, so the comparison (corofuse vs qemu-storage-daemon,
//! an export vs the disk under it, built-in load vs fio, one placement vs another) must
//! be one command that anyone can rerun, with nothing to set up but root and /dev/fuse,
//! and that never leaves a mount, a daemon or a stray image behind. The one file it
//! keeps on purpose are the storage image, reused by the next run ([`storage`]), and the
//! qcow2 row's conversion of it ([`qcow2`]).
//!
//! Layout, one job per file:
//! - [`export`]: the rows and who serves them; [`workload`]: the matrix's workloads;
//!   [`plan`]: the command line resolved into rows and workloads; [`load`] (hidden
//!   `bench load`): the load generator, with [`runtime::histogram`];
//! - [`lab`](mod@lab): scratch directory and tmpfs image; [`storage`]: the image on real
//!   storage (checked, filled, kept, evicted); [`fill`]: what both images hold;
//!   [`qcow2`]: the qcow2 rows' images (qemu-img); [`nbd`]: the nbd row's qemu-nbd;
//!   [`daemon`]: start, stats, stop of one
//!   export daemon; [`qsd`]: qemu-storage-daemon's command line; [`fio`]: the fio
//!   driver; [`child`], [`interrupt`], [`mountinfo`], [`affinity`]: process plumbing;
//! - [`matrix`]: runs the cells, in the interleaved [`rounds`] that `--dir` ([`dir`]) runs
//!   too; [`stats`]: per-request costs from `--stats`; [`median`]: every median, range
//!   and ratio; [`report`]: table (comfy-table), JSON and SVG (by hand: plotters would
//!   lose the per-bar hover titles);
//!   [`env`](mod@env): environment and switch cost;
//! - [`stats_cmd`]: `corofuse stats PATH`; [`bench_switch`] (`bench switch`): the
//!   runtime's per-operation costs, timed by the kernels of [`switch`]; [`setting`]: a
//!   kernel setting changed for one run.
//!
//! Why the micro-benchmark kernels ([`switch`]) are here rather than in the
//! `corofuse-benches` crate: they are part of what the binary ships. `corofuse bench
//! switch` runs every one of them, and every lab report turns switch counts into time with
//! one of them (`runtime_switch`, in [`env`](mod@env)). Left in `corofuse-benches`, they
//! linked that crate into the server binary; a `bench switch` behind an off-by-default
//! feature would have left the documented command missing from the default build, and
//! the switch cost still needed a kernel. So the one copy of each kernel lives here, using
//! nothing `corofuse` does not already link (the runtime, corosensei, io-uring, the
//! transport's accounting, tempfile), and `corofuse-benches` re-exports [`switch`] for its
//! criterion benches: it depends on the lab, and nothing shipped depends on it.

// The layout above names the lab's private modules: its docs are for who works on it.
#![allow(rustdoc::private_intra_doc_links)]

mod affinity;
mod bench_switch;
mod child;
mod daemon;
mod dir;
mod env;
mod export;
mod fill;
mod fio;
mod interrupt;
mod lab;
mod load;
mod matrix;
mod median;
mod mountinfo;
mod nbd;
mod plan;
mod qcow2;
mod qsd;
mod report;
mod rounds;
mod setting;
mod stats;
pub mod stats_cmd;
mod storage;
pub mod switch;
mod variant;
mod workload;

use std::path::PathBuf;
use std::time::Instant;

use affinity::Cpus;
use export::{ExportKind, STORAGE_SIZE};

#[derive(clap::Args)]
#[command(
    args_conflicts_with_subcommands = true,
    after_help = "With no subcommand: run the lab (needs root and /dev/fuse). Its rows \
    (--only):\n  \
    local         no FUSE: the same load on /dev/zero (reads) or /dev/null (writes), \
    without O_DIRECT (they refuse it; no page cache): what the load itself can drive, \
    the ceiling of null and file (--only local,null)\n  \
    null          null:1G, the daemon's own cost\n  \
    file          a 1 GiB raw image on tmpfs (--scratch-dir)\n  \
    device        a 2 GiB pre-filled image on real storage (--storage-dir), loaded \
    straight with O_DIRECT, no FUSE: the ceiling of the next two\n  \
    disk          that image exported buffered (corofuse mount -w IMG)\n  \
    disk-direct   that image exported with O_DIRECT (corofuse mount -w --direct IMG)\n  \
    qcow2         opt-in: a fully allocated qcow2 image (qemu-img convert of that image, \
    64 KiB clusters, kept beside it) exported buffered; brings disk along, its raw export \
    (vs raw = IOPS / disk's; target >= 0.80x on reads)\n  \
    qcow2-alloc   opt-in: an empty qcow2 image (qemu-img create before every run), write \
    workloads only: allocating writes\n  \
    nbd           opt-in: that raw image served by qemu-nbd on a unix socket (-f raw \
    --cache=writeback --aio=io_uring --persistent --shared=0, started for every run) and \
    mounted as nbd+unix:///?socket=SOCK (qsd: driver=nbd); beside it fio's nbd engine \
    straight at the same qemu-nbd, no FUSE: its limit (vs limit), where fio has the engine\n\
    Each export runs on a fresh daemon; the load runs in a separate process with \
    O_DIRECT:\n  \
    randread-psync-qd1, randwrite-psync-qd1   4 KiB, one blocking I/O at a time\n  \
    randread-uring-qd64, randwrite-uring-qd64 4 KiB, io_uring, 64 in flight\n  \
    write1m-uring-qd4                         1 MiB sequential writes, io_uring, 4 in flight\n\
    By default local, null and file run these five and the three storage rows all but \
    randwrite-psync-qd1: 27 runs, about 95 s. --workload NAME runs exactly the named \
    workloads on every row; --only null,file leaves the storage rows out (~35 s). The \
    qcow2 rows (and device and disk beside them) run the five and read1m-uring-qd4 \
    (1 MiB sequential reads); qcow2-alloc its writes only: --only qcow2,qcow2-alloc \
    --compare-qsd is 36 runs, about 2 min, and needs qemu-img. The nbd row runs the same \
    six: --only nbd --compare-qsd is 18 runs (about 1 min), and needs qemu-nbd.\n\n\
    The built-in load (io_uring) submits in batches: one io_uring_enter submits every \
    I/O reaped since the last and waits for iodepth/4 completions (DEFER_TASKRUN), with \
    a registered file and buffers; --jobs N runs N threads, each with its own file, \
    ring and iodepth (fio: --numjobs N --group_reporting), reported as one row. \
    load% is the load's CPU time / wall time.\n\n\
    The storage image is written once (about a second at 2 GB/s, 10-15 s on a hard \
    disk) and kept as DIR/corofuse-bench.raw with a .filled marker, reused while its \
    size matches; --refill-image writes it again, rm -r DIR removes it. tmpfs and \
    ramfs are refused. Every run on it starts with it out of the page cache.\n\n\
    The table gives IOPS, the ratio to the device row (vs device), MB/s, mean and p99 \
    latency, the daemon's CPU, and from its --stats: coroutine switches, io_uring SQEs, \
    io_uring_enter calls and syscalls per request; cpu us/req is the daemon's CPU time \
    per request (qsd's too), so that IOPS bought with CPU shows. --queues 1,2 and \
    --transport dev,uring run each corofuse configuration (their product) through every \
    mounted cell, interleaved, with vs base (IOPS over the first) and the best marked; \
    uring turns the fuse module's enable_uring on for the run and restores it. With --compare-qsd, \
    qemu-storage-daemon runs every export too (aio=io_uring; cache.direct=on for \
    disk-direct). Progress goes to stderr. Ctrl-C stops the lab and cleans up.\n\n\
    Examples:\n  corofuse bench\n  corofuse bench --compare-qsd --trials 3 --seconds 5 --svg /tmp/bench.svg\n  \
    corofuse bench --only disk-direct --storage-dir /mnt/nvme/bench --workload randwrite-uring-qd64\n  \
    corofuse bench --only null --workload randread-psync-qd1 --cpus same --mount-opt \"--poll-us 50\"\n  \
    corofuse bench --only null,file --queues 1,2 --transport dev,uring --compare-qsd --trials 3\n\n\
    --dir benchmarks the directory export instead (corofuse mount-dir, beside libfuse's \
    passthrough_hp when --passthrough-hp PATH or COROFUSE_PASSTHROUGH_HP names its binary): \
    create/stat/unlink of --files small files, ls -l and find, readdir at --entries \
    sizes with the driver's and the requests' time beside the client's, fio 4 KiB random \
    IOPS at qd1 and qd64 and 1 MiB random writes by 16 jobs at qd64, on a scratch tree in \
    --storage-dir (a real file system), every row on a fresh mount, servers interleaved:\n  \
    corofuse bench --dir --trials 5 --passthrough-hp /path/to/passthrough_hp"
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
    /// The client of `--dir`'s metadata and readdir rows (one JSON line on stdout).
    #[command(hide = true)]
    DirClient(dir::ClientArgs),
}

#[derive(clap::Args)]
struct LabArgs {
    /// Seconds of load per run
    #[arg(long, default_value_t = 3.0, value_name = "S")]
    seconds: f64,
    /// Runs per cell, interleaved across cells; medians are reported
    #[arg(long, default_value_t = 1, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    trials: u32,
    /// Only these rows (repeatable or comma-separated). The rows on real storage bring
    /// the device row along (their ceiling; not nbd, whose limit is fio's nbd engine),
    /// qcow2 the disk row (its raw export). Default: all but qcow2, qcow2-alloc and nbd
    #[arg(long, value_enum, value_delimiter = ',', value_name = "ROW")]
    only: Vec<ExportKind>,
    /// Only this workload, on every row but reads on qcow2-alloc (repeatable; default:
    /// the five, four on the storage rows, six on nbd and beside the qcow2 row)
    #[arg(long = "workload", value_name = "NAME",
          value_parser = clap::builder::PossibleValuesParser::new(workload::NAMES))]
    workloads: Vec<String>,
    /// Extra options for `corofuse mount`, e.g. "--readers 4" (repeatable)
    #[arg(long = "mount-opt", value_name = "OPTS", allow_hyphen_values = true)]
    mount_opts: Vec<String>,
    /// Pin the daemon (all its threads) and the load: on the same CPU, or on two CPUs; or
    /// only the load (on the last CPU; the daemon's loops pin themselves). Default: no
    /// pinning. At iodepth 1 this placement decides the result
    #[arg(long, value_enum)]
    cpus: Option<Cpus>,
    /// Drive the matrix with fio instead of the built-in load
    #[arg(long)]
    fio: bool,
    /// Load jobs per run, each with the workload's iodepth in flight (built-in: threads
    /// with their own ring; fio: --numjobs), reported as one row
    #[arg(long, default_value_t = 1, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=64))]
    jobs: u32,
    /// corofuse variants: run every mounted cell once per queue count in this list
    /// (`mount --queues N`; times each --transport), side by side. Default: the daemon's
    #[arg(long, value_delimiter = ',', value_name = "LIST",
          value_parser = clap::value_parser!(u16).range(1..=256))]
    queues: Vec<u16>,
    /// corofuse variants: run every mounted cell once per transport in this list
    /// (`mount --transport`), e.g. dev,uring; uring turns the fuse module's enable_uring on
    /// for the run and restores it. Default: the daemon's (dev)
    #[arg(
        long = "transport",
        value_enum,
        value_delimiter = ',',
        value_name = "LIST"
    )]
    transports: Vec<variant::Transport>,
    /// Also run qemu-storage-daemon's FUSE export through each cell, interleaved with
    /// corofuse, and print corofuse/qsd ratios
    #[arg(long)]
    compare_qsd: bool,
    /// The qemu-storage-daemon binary to compare with (implies --compare-qsd), e.g. a
    /// newer QEMU built from source. Default: the one on the PATH
    #[arg(long, value_name = "PATH")]
    qsd: Option<PathBuf>,
    /// Give qsd's FUSE export N iothreads (`--object iothread,id=iotK` and
    /// `iothread.K=iotK`, the list form of QEMU's multi-threaded FUSE export); implies
    /// --compare-qsd. Default: qsd's main loop, as it ships
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=64))]
    qsd_iothreads: Option<u32>,
    /// Print one JSON document (cells, runs, environment, options) instead of the table
    #[arg(long)]
    json: bool,
    /// Also write a bar chart of IOPS per workload as SVG
    #[arg(long, value_name = "PATH")]
    svg: Option<PathBuf>,
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
    /// MiB of the storage image (and of the qcow2 rows' virtual disks), for tests that
    /// run a tiny lab; a kept image of another size is written again
    #[arg(long, hide = true, value_name = "MIB", default_value_t = STORAGE_SIZE >> 20,
          value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    storage_mib: u64,
    #[command(flatten)]
    dir: dir::DirArgs,
}

/// Runs `corofuse bench` as parsed: the lab, or one of its subcommands.
pub fn run(args: &Args) -> Result<(), String> {
    match &args.command {
        Some(Command::Switch(a)) => bench_switch::run(a),
        Some(Command::Load(a)) => load::run(a),
        Some(Command::DirClient(a)) => dir::client(a),
        None if args.lab.dir.enabled => dir::run(&args.lab),
        None => lab(&args.lab),
    }
}

fn lab(args: &LabArgs) -> Result<(), String> {
    let started = Instant::now();
    let mut plan = plan::build(args)?;
    let mut environment = begin()?;
    if args.fio {
        environment.fio_version = Some(fio::version()?);
    }
    if plan.compare_qsd {
        environment.qsd_version = Some(qsd::version(&plan.qsd)?);
    }
    if plan.uses_qcow2() {
        environment.qemu_img_version = Some(qcow2::version()?);
    }
    if plan.uses_nbd() {
        environment.qemu_nbd_version = Some(nbd::version()?);
        plan.nbd_limit = fio::has_nbd_engine();
        if plan.nbd_limit {
            environment.fio_version = Some(fio::version()?);
        } else {
            eprintln!(
                "corofuse bench: warning: fio with its nbd engine was not found (fio \
                 --enghelp=nbd): the nbd row runs without its limit"
            );
        }
    }
    let _uring = arm(plan.uses_uring())?;
    let storage = if plan.on_storage() {
        let mut image = storage::prepare(&args.storage_dir, plan.storage_size, args.refill_image)?;
        if image.reused {
            eprintln!(
                "reusing {} (filled by an earlier run; --refill-image writes it again)",
                image.path.display()
            );
        }
        if plan.rows.iter().any(|r| r.export == ExportKind::Qcow2) {
            let qcow2 = qcow2::prepare_allocated(&image.path, image.size, image.filled_at()?)?;
            if qcow2.reused {
                eprintln!(
                    "reusing {} (converted by an earlier run from the raw image)",
                    qcow2.path.display()
                );
            }
            image.qcow2 = Some(qcow2);
        }
        Some(image)
    } else {
        None
    };
    let runs = plan.runs();
    eprintln!(
        "corofuse bench: {runs} runs of {} s (about {:.0} s with setup); Ctrl-C stops and cleans up",
        plan.seconds,
        runs as f64 * (plan.seconds + 0.3) + 2.0
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
    let report = report::Report::new(environment, options(args, &plan), switch_ns, storage, cells);
    if let Some(path) = &args.svg {
        std::fs::write(path, report::svg::render(&report))
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    emit(&report, args.json, report::table::render)?;
    if let Some(warning) = plan.one_load_warning() {
        eprintln!("{warning}");
    }
    eprintln!("done in {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

fn options(args: &LabArgs, plan: &plan::Plan) -> report::Options {
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
        load: if plan.fio { "fio" } else { "builtin" },
        jobs: plan.jobs,
        compare_qsd: plan.compare_qsd,
        exports: plan.exports(),
        workloads,
        variants: plan.variants.clone(),
        mount_opts: plan.mount_opts.clone(),
        cpus: args.cpus,
        placement: plan.placement,
    }
}

/// Before a lab plans its runs' setup: checks that it can mount (mount(2) needs euid 0 and
/// a usable /dev/fuse) and probes the environment its report records.
fn begin() -> Result<env::Environment, String> {
    if let Some(why) = fuse::mount::mount_unavailable() {
        return Err(format!(
            "corofuse bench mounts its own exports with mount(2), and cannot here: {why} \
             (run it as root)"
        ));
    }
    Ok(env::Environment::probe())
}

/// Before a lab's first mount: Ctrl-C stops it cleanly from now on, and FUSE over io_uring
/// is on for the run when a variant uses it (until the switch returned is dropped).
fn arm(uses_uring: bool) -> Result<Option<variant::UringSwitch>, String> {
    interrupt::install()?;
    uses_uring.then(variant::UringSwitch::enable).transpose()
}

/// `corofuse bench ARGS` parsed into the lab's options (the plans' tests).
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
