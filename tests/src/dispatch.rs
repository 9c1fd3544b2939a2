//! `--dispatch MODE`: every export test runs once per mode, from one `cargo test`.
//!
//! "Same backends, same results": the export behaves the same whether requests run as
//! coroutines over io_uring, one at a time on the loop (`inline`), or on worker threads
//! with blocking syscalls (`threads:N`, like libfuse). [`dispatch_tests!`](crate::dispatch_tests)
//! turns a test body `fn mount_x(mode: Dispatch)` into one `#[test]` per mode, named
//! `mount_x::coroutine`, `mount_x::inline` and `mount_x::threads`, so that
//! `cargo test -p corofuse-tests ::threads` selects a mode and `mount_x` a test.
//!
//! `COROFUSE_TEST_DISPATCH=inline` (a comma-separated list of `coroutine`, `inline`,
//! `threads` or `threads:N`) runs only those modes' tests, for debugging; the others
//! report `SKIPPED` and pass. `threads:N` also sets the worker count (default
//! [`Dispatch::THREADS`]).

use std::fmt;

use crate::require::{fuse_unavailable, report_deselected, report_skip};

/// The environment variable that restricts the modes run.
pub const ENV: &str = "COROFUSE_TEST_DISPATCH";

/// A value of `corofuse mount --dispatch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dispatch {
    /// `coroutine` (the default): one coroutine per request over io_uring.
    Coroutine,
    /// `inline`: one request at a time on the event loop, blocking syscalls.
    Inline,
    /// `threads:N`: N worker threads, blocking syscalls.
    Threads(u16),
    /// `coroutine` on `--queues N` event loops, each with its own clone of the /dev/fuse fd.
    Queues(u16),
    /// `coroutine` with `--transport uring` (FUSE over io_uring, 4 entries per CPU).
    Uring,
    /// `coroutine` on two loops with `--idle-wait ring`: a loop with nothing else to do
    /// waits for a request through its ring, never in a blocking read (the default's
    /// `block`). Not in [`Dispatch::ALL`]: tests ask for it (`dispatch_tests!(name +ring)`).
    Ring,
}

impl Dispatch {
    /// The threads mode the tests use unless [`ENV`] says otherwise: 4 workers, more
    /// than the CPUs of a small CI machine, so requests really overlap.
    pub const THREADS: Dispatch = Dispatch::Threads(4);

    /// The multi-queue mode the tests use: two loops, as many as a small CI machine has CPUs.
    pub const QUEUES: Dispatch = Dispatch::Queues(2);

    /// Every mode, as the generated tests run them.
    pub const ALL: [Dispatch; 5] = [
        Dispatch::Coroutine,
        Dispatch::Inline,
        Dispatch::THREADS,
        Dispatch::QUEUES,
        Dispatch::Uring,
    ];

    /// The mode's name, as in the generated test names: `coroutine`, `inline`, `threads`,
    /// `queues`.
    pub fn name(self) -> &'static str {
        match self {
            Dispatch::Coroutine => "coroutine",
            Dispatch::Inline => "inline",
            Dispatch::Threads(_) => "threads",
            Dispatch::Queues(_) => "queues",
            Dispatch::Uring => "uring",
            Dispatch::Ring => "ring",
        }
    }

    /// The argument of `--dispatch`, e.g. `threads:4` (`coroutine` for the queues mode).
    pub fn arg(self) -> String {
        match self {
            Dispatch::Threads(n) => format!("threads:{n}"),
            Dispatch::Queues(_) | Dispatch::Uring | Dispatch::Ring => "coroutine".to_string(),
            mode => mode.name().to_string(),
        }
    }

    /// The daemon's arguments for this mode: `--dispatch MODE` and, for the queues mode,
    /// `--queues N`.
    pub fn args(self) -> Vec<String> {
        let mut args = vec!["--dispatch".to_string(), self.arg()];
        match self {
            Dispatch::Queues(n) => args.extend(["--queues".to_string(), n.to_string()]),
            Dispatch::Uring => {
                args.extend(["--transport", "uring", "--uring-depth", "4"].map(String::from))
            }
            Dispatch::Ring => {
                args.extend(["--queues", "2", "--idle-wait", "ring"].map(String::from))
            }
            _ => {}
        }
        args
    }

    /// Whether the daemon runs the coroutine runtime (and so has runtime counters):
    /// `coroutine`, `inline` and `queues` do, `threads:N` does not.
    pub fn has_runtime(self) -> bool {
        !matches!(self, Dispatch::Threads(_))
    }

    /// This mode as [`ENV`] selects it (`threads:N` there sets N), or `None`, after
    /// printing why, if [`ENV`] leaves it out. Panics on a value it cannot parse, so that a
    /// typo does not skip everything quietly.
    pub fn selected(self) -> Option<Dispatch> {
        let Ok(wanted) = std::env::var(ENV) else {
            return Some(self);
        };
        let wanted = wanted.trim();
        if wanted.is_empty() {
            return Some(self);
        }
        let mut chosen = None;
        for item in wanted.split(',').map(str::trim) {
            let mode = parse(item).unwrap_or_else(|| {
                panic!("{ENV}={wanted:?}: {item:?} is not coroutine, inline, threads[:N] or queues[:N]")
            });
            if mode.name() == self.name() {
                // A bare `threads` keeps the default count.
                chosen = Some(if item.contains(':') { mode } else { self });
            }
        }
        if chosen.is_none() {
            report_deselected(&format!("{ENV}={wanted} leaves out {}", self.name()));
        }
        chosen
    }
}

