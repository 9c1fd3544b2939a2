//! Each node's `O_PATH` descriptor, and the budget that bounds how many are open at once.
//!
//! Why a budget: every node the kernel holds needs a way back to its file whatever
//! happens to its path. A descriptor per node (passthrough_hp's way) bounds the nodes the
//! kernel may hold at once by the open-file limit: with the 20,000 of a container that may
//! not raise it, `ls -l` of a directory of 100,000 files failed with EMFILE. virtiofsd's
//! `--inode-file-handles` keeps a file handle per node instead and opens it for every
//! operation, which costs a syscall per request. Here a node keeps its descriptor while it
//! is among the [`Descriptors::budget`] most recently used; past the budget a clock
//! (second-chance) sweep closes the coldest ones, each first turned into a file handle
//! (`name_to_handle_at`), and a node whose descriptor was closed reopens it from its
//! handle (`open_by_handle_at`) when next used. So below the budget nothing costs more
//! than a descriptor per node, and above it only the cold nodes pay a reopen.
//!
//! A node keeps its descriptor for good (it is pinned) when no handle can be had: the
//! daemon may not open handles (that needs CAP_DAC_READ_SEARCH: it is not root), the
//! source file system has none (no export operations), or the node lies on another mount
//! below the source directory (handles are opened relative to the source's mount). The
//! root is always pinned. Pinned nodes are bounded by the open-file limit as before.
//!
//! A node reopened after its file was deleted gets ESTALE: that happens only to a node
//! both cold and deleted (an open file has a descriptor of its own, in the handle table).
//!
//! Locks: each node's state has its own mutex, held for a descriptor clone or a reopen;
//! the clock has one, under which the sweep only *tries* the nodes' locks (a node being
//! reopened is passed over), so the two never wait on each other in opposite orders.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use crate::sys::{self, FileHandle};

/// The descriptor of a node, as the operations use it: a clone that keeps it open for
/// the operation even if the sweep closes the node's own.
pub type Fd = Arc<OwnedFd>;

/// What the budget did, for `--stats`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DescriptorStats {
    /// The budget: node descriptors kept open at most (beyond the pinned ones).
    pub budget: u64,
    /// Whether nodes can be reopened from file handles at all.
    pub file_handles: bool,
    /// Descriptors the sweep closed (each node's handle taken first).
    pub closed: u64,
    /// Nodes reopened from their file handle.
    pub reopened: u64,
    /// Closed nodes given the descriptor a lookup of their file had just opened.
    pub revived: u64,
    /// Nodes pinned because no file handle could be had for them.
    pub pinned: u64,
}

struct State {
    fd: Option<Fd>,
    /// Taken when the descriptor is first closed; kept from then on.
    handle: Option<FileHandle>,
}

/// One node's descriptor, open or closed with its file handle kept.
pub struct NodeFd {
    state: Mutex<State>,
    /// Used since the sweep last passed (the clock's second chance).
    used: AtomicBool,
}

impl std::fmt::Debug for NodeFd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.lock();
        f.debug_struct("NodeFd")
            .field("fd", &state.fd)
            .field("handle", &state.handle.is_some())
            .finish()
    }
}

