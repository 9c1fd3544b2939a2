//! [`Server`]: one mount of one file system, from the mount(2) to the unmount.
//!
//! Order of events: [`Server::mount`] mounts, answers INIT and tells the file system the
//! session started (the mount is live from here: requests queue in the kernel until
//! serving starts, so a caller may write a pidfile between the two); [`Server::serve`]
//! starts the loops or workers, serves until [`ServeHandle::stop`] or the unmount from
//! outside, lets the requests in flight finish, closes the file system once (flushed,
//! image locks released: [`FileSystem::close`]), *then* unmounts, so that whoever waits
//! for the mount to go finds the storage free; and returns the final statistics.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use fuse::init::InitConfig;
use fuse::mount::{Mount, MountOptions, ENABLE_URING};
use fuse::session::handshake;
use runtime::{CounterSnapshot, Ctx};
use transport::placement::ControllerStats;
use transport::{FileSystem, OpReport, QueueConfig, QueueStats};

use crate::control::{Commands, ServeHandle};
use crate::error::{MountError, ServeError, UringOff};
use crate::loop_set::LoopSet;
use crate::options::{Dispatch, IdleWait, LoopPlacement, ServeOptions, Transport};
use crate::{loops, threads};

/// Where and as what a file system is mounted.
#[derive(Clone, Debug)]
pub struct Target {
    /// An existing regular file, or directory with `directory`.
    pub mountpoint: PathBuf,
    /// The mount's source as /proc/mounts shows it (the image, the source directory).
    pub name: String,
    /// A directory root over a directory (else a regular file over a regular file).
    pub directory: bool,
    /// Mount read-only (MS_RDONLY).
    pub read_only: bool,
}

/// What serving counted: the loops' runtimes, the queues, and per opcode.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// The event loops' counters, summed (zeros with worker threads).
    pub runtime: CounterSnapshot,
    /// The queues' counters, summed.
    pub queue: QueueStats,
    /// Per-opcode accounting (with [`ServeOptions::accounting`]).
    pub ops: BTreeMap<String, OpReport>,
    /// Each event loop's own queue counters, in loop order (empty with worker threads).
    pub per_queue: Vec<QueueStats>,
    /// What the adaptive loop placement did (`None` where it does not run).
    pub placement: Option<ControllerStats>,
}

/// How serving ended: the first error (a loop failed, the request stream broke, the
/// flush or the unmount failed), and the final statistics either way.
#[derive(Debug)]
pub struct Served {
    pub result: Result<(), ServeError>,
    pub report: Report,
}

impl Served {
    pub(crate) fn failed(error: ServeError) -> Served {
        Served {
            result: Err(error),
            report: Report::default(),
        }
    }
}

/// A mounted file system, ready to serve.
pub struct Server<F: FileSystem> {
    pub(crate) fs: Arc<F>,
    pub(crate) options: ServeOptions,
    pub(crate) session: fuse::dev::FuseDev,
    mount: Mount,
    pub(crate) max_write: u32,
    /// Requests come through FUSE over io_uring.
    pub(crate) uring: bool,
    /// Event loops, and the CPUs to pin them to, loop i to the i-th (empty: no pinning).
    pub(crate) queues: usize,
    pub(crate) cpus: Vec<usize>,
    dispatch: String,
    pub(crate) commands: Arc<Commands>,
}

impl<F: FileSystem> Server<F> {
    /// Mounts `fs` on `target` and answers INIT, as `options` say.
    pub fn mount(
        fs: Arc<F>,
        target: &Target,
        options: &ServeOptions,
    ) -> Result<Server<F>, MountError> {
        options.check()?;
        let allowed = runtime::affinity::allowed_cpus().unwrap_or_default();
        let (queues, cpus) = options.plan_loops(allowed);
        let uring = want_uring(options)?;
        let commands = Arc::new(Commands::new().map_err(MountError::EventFd)?);
        let init = fs.init_config(InitConfig {
            max_background: 256,
            congestion_threshold: 192,
            io_uring: uring,
            ..InitConfig::new().with_system_limits()
        });
        let mount_options = MountOptions {
            fsname: target.name.clone(),
            allow_other: options.allow_other,
            max_read: Some(init.max_write),
            directory: target.directory,
            read_only: target.read_only,
            ..MountOptions::default()
        };
        let (session, mount) =
            fuse::mount::mount(&target.mountpoint, &mount_options).map_err(MountError::Mount)?;
        let negotiated = handshake(&session, &init).map_err(MountError::Handshake)?;
        fs.session_started(&negotiated, std::os::fd::AsFd::as_fd(&session));
        let granted = uring && negotiated.has(fuse::abi::FUSE_OVER_IO_URING);
        if uring && !granted {
            let kernel_minor = negotiated.kernel_minor;
            if options.transport == Transport::Uring {
                return Err(MountError::UringNotOffered { kernel_minor });
            }
            log::warn!(
                "--transport auto: the kernel (FUSE 7.{kernel_minor}) did not offer FUSE over \
                 io_uring; serving through /dev/fuse"
            );
        }
        let dispatch = options.describe(queues, granted);
        log::info!(
            "exporting {} on {} ({} dispatch)",
            fs.describe(),
            mount.path().display(),
            dispatch
        );
        Ok(Server {
            fs,
            options: options.clone(),
            session,
            mount,
            max_write: negotiated.max_write,
            uring: granted,
            queues,
            cpus,
            dispatch,
            commands,
        })
    }

