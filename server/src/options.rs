//! [`ServeOptions`]: how a mount is served, whatever the file system, and the choices made
//! from them (how many loops, on which CPUs, which transport).

use std::fmt;
use std::str::FromStr;

use crate::error::{OptionsError, ParseError};

/// Most loops the default `queues` starts.
pub const MAX_DEFAULT_QUEUES: usize = 8;

/// How requests are dispatched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dispatch {
    /// One coroutine per request on an io_uring event loop, suspending on its I/O.
    Coroutine,
    /// Requests one at a time on the loop, with blocking syscalls (QEMU before coroutines).
    Inline,
    /// N worker threads with blocking syscalls (the libfuse model).
    Threads(usize),
}

impl fmt::Display for Dispatch {
    /// As `corofuse mount --dispatch` takes it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dispatch::Coroutine => f.write_str("coroutine"),
            Dispatch::Inline => f.write_str("inline"),
            Dispatch::Threads(n) => write!(f, "threads:{n}"),
        }
    }
}

impl FromStr for Dispatch {
    type Err = ParseError;

    fn from_str(text: &str) -> Result<Dispatch, ParseError> {
        match text {
            "coroutine" => Ok(Dispatch::Coroutine),
            "inline" => Ok(Dispatch::Inline),
            _ => match text.strip_prefix("threads:").map(str::parse::<usize>) {
                Some(Ok(n)) if (1..=256).contains(&n) => Ok(Dispatch::Threads(n)),
                _ => Err(ParseError::Expected(
                    "coroutine, inline or threads:N (N from 1 to 256)".into(),
                )),
            },
        }
    }
}

/// How requests reach the loops. The values and their help are the command line's
/// (`corofuse mount --transport`): clap reads them from here, so they are listed once.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Transport {
    /// Reads of /dev/fuse
    Dev,
    /// FUSE over io_uring (Linux 6.14+ with the fuse module's enable_uring=Y): one queue
    /// of ring entries per CPU; loop i serves the queues of CPUs i, i+N, ...
    Uring,
    /// uring where the kernel offers it, else dev with a warning
    Auto,
}

/// The scheduling class of the loops that serve FUSE over io_uring; the command line's
/// values (`--uring-class`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum UringClass {
    /// The idle class while the loop gets its CPU at once, the normal class while other
    /// work starves it or a deep client crowds it (then floating on the loops' CPUs while
    /// they have room): a client at iodepth 1 stays on its CPU (where a thread may leave
    /// the idle class again: CAP_SYS_NICE or enough RLIMIT_NICE; else normal)
    Idle,
    /// The normal class (nice 0) always
    Normal,
}

/// How a /dev/fuse loop waits for a request when it has nothing else to do (coroutine
/// dispatch); the command line's values (`--idle-wait`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum IdleWait {
    /// A poll on the loop's io_uring, like every other wait
    Ring,
    /// A blocking read(2) on the loop's thread, woken alone by the kernel, and the
    /// request it brings served with blocking calls; a wake-up of the loop ends the read
    Block,
}

/// Which of several /dev/fuse loops take requests (coroutine dispatch); the command
/// line's values (`--placement`), listed here only.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LoopPlacement {
    /// A loop whose CPU the client keeps busy steps back while another loop has room, and
    /// comes back to measure again (see transport::placement)
    Adaptive,
    /// Every loop, always
    All,
}

impl FromStr for Transport {
    type Err = ParseError;

    fn from_str(text: &str) -> Result<Transport, ParseError> {
        parse_value(text)
    }
}

impl FromStr for LoopPlacement {
    type Err = ParseError;

    fn from_str(text: &str) -> Result<LoopPlacement, ParseError> {
        parse_value(text)
    }
}