impl NodeFd {
    /// A node's descriptor, open; [`Descriptors::admit`] counts it against the budget.
    pub fn new(fd: OwnedFd) -> Arc<NodeFd> {
        Arc::new(NodeFd {
            state: Mutex::new(State {
                fd: Some(Arc::new(fd)),
                handle: None,
            }),
            used: AtomicBool::new(true),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The budget of node descriptors, and how to reopen a closed one.
pub struct Descriptors {
    /// The source directory open for reading (not `O_PATH`): file handles are opened
    /// relative to its mount.
    mount: Fd,
    mount_id: libc::c_int,
    /// Whether handles can be reopened here (probed at start).
    handles: bool,
    budget: usize,
    /// Nodes with an open descriptor that the sweep may close, oldest first. Entries of
    /// nodes that are gone stay until the sweep passes them.
    clock: Mutex<VecDeque<Weak<NodeFd>>>,
    closed: AtomicU64,
    reopened: AtomicU64,
    revived: AtomicU64,
    pinned: AtomicU64,
}

impl std::fmt::Debug for Descriptors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Descriptors")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl Descriptors {
    /// A budget of `budget` open node descriptors for the tree whose root is `root`, and
    /// the root's own (pinned) descriptor. Probes once whether file handles work there;
    /// if not, every node is pinned and the budget is not enforced.
    pub fn new(root: OwnedFd, budget: usize) -> (Arc<Descriptors>, NodeFd) {
        let root = Arc::new(root);
        // open_by_handle_at takes no O_PATH descriptor for its mount: the root opened
        // for reading stands for the mount.
        let probe = sys::open_dir(root.as_fd()).and_then(|mount| {
            let (handle, mount_id) = sys::file_handle(root.as_fd())?;
            sys::open_by_handle(mount.as_fd(), &handle, libc::O_PATH)?;
            Ok((Arc::new(mount), mount_id))
        });
        let (mount, handles, mount_id) = match probe {
            Ok((mount, mount_id)) => (mount, true, mount_id),
            Err(e) => {
                log::info!(
                    "no file handles on the source ({e}): every node keeps its descriptor, \
                     so the nodes held at once are bounded by the open-file limit"
                );
                (Arc::clone(&root), false, -1)
            }
        };
        let node = NodeFd {
            state: Mutex::new(State {
                fd: Some(Arc::clone(&root)),
                handle: None,
            }),
            used: AtomicBool::new(true),
        };
        let descriptors = Descriptors {
            mount,
            mount_id,
            handles,
            budget: budget.max(1),
            clock: Mutex::new(VecDeque::new()),
            closed: AtomicU64::new(0),
            reopened: AtomicU64::new(0),
            revived: AtomicU64::new(0),
            pinned: AtomicU64::new(0),
        };
        (Arc::new(descriptors), node)
    }

    /// The descriptor of `node`, reopened from its file handle if the sweep closed it.
    pub fn fd(&self, node: &Arc<NodeFd>) -> io::Result<Fd> {
        node.used.store(true, Ordering::Relaxed);
        let mut state = node.lock();
        if let Some(fd) = &state.fd {
            return Ok(Arc::clone(fd));
        }
        let handle = state
            .handle
            .as_ref()
            .expect("a closed descriptor has its handle");
        let fd = Arc::new(sys::open_by_handle(
            self.mount.as_fd(),
            handle,
            libc::O_PATH,
        )?);
        state.fd = Some(Arc::clone(&fd));
        drop(state);
        self.reopened.fetch_add(1, Ordering::Relaxed);
        self.admit(node);
        Ok(fd)
    }

    /// Gives a node whose descriptor was closed the one a lookup just opened on the same
    /// file, sparing a reopen; otherwise `fd` closes.
    pub fn revive(&self, node: &Arc<NodeFd>, fd: OwnedFd) {
        node.used.store(true, Ordering::Relaxed);
        let mut state = node.lock();
        if state.fd.is_some() {
            return;
        }
        state.fd = Some(Arc::new(fd));
        drop(state);
        self.revived.fetch_add(1, Ordering::Relaxed);
        self.admit(node);
    }

    /// Puts `node` (just given a descriptor) on the clock, and sweeps while more than the
    /// budget are open.
    pub fn admit(&self, node: &Arc<NodeFd>) {
        if !self.handles {
            return;
        }
        let mut clock = self.clock.lock().unwrap_or_else(|e| e.into_inner());
        clock.push_back(Arc::downgrade(node));
        // Two full turns at most: the first clears every second chance.
        let mut steps = 2 * clock.len();
        while clock.len() > self.budget && steps > 0 {
            steps -= 1;
            let Some(entry) = clock.pop_front() else {
                break;
            };
            let Some(cold) = entry.upgrade() else {
                continue; // the node is gone, and its descriptor with it
            };
            if cold.used.swap(false, Ordering::Relaxed) {
                clock.push_back(entry);
                continue;
            }
            match cold.state.try_lock() {
                Ok(mut state) => self.close(&mut state),
                Err(_) => clock.push_back(entry), // in use right now: not cold
            };
        }
    }

    /// Closes a cold node's descriptor, taking its file handle first; a node that has
    /// none (another mount, a file system without handles) is pinned instead.
    fn close(&self, state: &mut State) {
        let Some(fd) = &state.fd else {
            return;
        };
        if !self.keep_handle(&mut state.handle, fd.as_fd()) {
            self.pinned.fetch_add(1, Ordering::Relaxed);
            return;
        }
        state.fd = None;
        self.closed.fetch_add(1, Ordering::Relaxed);
    }

    /// Takes the file handle of the node behind `fd` into `handle`, where it has none
    /// yet; `false` where it has none to take (another mount, a file system without
    /// handles): it could not be reopened.
    fn keep_handle(&self, handle: &mut Option<FileHandle>, fd: BorrowedFd<'_>) -> bool {
        if handle.is_some() {
            return true;
        }
        match sys::file_handle(fd) {
            Ok((taken, mount_id)) if mount_id == self.mount_id => {
                *handle = Some(taken);
                true
            }
            _ => false,
        }
    }

    /// Whether nodes can be reopened from file handles here.
    pub fn has_handles(&self) -> bool {
        self.handles
    }

    /// A node the kernel has forgotten, kept so that a file handle naming it can find it
    /// again: closes its descriptor now (an `O_PATH` descriptor would keep a deleted
    /// file's space), keeping its file handle to reopen it from. `false` if the node
    /// cannot come back this way (its file has no name left, it lies on another mount,
    /// or it has no handle): the caller forgets it for good.
    pub fn retire(&self, node: &Arc<NodeFd>) -> bool {
        if !self.handles {
            return false;
        }
        let mut state = node.lock();
        let Some(fd) = state.fd.clone() else {
            return true; // closed by the sweep, its handle kept
        };
        if sys::stat(fd.as_fd()).map_or(true, |st| st.st_nlink == 0) {
            return false;
        }
        if !self.keep_handle(&mut state.handle, fd.as_fd()) {
            return false;
        }
        state.fd = None;
        true
    }

    /// Whether the file behind `fd` is the one `node` names: an open node holds its
    /// file (its inode number cannot be reused), a closed one is compared by file handle.
    pub fn same_file(&self, node: &Arc<NodeFd>, fd: BorrowedFd<'_>) -> bool {
        let state = node.lock();
        match (&state.fd, &state.handle) {
            (Some(_), _) => true,
            (None, Some(handle)) => sys::file_handle(fd).is_ok_and(|(other, _)| other == *handle),
            (None, None) => false,
        }
    }

    /// What the budget did so far.
    pub fn stats(&self) -> DescriptorStats {
        DescriptorStats {
            budget: self.budget as u64,
            file_handles: self.handles,
            closed: self.closed.load(Ordering::Relaxed),
            reopened: self.reopened.load(Ordering::Relaxed),
            revived: self.revived.load(Ordering::Relaxed),
            pinned: self.pinned.load(Ordering::Relaxed),
        }
    }

    /// Node descriptors open now that the sweep may close (an upper bound: entries of
    /// nodes gone since are counted until the sweep passes them).
    pub fn open(&self) -> usize {
        self.clock.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}
