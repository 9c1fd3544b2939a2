//! The single-file image export: what each FUSE operation does to a [`BlockBackend`].
//!
//! Depends on the protocol (`fuse`), the transports' seam ([`transport::FileSystem`], so
//! that every transport can serve it) and the backends (`backend`); not on the runtime.
//!
//! This is the product's semantics, independent of how requests arrive (a coroutine queue
//! over io_uring, blocking threads, FUSE over io_uring): [`Export`] is a
//! [`FileSystem`]; a transport decodes a [`Request`](fuse::Request), calls
//! [`FileSystem::handle`] with the [`Ctx`] it runs in, which runs the operation's method of
//! [`Operations`](transport::Operations) (`ops`; those the export does not serve answer
//! ENOSYS), and sends the returned [`Reply`](fuse::Reply). Nothing here allocates: reply
//! arguments live in a [`ReplyArgs`] the caller owns (on its coroutine's stack) and READ
//! data goes into the caller's data buffer.
//!
//! Rules, QEMU's FUSE export where they make sense:
//! - sizes are byte-exact (QEMU rounds to 512 bytes);
//! - a read-only export shows no write bits and refuses every modification with `EROFS`
//!   (QEMU answers `EACCES`);
//! - a write past the end grows the image when the export is growable; otherwise it is
//!   short up to the end and `ENOSPC` beyond it, never silently dropped; likewise only a
//!   growable export grows by `truncate` (`EFBIG` otherwise) or `fallocate` (`ENOSPC`);
//! - mode, owner and times are kept in memory (see [`attr`]).
#![warn(missing_docs)]

pub mod attr;
mod data;
mod ops;

use std::io;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use backend::{BlockBackend, Ctx};
use zerocopy::FromZeros;

use attr::Attributes;
use fuse::abi::*;
use fuse::backing::{self, Mode};
use fuse::init::{InitConfig, Negotiated};
use fuse::Errno;
use std::os::fd::BorrowedFd;
use transport::FileSystem;

/// How the image is exported.
#[derive(Clone, Copy, Debug, Default)]
pub struct ExportOptions {
    /// Writes allowed (default: read-only, as in QEMU).
    pub writable: bool,
    /// Writes past the end grow the image.
    pub growable: bool,
    /// Users other than the owner may access the mount.
    pub allow_other: bool,
    /// FUSE passthrough for a raw image file ([`BlockBackend::passthrough_file`]): opens
    /// that only read get the image file itself (reads and mappings at the device's
    /// speed); writable opens keep their reads and writes here (the size stays exact and
    /// fixed), with mappings passed through.
    pub passthrough: bool,
}

/// Storage for the argument struct of one reply, owned by the request's caller.
pub struct ReplyArgs {
    attr: fuse_attr_out,
    open: fuse_open_out,
    write: fuse_write_out,
    lseek: fuse_lseek_out,
    statfs: fuse_statfs_out,
}

impl Default for ReplyArgs {
    fn default() -> Self {
        ReplyArgs {
            attr: FromZeros::new_zeroed(),
            open: FromZeros::new_zeroed(),
            write: FromZeros::new_zeroed(),
            lseek: FromZeros::new_zeroed(),
            statfs: FromZeros::new_zeroed(),
        }
    }
}

/// One exported image. `Send + Sync`: every queue and worker thread shares it.
pub struct Export {
    backend: Arc<dyn BlockBackend>,
    options: ExportOptions,
    attrs: Attributes,
    /// FUSE passthrough, with `options.passthrough`: the session's side, and the one
    /// inode's mode.
    passthrough: backing::Session,
    inode: backing::Inode,
    /// What passthrough registers: the image file opened again (`O_PATH`, through
    /// /proc/self/fd), not the backend's descriptor. The kernel keeps a registered file
    /// until the connection is gone, and the backend's descriptor holds the image's
    /// locks (OFD locks live with the open file description): registered, they would
    /// outlive the daemon, and the next export of the image would find it locked.
    passthrough_file: Option<std::os::fd::OwnedFd>,
    /// The exports serving the same backend, this one included, when the backend is a
    /// node several exports may share ([`Export::sharing`]): only the last one's close
    /// lets the backend go (its locks, its closing writes); the others flush.
    sharers: Option<Arc<AtomicUsize>>,
    /// Opens so far: each open's `fh` carries its number above the flag bits, so that
    /// a transport can tell the clients apart (`transport::backlog` serves them by turns).
    opens: AtomicU64,
}

