//! The errors of mounting and serving, one type per concern: a value of the command line
//! refused ([`ParseError`]), serving options refused ([`OptionsError`]), a mount that
//! could not be made ([`MountError`]), an export refused ([`ExportError`]), how serving
//! ended ([`ServeError`]).
//!
//! Why typed: a caller can tell the cases apart (and reach the `io::Error` through
//! [`Error::source`]) instead of parsing text. Their `Display` is the text the command
//! line prints, which users and tests compare, so it is kept word for word.

use std::error::Error;
use std::fmt;
use std::io;

use fuse::mount::ENABLE_URING;

use crate::options::Dispatch;

/// A value the command line spells was not one of those accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParseError {
    /// What is accepted, e.g. `dev, uring or auto`.
    Expected(String),
    /// The type accepts no value at all.
    NoValue,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParseError::Expected(what) => write!(f, "expected {what}"),
            ParseError::NoValue => f.write_str("no value is accepted"),
        }
    }
}

impl Error for ParseError {}

/// Serving options refused before anything is opened ([`crate::ServeOptions::check`]).
#[derive(Debug)]
pub enum OptionsError {
    /// FUSE over io_uring with a dispatch other than coroutines.
    UringNeedsCoroutine(Dispatch),
    /// `--queues` with worker threads, which have their queues already.
    QueuesWithThreads(usize),
    /// `--readers` or `--uring-depth` is 0.
    ZeroDepth,
    /// The CPUs this process may run on could not be read.
    AllowedCpus(io::Error),
    /// A CPU of `--cpus` this process may not run on, and those it may.
    CpuNotAllowed { cpu: usize, allowed: Vec<usize> },
}

impl fmt::Display for OptionsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OptionsError::UringNeedsCoroutine(dispatch) => write!(
                f,
                "--transport uring needs --dispatch coroutine (not {dispatch})"
            ),
            OptionsError::QueuesWithThreads(n) => write!(
                f,
                "--queues is for coroutine and inline dispatch; threads:{n} serves {n} queues already"
            ),
            OptionsError::ZeroDepth => f.write_str("--readers and --uring-depth must be at least 1"),
            OptionsError::AllowedCpus(e) => {
                write!(f, "cannot read the CPUs this process may run on: {e}")
            }
            OptionsError::CpuNotAllowed { cpu, allowed } => {
                let allowed: Vec<String> = allowed.iter().map(usize::to_string).collect();
                write!(
                    f,
                    "--cpus: CPU {cpu} is not one this process may run on ({})",
                    allowed.join(",")
                )
            }
        }
    }
}

impl Error for OptionsError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            OptionsError::AllowedCpus(e) => Some(e),
            _ => None,
        }
    }
}

/// The fuse module does not offer FUSE over io_uring: why, and how to turn it on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UringOff {
    /// The module's switch is missing (an older kernel), rather than `N`.
    pub missing: bool,
}

impl fmt::Display for UringOff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "FUSE over io_uring is off ({ENABLE_URING} is {}); enable it with `echo Y > {ENABLE_URING}` \
             as root (Linux 6.14+)",
            if self.missing { "missing" } else { "N" }
        )
    }
}

impl Error for UringOff {}

/// A mount that could not be made and started ([`crate::Server::mount`],
/// [`crate::Background::start`]).
#[derive(Debug)]
pub enum MountError {
    /// The serving options were refused.
    Options(OptionsError),
    /// `--transport uring` while the fuse module does not offer it.
    UringOff(UringOff),
    /// The kernel answered INIT without FUSE over io_uring (`--transport uring`).
    UringNotOffered { kernel_minor: u32 },
    /// The eventfd that carries commands to the server.
    EventFd(io::Error),
    /// mount(2) or fusermount3; its text says which.
    Mount(io::Error),
    /// The INIT exchange.
    Handshake(io::Error),
    /// The thread that serves a mount in the background.
    ServingThread(io::Error),
}

impl fmt::Display for MountError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MountError::Options(e) => e.fmt(f),
            MountError::UringOff(off) => {
                write!(f, "--transport uring: {off}, or use --transport dev")
            }
            MountError::UringNotOffered { kernel_minor } => write!(
                f,
                "--transport uring: the kernel (FUSE 7.{kernel_minor}) did not offer FUSE over \
                 io_uring; use --transport dev"
            ),
            MountError::EventFd(e) => write!(f, "eventfd: {e}"),
            MountError::Mount(e) => e.fmt(f),
            MountError::Handshake(e) => write!(f, "FUSE handshake: {e}"),
            MountError::ServingThread(e) => write!(f, "starting the serving thread: {e}"),
        }
    }
}

impl Error for MountError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            // Shown as their own text: their source is the next link.
            MountError::Options(e) => e.source(),
            MountError::Mount(e) => e.source(),
            MountError::UringOff(off) => Some(off),
            MountError::EventFd(e) | MountError::Handshake(e) | MountError::ServingThread(e) => {
                Some(e)
            }
            MountError::UringNotOffered { .. } => None,
        }
    }
}

impl From<OptionsError> for MountError {
    fn from(e: OptionsError) -> MountError {
        MountError::Options(e)
    }
}

