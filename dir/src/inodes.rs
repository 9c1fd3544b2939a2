//! The inode table: what a FUSE node id stands for in the source tree.
//!
//! Why handles and counts, as libfuse's passthrough_hp and virtiofsd keep them: a node id
//! the kernel holds must keep naming the same file whatever happens to its path (a rename
//! elsewhere, a directory moved), so each node owns an `O_PATH` descriptor of its file,
//! opened relative to its parent's, and every later request works from that descriptor
//! (closed and reopened from the file's handle when more nodes are held than the
//! descriptor budget allows: [`crate::nodefd`]).
//! A node lives while the kernel may send its id: each LOOKUP reply (and each READDIRPLUS
//! entry, but "." and "..") adds one to its count, FORGET and BATCH_FORGET take them off,
//! and at zero the node and its descriptor go. Identity is the file's device and inode
//! number, so that two names of one file (hard links) are one node, as the kernel expects
//! (it would otherwise cache two inodes for one file and their attributes could disagree).
//!
//! Node ids are slots of a slab plus one (the root, 1, is slot 0, never forgotten); a slot
//! freed at zero lookups may be reused, which is safe because the kernel has forgotten the
//! id, and each node carries a fresh generation number for `fuse_entry_out.generation`.
//! One mutex guards the table: it is held for a hash lookup and an insert or a count
//! change, never across a system call.

use std::collections::HashMap;
use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use slab::Slab;

use crate::nodefd::{DescriptorStats, Descriptors, Fd, NodeFd};
use crate::sys;

/// The root's node id.
pub const ROOT: u64 = fuse::abi::FUSE_ROOT_ID;

/// The slab slot a node id names (ids are slots plus one), if it can name one.
fn slot_of(nodeid: u64) -> Option<usize> {
    usize::try_from(nodeid.checked_sub(1)?).ok()
}

/// The node id of a slab slot.
fn id_of(slot: usize) -> u64 {
    slot as u64 + 1 // a usize fits in a u64 on every target Linux runs on
}

/// One file of the source tree, as the kernel knows it.
#[derive(Debug)]
pub struct Inode {
    /// `O_PATH` descriptor of the file (symlinks themselves, not their targets).
    fd: Arc<NodeFd>,
    /// The budget it counts against, which reopens it.
    descriptors: Arc<Descriptors>,
    pub dev: u64,
    pub ino: u64,
    /// The file type bits of its mode (`S_IFMT`), fixed for a file's life.
    pub kind: u32,
    pub generation: u64,
    /// Its FUSE passthrough mode while opens of it live ([`crate::fs`]).
    pub backing: fuse::backing::Inode,
}

impl Inode {
    /// The file's `O_PATH` descriptor (reopened from its handle if the budget closed it:
    /// ESTALE if the file is gone since), held open while the returned clone lives.
    pub fn handle(&self) -> io::Result<Fd> {
        self.descriptors.fd(&self.fd)
    }

    pub fn is_dir(&self) -> bool {
        self.kind == libc::S_IFDIR
    }
}

/// What a lookup answers: the node (its count raised by one) and the file's attributes.
pub struct Entry {
    pub nodeid: u64,
    pub inode: Arc<Inode>,
    pub attr: libc::stat,
}

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entry")
            .field("nodeid", &self.nodeid)
            .field("inode", &self.inode)
            .field("mode", &format_args!("{:o}", self.attr.st_mode))
            .finish()
    }
}

struct Slot {
    inode: Arc<Inode>,
    lookups: u64,
}

#[derive(Default)]
struct Table {
    slots: Slab<Slot>,
    by_file: HashMap<(u64, u64), usize>,
}

/// Every node the kernel holds, by id and by (device, inode number).
pub struct Inodes {
    table: Mutex<Table>,
    generations: AtomicU64,
    descriptors: Arc<Descriptors>,
}

