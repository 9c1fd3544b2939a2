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
//!
//! File handles (`name_to_handle_at` on the mount, as an NFS server re-exporting it or a
//! backup tool takes them) hold a node id and its generation, and the kernel asks for the
//! node again with a LOOKUP of "." in that id once it has forgotten it
//! (FUSE_EXPORT_SUPPORT). So where the source gives file handles of its own (the daemon
//! is root, the file system has them), a node at zero lookups is *kept*, forgotten:
//! its descriptor closes (a deleted file's space is not held) and its source file handle
//! stays, so "." reopens it under the same id and generation, and a lookup by name of the
//! same file finds the same node. A forgotten node whose file has no name left, or that
//! has no handle, goes for good; one whose inode number another file now has is replaced
//! (the handles differ). The cost: a node record per file ever looked up and still
//! existing (`DirStats::forgotten`). Without file handles, nodes go at zero lookups and the
//! export refuses file handles (FUSE_NO_EXPORT_SUPPORT).
//! One mutex guards the table: it is held for a hash lookup and an insert or a count
//! change, never across a system call.

use std::collections::HashMap;
use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use runtime::Ctx;
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
    /// Its passthrough opens that may write: its attributes are then answered valid for
    /// no time ([`crate::fresh`]).
    pub writers: crate::fresh::Writers,
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
    /// Slots at zero lookups, kept for file handles.
    forgotten: usize,
}

impl Table {
    /// Adds `n` lookups to the node in `slot`.
    fn count(&mut self, slot: usize, n: u64) -> Option<Arc<Inode>> {
        let s = self.slots.get_mut(slot)?;
        let revived = s.lookups == 0;
        s.lookups += n;
        let inode = Arc::clone(&s.inode);
        self.forgotten -= usize::from(revived && n > 0);
        Some(inode)
    }

    /// Removes the forgotten node `inode` from `slot`, if it is still there and forgotten.
    fn drop_forgotten(&mut self, slot: usize, inode: &Arc<Inode>) {
        let there = self.slots.get(slot);
        if there.is_some_and(|s| s.lookups == 0 && Arc::ptr_eq(&s.inode, inode)) {
            self.slots.remove(slot);
            self.forgotten -= 1;
            if self.by_file.get(&(inode.dev, inode.ino)) == Some(&slot) {
                self.by_file.remove(&(inode.dev, inode.ino));
            }
        }
    }
}

