//! [`MemFs`]: a directory tree in memory, as a [`FileSystem`] that every transport of the
//! `server` crate serves.
//!
//! The file system of the `memfs` example (`main.rs` beside this file), and of
//! `server/tests/memfs.rs`, which includes this file with `#[path]` and mounts it with
//! every dispatch and transport. It shows what serving asks of a file system: requests
//! come decoded, each to its method of [`Operations`] (the rest answer ENOSYS), which
//! returns the [`Reply`], borrowing the per-request `Scratch` (the reply's argument
//! structs) or `data` (the transport's buffer: READ data, READLINK targets, directory
//! listings), so that answering allocates nothing of its own. The transport sends it;
//! [`FileSystem`] holds the rest (what to ask at INIT, flush, a name for the logs).
//!
//! How it is kept:
//! - Every node (file, directory, symlink) is in one table, under one `Mutex` (the loops
//!   or worker threads serve concurrently and share the file system), keyed by its node
//!   id, the number the kernel knows it by. Ids are never reused: the generation is 0.
//! - A file's bytes are a `Vec<u8>`, grown with zeros by a write past the end or a
//!   truncate upwards. All files together hold at most the capacity given to
//!   [`MemFs::new`] (ENOSPC beyond), and there are at most [`MAX_NODES`] nodes; STATFS
//!   reports both.
//! - Lookup counts: a reply that gives the kernel a node (LOOKUP, CREATE, MKDIR, SYMLINK,
//!   LINK) counts one lookup, FORGET and BATCH_FORGET take them back. A node dies when no
//!   directory names it and the kernel has forgotten it, so a file unlinked while open
//!   stays readable and writable until its last close (the kernel holds its lookup).
//! - Open files keep no state: OPEN answers handle 0, READ and WRITE go by node id. An
//!   open directory keeps a snapshot of its entries, taken by the READDIR at offset 0,
//!   so that a listing stays whole while the directory changes under it (`rm -r` removes
//!   entries between two READDIRs); the offsets are positions in the snapshot.
//! - Permissions are the kernel's to check (the mount has `default_permissions`) against
//!   the modes and owners kept here; a new node belongs to its caller, the umask already
//!   applied by the kernel. Access times change only by SETATTR (as with `noatime`).
//!
//! Everything else answers ENOSYS, and the kernel copes: MKNOD (no FIFOs or devices),
//! extended attributes (EOPNOTSUPP to the caller), locks (kept local by the kernel),
//! ACCESS, FALLOCATE, LSEEK, COPY_FILE_RANGE (the kernel copies), STATX (GETATTR
//! instead); RENAME2 takes only `RENAME_NOREPLACE`.

#![forbid(unsafe_code)]

