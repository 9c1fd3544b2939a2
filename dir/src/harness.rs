//! [`MountedDir`]: a [`DirFs`] mounted over a directory and served by worker threads or
//! by a coroutine queue on an event loop of its own, for the crate's own end-to-end tests
//! and benches (root and /dev/fuse needed). `corofuse mount-dir` serves the same file
//! system with every transport and queue count (`bin/src/mount.rs`); this is the smallest
//! way to put the kernel in front of it without the binary.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use fuse::init::InitConfig;
use fuse::mount::{Mount, MountOptions};
use transport::blocking::Workers;
use transport::{FileSystem, Queue, QueueConfig};

use crate::fs::{DirFs, DirOptions};

/// Who serves the mount.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Serve {
    /// N worker threads with blocking I/O (`transport::blocking`).
    Threads(usize),
    /// One coroutine per request on an io_uring event loop (`transport::Queue`).
    Coroutines,
}

/// A live mount; unmounts and stops its server when dropped.
pub struct MountedDir {
    fs: Arc<DirFs>,
    mount: Option<Mount>,
    workers: Option<Workers>,
    event_loop: Option<std::thread::JoinHandle<io::Result<()>>>,
    path: PathBuf,
}

impl MountedDir {
    /// Mounts `source` on the directory `mountpoint`, served by `threads` workers.
    pub fn new(
        source: &Path,
        mountpoint: &Path,
        options: DirOptions,
        threads: usize,
    ) -> io::Result<MountedDir> {
        Self::served(source, mountpoint, options, Serve::Threads(threads))
    }

    /// Mounts `source` on the directory `mountpoint`, served as `serve` says.
    pub fn served(
        source: &Path,
        mountpoint: &Path,
        options: DirOptions,
        serve: Serve,
    ) -> io::Result<MountedDir> {
        let fs = Arc::new(DirFs::new(source, options)?);
        let init = fs.init_config(InitConfig::new().with_system_limits());
        let mount_options = MountOptions {
            fsname: source.display().to_string(),
            directory: true,
            max_read: Some(init.max_write),
            read_only: options.read_only,
            ..MountOptions::default()
        };
        let (session, mount) = fuse::mount::mount(mountpoint, &mount_options)?;
        let negotiated = fuse::session::handshake(&session, &init)?;
        let (mut workers, mut event_loop) = (None, None);
        match serve {
            Serve::Threads(n) => {
                workers = Some(Workers::start(
                    &session,
                    &fs,
                    negotiated.max_write,
                    n,
                    false,
                )?)
            }
            Serve::Coroutines => {
                let dev = session.clone_queue(true)?;
                let (fs, max_write) = (Arc::clone(&fs), negotiated.max_write);
                // The loop ends when the unmount ends its reads (ENODEV).
                event_loop = Some(std::thread::spawn(move || -> io::Result<()> {
                    let rt = runtime::Runtime::new(runtime::Config::default())?;
                    rt.block_on(move |co| -> io::Result<()> {
                        let queue = Queue::new(dev, fs, max_write, QueueConfig::default());
                        queue.start(co)?;
                        queue.wait_finished(co);
                        queue
                            .failure()
                            .map_or(Ok(()), |why| Err(io::Error::other(why)))
                    })?
                }));
            }
        }
        Ok(MountedDir {
            fs,
            mount: Some(mount),
            workers,
            event_loop,
            path: mountpoint.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn fs(&self) -> &DirFs {
        &self.fs
    }
}

impl Drop for MountedDir {
    fn drop(&mut self) {
        if let Some(mount) = self.mount.take() {
            if let Err(e) = mount.unmount() {
                log::error!("unmounting {}: {e}", self.path.display());
            }
        }
        if let Some(workers) = self.workers.take() {
            workers.stop();
        }
        if let Some(event_loop) = self.event_loop.take() {
            match event_loop.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => log::error!("the event loop of {}: {e}", self.path.display()),
                Err(_) => log::error!("the event loop of {} panicked", self.path.display()),
            }
        }
    }
}