impl fmt::Display for Dispatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.args()[1..].join(" "))
    }
}

fn parse(item: &str) -> Option<Dispatch> {
    match item {
        "coroutine" => Some(Dispatch::Coroutine),
        "inline" => Some(Dispatch::Inline),
        "threads" => Some(Dispatch::THREADS),
        "queues" => Some(Dispatch::QUEUES),
        "uring" => Some(Dispatch::Uring),
        "ring" => Some(Dispatch::Ring),
        _ => {
            let (make, n): (fn(u16) -> Dispatch, _) = match item.split_once(':')? {
                ("threads", n) => (Dispatch::Threads, n),
                ("queues", n) => (Dispatch::Queues, n),
                _ => return None,
            };
            n.parse().ok().filter(|&n| n > 0).map(make)
        }
    }
}

/// What each generated test does: skip (visibly) without FUSE or when [`ENV`] leaves the
/// mode out, else run `test` in `mode`.
pub fn run(test: fn(Dispatch), mode: Dispatch) {
    if let Some(why) = fuse_unavailable() {
        report_skip(&why);
        return;
    }
    if let Some(mode) = mode.selected() {
        // FUSE over io_uring needs the fuse module's switch on for the test's run.
        let _uring = match mode {
            Dispatch::Uring => match crate::uring::EnableUring::acquire() {
                Ok(guard) => Some(guard),
                Err(why) => return report_skip(&format!("--transport uring: {why}")),
            },
            _ => None,
        };
        test(mode);
    }
}

/// One `#[test]` per dispatch mode for a test body `fn NAME(mode: Dispatch)`, in a module
/// `NAME`: tests `NAME::coroutine`, `NAME::inline` and `NAME::threads`. Each skips,
/// saying why, unless FUSE mounts can be made (so the body needs no `require_fuse!`).
///
/// A list restricts the modes, and attributes go on one mode's test only:
///
/// ```no_run
/// use corofuse_tests::{dispatch_tests, Dispatch};
///
/// dispatch_tests!(mount_writes_reach_the_image);
/// dispatch_tests!(mount_reads_return_the_image +ring); // every mode, and `ring`
/// dispatch_tests!(mount_ring_replies_round_trip [coroutine]);
/// dispatch_tests!(mount_stats [coroutine, inline, #[ignore = "BUG: ..."] threads]);
/// # fn mount_writes_reach_the_image(_: Dispatch) {}
/// # fn mount_reads_return_the_image(_: Dispatch) {}
/// # fn mount_ring_replies_round_trip(_: Dispatch) {}
/// # fn mount_stats(_: Dispatch) {}
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! dispatch_tests {
    (@mode coroutine) => {
        $crate::dispatch::Dispatch::Coroutine
    };
    (@mode inline) => {
        $crate::dispatch::Dispatch::Inline
    };
    (@mode threads) => {
        $crate::dispatch::Dispatch::THREADS
    };
    (@mode queues) => {
        $crate::dispatch::Dispatch::QUEUES
    };
    (@mode uring) => {
        $crate::dispatch::Dispatch::Uring
    };
    (@mode ring) => {
        $crate::dispatch::Dispatch::Ring
    };
    ($name:ident) => {
        $crate::dispatch_tests!($name [coroutine, inline, threads, queues, uring]);
    };
    ($name:ident +ring) => {
        $crate::dispatch_tests!($name [coroutine, inline, threads, queues, uring, ring]);
    };
    ($name:ident [$($(#[$attr:meta])* $mode:ident),+ $(,)?]) => {
        mod $name {
            $(
                #[test]
                $(#[$attr])*
                fn $mode() {
                    $crate::dispatch::run(super::$name, $crate::dispatch_tests!(@mode $mode));
                }
            )+
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_modes() {
        assert_eq!(parse("threads"), Some(Dispatch::Threads(4)));
        assert_eq!(parse("threads:8"), Some(Dispatch::Threads(8)));
        assert_eq!(parse("threads:0"), None);
        assert_eq!(parse("bogus"), None);
        assert_eq!(parse("queues:3"), Some(Dispatch::Queues(3)));
        let args: Vec<String> = Dispatch::ALL.iter().map(|m| m.to_string()).collect();
        assert_eq!(
            args,
            [
                "coroutine",
                "inline",
                "threads:4",
                "coroutine --queues 2",
                "coroutine --transport uring --uring-depth 4"
            ]
        );
        for mode in Dispatch::ALL {
            assert_eq!(
                parse(&format!("{}:{}", mode.name(), 2)).is_some(),
                mode.name() == "threads" || mode.name() == "queues"
            );
            assert_eq!(parse(mode.name()).map(|m| m.name()), Some(mode.name()));
        }
    }
}