/// A value as the command line spells it, by the names clap derives from the enum (the
/// one list); the error lists them: "expected dev, uring or auto".
fn parse_value<T: clap::ValueEnum>(text: &str) -> Result<T, ParseError> {
    T::from_str(text, false).map_err(|_| {
        let names: Vec<String> = (T::value_variants().iter())
            .filter_map(|v| v.to_possible_value().map(|p| p.get_name().to_string()))
            .collect();
        match names.split_last() {
            Some((last, [])) => ParseError::Expected(last.clone()),
            Some((last, rest)) => ParseError::Expected(format!("{} or {last}", rest.join(", "))),
            None => ParseError::NoValue,
        }
    })
}

/// How a mount is served. `Default` is what `corofuse mount` does without options.
#[derive(Clone, Debug, PartialEq)]
pub struct ServeOptions {
    /// Other users may access the mount (`allow_other`).
    pub allow_other: bool,
    /// Reads of /dev/fuse kept outstanding per loop.
    pub readers: usize,
    /// Replies through the ring instead of `writev(2)`.
    pub ring_replies: bool,
    /// How requests run.
    pub dispatch: Dispatch,
    /// Adaptive polling window before a loop sleeps, in microseconds (0: never poll).
    pub poll_us: u64,
    /// Event loops (coroutine and inline dispatch). `None`: with coroutine dispatch one per
    /// CPU this process may run on (at most [`MAX_DEFAULT_QUEUES`]), else 1.
    pub queues: Option<usize>,
    /// Pin loop i to the i-th of these CPUs (cycling). `None`: with several loops, loop i
    /// on the i-th CPU this process may run on.
    pub cpus: Option<Vec<usize>>,
    /// How requests reach the loops.
    pub transport: Transport,
    /// Ring entries per CPU queue with FUSE over io_uring.
    pub uring_depth: usize,
    /// Which /dev/fuse loops take requests.
    pub placement: LoopPlacement,
    /// With FUSE over io_uring, the loops serve from the idle scheduling class, guarded
    /// against starvation (`loop_class`): a client at iodepth 1 stays on its CPU.
    pub uring_idle_class: bool,
    /// Per-request accounting per opcode (a few clock reads per request), for
    /// [`Report::ops`](crate::Report::ops).
    pub accounting: bool,
    /// How an idle /dev/fuse loop waits for a request.
    pub idle_wait: IdleWait,
}

impl Default for ServeOptions {
    fn default() -> ServeOptions {
        ServeOptions {
            allow_other: false,
            readers: 2,
            ring_replies: false,
            dispatch: Dispatch::Coroutine,
            poll_us: 0,
            queues: None,
            cpus: None,
            transport: Transport::Dev,
            uring_depth: 64,
            placement: LoopPlacement::Adaptive,
            uring_idle_class: true,
            accounting: false,
            idle_wait: IdleWait::Block,
        }
    }
}

impl ServeOptions {
    /// The combinations refused before anything is opened.
    pub fn check(&self) -> Result<(), OptionsError> {
        if self.transport == Transport::Uring && self.dispatch != Dispatch::Coroutine {
            return Err(OptionsError::UringNeedsCoroutine(self.dispatch));
        }
        if let (Dispatch::Threads(n), Some(2..)) = (self.dispatch, self.queues) {
            return Err(OptionsError::QueuesWithThreads(n));
        }
        if self.readers == 0 || self.uring_depth == 0 {
            return Err(OptionsError::ZeroDepth);
        }
        if let Some(cpus) = &self.cpus {
            let allowed = runtime::affinity::allowed_cpus().map_err(OptionsError::AllowedCpus)?;
            if let Some(&cpu) = cpus.iter().find(|c| !allowed.contains(c)) {
                return Err(OptionsError::CpuNotAllowed { cpu, allowed });
            }
        }
        Ok(())
    }

    /// The loops to run and the CPUs to pin them to, given the CPUs this process may run
    /// on. Several loops are always pinned: unpinned, the one that shares the client's CPU
    /// is not the one that serves it, and FUSE over io_uring, whose queue of CPU c must be
    /// served on c, loses its point.
    pub fn plan_loops(&self, mut allowed: Vec<usize>) -> (usize, Vec<usize>) {
        let n = match (self.queues, self.dispatch) {
            (Some(n), _) => n.max(1),
            (None, Dispatch::Coroutine) => allowed.len().clamp(1, MAX_DEFAULT_QUEUES),
            (None, _) => 1,
        };
        allowed.truncate(n);
        let pin = if n > 1 { allowed } else { Vec::new() };
        (n, self.cpus.clone().unwrap_or(pin))
    }

