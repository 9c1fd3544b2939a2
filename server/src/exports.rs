//! [`Exports`]: several mounts in one process, each added and removed while the others
//! serve, by id: what a daemon with a control plane (QMP's `block-export-add` and
//! `block-export-del`) needs, for any [`FileSystem`].
//!
//! Each export is a [`Background`]: its own mount, its own loops on a thread of its own.
//! Removing one stops it as a stop always does (the requests in flight finish, the file
//! system is closed, *then* the mount goes: [`crate::Server::serve`]), so when
//! [`Exports::remove`] returns the mount is gone and the storage free. An export
//! unmounted from outside is found by [`Exports::reap`].

use std::collections::BTreeMap;
use std::sync::Arc;

use transport::FileSystem;

use crate::{Background, ServeOptions, Served, Target};

/// Live exports by id.
pub struct Exports<F: FileSystem> {
    live: BTreeMap<String, Background<F>>,
}

impl<F: FileSystem> Default for Exports<F> {
    fn default() -> Self {
        Exports {
            live: BTreeMap::new(),
        }
    }
}

impl<F: FileSystem> Exports<F> {
    /// Mounts `fs` on `target` and serves it as export `id`; the mount is live on return.
    pub fn add(
        &mut self,
        id: &str,
        fs: Arc<F>,
        target: &Target,
        options: &ServeOptions,
    ) -> Result<(), String> {
        if self.live.contains_key(id) {
            return Err(format!("export id '{id}' is already in use"));
        }
        let served = Background::start(fs, target, options)?;
        self.live.insert(id.to_string(), served);
        Ok(())
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