use std::collections::{BTreeMap, HashMap};
use std::ffi::CStr;
use std::io;
use std::sync::{Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use fuse::abi::*;
use fuse::reply::{dirent_type, Pushed, ReaddirBuf};
use fuse::{Errno, Reply, Request, WriteData};
use runtime::Ctx;
use transport::{Answer, FileSystem, Operations};
use zerocopy::FromZeros;

/// How long the kernel may cache names and attributes, in seconds. Every change comes
/// through the kernel, which updates its caches from the replies.
const TTL: u64 = 1;
/// The block size GETATTR and STATFS report.
const BLOCK: u64 = 4096;
/// Most nodes at once, the root included.
pub const MAX_NODES: u64 = 1 << 20;
/// Longest name.
const NAME_MAX: usize = 255;

/// An in-memory directory tree.
pub struct MemFs {
    tree: Mutex<Tree>,
}

impl MemFs {
    /// An empty tree whose root directory (mode 0755) belongs to `uid` and `gid`, and whose
    /// files may hold `capacity` bytes in all.
    pub fn new(capacity: u64, uid: u32, gid: u32) -> MemFs {
        let root = Node::new(dir_kind(FUSE_ROOT_ID), 0o755, uid, gid);
        let tree = Tree {
            nodes: HashMap::from([(FUSE_ROOT_ID, root)]),
            next_id: FUSE_ROOT_ID + 1,
            used: 0,
            capacity,
            listings: HashMap::new(),
            next_fh: 1,
        };
        MemFs {
            tree: Mutex::new(tree),
        }
    }

    /// The nodes alive and the bytes the files hold.
    pub fn usage(&self) -> (usize, u64) {
        let tree = self.lock();
        (tree.nodes.len(), tree.used)
    }

    fn lock(&self) -> MutexGuard<'_, Tree> {
        self.tree.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Storage for one reply's argument structs, on the serving coroutine's or thread's stack.
pub struct Scratch {
    entry: fuse_entry_out,
    attr: fuse_attr_out,
    open: fuse_open_out,
    write: fuse_write_out,
    statfs: fuse_statfs_out,
}

impl Default for Scratch {
    fn default() -> Scratch {
        Scratch {
            entry: FromZeros::new_zeroed(),
            attr: FromZeros::new_zeroed(),
            open: FromZeros::new_zeroed(),
            write: FromZeros::new_zeroed(),
            statfs: FromZeros::new_zeroed(),
        }
    }
}

/// Every operation takes the tree's lock for its whole answer: it is served at once, so
/// there is nothing to interrupt.
impl Operations for MemFs {
    type Scratch = Scratch;

    fn lookup<'b>(
        &self,
        _: &Ctx<'_>,
        req: &Request<'_>,
        name: &CStr,
        s: &'b mut Scratch,
    ) -> Answer<'b> {
        let mut tree = self.lock();
        let id = tree.child(req.nodeid, name.to_bytes())?;
        s.entry = tree.hand_out(id)?;
        Ok(Reply::entry(req.unique, &s.entry))
    }

    fn forget(&self, nodeid: u64, nlookup: u64) {
        self.lock().forget(nodeid, nlookup);
    }

    fn getattr<'b>(
        &self,
        _: &Ctx<'_>,
        req: &Request<'_>,
        _: &fuse_getattr_in,
        s: &'b mut Scratch,
    ) -> Answer<'b> {
        s.attr = self.lock().attr_out(req.nodeid)?;
        Ok(Reply::arg(req.unique, &s.attr))
    }

    fn setattr<'b>(
        &self,
        _: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_setattr_in,
        s: &'b mut Scratch,
    ) -> Answer<'b> {
        let mut tree = self.lock();
        tree.setattr(req.nodeid, arg)?;
        s.attr = tree.attr_out(req.nodeid)?;
        Ok(Reply::arg(req.unique, &s.attr))
    }

    fn statfs<'b>(&self, _: &Ctx<'_>, req: &Request<'_>, s: &'b mut Scratch) -> Answer<'b> {
        s.statfs = self.lock().statfs();
        Ok(Reply::arg(req.unique, &s.statfs))
    }

    fn open<'b>(
        &self,
        _: &Ctx<'_>,
        req: &Request<'_>,
        _: &fuse_open_in,
        s: &'b mut Scratch,
    ) -> Answer<'b> {
        self.lock().file(req.nodeid)?;
        s.open = FromZeros::new_zeroed();
        Ok(Reply::arg(req.unique, &s.open))
    }

    fn read<'b>(
        &self,
        _: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_read_in,
        data: &'b mut [u8],
    ) -> Answer<'b> {
        let len = data.len().min(arg.size as usize);
        let n = self.lock().read(req.nodeid, arg.offset, &mut data[..len])?;
        Ok(Reply::data(req.unique, &data[..n]))
    }

    fn write<'b>(
        &self,
        _: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_write_in,
        data: WriteData<'_>,
        s: &'b mut Scratch,
    ) -> Answer<'b> {
        let size = self.lock().write(req.nodeid, arg.offset, data)?;
        s.write = fuse_write_out { size, padding: 0 };
        Ok(Reply::arg(req.unique, &s.write))
    }

    fn flush_file<'b>(&self, _: &Ctx<'_>, req: &Request<'_>, _: &fuse_flush_in) -> Answer<'b> {
        Ok(Reply::empty(req.unique))
    }

    fn fsync<'b>(&self, _: &Ctx<'_>, req: &Request<'_>, _: &fuse_fsync_in) -> Answer<'b> {
        Ok(Reply::empty(req.unique))
    }

    fn fsyncdir<'b>(&self, _: &Ctx<'_>, req: &Request<'_>, _: &fuse_fsync_in) -> Answer<'b> {
        Ok(Reply::empty(req.unique))
    }

    fn release<'b>(&self, _: &Ctx<'_>, req: &Request<'_>, _: &fuse_release_in) -> Answer<'b> {
        Ok(Reply::empty(req.unique))
    }

    fn create<'b>(
        &self,
        _: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_create_in,
        name: &CStr,
        s: &'b mut Scratch,
    ) -> Answer<'b> {
        let mut tree = self.lock();
        let id = tree.make(req, name.to_bytes(), Kind::File(Vec::new()), arg.mode)?;
        s.entry = tree.hand_out(id)?;
        s.open = FromZeros::new_zeroed();
        Ok(Reply::create(req.unique, &s.entry, &s.open))
    }

    fn mkdir<'b>(
        &self,
        _: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_mkdir_in,
        name: &CStr,
        s: &'b mut Scratch,
    ) -> Answer<'b> {
        let mut tree = self.lock();
        let id = tree.make(req, name.to_bytes(), dir_kind(req.nodeid), arg.mode)?;
        s.entry = tree.hand_out(id)?;
        Ok(Reply::entry(req.unique, &s.entry))
    }

    fn symlink<'b>(
        &self,
        _: &Ctx<'_>,
        req: &Request<'_>,
        name: &CStr,
        target: &CStr,
        s: &'b mut Scratch,
    ) -> Answer<'b> {
        let link = Kind::Symlink(target.to_bytes().to_vec());
        let mut tree = self.lock();
        let id = tree.make(req, name.to_bytes(), link, 0o777)?;
        s.entry = tree.hand_out(id)?;
        Ok(Reply::entry(req.unique, &s.entry))
    }

    fn link<'b>(
        &self,
        _: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_link_in,
        newname: &CStr,
        s: &'b mut Scratch,
    ) -> Answer<'b> {
        let (mut tree, id) = (self.lock(), arg.oldnodeid);
        if tree.is_dir(id)? {
            return Err(Errno::EPERM);
        }
        tree.add_entry(req.nodeid, newname.to_bytes(), id)?;
        tree.node_mut(id)?.nlink += 1;
        s.entry = tree.hand_out(id)?;
        Ok(Reply::entry(req.unique, &s.entry))
    }

    fn readlink<'b>(&self, _: &Ctx<'_>, req: &Request<'_>, data: &'b mut [u8]) -> Answer<'b> {
        let tree = self.lock();
        let Kind::Symlink(target) = &tree.node(req.nodeid)?.kind else {
            return Err(Errno::EINVAL);
        };
        let out = data.get_mut(..target.len()).ok_or(Errno::ENAMETOOLONG)?;
        out.copy_from_slice(target);
        Ok(Reply::readlink(req.unique, out))
    }

    fn unlink<'b>(&self, _: &Ctx<'_>, req: &Request<'_>, name: &CStr) -> Answer<'b> {
        self.lock().remove(req.nodeid, name.to_bytes(), false)?;
        Ok(Reply::empty(req.unique))
    }

    fn rmdir<'b>(&self, _: &Ctx<'_>, req: &Request<'_>, name: &CStr) -> Answer<'b> {
        self.lock().remove(req.nodeid, name.to_bytes(), true)?;
        Ok(Reply::empty(req.unique))
    }

    fn rename<'b>(
        &self,
        _: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_rename_in,
        name: &CStr,
        newname: &CStr,
    ) -> Answer<'b> {
        let (name, newname) = (name.to_bytes(), newname.to_bytes());
        self.lock()
            .rename(req.nodeid, name, arg.newdir, newname, 0)?;
        Ok(Reply::empty(req.unique))
    }

    fn rename2<'b>(
        &self,
        _: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_rename2_in,
        name: &CStr,
        newname: &CStr,
    ) -> Answer<'b> {
        let (name, newname) = (name.to_bytes(), newname.to_bytes());
        self.lock()
            .rename(req.nodeid, name, arg.newdir, newname, arg.flags)?;
        Ok(Reply::empty(req.unique))
    }

    fn opendir<'b>(
        &self,
        _: &Ctx<'_>,
        req: &Request<'_>,
        _: &fuse_open_in,
        s: &'b mut Scratch,
    ) -> Answer<'b> {
        let mut tree = self.lock();
        tree.entries(req.nodeid)?;
        s.open = FromZeros::new_zeroed();
        s.open.fh = tree.next_fh;
        tree.next_fh += 1;
        tree.listings.insert(s.open.fh, Vec::new());
        Ok(Reply::arg(req.unique, &s.open))
    }

    /// READDIR; READDIRPLUS is not asked for at INIT, and answers ENOSYS.
    fn readdir<'b>(
        &self,
        _: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_read_in,
        plus: bool,
        data: &'b mut [u8],
    ) -> Answer<'b> {
        if plus {
            return Err(Errno::ENOSYS);
        }
        let listing = self
            .lock()
            .readdir(req.nodeid, arg, ReaddirBuf::new(data, arg.size))?;
        Ok(listing.reply(req.unique))
    }

    fn releasedir<'b>(&self, _: &Ctx<'_>, req: &Request<'_>, arg: &fuse_release_in) -> Answer<'b> {
        self.lock().listings.remove(&arg.fh);
        Ok(Reply::empty(req.unique))
    }
}

