//! [`ServeArgs`]: how a mount is served, as `corofuse mount` and `mount-dir` both take it
//! on the command line (clap arguments turned into the server's `ServeOptions`), checked
//! before anything is opened.

use std::path::PathBuf;

use server::{Dispatch, IdleWait, LoopPlacement, ServeOptions, Transport, UringClass};

/// How a mount is served, for `mount` and `mount-dir` alike.
#[derive(clap::Args, Clone, Debug)]
pub struct ServeArgs {
    /// Other users may access the mount
    #[arg(long, help_heading = "Serving")]
    pub allow_other: bool,
    /// Written once the mount is live
    #[arg(long, value_name = "PATH", help_heading = "Diagnostics")]
    pub pidfile: Option<PathBuf>,
    /// Write the runtime's counters as JSON at exit and on SIGUSR1
    #[arg(long, value_name = "PATH", help_heading = "Diagnostics")]
    pub stats: Option<PathBuf>,
    /// Coroutines per loop that read /dev/fuse (each waits on it when idle)
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=256), help_heading = "Serving")]
    pub readers: u16,
    /// Send replies through io_uring instead of writev(2)
    #[arg(long, help_heading = "Serving")]
    pub ring_replies: bool,
    /// How requests run: `coroutine` (one per request, suspending on io_uring), `inline`
    /// (one at a time on the loop, blocking syscalls) or `threads:N` (N worker threads,
    /// blocking syscalls, like libfuse)
    #[arg(long, default_value = "coroutine", help_heading = "Serving")]
    pub dispatch: Dispatch,
    /// Spin up to this long for the next request before sleeping (0: never). The window
    /// adapts (QEMU's poll-max-ns): it grows while requests come quickly and drops to 0
    /// after a long idle wait, so an idle export burns no CPU
    #[arg(
        long,
        value_name = "MICROSECONDS",
        default_value_t = 0,
        help_heading = "Serving"
    )]
    pub poll_us: u64,
    /// Event loops (coroutine and inline dispatch): N threads, each with its own clone of
    /// the /dev/fuse fd, its own io_uring, coroutine and buffer pools. With N > 1, loop i
    /// is pinned to the i-th CPU this process may run on (cycling; `--cpus` to choose).
    /// Default: with coroutine dispatch, one per CPU this process may run on (at most 8;
    /// measured best: BENCHMARKS.md), but 1 for an NBD image (the server does the storage
    /// work); with inline dispatch, 1
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=256), help_heading = "Serving")]
    pub queues: Option<u16>,
    /// Pin loop i to the i-th CPU of this comma-separated list (cycling), e.g. 0,1
    #[arg(long, value_name = "LIST", value_parser = parse_cpus, help_heading = "Serving")]
    pub cpus: Option<Cpus>,
    /// How requests reach the loops
    #[arg(long, value_enum, default_value_t = Transport::Dev, help_heading = "Serving")]
    pub transport: Transport,
    /// Ring entries per CPU queue with `--transport uring`
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u16).range(1..=1024), help_heading = "Serving")]
    pub uring_depth: u16,
    /// Which of several /dev/fuse loops take requests (coroutine dispatch)
    #[arg(long, value_enum, default_value_t = LoopPlacement::Adaptive, help_heading = "Serving")]
    pub placement: LoopPlacement,
    /// Scheduling class of the loops with `--transport uring`
    #[arg(long, value_enum, default_value_t = UringClass::Idle, help_heading = "Serving")]
    pub uring_class: UringClass,
    /// How a /dev/fuse loop with nothing else to do waits for the next request
    /// (coroutine dispatch)
    #[arg(long, value_enum, default_value_t = IdleWait::Block, help_heading = "Serving")]
    pub idle_wait: IdleWait,
}

impl ServeArgs {
    /// Checks what can be checked before anything is opened: the serving options, and that
    /// `--pidfile` and `--stats` can be written where they say.
    pub fn check(&self) -> Result<(), String> {
        self.options().check().map_err(|e| e.to_string())?;
        if let Some(path) = &self.pidfile {
            crate::pidfile::check_writable("--pidfile", path)?;
        }
        if let Some(path) = &self.stats {
            crate::pidfile::check_writable("--stats", path)?;
        }
        Ok(())
    }

    /// The serving options these arguments say.
    pub fn options(&self) -> ServeOptions {
        ServeOptions {
            allow_other: self.allow_other,
            readers: usize::from(self.readers),
            ring_replies: self.ring_replies,
            dispatch: self.dispatch,
            poll_us: self.poll_us,
            queues: self.queues.map(usize::from),
            cpus: self.cpus.clone().map(|c| c.0),
            transport: self.transport,
            uring_depth: usize::from(self.uring_depth),
            placement: self.placement,
            uring_idle_class: self.uring_class == UringClass::Idle,
            // Per-request accounting is on when there is somewhere to write it.
            accounting: self.stats.is_some(),
            idle_wait: self.idle_wait,
        }
    }
}

/// A `--cpus` list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cpus(Vec<usize>);

fn parse_cpus(text: &str) -> Result<Cpus, String> {
    let cpus: Result<Vec<usize>, _> = text.split(',').map(|c| c.trim().parse()).collect();
    match cpus {
        Ok(cpus) if !cpus.is_empty() => Ok(Cpus(cpus)),
        _ => Err("expected CPU numbers separated by commas, e.g. 0,1".into()),
    }
}