/// Bit of `fh` for an open that passed through, so that RELEASE knows.
const FH_PASSTHROUGH: u64 = 1;
/// Bit of `fh` for an open for reading only, so that FLUSH knows: such a handle wrote
/// nothing, and its close does not wait for the backend (a down NBD server would hold
/// it up to `--reconnect-delay`).
const FH_READ_ONLY: u64 = 2;
/// The bits of `fh` below the open's number.
const FH_FLAG_BITS: u32 = 8;

impl Export {
    /// Exports `backend`; a read-only backend makes a read-only export whatever `options`
    /// say.
    pub fn new(backend: Arc<dyn BlockBackend>, mut options: ExportOptions) -> Export {
        options.writable &= !backend.read_only();
        options.growable &= options.writable;
        let attrs = Attributes::new(&options);
        let passthrough_file = match options.passthrough {
            true => backend.passthrough_file().and_then(|fd| {
                reopen_path(fd)
                    .map_err(|e| log::warn!("FUSE passthrough off: reopening the image: {e}"))
                    .ok()
            }),
            false => None,
        };
        options.passthrough = passthrough_file.is_some();
        Export {
            backend,
            options,
            attrs,
            passthrough: backing::Session::default(),
            inode: backing::Inode::default(),
            passthrough_file,
            sharers: None,
            opens: AtomicU64::new(0),
        }
    }

    /// An export of a backend that other exports may serve too: `sharers` counts them,
    /// this one included, kept by the owner of the backend (it counts an export out once
    /// the export is closed). Closing this export while others count only flushes the
    /// backend, so that a node shared by two exports keeps its image locks and stays
    /// whole while one of them still serves; the last one closes it.
    pub fn sharing(
        backend: Arc<dyn BlockBackend>,
        options: ExportOptions,
        sharers: Arc<AtomicUsize>,
    ) -> Export {
        Export {
            sharers: Some(sharers),
            ..Export::new(backend, options)
        }
    }

    /// What passthrough did, with `options.passthrough`.
    pub fn passthrough_stats(&self) -> Option<backing::PassthroughStats> {
        self.options.passthrough.then(|| self.passthrough.stats())
    }

    /// The backend behind the export.
    pub fn backend(&self) -> &Arc<dyn BlockBackend> {
        &self.backend
    }

    /// The options in force (a read-only backend clears `writable`).
    pub fn options(&self) -> ExportOptions {
        self.options
    }