impl FileSystem for MemFs {
    /// Nothing to make durable: it all goes when the process does.
    fn flush(&self, _cx: &Ctx<'_>) -> io::Result<()> {
        Ok(())
    }

    fn describe(&self) -> String {
        let (nodes, bytes) = self.usage();
        format!("memfs (in memory: {nodes} nodes, {bytes} bytes)")
    }
}

/// A point in time as the kernel takes it.
#[derive(Clone, Copy)]
struct Time {
    secs: u64,
    nsecs: u32,
}

impl Time {
    fn now() -> Time {
        let since = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        Time {
            secs: since.as_secs(),
            nsecs: since.subsec_nanos(),
        }
    }
}

/// What a node is, with what it holds.
enum Kind {
    File(Vec<u8>),
    /// Entries by name, and the directory this one is in (the root's is itself).
    Dir {
        entries: BTreeMap<Vec<u8>, u64>,
        parent: u64,
    },
    Symlink(Vec<u8>),
}

fn dir_kind(parent: u64) -> Kind {
    Kind::Dir {
        entries: BTreeMap::new(),
        parent,
    }
}

struct Node {
    kind: Kind,
    /// File type and permission bits.
    mode: u32,
    uid: u32,
    gid: u32,
    /// Names of a file; 2 plus subdirectories for a directory, 0 once removed.
    nlink: u32,
    /// Lookups the kernel holds.
    lookups: u64,
    atime: Time,
    mtime: Time,
    ctime: Time,
}

