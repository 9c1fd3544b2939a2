//! [`Foreground`]: the life of a foreground export (`corofuse mount`, `mount-dir`) once
//! its mount is live: the pidfile written, SIGINT/SIGTERM/SIGHUP stop it (a second one
//! gives up on requests waiting for a remote server), SIGUSR1 writes `--stats`, an
//! unmount from outside ends it; then the export removed (its mount gone, its storage
//! flushed and free), `--stats` written a last time, the pidfile removed.
//!
//! The export itself is served as every export is (`server::Exports`, on loops of its
//! own): this adds only what a foreground daemon owes its caller.

use std::path::PathBuf;

use server::{Background, Report, ServeHandle, Served};
use transport::FileSystem;

use crate::model::Sections;
use crate::serve_args::ServeArgs;
use crate::signals::SignalFd;

/// Reads the file system's own `--stats` sections (by name), at any time.
pub type ReportFn = Box<dyn Fn() -> Sections + Send + Sync>;

/// One live foreground export, and what its life writes.
pub struct Foreground {
    pidfile: Option<PathBuf>,
    stats: StatsFile,
    handle: ServeHandle,
}

impl Foreground {
    /// The export served by `served`, shown as `name` in `--stats`, its file system's
    /// sections read by `report`.
    pub fn new<F: FileSystem>(
        args: &ServeArgs,
        name: &str,
        served: &Background<F>,
        report: ReportFn,
    ) -> Foreground {
        Foreground {
            pidfile: args.pidfile.clone(),
            stats: StatsFile {
                path: args.stats.clone(),
                name: name.to_string(),
                dispatch: served.dispatch().to_string(),
                report,
            },
            handle: served.handle().clone(),
        }
    }

    /// Writes the pidfile and serves until a stop signal or the unmount; then `remove`
    /// takes the export out (returning once its mount is gone) and `--stats` is written.
    /// `signals` must have been made before the file system started any thread of its
    /// own, so that every thread has the handled signals blocked ([`SignalFd::new`]).
    pub fn serve(
        self,
        signals: SignalFd,
        remove: impl FnOnce() -> Option<Served>,
    ) -> Result<(), String> {
        // The final statistics, and how serving ended in the words the command line prints.
        let finish = || match remove() {
            Some(served) => (served.report, served.result.map_err(|e| e.to_string())),
            None => (
                Report::default(),
                Err("the export was gone already".to_string()),
            ),
        };
        // Removed when this returns, after the unmount.
        let written = (self.pidfile.as_deref())
            .map(|path| {
                crate::pidfile::PidFile::write(path)
                    .map_err(|e| format!("cannot write pidfile {}: {e}", path.display()))
            })
            .transpose();
        let _pidfile = match written {
            Ok(pidfile) => pidfile,
            Err(e) => {
                let _ = finish();
                return Err(e);
            }
        };
        crate::signals::watch(&signals, &self.handle, &self.stats);
        let (report, result) = finish();
        self.stats.write(&report);
        result
    }
}

/// Where `--stats` goes and what it says besides the serving counters.
pub struct StatsFile {
    path: Option<PathBuf>,
    name: String,
    dispatch: String,
    report: ReportFn,
}

impl StatsFile {
    /// Writes `--stats`, if asked for, with `served` and the file system's sections.
    pub fn write(&self, served: &Report) {
        let Some(path) = &self.path else { return };
        // Counted before this snapshot's own copies below.
        let allocations = crate::alloc_count::allocations();
        let stats = daemon_stats::Stats {
            image: self.name.clone(),
            dispatch: self.dispatch.clone(),
            runtime: served.runtime,
            queue: served.queue,
            sections: (self.report)(),
            allocations,
            ops: served.ops.clone(),
            per_queue: served.per_queue.clone(),
            placement: served.placement.clone(),
        };
        crate::out_file::write_stats(path, &stats);
    }
}