    /// A handle to stop the server or read its statistics from another thread.
    pub fn handle(&self) -> ServeHandle {
        let fs = Arc::clone(&self.fs);
        ServeHandle {
            commands: Arc::clone(&self.commands),
            abort: Arc::new(move || fs.abort()),
        }
    }

    /// The dispatch as it runs, spelled as on the command line, e.g. `coroutine --queues 2`.
    pub fn dispatch(&self) -> &str {
        &self.dispatch
    }

    /// The file system served.
    pub fn fs(&self) -> &Arc<F> {
        &self.fs
    }

    /// Serves until stopped or unmounted, on loops of its own (as the options say);
    /// then flushes, unmounts and reports.
    pub fn serve(self) -> Served {
        let mut set = None;
        let served = match self.options.dispatch {
            Dispatch::Coroutine | Dispatch::Inline => match self.own_loops() {
                Ok(own) => {
                    let on: Vec<usize> = (0..self.queues).collect();
                    loops::serve(&self, set.insert(own), &on)
                }
                Err(e) => Served::failed(ServeError::StartLoops(e)),
            },
            Dispatch::Threads(n) => threads::serve(&self, n),
        };
        let served = self.finish(served);
        // After the unmount, which ends FUSE over io_uring's ring entries: the loops
        // end, and dropping the set waits for their threads (their rings and stacks
        // gone before this returns).
        drop(set);
        served
    }

    /// Serves until stopped or unmounted on the loops `on` of `set`, which other sessions
    /// may share (coroutine or inline dispatch; `--queues` and `--cpus` are the set's
    /// business then, and so are polling and ring size); then flushes, unmounts and
    /// reports. The loops go on serving the others.
    pub fn serve_on(mut self, set: &LoopSet, on: &[usize]) -> Served {
        let served = match self.options.dispatch {
            _ if on.is_empty() => Served::failed(ServeError::NoLoop),
            Dispatch::Threads(_) => Served::failed(ServeError::ThreadsCannotShare),
            Dispatch::Coroutine | Dispatch::Inline => {
                self.queues = on.len();
                loops::serve(&self, set, on)
            }
        };
        self.finish(served)
    }

    /// The loops of a mount served alone: `queues` of them, pinned as planned.
    fn own_loops(&self) -> std::io::Result<LoopSet> {
        let set = LoopSet::new();
        set.add_loops(
            self.queues,
            &self.cpus,
            &self.options.runtime_config(self.uring),
        )?;
        Ok(set)
    }

    /// After serving: unmounts and says how serving ended.
    fn finish(self, served: Served) -> Served {
        let Server {
            mount, commands, ..
        } = self;
        let shown = mount.path().display().to_string();
        let unmounted = mount.unmount();
        commands.set_finished();
        let stream_errors = served.report.queue.stream_errors;
        let result = served.result.and(match stream_errors {
            0 => Ok(()),
            failed_reads => Err(ServeError::Stream { failed_reads }),
        });
        let result = result.and_then(|()| {
            unmounted.map_err(|source| ServeError::Unmount {
                path: shown.clone(),
                source,
            })?;
            log::info!("unmounted {shown}");
            Ok(())
        });
        Served {
            result,
            report: served.report,
        }
    }

    pub(crate) fn queue_config(&self) -> QueueConfig {
        QueueConfig {
            readers: self.options.readers,
            ring_replies: self.options.ring_replies,
            inline: self.options.dispatch == Dispatch::Inline,
            account: self.options.accounting,
            block_when_idle: self.options.idle_wait == IdleWait::Block,
        }
    }

    /// Whether the loops' placement adapts ([`transport::placement`]): several coroutine
    /// loops on /dev/fuse, unless the options say every loop always.
    pub(crate) fn adaptive_placement(&self, loops: usize) -> bool {
        loops > 1
            && !self.uring
            && self.options.dispatch == Dispatch::Coroutine
            && self.options.placement == LoopPlacement::Adaptive
    }

    /// Once the last request is done, and before the unmount: closes the file system
    /// (durable, its image locks released), so that the storage is free the moment the
    /// mount is gone.
    pub(crate) fn flush(&self) -> Result<(), ServeError> {
        let what = self.fs.describe();
        log::info!("no request left in flight; flushing and closing {what}");
        (self.fs.close(&Ctx::Blocking)).map_err(|source| ServeError::Flush { what, source })
    }
}

/// Whether to ask for FUSE over io_uring at INIT.
fn want_uring(options: &ServeOptions) -> Result<bool, MountError> {
    Ok(match options.transport {
        Transport::Dev => false,
        Transport::Uring => {
            uring_switch().map_err(MountError::UringOff)?;
            true
        }
        Transport::Auto => match (options.dispatch, uring_switch()) {
            (Dispatch::Coroutine, Ok(())) => true,
            (Dispatch::Coroutine, Err(off)) => {
                log::warn!("--transport auto: {off}; serving through /dev/fuse");
                false
            }
            _ => false,
        },
    })
}

/// Whether the fuse module offers FUSE over io_uring; if not, why and how to turn it on.
fn uring_switch() -> Result<(), UringOff> {
    match std::fs::read_to_string(ENABLE_URING).map(|v| v.trim() == "Y") {
        Ok(true) => Ok(()),
        state => Err(UringOff {
            missing: state.is_err(),
        }),
    }
}