/// An export refused ([`crate::Exports::add`], [`crate::Exports::add_on`]).
#[derive(Debug)]
pub enum ExportError {
    /// An export with this id is live.
    InUse(String),
    /// A shared loop asked for that the set does not have.
    NoLoop { missing: usize, loops: usize },
    /// The mount failed.
    Mount(MountError),
}

impl fmt::Display for ExportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExportError::InUse(id) => write!(f, "export id '{id}' is already in use"),
            ExportError::NoLoop { missing, loops } => {
                write!(f, "no event loop {missing}: the shared set has {loops}")
            }
            ExportError::Mount(e) => e.fmt(f),
        }
    }
}

impl Error for ExportError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            ExportError::Mount(e) => e.source(),
            _ => None,
        }
    }
}

impl From<MountError> for ExportError {
    fn from(e: MountError) -> ExportError {
        ExportError::Mount(e)
    }
}

/// How serving ended when it did not end well ([`crate::Served::result`]).
#[derive(Debug)]
pub enum ServeError {
    /// The mount failed ([`crate::serve`]).
    Mount(MountError),
    /// The event loops of a mount served alone did not start.
    StartLoops(io::Error),
    /// The session's part on shared loop `at` did not start.
    StartLoop { at: usize, source: io::Error },
    /// The worker threads did not start.
    StartWorkers { threads: usize, source: io::Error },
    /// [`crate::Server::serve_on`] was given no loop.
    NoLoop,
    /// [`crate::Server::serve_on`] with worker threads.
    ThreadsCannotShare,
    /// The session's part on loop `index` failed.
    Loop { index: usize, source: io::Error },
    /// A loop failed (its error logged), the others were stopped, the mount is gone.
    LoopFailed,
    /// A loop ended without saying how.
    LeftSession,
    /// Reads of /dev/fuse failed; the mount is gone.
    Stream { failed_reads: u64 },
    /// The final flush of the file system (named).
    Flush { what: String, source: io::Error },
    /// The unmount of the mount point (shown).
    Unmount { path: String, source: io::Error },
    /// The thread serving in the background panicked.
    Panicked,
    /// The background serving was already finished.
    AlreadyFinished,
}

impl fmt::Display for ServeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServeError::Mount(e) => e.fmt(f),
            ServeError::StartLoops(e) => write!(f, "starting the event loops: {e}"),
            ServeError::StartLoop { at, source } => {
                write!(f, "starting event loop {at}: {source}")
            }
            ServeError::StartWorkers { threads, source } => {
                write!(f, "starting {threads} worker threads: {source}")
            }
            ServeError::NoLoop => f.write_str("no event loop to serve on"),
            ServeError::ThreadsCannotShare => {
                f.write_str("worker threads (threads:N) cannot share event loops")
            }
            ServeError::Loop { index, source } => write!(f, "loop {index}: {source}"),
            ServeError::LoopFailed => f.write_str("an event loop failed (see above); unmounted"),
            ServeError::LeftSession => f.write_str("an event loop left the session"),
            ServeError::Stream { failed_reads } => write!(
                f,
                "the request stream from /dev/fuse failed ({failed_reads} failed reads, see \
                 above); unmounted"
            ),
            ServeError::Flush { what, source } => write!(f, "the final flush of {what}: {source}"),
            ServeError::Unmount { path, source } => write!(f, "unmount {path}: {source}"),
            ServeError::Panicked => f.write_str("the serving thread panicked"),
            ServeError::AlreadyFinished => f.write_str("already finished"),
        }
    }
}

impl Error for ServeError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            ServeError::Mount(e) => e.source(),
            ServeError::StartLoops(source)
            | ServeError::StartLoop { source, .. }
            | ServeError::StartWorkers { source, .. }
            | ServeError::Loop { source, .. }
            | ServeError::Flush { source, .. }
            | ServeError::Unmount { source, .. } => Some(source),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_texts_are_the_command_lines_and_the_io_error_is_the_source() {
        let flush = ServeError::Flush {
            what: "the image".into(),
            source: io::Error::from_raw_os_error(libc::EIO),
        };
        assert!(flush
            .to_string()
            .starts_with("the final flush of the image: "));
        let source = flush.source().expect("the io::Error");
        assert_eq!(
            source
                .downcast_ref::<io::Error>()
                .and_then(io::Error::raw_os_error),
            Some(libc::EIO)
        );
        let off = MountError::UringOff(UringOff { missing: true });
        assert!(off
            .to_string()
            .starts_with("--transport uring: FUSE over io_uring is off"));
        assert!(off.to_string().ends_with(", or use --transport dev"));
        assert!(off.source().is_some_and(|s| s.is::<UringOff>()));
        let in_use = ExportError::InUse("a".into());
        assert_eq!(in_use.to_string(), "export id 'a' is already in use");
        let cpus = OptionsError::CpuNotAllowed {
            cpu: 9,
            allowed: vec![0, 1],
        };
        assert_eq!(
            MountError::from(cpus).to_string(),
            "--cpus: CPU 9 is not one this process may run on (0,1)"
        );
    }
}
