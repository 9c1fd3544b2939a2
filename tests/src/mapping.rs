//! [`Mapping`]: a file mapped with mmap(2), behind a safe interface.
//!
//! The memory of a shared mapping can change under the process at any time (another
//! mapping, a write(2) to the file, the kernel dropping and re-reading a page), so a
//! `Mapping` never hands out references into it: bytes are copied in and out, with bounds
//! checked, and stores into a read-only mapping panic instead of faulting. It unmaps on
//! drop. What the type cannot prevent is SIGBUS: touching a page that is past the end of
//! the file (shrunk after mapping) or that the FUSE server fails to read. [`Mapping::map`]
//! refuses a range past the end; keep the file's size and the server alive while mapped.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::ptr::{self, NonNull};

use crate::sys::page_size;

/// What a mapping may do with its pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// `PROT_READ`.
    Read,
    /// `PROT_READ | PROT_WRITE`.
    ReadWrite,
}

/// Whether stores reach the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sharing {
    /// `MAP_SHARED`: stores go to the file (on writeback or msync), others' writes show.
    Shared,
    /// `MAP_PRIVATE`: stores are copy-on-write, private to this mapping.
    Private,
}

/// `len` bytes of a file from `offset` on, mapped; unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    access: Access,
}

impl Mapping {
    /// Maps `len` bytes of `file` at `offset` (a multiple of the page size). Fails with
    /// the kernel's errno (e.g. `EACCES` for a writable shared mapping of a read-only fd,
    /// `ENODEV` if the file system refuses mappings), or `InvalidInput` if the range is
    /// empty or goes past the end of the file.
    pub fn map(
        file: &File,
        offset: u64,
        len: usize,
        access: Access,
        sharing: Sharing,
    ) -> io::Result<Mapping> {
        let size = file.metadata()?.len();
        let past_end = offset.checked_add(len as u64).is_none_or(|end| end > size);
        if len == 0 || past_end {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("cannot map {len} bytes at {offset} of a {size}-byte file"),
            ));
        }
        let prot = match access {
            Access::Read => libc::PROT_READ,
            Access::ReadWrite => libc::PROT_READ | libc::PROT_WRITE,
        };
        let flags = match sharing {
            Sharing::Shared => libc::MAP_SHARED,
            Sharing::Private => libc::MAP_PRIVATE,
        };
        let offset = libc::off_t::try_from(offset)
            .map_err(|_| io::Error::from_raw_os_error(libc::EOVERFLOW))?;
        // SAFETY: with a null address the kernel picks a range that overlaps no existing
        // mapping, so no memory Rust knows about changes; the fd is valid (borrowed from
        // `file`) for the call, and the mapping keeps its own reference to the file.
        let addr =
            unsafe { libc::mmap(ptr::null_mut(), len, prot, flags, file.as_raw_fd(), offset) };
        if addr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(addr.cast::<u8>()).expect("mmap(2) returned NULL");
        Ok(Mapping { ptr, len, access })
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty (never: [`Mapping::map`] refuses empty ranges).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Panics unless `[offset, offset + len)` lies inside the mapping.
    #[track_caller]
    fn check_range(&self, offset: usize, len: usize) {
        let end = offset.checked_add(len);
        assert!(
            end.is_some_and(|end| end <= self.len),
            "{len} bytes at {offset} are outside a {}-byte mapping",
            self.len
        );
    }

    /// Copies `buf.len()` bytes from `offset` of the mapping into `buf` (loads: page
    /// faults may read from the file).
    #[track_caller]
    pub fn read_into(&self, offset: usize, buf: &mut [u8]) {
        self.check_range(offset, buf.len());
        // SAFETY: the source range lies inside our live, readable mapping (checked above)
        // and cannot overlap `buf`, which Rust owns; the copy goes through raw pointers,
        // so no reference into the mapping's changeable memory is made.
        unsafe {
            ptr::copy_nonoverlapping(self.ptr.as_ptr().add(offset), buf.as_mut_ptr(), buf.len())
        }
    }

    /// `len` bytes from `offset` of the mapping.
    #[track_caller]
    pub fn read(&self, offset: usize, len: usize) -> Vec<u8> {
        let mut out = vec![0; len];
        self.read_into(offset, &mut out);
        out
    }

    /// Stores `data` at `offset` of the mapping. Panics on a read-only mapping (it would
    /// fault) or outside the mapping.
    #[track_caller]
    pub fn write(&self, offset: usize, data: &[u8]) {
        assert_eq!(
            self.access,
            Access::ReadWrite,
            "store into a read-only mapping"
        );
        self.check_range(offset, data.len());
        // SAFETY: the destination range lies inside our live mapping (checked above),
        // which is writable (PROT_WRITE, checked above); it is not memory Rust hands out
        // references to, so nothing aliases it, and it cannot overlap `data`.
        unsafe {
            ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(offset), data.len())
        }
    }

    /// `msync(MS_SYNC)` over the pages holding `[offset, offset + len)`: returns once the
    /// dirty ones among them are written to the file (for a shared mapping).
    #[track_caller]
    pub fn sync(&self, offset: usize, len: usize) -> io::Result<()> {
        self.check_range(offset, len);
        let page = page_size();
        let start = offset / page * page;
        let end = (offset + len)
            .next_multiple_of(page)
            .min(self.len.next_multiple_of(page));
        // SAFETY: msync(2) only reads the page tables of `[start, end)`, a page-aligned
        // range inside our live mapping (which the kernel rounds to whole pages too).
        let res = unsafe {
            libc::msync(
                self.ptr.as_ptr().add(start).cast(),
                end - start,
                libc::MS_SYNC,
            )
        };
        if res < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// `msync(MS_SYNC)` over the whole mapping.
    pub fn sync_all(&self) -> io::Result<()> {
        self.sync(0, self.len)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr` and `len` are exactly what mmap(2) returned and was asked for, the
        // mapping was not unmapped before, and no reference into it exists (see the type).
        let res = unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
        if res < 0 {
            crate::require::note(&format!("munmap: {}", io::Error::last_os_error()));
        }
    }
}