impl Inodes {
    /// A table holding only the root, `dir` (which must be a directory), keeping at most
    /// `budget` node descriptors open where file handles allow ([`crate::nodefd`]).
    pub fn new(dir: &Path, budget: usize) -> io::Result<Inodes> {
        let handle = std::fs::File::options()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
            .open(dir)
            .map(OwnedFd::from)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.display())))?;
        let attr = sys::stat(handle.as_fd())?;
        let (descriptors, root) = Descriptors::new(handle, budget);
        let inodes = Inodes {
            table: Mutex::new(Table::default()),
            generations: AtomicU64::new(0),
            descriptors,
        };
        let root = inodes.node(Arc::new(root), &attr);
        let mut table = inodes.lock();
        let slot = table.slots.insert(Slot {
            inode: root,
            lookups: 1,
        });
        assert_eq!(slot, 0, "the root is the first node");
        table.by_file.insert((attr.st_dev, attr.st_ino), slot);
        drop(table);
        Ok(inodes)
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The descriptor budget the nodes' descriptors count against.
    pub fn descriptors(&self) -> &Descriptors {
        &self.descriptors
    }

    /// What the descriptor budget did.
    pub fn descriptor_stats(&self) -> DescriptorStats {
        self.descriptors.stats()
    }

    fn node(&self, fd: Arc<NodeFd>, attr: &libc::stat) -> Arc<Inode> {
        Arc::new(Inode {
            fd,
            descriptors: Arc::clone(&self.descriptors),
            dev: attr.st_dev,
            ino: attr.st_ino,
            kind: attr.st_mode & libc::S_IFMT,
            generation: self.generations.fetch_add(1, Ordering::Relaxed),
            backing: Default::default(),
        })
    }

    /// The node `nodeid` names, if the kernel still holds it.
    pub fn get(&self, nodeid: u64) -> Option<Arc<Inode>> {
        self.lock()
            .slots
            .get(slot_of(nodeid)?)
            .map(|s| Arc::clone(&s.inode))
    }

    /// `name` in the directory `parent` (node `parent_id`): its node, found by the file's
    /// identity or made, with one more lookup. `..` of the root is the root (the export
    /// never reaches above its source directory), `.` is `parent` itself. (A directory
    /// moved out of the source tree by someone else keeps its real `..`: as in
    /// passthrough_hp and virtiofsd, the tree is trusted not to be rearranged under it.)
    pub fn lookup(&self, parent_id: u64, parent: &Inode, name: &CStr) -> io::Result<Entry> {
        let bytes = name.to_bytes();
        if bytes.is_empty() || bytes.contains(&b'/') {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        if bytes == b"." || (bytes == b".." && parent_id == ROOT) {
            let attr = sys::stat(parent.handle()?.as_fd())?;
            let inode = self.count(parent_id, 1)?;
            return Ok(Entry {
                nodeid: parent_id,
                inode,
                attr,
            });
        }
        let handle = sys::open_path(parent.handle()?.as_fd(), name)?;
        let attr = sys::stat(handle.as_fd())?;
        let key = (attr.st_dev, attr.st_ino);
        let mut table = self.lock();
        if let Some(&slot) = table.by_file.get(&key) {
            // Another name of a file the kernel knows (a hard link), or the same name
            // again: one node; the new handle closes, unless the node's was closed.
            let s = &mut table.slots[slot];
            s.lookups += 1;
            let inode = Arc::clone(&s.inode);
            drop(table);
            self.descriptors.revive(&inode.fd, handle);
            return Ok(Entry {
                nodeid: id_of(slot),
                inode,
                attr,
            });
        }
        let inode = self.node(NodeFd::new(handle), &attr);
        let slot = table.slots.insert(Slot {
            inode: Arc::clone(&inode),
            lookups: 1,
        });
        table.by_file.insert(key, slot);
        drop(table);
        // Counted against the budget once the table is free: the sweep makes syscalls.
        self.descriptors.admit(&inode.fd);
        Ok(Entry {
            nodeid: id_of(slot),
            inode,
            attr,
        })
    }

    /// Adds `n` lookups to a node the kernel holds.
    fn count(&self, nodeid: u64, n: u64) -> io::Result<Arc<Inode>> {
        let mut table = self.lock();
        let s = slot_of(nodeid)
            .and_then(|slot| table.slots.get_mut(slot))
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ESTALE))?;
        s.lookups += n;
        Ok(Arc::clone(&s.inode))
    }

    /// FORGET: the kernel drops `n` of its lookups of `nodeid`; at zero the node goes
    /// (its handle closes once no request still uses it). The root is never forgotten. An
    /// unknown id, or more forgets than lookups, is logged and otherwise ignored: FORGET
    /// has no reply to carry an error.
    pub fn forget(&self, nodeid: u64, n: u64) {
        if nodeid == ROOT {
            return;
        }
        let Some(slot) = slot_of(nodeid) else {
            return;
        };
        let mut table = self.lock();
        let Some(s) = table.slots.get_mut(slot) else {
            log::warn!("FORGET of unknown node {nodeid}");
            return;
        };
        if n > s.lookups {
            log::warn!(
                "FORGET {n} of node {nodeid}, which has {} lookups",
                s.lookups
            );
        }
        s.lookups = s.lookups.saturating_sub(n);
        if s.lookups == 0 {
            let gone = table.slots.remove(slot);
            table.by_file.remove(&(gone.inode.dev, gone.inode.ino));
        }
    }

    /// Nodes held, the root included.
    pub fn len(&self) -> usize {
        self.lock().slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Lookups the kernel holds on `nodeid` (0 if unknown).
    pub fn lookups(&self, nodeid: u64) -> u64 {
        let Some(slot) = slot_of(nodeid) else {
            return 0;
        };
        self.lock().slots.get(slot).map_or(0, |s| s.lookups)
    }
}