impl Node {
    fn new(kind: Kind, perm: u32, uid: u32, gid: u32) -> Node {
        let (file_type, nlink) = match kind {
            Kind::File(_) => (libc::S_IFREG, 1),
            Kind::Dir { .. } => (libc::S_IFDIR, 2),
            Kind::Symlink(_) => (libc::S_IFLNK, 1),
        };
        let now = Time::now();
        Node {
            kind,
            mode: file_type | (perm & 0o7777),
            uid,
            gid,
            nlink,
            lookups: 0,
            atime: now,
            mtime: now,
            ctime: now,
        }
    }

    /// The contents changed.
    fn touch(&mut self) {
        let now = Time::now();
        (self.mtime, self.ctime) = (now, now);
    }

    fn attr(&self, ino: u64) -> fuse_attr {
        let size = match &self.kind {
            Kind::File(bytes) | Kind::Symlink(bytes) => bytes.len() as u64,
            Kind::Dir { .. } => BLOCK,
        };
        fuse_attr {
            ino,
            size,
            blocks: size.div_ceil(512),
            atime: self.atime.secs,
            mtime: self.mtime.secs,
            ctime: self.ctime.secs,
            atimensec: self.atime.nsecs,
            mtimensec: self.mtime.nsecs,
            ctimensec: self.ctime.nsecs,
            mode: self.mode,
            nlink: self.nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: BLOCK as u32,
            flags: 0,
        }
    }
}

/// One entry of an open directory's snapshot.
struct Dirent {
    ino: u64,
    /// `DT_*`.
    kind: u32,
    name: Vec<u8>,
}

/// Everything [`MemFs`] keeps, behind its lock.
struct Tree {
    nodes: HashMap<u64, Node>,
    next_id: u64,
    /// Bytes the files hold, and the most they may.
    used: u64,
    capacity: u64,
    /// Open directories' snapshots, by handle.
    listings: HashMap<u64, Vec<Dirent>>,
    next_fh: u64,
}

impl Tree {
    fn node(&self, id: u64) -> Result<&Node, Errno> {
        self.nodes.get(&id).ok_or(Errno::ENOENT)
    }

    fn node_mut(&mut self, id: u64) -> Result<&mut Node, Errno> {
        self.nodes.get_mut(&id).ok_or(Errno::ENOENT)
    }

