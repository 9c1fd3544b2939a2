//! `corofuse bench`: the measurement lab. With no subcommand it mounts its own exports
//! (null:1G and a 1 GiB raw image on tmpfs), drives each with a matrix of workloads from
//! a separate process, and reports IOPS, bandwidth, latency and what each request cost
//! the daemon (coroutine switches, SQEs, `io_uring_enter` calls, syscalls, CPU).
//!
//! Why a lab inside the binary: the figures that matter (CONTEXT.md) are ratios within
//! one run on one noisy machine, so the comparison (corofuse vs qemu-storage-daemon,
//! built-in load vs fio, one placement vs another) must be one command that anyone can
//! rerun, with nothing to set up but root and /dev/fuse, and that never leaves a mount,
//! a daemon or a 1 GiB file behind.
//!
//! Layout, one job per file:
//! - [`workload`]: the matrix's names; [`load`] (hidden `bench load`): the load
//!   generator, with [`runtime::histogram`];
//! - [`lab`](mod@lab): scratch directory and image; [`daemon`]: start, stats, stop of one export
//!   daemon; [`qsd`]: qemu-storage-daemon's command line; [`fio`]: the fio driver;
//!   [`child`], [`interrupt`], [`mountinfo`], [`affinity`]: process plumbing;
//! - [`matrix`]: runs the cells; [`stats`]: per-request costs from `--stats`;
//!   [`report`]: table, JSON and SVG; [`env`](mod@env): environment and switch cost;
//! - [`stats_cmd`]: `corofuse stats PATH`.

mod affinity;
mod child;
mod daemon;
mod env;
mod fill;
mod fio;
mod interrupt;
mod lab;
mod load;
mod matrix;
mod mountinfo;
mod qsd;
mod report;
mod stats;
pub mod stats_cmd;
mod workload;

use std::path::PathBuf;
use std::time::Instant;

use affinity::{Cpus, Placement};
use workload::{ExportKind, Server};

#[derive(clap::Args)]
#[command(
    args_conflicts_with_subcommands = true,
    after_help = "With no subcommand: run the lab (needs root and /dev/fuse). It mounts \
    null:1G and a 1 GiB raw image on tmpfs with `corofuse mount`, one fresh daemon per \
    run, and drives each with these workloads from a separate process (O_DIRECT):\n  \
    randread-psync-qd1, randwrite-psync-qd1   4 KiB, one blocking I/O at a time\n  \
    randread-uring-qd64, randwrite-uring-qd64 4 KiB, io_uring, 64 in flight\n  \
    write1m-uring-qd4                         1 MiB sequential writes, io_uring, 4 in flight\n\
    The table gives IOPS, MB/s, mean and p99 latency, the daemon's CPU, and from its \
    --stats: coroutine switches, io_uring SQEs, io_uring_enter calls and syscalls per \
    request. Progress goes to stderr. Ctrl-C stops the lab and cleans up.\n\n\
    Examples:\n  corofuse bench\n  corofuse bench --compare-qsd --trials 3 --seconds 5 --svg /tmp/bench.svg\n  \
    corofuse bench --only null --workload randread-psync-qd1 --cpus same --mount-opt \"--poll-us 50\""
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
    Switch(crate::bench_switch::Args),
    /// The load generator the lab runs in a child process (one JSON line on stdout).
    #[command(hide = true)]
    Load(load::Args),
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
    /// Only this export
    #[arg(long, value_enum)]
    only: Option<ExportKind>,
    /// Only this workload (repeatable; default: all five)
    #[arg(long = "workload", value_name = "NAME",
          value_parser = clap::builder::PossibleValuesParser::new(workload::NAMES))]
    workloads: Vec<String>,
    /// Extra options for `corofuse mount`, e.g. "--readers 4" (repeatable)
    #[arg(long = "mount-opt", value_name = "OPTS", allow_hyphen_values = true)]
    mount_opts: Vec<String>,
    /// Pin the daemon (all its threads) and the load: on the same CPU, or on two CPUs.
    /// Default: no pinning. At iodepth 1 this placement decides the result
    #[arg(long, value_enum)]
    cpus: Option<Cpus>,
    /// Drive the matrix with fio instead of the built-in load
    #[arg(long)]
    fio: bool,
    /// Also run qemu-storage-daemon's FUSE export through each cell, interleaved with
    /// corofuse, and print corofuse/qsd ratios
    #[arg(long)]
    compare_qsd: bool,
    /// Print one JSON document (cells, runs, environment, options) instead of the table
    #[arg(long)]
    json: bool,
    /// Also write a bar chart of IOPS per workload as SVG
    #[arg(long, value_name = "PATH")]
    svg: Option<PathBuf>,
    /// Where the lab's scratch directory (mount point, 1 GiB image) goes
    #[arg(long, value_name = "DIR", default_value = "/dev/shm")]
    dir: PathBuf,
}

