//! The export as a [`FileSystem`]: what it asks the kernel for at INIT and why each flag
//! (READDIRPLUS, HANDLE_KILLPRIV_V2, DONT_MASK, POSIX_ACL, the lock families, the
//! writeback cache, passthrough, export support), what starts with the session (the
//! notifier of stale attributes, passthrough's registration) and its end. Requests come in
//! through [`FileSystem::handle`]'s default, the typed dispatch into `ops`.

use std::io;
use std::os::fd::BorrowedFd;

use fuse::abi::*;
use fuse::init::{InitConfig, Negotiated};
use runtime::Ctx;
use transport::FileSystem;

use super::{DirFs, PassthroughPolicy};

impl FileSystem for DirFs {
    /// The protocol's defaults plus READDIRPLUS (adaptive: the kernel asks for it when a
    /// listing is followed by stats, as `ls -l` does), HANDLE_KILLPRIV_V2 (the kernel
    /// then sends no GETXATTR of `security.capability` before each WRITE; the daemon
    /// clears set-user-ID and set-group-ID where the kernel says so, see
    /// [`DirFs::kill_suidgid`]), DONT_MASK (the caller's umask comes unapplied, and the
    /// tree applies it unless a default ACL decides: [`Tree::creation_mode`](crate::tree::Tree::creation_mode)), POSIX_ACL
    /// (the kernel's permission checks, `default_permissions`, then read the source's
    /// access ACLs with GETXATTR of `system.posix_acl_access` and enforce them; without
    /// it they would check the mode bits alone, and an ACL entry denying a user would not
    /// hold through the mount, since the daemon itself acts as root), the
    /// writeback cache if asked, POSIX_LOCKS and FLOCK_LOCKS (the kernel sends every lock
    /// here and they are taken on the source: [`crate::locks`]), shared mappings of the direct-I/O files
    /// (DIRECT_IO_ALLOW_MMAP, 7.39+: O_DIRECT opens, and every file with `--cache never`),
    /// and EXPORT_SUPPORT where forgotten nodes are kept for file handles
    /// ([`crate::inodes`]: the daemon is root and the source has file handles), so that
    /// `name_to_handle_at` and `open_by_handle_at` on the mount work as on the source,
    /// across dropped caches; elsewhere NO_EXPORT_SUPPORT: the daemon could not find a
    /// node again once the kernel forgot it, so handles are refused (EOPNOTSUPP), as
    /// libfuse does by default, instead of going stale (ESTALE).
    fn init_config(&self, mut config: InitConfig) -> InitConfig {
        config.flags |= FUSE_DO_READDIRPLUS
            | FUSE_READDIRPLUS_AUTO
            | FUSE_HANDLE_KILLPRIV_V2
            | FUSE_DONT_MASK
            | FUSE_POSIX_ACL
            | FUSE_POSIX_LOCKS
            | FUSE_FLOCK_LOCKS;
        config.flags |= match self.tree.inodes.exportable() {
            true => FUSE_EXPORT_SUPPORT,
            false => FUSE_NO_EXPORT_SUPPORT,
        };
        if self.options.writeback {
            config.flags |= FUSE_WRITEBACK_CACHE;
        }
        if self.wants_passthrough() {
            config.flags |= FUSE_PASSTHROUGH;
        }
        // Files opened O_DIRECT (and all with --cache never) are FOPEN_DIRECT_IO: without
        // this the kernel refuses MAP_SHARED of them (ENODEV); with it, it writes mapped
        // pages back around each direct read and write.
        config.flags |= FUSE_DIRECT_IO_ALLOW_MMAP;
        config
    }

    fn session_started(&self, negotiated: &Negotiated, session: BorrowedFd<'_>) {
        self.notify.start(session);
        if self.wants_passthrough() {
            self.passthrough
                .start(negotiated.has(FUSE_PASSTHROUGH), session);
        } else if self.options.writeback && self.options.passthrough != PassthroughPolicy::Never {
            log::info!("FUSE passthrough: off with --writeback (the kernel has no passthrough beside the writeback cache)");
        }
    }

    /// Nothing is buffered here: every WRITE went to the source file before its reply.
    fn flush(&self, _cx: &Ctx<'_>) -> io::Result<()> {
        Ok(())
    }

    fn describe(&self) -> String {
        let mode = if self.options.read_only {
            "read-only"
        } else {
            "writable"
        };
        format!("directory {} ({mode})", self.source)
    }

    /// Where metadata calls run on the loop (a local source, or `--metadata on-loop`), a
    /// request may as well hold the loop; on a network or FUSE source they run off it and
    /// so does every request.
    fn waits_are_bounded(&self) -> bool {
        self.offload.is_none()
    }
}