    fn is_dir(&self, id: u64) -> Result<bool, Errno> {
        Ok(matches!(self.node(id)?.kind, Kind::Dir { .. }))
    }

    /// The bytes of file `id`.
    fn file(&self, id: u64) -> Result<&Vec<u8>, Errno> {
        match &self.node(id)?.kind {
            Kind::File(bytes) => Ok(bytes),
            Kind::Dir { .. } => Err(Errno::EISDIR),
            Kind::Symlink(_) => Err(Errno::EINVAL),
        }
    }

    fn file_mut(&mut self, id: u64) -> Result<&mut Vec<u8>, Errno> {
        match &mut self.node_mut(id)?.kind {
            Kind::File(bytes) => Ok(bytes),
            Kind::Dir { .. } => Err(Errno::EISDIR),
            Kind::Symlink(_) => Err(Errno::EINVAL),
        }
    }

    /// The entries of directory `id`.
    fn entries(&self, id: u64) -> Result<&BTreeMap<Vec<u8>, u64>, Errno> {
        match &self.node(id)?.kind {
            Kind::Dir { entries, .. } => Ok(entries),
            _ => Err(Errno::ENOTDIR),
        }
    }

    fn entries_mut(&mut self, id: u64) -> Result<&mut BTreeMap<Vec<u8>, u64>, Errno> {
        match &mut self.node_mut(id)?.kind {
            Kind::Dir { entries, .. } => Ok(entries),
            _ => Err(Errno::ENOTDIR),
        }
    }

    /// The node `name` in directory `dir`.
    fn child(&self, dir: u64, name: &[u8]) -> Result<u64, Errno> {
        self.entries(dir)?.get(name).copied().ok_or(Errno::ENOENT)
    }

    fn attr_out(&self, id: u64) -> Result<fuse_attr_out, Errno> {
        let mut out = fuse_attr_out::new_zeroed();
        out.attr_valid = TTL;
        out.attr = self.node(id)?.attr(id);
        Ok(out)
    }

    /// Gives node `id` to the kernel: its LOOKUP answer, one lookup counted.
    fn hand_out(&mut self, id: u64) -> Result<fuse_entry_out, Errno> {
        let node = self.node_mut(id)?;
        node.lookups += 1;
        let mut out = fuse_entry_out::new_zeroed();
        (out.nodeid, out.entry_valid, out.attr_valid) = (id, TTL, TTL);
        out.attr = node.attr(id);
        Ok(out)
    }

    /// Takes back `n` lookups of node `id`.
    fn forget(&mut self, id: u64, n: u64) {
        if let Some(node) = self.nodes.get_mut(&id) {
            node.lookups = node.lookups.saturating_sub(n);
        }
        self.drop_if_unused(id);
    }

    /// Frees node `id` once no directory names it and the kernel holds no lookup of it.
    fn drop_if_unused(&mut self, id: u64) {
        let unused = |n: &Node| n.nlink == 0 && n.lookups == 0;
        if id == FUSE_ROOT_ID || !self.nodes.get(&id).is_some_and(unused) {
            return;
        }
        if let Some(Node {
            kind: Kind::File(bytes),
            ..
        }) = self.nodes.remove(&id)
        {
            self.used -= bytes.len() as u64;
        }
    }

    /// A new node `name` in the directory of `req`, for its caller.
    fn make(
        &mut self,
        req: &Request<'_>,
        name: &[u8],
        kind: Kind,
        perm: u32,
    ) -> Result<u64, Errno> {
        if self.nodes.len() as u64 >= MAX_NODES {
            return Err(Errno::ENOSPC);
        }
        let id = self.next_id;
        self.nodes
            .insert(id, Node::new(kind, perm, req.uid, req.gid));
        if let Err(errno) = self.add_entry(req.nodeid, name, id) {
            self.nodes.remove(&id);
            return Err(errno);
        }
        self.next_id += 1;
        Ok(id)
    }

    /// Names node `id` `name` in directory `dir` (EEXIST if the name is taken).
    fn add_entry(&mut self, dir: u64, name: &[u8], id: u64) -> Result<(), Errno> {
        if name.len() > NAME_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        let is_dir = self.is_dir(id)?;
        let entries = self.entries_mut(dir)?;
        if entries.contains_key(name) {
            return Err(Errno::EEXIST);
        }
        entries.insert(name.to_vec(), id);
        let parent = self.node_mut(dir)?;
        parent.touch();
        parent.nlink += u32::from(is_dir); // the new directory's `..`
        let node = self.node_mut(id)?;
        node.ctime = Time::now();
        if let Kind::Dir { parent, .. } = &mut node.kind {
            *parent = dir;
        }
        Ok(())
    }