pub fn run(args: Args) -> Result<(), String> {
    match args.command {
        Some(Command::Switch(a)) => crate::bench_switch::run(&a),
        Some(Command::Load(a)) => load::run(&a),
        None => lab(&args.lab),
    }
}

fn lab(args: &LabArgs) -> Result<(), String> {
    let started = Instant::now();
    if !(args.seconds > 0.0 && args.seconds.is_finite()) {
        return Err("--seconds must be a positive number".into());
    }
    check_privileges()?;
    let mut environment = env::Environment::probe();
    if args.fio {
        environment.fio_version = Some(fio::version()?);
    }
    if args.compare_qsd {
        environment.qsd_version = Some(qsd::version()?);
    }
    let plan = plan(args)?;
    interrupt::install()?;
    let runs = plan.exports.len() * plan.workloads.len() * plan.servers.len() * plan.trials;
    eprintln!(
        "corofuse bench: {runs} runs of {} s (about {:.0} s with setup); Ctrl-C stops and cleans up",
        plan.seconds,
        runs as f64 * (plan.seconds + 0.3) + 2.0
    );
    eprintln!("measuring the one-way coroutine switch (runtime_switch micro-benchmark) ...");
    let switch_ns = env::one_way_switch_ns()?;
    let mut lab = lab::Lab::new(&args.dir)?;
    if plan.exports.contains(&ExportKind::File) {
        eprintln!("writing a 1 GiB image in {} ...", lab.dir().display());
        lab.create_image()?;
    }
    let cells = matrix::run(&plan, &lab)?;
    drop(lab);
    let report = report::Report::new(environment, options(args, &plan), switch_ns, cells);
    if let Some(path) = &args.svg {
        std::fs::write(path, report::svg::render(&report))
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?
        );
    } else {
        print!("{}", report::table::render(&report));
    }
    eprintln!("done in {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

fn plan(args: &LabArgs) -> Result<matrix::Plan, String> {
    let exports = match args.only {
        Some(e) => vec![e],
        None => vec![ExportKind::Null, ExportKind::File],
    };
    let workloads = workload::select(&args.workloads);
    let mount_opts: Vec<String> = args
        .mount_opts
        .iter()
        .flat_map(|o| o.split_whitespace().map(String::from))
        .collect();
    let mut servers = vec![Server::Corofuse];
    if args.compare_qsd {
        servers.push(Server::Qsd);
    }
    Ok(matrix::Plan {
        seconds: args.seconds,
        trials: args.trials as usize,
        exports,
        workloads,
        servers,
        ring_replies: mount_opts.iter().any(|o| o == "--ring-replies"),
        mount_opts,
        placement: args.cpus.map(Placement::choose).transpose()?,
        fio: args.fio,
    })
}

fn options(args: &LabArgs, plan: &matrix::Plan) -> report::Options {
    report::Options {
        seconds: plan.seconds,
        trials: plan.trials,
        load: if plan.fio { "fio" } else { "builtin" },
        compare_qsd: args.compare_qsd,
        exports: plan.exports.clone(),
        workloads: plan.workloads.iter().map(|w| w.name).collect(),
        mount_opts: plan.mount_opts.clone(),
        cpus: args.cpus,
        placement: plan.placement,
    }
}

/// The lab mounts with mount(2): it needs euid 0 and a usable /dev/fuse.
fn check_privileges() -> Result<(), String> {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Err(
            "corofuse bench mounts its own exports and needs root: run it with sudo".into(),
        );
    }
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .map_err(|e| format!("cannot open /dev/fuse: {e} (try `modprobe fuse`)"))?;
    Ok(())
}
