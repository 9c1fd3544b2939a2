//! [`Background`]: a mount served on a thread of its own and torn down when dropped, so a
//! test or a program can use the mount from the thread that made it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use transport::FileSystem;

use crate::error::{MountError, ServeError};
use crate::{LoopSet, Report, ServeHandle, ServeOptions, Served, Server, Target};

/// A live mount; dropping it (or [`Background::finish`]) stops the server, which lets the
/// requests in flight finish, flushes, and unmounts.
pub struct Background<F: FileSystem> {
    fs: Arc<F>,
    handle: ServeHandle,
    thread: Option<JoinHandle<Served>>,
    path: PathBuf,
    /// The dispatch as it runs ([`Server::dispatch`]).
    dispatch: String,
}

impl<F: FileSystem> Background<F> {
    /// Mounts `fs` on `target` and starts serving it on a new thread, on loops of its own.
    pub fn start(fs: Arc<F>, target: &Target, options: &ServeOptions) -> Result<Self, MountError> {
        Self::start_with(fs, target, options, Server::serve)
    }

    /// Mounts `fs` on `target` and starts serving it on the loops `on` of `set`, which
    /// other mounts may share ([`Server::serve_on`]); the thread started only supervises
    /// (stop, snapshots, the loop placement).
    pub fn start_on(
        fs: Arc<F>,
        target: &Target,
        options: &ServeOptions,
        set: Arc<LoopSet>,
        on: Vec<usize>,
    ) -> Result<Self, MountError> {
        Self::start_with(fs, target, options, move |server| {
            server.serve_on(&set, &on)
        })
    }

    fn start_with(
        fs: Arc<F>,
        target: &Target,
        options: &ServeOptions,
        serve: impl FnOnce(Server<F>) -> Served + Send + 'static,
    ) -> Result<Self, MountError> {
        let server = Server::mount(Arc::clone(&fs), target, options)?;
        let handle = server.handle();
        let dispatch = server.dispatch().to_string();
        let thread = std::thread::Builder::new()
            .name("fuse-serve".into())
            .spawn(move || serve(server))
            .map_err(MountError::ServingThread)?;
        Ok(Background {
            fs,
            handle,
            thread: Some(thread),
            path: target.mountpoint.clone(),
            dispatch,
        })
    }

    /// The dispatch as it runs, spelled as on the command line ([`Server::dispatch`]).
    pub fn dispatch(&self) -> &str {
        &self.dispatch
    }

    /// The mount point.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file system served.
    pub fn fs(&self) -> &F {
        &self.fs
    }

    /// Whether serving has ended by itself (unmounted from outside, or failed).
    pub fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }

    /// The statistics so far (`None` if the server does not answer within a second).
    pub fn snapshot(&self) -> Option<Report> {
        self.handle.snapshot(Duration::from_secs(1))
    }

    /// A handle on the server (stop, snapshots) for another thread.
    pub fn handle(&self) -> &ServeHandle {
        &self.handle
    }

    /// Stops serving and unmounts; returns how serving ended.
    pub fn finish(mut self) -> Served {
        self.stop_and_join()
    }

    fn stop_and_join(&mut self) -> Served {
        self.handle.stop();
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(served)) => served,
            Some(Err(_)) => Served::failed(ServeError::Panicked),
            None => Served::failed(ServeError::AlreadyFinished),
        }
    }
}

impl<F: FileSystem> Drop for Background<F> {
    fn drop(&mut self) {
        if self.thread.is_some() {
            if let Err(e) = self.stop_and_join().result {
                log::error!("serving {}: {e}", self.path.display());
            }
        }
    }
}