    /// Takes the name `name` out of directory `dir`; returns the node it named.
    fn take_entry(&mut self, dir: u64, name: &[u8]) -> Result<u64, Errno> {
        let id = self.entries_mut(dir)?.remove(name).ok_or(Errno::ENOENT)?;
        let is_dir = self.is_dir(id)?;
        let parent = self.node_mut(dir)?;
        parent.touch();
        parent.nlink -= u32::from(is_dir);
        Ok(id)
    }

    /// UNLINK (`want_dir` false) or RMDIR (true) of `name` in `dir`.
    fn remove(&mut self, dir: u64, name: &[u8], want_dir: bool) -> Result<(), Errno> {
        let id = self.child(dir, name)?;
        match (&self.node(id)?.kind, want_dir) {
            (Kind::Dir { entries, .. }, true) if !entries.is_empty() => Err(Errno::ENOTEMPTY),
            (Kind::Dir { .. }, false) => Err(Errno::EISDIR),
            (Kind::File(_) | Kind::Symlink(_), true) => Err(Errno::ENOTDIR),
            _ => Ok(()),
        }?;
        self.take_entry(dir, name)?;
        let node = self.node_mut(id)?;
        node.nlink = if want_dir { 0 } else { node.nlink - 1 };
        node.ctime = Time::now();
        self.drop_if_unused(id);
        Ok(())
    }

    /// RENAME, and RENAME2 with no flag but `RENAME_NOREPLACE` (EINVAL for the others).
    fn rename(
        &mut self,
        dir: u64,
        name: &[u8],
        newdir: u64,
        newname: &[u8],
        flags: u32,
    ) -> Result<(), Errno> {
        if flags & !libc::RENAME_NOREPLACE != 0 {
            return Err(Errno::EINVAL);
        }
        if newname.len() > NAME_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        let id = self.child(dir, name)?;
        let is_dir = self.is_dir(id)?;
        if is_dir && self.is_within(newdir, id)? {
            return Err(Errno::EINVAL); // a directory cannot move under itself
        }
        match self.entries(newdir)?.get(newname).copied() {
            Some(target) if target == id => return Ok(()), // two names of one file
            Some(_) if flags & libc::RENAME_NOREPLACE != 0 => return Err(Errno::EEXIST),
            // Replaced: a file by a file, an empty directory by a directory.
            Some(_) => self.remove(newdir, newname, is_dir)?,
            None => {}
        }
        self.take_entry(dir, name)?;
        self.add_entry(newdir, newname, id)
    }

    /// Whether directory `id` is `ancestor` or below it.
    fn is_within(&self, mut id: u64, ancestor: u64) -> Result<bool, Errno> {
        loop {
            if id == ancestor {
                return Ok(true);
            }
            match self.node(id)?.kind {
                Kind::Dir { parent, .. } if id != FUSE_ROOT_ID => id = parent,
                Kind::Dir { .. } => return Ok(false),
                _ => return Err(Errno::ENOTDIR),
            }
        }
    }

    fn setattr(&mut self, id: u64, arg: &fuse_setattr_in) -> Result<(), Errno> {
        let has = |bit: u32| arg.valid & bit != 0;
        if has(FATTR_SIZE) {
            self.resize(id, arg.size)?;
        }
        let node = self.node_mut(id)?;
        let now = Time::now();
        let time = |now_bit, set_bit, secs, nsecs| match (has(now_bit), has(set_bit)) {
            (true, _) => Some(now),
            (false, true) => Some(Time { secs, nsecs }),
            (false, false) => None,
        };
        if has(FATTR_MODE) {
            node.mode = (node.mode & libc::S_IFMT) | (arg.mode & 0o7777);
        }
        if has(FATTR_UID) {
            node.uid = arg.uid;
        }
        if has(FATTR_GID) {
            node.gid = arg.gid;
        }
        if let Some(t) = time(FATTR_ATIME_NOW, FATTR_ATIME, arg.atime, arg.atimensec) {
            node.atime = t;
        }
        if let Some(t) = time(FATTR_MTIME_NOW, FATTR_MTIME, arg.mtime, arg.mtimensec) {
            node.mtime = t;
        } else if has(FATTR_SIZE) {
            node.mtime = now;
        }
        node.ctime = now;
        Ok(())
    }

