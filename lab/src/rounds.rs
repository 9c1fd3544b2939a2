//! The interleaved order of the lab's runs, the progress line, and starting and stopping a
//! daemon with the lab's files.
//!
//! Why this order: trials are the outer loop and, within a group, its members run back
//! to back, first to last on even trials and last to first on odd ones: noise from the
//! shared machine falls on every cell alike instead of hitting one, and no member always
//! runs first (on a warm or a cold page cache).

use std::path::Path;

use crate::daemon::{Daemon, Paths};
use crate::lab::Lab;

/// One run: trial, group, and the index of the server within the group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    pub trial: usize,
    pub group: usize,
    pub server: usize,
}

/// The interleaved order (module docs) of `trials` rounds over groups of these sizes.
pub fn schedule(trials: usize, groups: &[usize]) -> Vec<Step> {
    let mut steps = Vec::new();
    for trial in 0..trials {
        for (group, &servers) in groups.iter().enumerate() {
            for k in 0..servers {
                let server = if trial % 2 == 0 { k } else { servers - 1 - k };
                steps.push(Step {
                    trial,
                    group,
                    server,
                });
            }
        }
    }
    steps
}

/// Starts the progress line of run `i` (from 0) of `total`: "[3/10] what (trial 1/2) ... ".
pub fn progress(i: usize, total: usize, what: &str, step: Step, trials: usize) {
    let trial = if trials > 1 {
        format!(" (trial {}/{trials})", step.trial + 1)
    } else {
        String::new()
    };
    eprint!("[{}/{total}] {what}{trial} ... ", i + 1);
}

/// Starts a daemon on `mountpoint` with the lab's pidfile, log and stats file: `start`
/// makes its command line from them and starts it.
pub fn start_daemon(
    lab: &Lab,
    mountpoint: &Path,
    start: impl FnOnce(&Paths) -> Result<Daemon, String>,
) -> Result<Daemon, String> {
    let (pidfile, log, stats) = (
        lab.file("pid"),
        lab.file("daemon.log"),
        lab.file("stats.json"),
    );
    start(&Paths {
        mountpoint,
        pidfile: &pidfile,
        log: &log,
        stats: &stats,
    })
}

/// Stops `daemon`; a failure to is a warning, the run's figures stand.
pub fn stop(daemon: &mut Daemon) {
    if let Err(e) = daemon.stop() {
        eprintln!("\ncorofuse-lab bench: warning: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_alternate_within_each_group_across_trials() {
        let order: Vec<(usize, usize, usize)> = schedule(2, &[2, 2])
            .into_iter()
            .map(|s| (s.trial, s.group, s.server))
            .collect();
        assert_eq!(
            order,
            [
                (0, 0, 0),
                (0, 0, 1),
                (0, 1, 0),
                (0, 1, 1),
                (1, 0, 1),
                (1, 0, 0),
                (1, 1, 1),
                (1, 1, 0),
            ]
        );
        assert_eq!(schedule(3, &[3; 13]).len(), 3 * 13 * 3);
        let uneven: Vec<(usize, usize)> = schedule(2, &[1, 2])
            .into_iter()
            .map(|s| (s.group, s.server))
            .collect();
        assert_eq!(uneven, [(0, 0), (1, 0), (1, 1), (0, 0), (1, 1), (1, 0)]);
    }
}
