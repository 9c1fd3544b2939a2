//! [`MountedDir`]: a [`DirFs`] mounted over a directory and served by worker threads, for
//! the crate's own end-to-end tests and benches (root and /dev/fuse needed). The
//! `corofuse mount-dir` command will serve the same file system with every transport;
//! this is the smallest way to put the kernel in front of it.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use fuse::init::InitConfig;
use fuse::mount::{Mount, MountOptions};
use transport::blocking::Workers;
use transport::FileSystem;

use crate::fs::{DirFs, DirOptions};

/// A live mount; unmounts and stops its workers when dropped.
pub struct MountedDir {
    fs: Arc<DirFs>,
    mount: Option<Mount>,
    workers: Option<Workers>,
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
        let workers = Workers::start(&session, &fs, negotiated.max_write, threads, false)?;
        Ok(MountedDir {
            fs,
            mount: Some(mount),
            workers: Some(workers),
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
    }
}