    /// Sets the length of file `id`, zeros after the old end; ENOSPC past the capacity.
    fn resize(&mut self, id: u64, len: u64) -> Result<(), Errno> {
        let room = self.capacity - self.used;
        let bytes = self.file_mut(id)?;
        let old = bytes.len() as u64;
        if len > old {
            if len - old > room {
                return Err(Errno::ENOSPC);
            }
            let more = usize::try_from(len - old).map_err(|_| Errno::EFBIG)?;
            bytes.try_reserve(more).map_err(|_| Errno::ENOSPC)?;
        }
        bytes.resize(len as usize, 0); // fits: reserved above, or not longer than before
        self.used = self.used - old + len;
        Ok(())
    }

    /// READ: copies from `offset` into `out`; returns the bytes copied (short at the end).
    fn read(&self, id: u64, offset: u64, out: &mut [u8]) -> Result<usize, Errno> {
        let bytes = self.file(id)?;
        let start = usize::try_from(offset).map_or(bytes.len(), |o| o.min(bytes.len()));
        let n = out.len().min(bytes.len() - start);
        out[..n].copy_from_slice(&bytes[start..start + n]);
        Ok(n)
    }

    /// WRITE: `payload` at `offset`, the file grown as needed; returns the bytes written.
    fn write(&mut self, id: u64, offset: u64, payload: WriteData<'_>) -> Result<u32, Errno> {
        if payload.is_empty() {
            return Ok(0); // extends nothing
        }
        let end = offset
            .checked_add(payload.len() as u64)
            .ok_or(Errno::EFBIG)?;
        if end > self.file(id)?.len() as u64 {
            self.resize(id, end)?;
        }
        let bytes = self.file_mut(id)?;
        payload.copy_to(&mut bytes[offset as usize..end as usize]); // within the file now
        self.node_mut(id)?.touch();
        Ok(payload.len() as u32) // at most max_write
    }

    /// READDIR of the open directory `arg.fh` (node `dir`) from `arg.offset` on, into `out`.
    fn readdir<'b>(
        &mut self,
        dir: u64,
        arg: &fuse_read_in,
        mut out: ReaddirBuf<'b>,
    ) -> Result<ReaddirBuf<'b>, Errno> {
        if !self.listings.contains_key(&arg.fh) {
            return Err(Errno::EBADF);
        }
        if arg.offset == 0 {
            let snapshot = self.snapshot(dir)?;
            self.listings.insert(arg.fh, snapshot);
        }
        let skip = usize::try_from(arg.offset).unwrap_or(usize::MAX);
        for (i, entry) in self.listings[&arg.fh].iter().enumerate().skip(skip) {
            // The offset of an entry is that of the next one: where to go on from.
            if out.push(entry.ino, i as u64 + 1, entry.kind, &entry.name) == Pushed::Full {
                break;
            }
        }
        Ok(out)
    }

    /// The entries of directory `id`, `.` and `..` first.
    fn snapshot(&self, id: u64) -> Result<Vec<Dirent>, Errno> {
        let Kind::Dir { entries, parent } = &self.node(id)?.kind else {
            return Err(Errno::ENOTDIR);
        };
        let dir = |ino, name: &[u8]| Dirent {
            ino,
            kind: dirent_type(libc::S_IFDIR),
            name: name.to_vec(),
        };
        let mut list = vec![dir(id, b"."), dir(*parent, b"..")];
        list.extend(entries.iter().map(|(name, &ino)| Dirent {
            ino,
            kind: self.nodes.get(&ino).map_or(0, |n| dirent_type(n.mode)),
            name: name.clone(),
        }));
        Ok(list)
    }

    fn statfs(&self) -> fuse_statfs_out {
        let mut out = fuse_statfs_out::new_zeroed();
        let st = &mut out.st;
        (st.bsize, st.frsize, st.namelen) = (BLOCK as u32, BLOCK as u32, NAME_MAX as u32);
        st.blocks = self.capacity / BLOCK;
        st.bfree = (self.capacity - self.used) / BLOCK;
        st.bavail = st.bfree;
        st.files = MAX_NODES;
        st.ffree = MAX_NODES - self.nodes.len() as u64;
        out
    }
}
