//! The image file under the qcow2 layer, any [`BlockBackend`]: a [`FileBackend`] (so the
//! file gets its retries, its O_DIRECT bounces and QEMU's image locks) or an NBD export
//! holding the qcow2 file; with byte-buffer helpers for metadata, and [`Nap`], how a
//! request waits for another one in every [`Ctx`].
//!
//! What the layer asks of it: reads, writes, `write_durable`, flush, discard (space given
//! back, `EOPNOTSUPP` tolerated), its length and `resize` to grow it when clusters are
//! allocated past the end. An NBD export cannot grow (as QEMU's `driver=nbd`: "Cannot
//! grow NBD nodes"), so over NBD clusters are allocated only inside the export's size:
//! the refcount table's free clusters; past them writes fail with `ENOSPC`.
//!
//! [`FileBackend`]: crate::FileBackend

use std::io::{self, IoSlice, IoSliceMut};
use std::time::Duration;

use std::sync::Arc;

use crate::{BlockBackend, Ctx};

/// The qcow2 image file.
pub(crate) struct Host {
    pub(crate) file: Arc<dyn BlockBackend>,
}

impl Host {
    /// Reads all of `buf` at `offset`; `InvalidData` if the file ends first (metadata
    /// past the end of the file).
    pub(crate) fn read_exact(&self, cx: &Ctx<'_>, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let want = buf.len();
        let n = self.file.readv(cx, &mut [IoSliceMut::new(buf)], offset)?;
        if n < want {
            return Err(super::header::invalid(format_args!(
                "{want} bytes at {offset:#x} lie past the end of the file"
            )));
        }
        Ok(())
    }

    /// Reads `buf` at `offset`, zero-filling what lies past the end of the file (a data
    /// cluster may end there when its last bytes were never written).
    pub(crate) fn read_padded(&self, cx: &Ctx<'_>, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let n = self.file.readv(cx, &mut [IoSliceMut::new(buf)], offset)?;
        buf[n..].fill(0);
        Ok(())
    }

    /// Writes all of `buf` at `offset`.
    pub(crate) fn write(&self, cx: &Ctx<'_>, buf: &[u8], offset: u64) -> io::Result<()> {
        self.file.writev(cx, &[IoSlice::new(buf)], offset)
    }

    /// Writes all of `buf` at `offset`, durable on return (with `RWF_DSYNC`: the rest of
    /// the image's dirty pages are not written back with it).
    pub(crate) fn write_durable(&self, cx: &Ctx<'_>, buf: &[u8], offset: u64) -> io::Result<()> {
        self.file.write_durable(cx, buf, offset)
    }

    /// Writes one big-endian 64-bit table entry.
    pub(crate) fn write_u64(&self, cx: &Ctx<'_>, value: u64, offset: u64) -> io::Result<()> {
        self.write(cx, &value.to_be_bytes(), offset)
    }
}

/// A request's way of waiting for another that holds what it needs: a coroutine yields
/// once and then sleeps on io_uring timeouts (20 µs doubling to 1 ms), so its loop keeps
/// serving; a thread sleeps likewise.
#[derive(Default)]
pub(crate) struct Nap(Option<Duration>);

impl Nap {
    pub(crate) fn wait(&mut self, cx: &Ctx<'_>) {
        match (cx, self.0) {
            (Ctx::Coroutine(co), None) => co.yield_now(),
            (Ctx::Coroutine(co), Some(d)) => {
                if co.ctx().sleep(d).is_err() {
                    co.yield_now();
                }
            }
            (Ctx::Blocking, d) => std::thread::sleep(d.unwrap_or(Duration::from_micros(20))),
        }
        let next = self.0.map_or(Duration::from_micros(20), |d| d * 2);
        self.0 = Some(next.min(Duration::from_millis(1)));
    }
}
