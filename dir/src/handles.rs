//! Open files and directories by file handle (`fh`), from OPEN/CREATE/OPENDIR to
//! RELEASE/RELEASEDIR.
//!
//! Why a table and not the descriptor number as the handle (as some servers do): the
//! kernel may send any 64-bit value back, and a handle must be checked against what this
//! server opened, never trusted as a descriptor to act on. Slots are reused after
//! release; the kernel sends RELEASE only once no I/O on the handle remains, so a reused
//! number cannot meet a request meant for the old file. The entry is shared (`Arc`) so
//! that a request holds its file without holding the table's lock during I/O.

use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, MutexGuard};

use slab::Slab;

use fuse::backing::Mode;

use crate::dirstream::DirStream;
use crate::inodes::Inode;

/// What a handle stands for.
pub enum Open {
    /// A file opened for I/O, and, where the session has FUSE passthrough, the node and
    /// the mode its open was answered in (undone at RELEASE).
    File(OwnedFd, Option<Backed>),
    /// An open directory's listing (READDIR takes it in turns).
    Dir(Mutex<DirStream>),
}

/// An open counted in its node's passthrough mode ([`fuse::backing::Inode`]).
pub struct Backed {
    pub inode: Arc<Inode>,
    pub mode: Mode,
    /// Counted among the node's passthrough writers ([`Inode::writers`]).
    pub writes: bool,
}

/// Every open handle.
#[derive(Default)]
pub struct Handles {
    table: Mutex<Slab<Arc<Open>>>,
}

impl Handles {
    fn lock(&self) -> MutexGuard<'_, Slab<Arc<Open>>> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers `open`; returns its handle.
    pub fn insert(&self, open: Open) -> u64 {
        self.lock().insert(Arc::new(open)) as u64
    }

    /// The open file or directory behind `fh`, if this server opened it.
    pub fn get(&self, fh: u64) -> Option<Arc<Open>> {
        let slot = usize::try_from(fh).ok()?;
        self.lock().get(slot).map(Arc::clone)
    }

    /// RELEASE / RELEASEDIR: forgets `fh` (its descriptor closes once no request uses it).
    pub fn remove(&self, fh: u64) -> Option<Arc<Open>> {
        let slot = usize::try_from(fh).ok()?;
        self.lock().try_remove(slot)
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_checked_and_reused_after_release() {
        let h = Handles::default();
        let dev_null = || OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
        let a = h.insert(Open::File(dev_null(), None));
        let b = h.insert(Open::File(dev_null(), None));
        assert_ne!(a, b);
        assert!(matches!(h.get(a).as_deref(), Some(Open::File(..))));
        assert!(
            h.get(999).is_none() && h.get(u64::MAX).is_none(),
            "never opened"
        );
        assert!(h.remove(a).is_some());
        assert!(h.get(a).is_none() && h.remove(a).is_none(), "released");
        assert_eq!(
            h.insert(Open::File(dev_null(), None)),
            a,
            "the slot is reused"
        );
        assert_eq!(h.len(), 2);
    }
}