/// Every node the kernel holds, by id and by (device, inode number).
pub struct Inodes {
    table: Mutex<Table>,
    generations: AtomicU64,
    descriptors: Arc<Descriptors>,
    /// Forgotten nodes are kept for file handles (see the module doc).
    exportable: bool,
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
            exportable: descriptors.has_handles(),
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
            writers: Default::default(),
        })
    }

    /// Whether a node id stays valid after the kernel forgets it, so that file handles of
    /// the mount can be offered (FUSE_EXPORT_SUPPORT).
    pub fn exportable(&self) -> bool {
        self.exportable
    }

    /// The node `nodeid` names, if the kernel still holds it.
    pub fn get(&self, nodeid: u64) -> Option<Arc<Inode>> {
        let table = self.lock();
        let s = table
            .slots
            .get(slot_of(nodeid)?)
            .filter(|s| s.lookups > 0)?;
        Some(Arc::clone(&s.inode))
    }

    /// LOOKUP of "." in `nodeid`, any kind of node: the kernel's way back to a node it
    /// forgot, from a file handle. The node itself, reopened from its source file handle
    /// if it was forgotten, with one more lookup; ESTALE if it is gone.
    pub fn lookup_self(&self, nodeid: u64) -> io::Result<Entry> {
        let stale = || io::Error::from_raw_os_error(libc::ESTALE);
        let slot = slot_of(nodeid).ok_or_else(stale)?;
        let inode = self.lock().slots.get(slot).map(|s| Arc::clone(&s.inode));
        let inode = inode.ok_or_else(stale)?;
        let attr = match inode.handle() {
            Ok(fd) => sys::stat(fd.as_fd())?,
            Err(e) => {
                // Deleted since it was forgotten: nothing will find it again.
                self.lock().drop_forgotten(slot, &inode);
                return Err(e);
            }
        };
        let mut table = self.lock();
        match table.slots.get(slot) {
            Some(s) if Arc::ptr_eq(&s.inode, &inode) => {}
            _ => return Err(stale()),
        }
        let inode = table.count(slot, 1).ok_or_else(stale)?;
        Ok(Entry {
            nodeid,
            inode,
            attr,
        })
    }

    /// `name` in the directory `parent` (node `parent_id`): its node, found by the file's
    /// identity or made, with one more lookup. `..` of the root is the root (the export
    /// never reaches above its source directory), `.` is `parent` itself. (A directory
    /// moved out of the source tree by someone else keeps its real `..`: as in
    /// passthrough_hp and virtiofsd, the tree is trusted not to be rearranged under it.)
    pub fn lookup(&self, parent_id: u64, parent: &Inode, name: &CStr) -> io::Result<Entry> {
        self.lookup_in(&Ctx::Blocking, parent_id, parent, name)
    }

    /// [`Inodes::lookup`] with the name opened through `cx`: from a coroutine, on the
    /// loop's ring (`IORING_OP_OPENAT2`), so that a slow path walk on the source (a cold
    /// disk, a network file system) holds back only this request; a name in the source's
    /// dentry cache is opened at submission, as fast as the system call.
    pub fn lookup_in(
        &self,
        cx: &Ctx<'_>,
        parent_id: u64,
        parent: &Inode,
        name: &CStr,
    ) -> io::Result<Entry> {
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
        let flags = libc::O_PATH | libc::O_NOFOLLOW;
        let handle = cx.open_at(&parent.handle()?.as_fd(), name, flags, 0)?;
        let attr = sys::stat(handle.as_fd())?;
        let key = (attr.st_dev, attr.st_ino);
        self.check_forgotten(key, attr.st_mode & libc::S_IFMT, handle.as_fd());
        let mut table = self.lock();
        if let Some(&slot) = table.by_file.get(&key) {
            // Another name of a file the kernel knows (a hard link), the same name again,
            // or a forgotten node's file: one node; the new handle closes, unless the
            // node's was closed.
            let inode = table.count(slot, 1).expect("by_file names live slots");
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
        let stale = || io::Error::from_raw_os_error(libc::ESTALE);
        let slot = slot_of(nodeid).ok_or_else(stale)?;
        match table.slots.get(slot) {
            Some(s) if s.lookups > 0 => {}
            _ => return Err(stale()),
        }
        Ok(table.count(slot, n).expect("checked above"))
    }

    /// Before a lookup finds the node of the file `key` (kind `kind`, open as `fd`): if
    /// that node is a forgotten one whose file is not this one (the inode number was
    /// reused), it goes, so that the file gets a node of its own.
    fn check_forgotten(&self, key: (u64, u64), kind: u32, fd: BorrowedFd<'_>) {
        let found = {
            let table = self.lock();
            let slot = table.by_file.get(&key).copied();
            slot.and_then(|slot| {
                let s = &table.slots[slot];
                (s.lookups == 0).then(|| (slot, Arc::clone(&s.inode)))
            })
        };
        let Some((slot, inode)) = found else { return };
        if inode.kind != kind || !self.descriptors.same_file(&inode.fd, fd) {
            self.lock().drop_forgotten(slot, &inode);
        }
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
        if s.lookups == 0 {
            return; // forgotten already: kept for file handles
        }
        s.lookups = s.lookups.saturating_sub(n);
        if s.lookups > 0 {
            return;
        }
        if self.exportable {
            let inode = Arc::clone(&s.inode);
            table.forgotten += 1;
            drop(table);
            // Outside the table's lock: closing takes the file's handle (a system call).
            if !self.descriptors.retire(&inode.fd) {
                self.lock().drop_forgotten(slot, &inode);
            }
            return;
        }
        let gone = table.slots.remove(slot);
        table.by_file.remove(&(gone.inode.dev, gone.inode.ino));
    }

    /// Nodes held, the root included.
    pub fn len(&self) -> usize {
        let table = self.lock();
        table.slots.len() - table.forgotten
    }

    /// Nodes the kernel forgot, kept so that file handles find them again.
    pub fn forgotten(&self) -> usize {
        self.lock().forgotten
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Lookups the kernel holds on `nodeid` (0 if unknown or forgotten).
    pub fn lookups(&self, nodeid: u64) -> u64 {
        let Some(slot) = slot_of(nodeid) else {
            return 0;
        };
        self.lock().slots.get(slot).map_or(0, |s| s.lookups)
    }
}