    fn attr_into<'a>(&self, out: &'a mut fuse_attr_out) -> Result<&'a fuse_attr_out, Errno> {
        let allocated = self.backend.allocated_bytes().map_err(Errno::from)?;
        *out = self.attrs.attr_out(self.backend.len(), allocated);
        Ok(out)
    }

    fn open_into<'a>(
        &self,
        arg: &fuse_open_in,
        out: &'a mut fuse_open_out,
    ) -> Result<&'a fuse_open_out, Errno> {
        let reads_only = arg.flags as i32 & libc::O_ACCMODE == libc::O_RDONLY;
        if !reads_only && !self.options.writable {
            return Err(Errno::EROFS);
        }
        // Direct I/O: every read and write reaches us (no page cache in between), and
        // parallel direct writes are not serialised on the inode lock.
        let number = self.opens.fetch_add(1, Ordering::Relaxed) << FH_FLAG_BITS;
        out.fh = number | if reads_only { FH_READ_ONLY } else { 0 };
        out.open_flags = FOPEN_DIRECT_IO | FOPEN_PARALLEL_DIRECT_WRITES;
        out.backing_id = 0;
        if self.options.passthrough {
            let register = || {
                let file = self.passthrough_file.as_ref()?;
                self.passthrough.register(std::os::fd::AsFd::as_fd(file))
            };
            // A writable open keeps its reads and writes here, where the size is kept
            // exact and fixed (the kernel would let a passthrough write grow the image
            // file): it is served as without passthrough, unless read-only opens pass
            // through already, beside which the kernel allows only the passthrough
            // family (then its mappings, and only they, go to the file).
            if let Mode::Passthrough(id) = self.inode.open(reads_only, register) {
                self.passthrough.count_open();
                out.fh |= FH_PASSTHROUGH;
                out.backing_id = id.0;
                out.open_flags = match reads_only {
                    true => FOPEN_PASSTHROUGH,
                    false => out.open_flags | FOPEN_PASSTHROUGH,
                };
            }
        }
        Ok(out)
    }

    /// RELEASE: the last passthrough open of the image unregisters its backing file.
    fn release_passthrough(&self, arg: &fuse_release_in) {
        if !self.options.passthrough {
            return;
        }
        let mode = match arg.fh & FH_PASSTHROUGH != 0 {
            true => Mode::Passthrough(backing::BackingId(0)),
            false => Mode::Served,
        };
        if let Some(id) = self.inode.release(mode) {
            self.passthrough.unregister(id);
        }
    }

    /// FLUSH (each close of handle `fh`): makes writes durable, where there can be any:
    /// not through a read-only export or a handle opened for reading only. fsync(2) on
    /// any handle still flushes (FSYNC).
    fn flush_writes(&self, cx: &Ctx<'_>, fh: u64) -> Result<(), Errno> {
        if !self.options.writable || fh & FH_READ_ONLY != 0 {
            return Ok(());
        }
        self.backend.flush(cx).map_err(Errno::from)
    }

    fn statfs_into<'a>(&self, out: &'a mut fuse_statfs_out) -> &'a fuse_statfs_out {
        const BSIZE: u64 = 4096;
        out.st.bsize = BSIZE as u32;
        out.st.frsize = BSIZE as u32;
        out.st.blocks = self.backend.len().div_ceil(BSIZE);
        out.st.files = 1;
        out.st.namelen = 255;
        out
    }
}

/// A new `O_PATH` open file description of the file behind `fd`, through its
/// /proc/self/fd link (which reaches the file itself, even under a mount over its path).
fn reopen_path(fd: BorrowedFd<'_>) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::File::options()
        .read(true)
        .custom_flags(libc::O_PATH)
        .open(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map(std::os::fd::OwnedFd::from)
}

impl FileSystem for Export {
    /// The protocol's defaults plus shared mappings: OPEN answers `FOPEN_DIRECT_IO`, and
    /// without DIRECT_IO_ALLOW_MMAP the kernel refuses `MAP_SHARED` of such a file.
    fn init_config(&self, mut config: InitConfig) -> InitConfig {
        config.flags |= FUSE_DIRECT_IO_ALLOW_MMAP;
        if self.options.passthrough {
            config.flags |= FUSE_PASSTHROUGH;
        }
        config
    }

    fn session_started(&self, negotiated: &Negotiated, session: BorrowedFd<'_>) {
        if let Some(warning) = self.backend.open_warning() {
            log::warn!("{warning}");
        }
        if self.options.passthrough {
            self.passthrough
                .start(negotiated.has(FUSE_PASSTHROUGH), session);
        }
    }

    /// fdatasync of the image, whether or not the export is writable.
    fn flush(&self, cx: &Ctx<'_>) -> io::Result<()> {
        self.backend.flush(cx)
    }

    /// The backend's close: durable, its closing writes done, its image locks released.
    fn close(&self, cx: &Ctx<'_>) -> io::Result<()> {
        match &self.sharers {
            Some(sharers) if sharers.load(Ordering::Acquire) > 1 => self.backend.flush(cx),
            _ => self.backend.close(cx),
        }
    }

    fn describe(&self) -> String {
        self.backend.describe()
    }

    /// The backend's: an image on local storage, not NBD or a network file system.
    fn waits_are_bounded(&self) -> bool {
        self.backend.waits_are_bounded()
    }

    fn abort(&self) {
        self.backend.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn export() -> Export {
        let disk = backend::open("null:1M", &Default::default()).unwrap();
        Export::new(disk, ExportOptions::default())
    }

    #[test]
    fn asks_for_shared_mappings_at_init() {
        let config = export().init_config(InitConfig::new());
        assert_eq!(
            config.flags,
            fuse::init::DEFAULT_FLAGS | FUSE_DIRECT_IO_ALLOW_MMAP
        );
    }
}
