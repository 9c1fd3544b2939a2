//! [`Exports`]: several mounts in one process, each added and removed while the others
//! serve, by id: what a daemon with a control plane (QMP's `block-export-add` and
//! `block-export-del`) needs, for any [`FileSystem`].
//!
//! Each export is a [`Background`]: its own mount, served either on loops of its own
//! ([`Exports::add`]) or on chosen loops of the set the exports share
//! ([`Exports::with_loops`], [`Exports::add_on`]: a loop serves every export given it,
//! each with its own /dev/fuse queue there, its own statistics and its own stop), with a
//! thread that only supervises it (stop, snapshots, the loop placement). Removing one stops it as a stop always does (the requests in flight finish, the file
//! system is closed, *then* the mount goes: [`crate::Server::serve`]), so when
//! [`Exports::remove`] returns the mount is gone and the storage free. An export
//! unmounted from outside is found by [`Exports::reap`].

use std::collections::BTreeMap;
use std::sync::Arc;

use transport::FileSystem;

use crate::error::ExportError;
use crate::{Background, LoopSet, Report, ServeOptions, Served, Target};

/// Live exports by id.
pub struct Exports<F: FileSystem> {
    live: BTreeMap<String, Background<F>>,
    /// The loops exports added with [`Exports::add_on`] share.
    loops: Arc<LoopSet>,
}

impl<F: FileSystem> Default for Exports<F> {
    fn default() -> Self {
        Exports::with_loops(Arc::new(LoopSet::new()))
    }
}

impl<F: FileSystem> Exports<F> {
    /// No export yet; those added with [`add_on`](Self::add_on) run on loops of `set`.
    pub fn with_loops(set: Arc<LoopSet>) -> Self {
        Exports {
            live: BTreeMap::new(),
            loops: set,
        }
    }

    /// The loops the exports share.
    pub fn loops(&self) -> &Arc<LoopSet> {
        &self.loops
    }

    /// Mounts `fs` on `target` and serves it as export `id` on loops of its own, as
    /// `options` say; the mount is live on return.
    pub fn add(
        &mut self,
        id: &str,
        fs: Arc<F>,
        target: &Target,
        options: &ServeOptions,
    ) -> Result<(), ExportError> {
        self.check_free(id)?;
        let served = Background::start(fs, target, options)?;
        self.live.insert(id.to_string(), served);
        Ok(())
    }

    /// Mounts `fs` on `target` and serves it as export `id` on the shared loops `on`
    /// (indices in [`loops`](Self::loops)), beside the exports already there; the mount
    /// is live on return.
    pub fn add_on(
        &mut self,
        id: &str,
        fs: Arc<F>,
        target: &Target,
        options: &ServeOptions,
        on: &[usize],
    ) -> Result<(), ExportError> {
        self.check_free(id)?;
        if let Some(missing) = on.iter().find(|&&i| i >= self.loops.len()) {
            return Err(ExportError::NoLoop {
                missing: *missing,
                loops: self.loops.len(),
            });
        }
        let set = Arc::clone(&self.loops);
        let served = Background::start_on(fs, target, options, set, on.to_vec())?;
        self.live.insert(id.to_string(), served);
        Ok(())
    }

    fn check_free(&self, id: &str) -> Result<(), ExportError> {
        match self.live.contains_key(id) {
            true => Err(ExportError::InUse(id.to_string())),
            false => Ok(()),
        }
    }

    /// Export `id`'s statistics so far: its own queues and per-opcode accounting, the
    /// runtime counters of the loops it runs on (`None` if there is no such export or it
    /// does not answer within a second).
    pub fn snapshot(&self, id: &str) -> Option<Report> {
        self.live.get(id).and_then(Background::snapshot)
    }

    /// Stops export `id` and returns how serving ended, once its mount is gone; `None`
    /// if there is no such export.
    pub fn remove(&mut self, id: &str) -> Option<Served> {
        self.live.remove(id).map(Background::finish)
    }

    /// Whether export `id` is live.
    pub fn contains(&self, id: &str) -> bool {
        self.live.contains_key(id)
    }

    /// The file system export `id` serves.
    pub fn get(&self, id: &str) -> Option<&F> {
        self.live.get(id).map(Background::fs)
    }

    /// Export `id`'s serving: its handle (stop, snapshots from another thread), its
    /// dispatch, its file system.
    pub fn background(&self, id: &str) -> Option<&Background<F>> {
        self.live.get(id)
    }

    /// The ids of the live exports, in order.
    pub fn ids(&self) -> impl Iterator<Item = &str> {
        self.live.keys().map(String::as_str)
    }

    /// Takes out the exports whose serving ended by itself (unmounted from outside, or
    /// failed), with how each ended.
    pub fn reap(&mut self) -> Vec<(String, Served)> {
        let ended: Vec<String> = self
            .live
            .iter()
            .filter(|(_, b)| b.is_finished())
            .map(|(id, _)| id.clone())
            .collect();
        ended
            .into_iter()
            .filter_map(|id| self.remove(&id).map(|served| (id, served)))
            .collect()
    }

    /// Stops every export (in id order), each as [`remove`](Self::remove) does.
    pub fn stop_all(&mut self) -> Vec<(String, Served)> {
        std::mem::take(&mut self.live)
            .into_iter()
            .map(|(id, b)| (id, b.finish()))
            .collect()
    }
}