    /// The dispatch as it runs, spelled as on the command line: the mode, plus the queues
    /// and the transport if not the defaults, e.g. `coroutine --queues 2 --transport uring`.
    /// An event loop's runtime as these options want it: their polling and accounting,
    /// and 128-byte SQEs for FUSE over io_uring.
    pub fn runtime_config(&self, uring: bool) -> runtime::Config {
        runtime::Config {
            poll_ns: self.poll_us * 1000,
            account: self.accounting,
            sqe128: uring,
            ..runtime::Config::default()
        }
    }

    pub fn describe(&self, queues: usize, uring: bool) -> String {
        let mut text = self.dispatch.to_string();
        if queues > 1 {
            text += &format!(" --queues {queues}");
        }
        if uring {
            text += " --transport uring";
        }
        if self.idle_wait == IdleWait::Ring && self.dispatch == Dispatch::Coroutine && !uring {
            text += " --idle-wait ring";
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loops(options: ServeOptions, allowed: &[usize]) -> (usize, Vec<usize>) {
        options.plan_loops(allowed.to_vec())
    }

    fn queues(n: usize) -> ServeOptions {
        ServeOptions {
            queues: Some(n),
            ..ServeOptions::default()
        }
    }

    #[test]
    fn several_loops_are_pinned_one_per_allowed_cpu() {
        let default = ServeOptions::default;
        assert_eq!(loops(default(), &[0, 1]), (2, vec![0, 1]), "the default");
        assert_eq!(loops(queues(2), &[2, 5, 7]), (2, vec![2, 5]));
        assert_eq!(loops(queues(4), &[0, 1]), (4, vec![0, 1]), "cycling");
        assert_eq!(loops(queues(1), &[0, 1]), (1, vec![]), "one loop floats");
        assert_eq!(loops(default(), &[3]), (1, vec![]));
        let cpus = ServeOptions {
            cpus: Some(vec![1, 1]),
            ..queues(2)
        };
        assert_eq!(loops(cpus, &[0, 1]), (2, vec![1, 1]));
        let inline = ServeOptions {
            dispatch: Dispatch::Inline,
            ..default()
        };
        assert_eq!(loops(inline, &[0, 1]), (1, vec![]));
        let many: Vec<usize> = (0..16).collect();
        assert_eq!(loops(default(), &many).0, MAX_DEFAULT_QUEUES);
    }

    #[test]
    fn options_parse_as_the_command_line_spells_them_and_bad_combinations_are_refused() {
        assert_eq!("threads:4".parse(), Ok(Dispatch::Threads(4)));
        assert_eq!(Dispatch::Threads(4).to_string(), "threads:4");
        assert!("threads:0".parse::<Dispatch>().is_err());
        assert_eq!("uring".parse(), Ok(Transport::Uring));
        assert_eq!("all".parse(), Ok(LoopPlacement::All));
        assert_eq!(
            "foo".parse::<Transport>().map_err(|e| e.to_string()),
            Err("expected dev, uring or auto".to_string()),
            "the values clap lists, in the same order"
        );
        assert_eq!(
            "foo".parse::<LoopPlacement>().unwrap_err().to_string(),
            "expected adaptive or all"
        );
        let uring_threads = ServeOptions {
            transport: Transport::Uring,
            dispatch: Dispatch::Threads(2),
            ..ServeOptions::default()
        };
        assert_eq!(
            uring_threads.check().unwrap_err().to_string(),
            "--transport uring needs --dispatch coroutine (not threads:2)"
        );
        let threads_queues = ServeOptions {
            dispatch: Dispatch::Threads(2),
            ..queues(2)
        };
        assert!(threads_queues.check().is_err());
        assert_eq!(
            queues(2).describe(2, true),
            "coroutine --queues 2 --transport uring"
        );
    }
}
