//! Request buffers, pooled per queue so that steady state allocates nothing.
//!
//! # Layout: a WRITE's data starts on a page boundary
//!
//! A read of /dev/fuse delivers one request as a byte stream: `fuse_in_header` (40 bytes),
//! the opcode's argument struct, then any payload. A WRITE's payload follows its
//! `fuse_write_in` (40 bytes), so it starts at byte [`WRITE_DATA_AT`] = 80 of the stream.
//! Each request is read into one page-aligned [`RequestBuf`], *starting 80 bytes before a
//! page boundary*:
//!
//! ```text
//!  page 0 (not read into)              | page 1, 2, ...
//!  [ ...unused... | in_header | write_in ][ WRITE data, 4 KiB .. max_write          ]
//!                 ^ the read starts at 4016 ^ 4096: page-aligned
//! ```
//!
//! - WRITE data of any size lands page-aligned and contiguous, so an O_DIRECT backend takes
//!   an aligned write as it is: no bounce, no copy, whatever the size (4 KiB to 1 MiB).
//! - A READ request is exactly 80 bytes (`in_header` + `fuse_read_in`), so it ends at the
//!   page boundary and its reply data is built in the same buffer from there on: page-aligned
//!   too, for O_DIRECT reads.
//! - Every other request is contiguous from the read's start, so the decoder sees one slice
//!   (`tail` empty). The header sits at offset 4016, 8-byte aligned as the decoder needs.
//!
//! The read offers `80 + max(max_write, 8192 - 80)` bytes, what the kernel demands
//! (`init::min_read_buffer`). FUSE over io_uring keeps the same property by registering a
//! page-aligned payload buffer: there the headers live in a separate iovec already.
//!
//! # Memory
//! One buffer per request in flight plus one per outstanding read: 4 KiB + `max_write`
//! reserved each (1 MiB + 4 KiB by default), but memory comes zeroed from the allocator
//! and a page is only backed once touched, so a 4 KiB request keeps two pages resident and
//! only large transfers make a buffer's pages resident. QEMU's series uses a small in-place
//! buffer plus a spill-over buffer taken only by large writes; we give that up because its
//! in-place part is what made our 4 KiB writes unaligned (issue 7), and the page that each
//! buffer reserves in front of its data is the price of alignment.

use std::cell::{Cell, RefCell};
use std::mem::size_of;

use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout};

use fuse::abi::{fuse_in_header, fuse_write_in};

/// Where a WRITE's data starts in the request stream: after the header and `fuse_write_in`.
pub const WRITE_DATA_AT: usize = size_of::<fuse_in_header>() + size_of::<fuse_write_in>();
/// Alignment of WRITE data and READ reply data in a [`RequestBuf`].
pub const DATA_ALIGN: usize = 4096;
/// Offset of the first request byte in a [`RequestBuf`].
const READ_AT: usize = DATA_ALIGN - WRITE_DATA_AT;
/// The kernel's smallest read buffer ([`fuse::abi::FUSE_MIN_READ_BUFFER`]).
const MIN_READ: usize = fuse::abi::FUSE_MIN_READ_BUFFER;

const _: () = assert!(
    READ_AT % 8 == 0,
    "the decoder needs an 8-byte aligned header"
);

/// One page, so that buffers are page-aligned.
#[derive(Clone, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C, align(4096))]
struct Page([u8; DATA_ALIGN]);

/// The buffer one request is read into and served from (see the module docs for its layout).
pub struct RequestBuf(Box<[Page]>);

impl RequestBuf {
    /// A buffer for requests carrying at most `max_write` bytes of data and READs of at most
    /// that much.
    pub fn new(max_write: u32) -> RequestBuf {
        let data = (max_write as usize).max(MIN_READ - WRITE_DATA_AT);
        let pages = 1 + data.div_ceil(DATA_ALIGN);
        RequestBuf(<[Page]>::new_box_zeroed_with_elems(pages).expect("allocation"))
    }

    /// Where to read a request into: from 80 bytes before the first data page to the end.
    pub fn read_area(&mut self) -> &mut [u8] {
        &mut self.0.as_mut_bytes()[READ_AT..]
    }

    /// The `n` request bytes a read placed in [`read_area`](Self::read_area), and the
    /// page-aligned space for READ reply data: everything after the request's bytes when the
    /// request ends at or before the first data page (as a READ does), else nothing.
    pub fn parts(&mut self, n: usize) -> (&[u8], &mut [u8]) {
        let bytes = self.0.as_mut_bytes();
        let n = n.min(bytes.len() - READ_AT);
        if n > WRITE_DATA_AT {
            return (&bytes[READ_AT..READ_AT + n], &mut []);
        }
        let (front, data) = bytes.split_at_mut(DATA_ALIGN);
        (&front[READ_AT..READ_AT + n], data)
    }

    /// The request bytes of a read of `n` (see [`parts`](Self::parts)).
    pub fn request(&self, n: usize) -> &[u8] {
        let bytes = &self.0.as_bytes()[READ_AT..];
        &bytes[..n.min(bytes.len())]
    }
}

/// A page-aligned buffer of whole pages: the payload buffer of a FUSE-over-io_uring ring
/// entry (WRITE data arrives there, READ replies are built there, both page-aligned).
pub struct PageBuf(Box<[Page]>);

impl PageBuf {
    /// At least `len` zeroed bytes, rounded up to whole pages.
    pub fn new(len: usize) -> PageBuf {
        PageBuf(<[Page]>::new_box_zeroed_with_elems(len.div_ceil(DATA_ALIGN)).expect("allocation"))
    }

    /// The buffer as bytes.
    pub fn bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }

    /// The buffer as bytes, to fill.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        self.0.as_mut_bytes()
    }
}

/// A free list; grows to the high-water mark of buffers in use, then reuses them.
pub struct Pool<T> {
    free: RefCell<Vec<T>>,
    make: Box<dyn Fn() -> T>,
    allocated: Cell<u64>,
}

impl<T> Pool<T> {
    fn new(make: Box<dyn Fn() -> T>) -> Self {
        Pool {
            free: RefCell::new(Vec::new()),
            make,
            allocated: Cell::new(0),
        }
    }

    /// A free buffer, or a new one when none is free.
    pub fn take(&self) -> T {
        if let Some(buf) = self.free.borrow_mut().pop() {
            return buf;
        }
        self.allocated.set(self.allocated.get() + 1);
        (self.make)()
    }

    /// Returns a buffer for reuse.
    pub fn give(&self, buf: T) {
        self.free.borrow_mut().push(buf);
    }

    /// Buffers allocated so far (the high-water mark of buffers in use).
    pub fn allocated(&self) -> u64 {
        self.allocated.get()
    }
}

/// The request buffers of one queue.
pub struct Buffers {
    /// One per outstanding read and per request in flight.
    pub requests: Pool<RequestBuf>,
}

impl Buffers {
    /// A pool for a queue whose requests carry at most `max_write` bytes of data.
    pub fn new(max_write: u32) -> Buffers {
        Buffers {
            requests: Pool::new(Box::new(move || RequestBuf::new(max_write))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fuse::init::min_read_buffer;

    #[test]
    fn write_data_and_read_replies_start_on_a_page() {
        let mut buf = RequestBuf::new(1 << 20);
        let area = buf.read_area();
        assert_eq!(
            area.len(),
            min_read_buffer(1 << 20),
            "what the kernel demands"
        );
        assert_eq!(area.as_ptr() as usize % 8, 0, "header alignment");
        let write_data = area[WRITE_DATA_AT..].as_ptr() as usize;
        assert_eq!(write_data % DATA_ALIGN, 0, "WRITE data page-aligned");
        let (request, data) = buf.parts(80); // a READ
        assert_eq!((request.len(), data.len()), (80, 1 << 20));
        assert_eq!(
            data.as_ptr() as usize % DATA_ALIGN,
            0,
            "READ data page-aligned"
        );
        let (request, data) = buf.parts(80 + 4096); // a 4 KiB WRITE
        assert_eq!((request.len(), data.len()), (80 + 4096, 0));
        assert_eq!(request[WRITE_DATA_AT..].as_ptr() as usize % DATA_ALIGN, 0);
    }

    #[test]
    fn small_max_write_still_offers_the_kernel_minimum() {
        let mut buf = RequestBuf::new(0);
        let offered = buf.read_area().len();
        assert!(offered >= min_read_buffer(0), "{offered}");
        assert_eq!(buf.request(1 << 30).len(), offered, "clamped");
    }
}
