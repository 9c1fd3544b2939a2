//! The read path: a request is cut at cluster boundaries, runs of data clusters that lie
//! back to back in the file are read in one transfer, straight into the caller's iovecs.
//! Also the whole-cluster reads that copy-on-write starts from, and `block_status`.

use std::io::{self, IoSliceMut};

use crate::range_lock::Mode;
use crate::{iov, BlockBackend, Ctx, Extent};

use super::entry::Mapping;
use super::Qcow2Backend;

/// Clusters `block_status` looks at, at most, to find where a run ends.
const STATUS_SCAN: u64 = 1024;

impl Qcow2Backend {
    pub(super) fn read(
        &self,
        cx: &Ctx<'_>,
        bufs: &mut [IoSliceMut<'_>],
        offset: u64,
    ) -> io::Result<usize> {
        let total = iov::total(bufs) as u64;
        crate::checked_end(offset, total)?;
        let size = self.len();
        if offset >= size || total == 0 {
            return Ok(0);
        }
        let n = total.min(size - offset);
        let first = self.cluster_of(offset);
        let _held = self.hold(cx, first, self.cluster_of(offset + n - 1) + 1, Mode::Shared);
        let mut done = 0;
        while done < n {
            let pos = offset + done;
            let (mapping, run) = self.run_at(cx, pos, n - done)?;
            self.read_run(cx, bufs, done as usize, run as usize, pos, mapping)?;
            done += run;
        }
        Ok(n as usize)
    }

    /// The mapping at guest byte `pos`, and how many of the next `max` bytes read the same
    /// way in one transfer (data clusters back to back in the file; one cluster otherwise).
    fn run_at(&self, cx: &Ctx<'_>, pos: u64, max: u64) -> io::Result<(Mapping, u64)> {
        let cs = self.cluster_size();
        let mapping = self.lookup(cx, self.cluster_of(pos))?;
        let mut run = (cs - pos % cs).min(max);
        if let Mapping::Data { host, .. } = mapping {
            let mut next = host + cs;
            while run < max {
                match self.lookup(cx, self.cluster_of(pos + run))? {
                    Mapping::Data { host, .. } if host == next => {}
                    _ => break,
                }
                run = (run + cs).min(max);
                next += cs;
            }
        }
        Ok((mapping, run))
    }

    /// Reads `len` bytes at guest `pos` that `mapping` describes into `bufs` from `skip`.
    fn read_run(
        &self,
        cx: &Ctx<'_>,
        bufs: &mut [IoSliceMut<'_>],
        skip: usize,
        len: usize,
        pos: u64,
        mapping: Mapping,
    ) -> io::Result<()> {
        let within = pos % self.cluster_size();
        match (mapping, &self.backing) {
            (Mapping::Unallocated, Some(b)) => read_from(cx, &**b, bufs, skip, len, pos),
            (Mapping::Zero { .. } | Mapping::Unallocated, _) => {
                zero_range(bufs, skip, len);
                Ok(())
            }
            (Mapping::Data { host, .. }, _) => {
                read_from(cx, &*self.host.file, bufs, skip, len, host + within)
            }
            (Mapping::Compressed { host, len: zlen }, _) => {
                let mut cluster = self.bufs.take();
                self.decompress(cx, host, zlen, &mut cluster)?;
                iov::scatter(bufs, skip, &cluster[within as usize..][..len]);
                Ok(())
            }
        }
    }

    /// Decompresses the cluster of `zlen` bytes at `host` into `out`.
    fn decompress(&self, cx: &Ctx<'_>, host: u64, zlen: u64, out: &mut [u8]) -> io::Result<()> {
        let mut input = self.zbufs.take();
        let input = &mut input[..(zlen as usize).min(2 * out.len())];
        self.host.read_padded(cx, input, host)?;
        self.decompressor.decompress(self.h.compression, input, out)
    }

    /// The whole guest `cluster` as it reads now (mapped as `mapping`), into `out`: where
    /// copy-on-write starts from.
    pub(super) fn read_cluster(
        &self,
        cx: &Ctx<'_>,
        cluster: u64,
        mapping: Mapping,
        out: &mut [u8],
    ) -> io::Result<()> {
        let n = match (mapping, &self.backing) {
            (Mapping::Unallocated, Some(b)) => {
                let pos = cluster * self.cluster_size();
                b.readv(cx, &mut [IoSliceMut::new(out)], pos)?
            }
            (Mapping::Zero { .. } | Mapping::Unallocated, _) => 0,
            (Mapping::Data { host, .. }, _) => return self.host.read_padded(cx, out, host),
            (Mapping::Compressed { host, len }, _) => return self.decompress(cx, host, len, out),
        };
        out[n..].fill(0);
        Ok(())
    }

    /// Data or hole at `offset`, and where that run ends.
    pub(super) fn status(&self, cx: &Ctx<'_>, offset: u64) -> io::Result<Extent> {
        let size = self.len();
        if offset >= size {
            return Err(io::Error::from_raw_os_error(libc::ENXIO));
        }
        let cs = self.cluster_size();
        let first = self.cluster_of(offset);
        let kind = self.status_of(cx, offset, self.lookup(cx, first)?)?;
        if let Some(Extent { kind, end }) = kind {
            return Ok(Extent {
                kind,
                end: end.min(size),
            }); // from the backing file
        }
        let data = matches!(
            self.lookup(cx, first)?,
            Mapping::Data { .. } | Mapping::Compressed { .. }
        );
        let mut end = (first + 1) * cs;
        while end < size && end / cs < first + STATUS_SCAN {
            let m = self.lookup(cx, end / cs)?;
            let same = match m {
                Mapping::Data { .. } | Mapping::Compressed { .. } => data,
                Mapping::Zero { .. } => !data,
                Mapping::Unallocated => !data && self.backing.is_none(),
            };
            if !same {
                break;
            }
            end += cs;
        }
        let end = end.min(size);
        Ok(if data {
            Extent::data(end)
        } else {
            Extent::hole(end)
        })
    }

    /// For an unallocated cluster over a backing file: what the backing file says, up to
    /// the end of the cluster; `None` otherwise.
    fn status_of(&self, cx: &Ctx<'_>, offset: u64, mapping: Mapping) -> io::Result<Option<Extent>> {
        let (Mapping::Unallocated, Some(b)) = (mapping, &self.backing) else {
            return Ok(None);
        };
        let cluster_end = (self.cluster_of(offset) + 1) * self.cluster_size();
        if offset >= b.len() {
            return Ok(Some(Extent::hole(cluster_end)));
        }
        let e = b.block_status(cx, offset)?;
        Ok(Some(Extent {
            kind: e.kind,
            end: e.end.min(cluster_end),
        }))
    }
}

/// Reads `len` bytes at `pos` of `from` into `bufs` from `skip` on; what lies past the end
/// of `from` reads as zeroes.
fn read_from(
    cx: &Ctx<'_>,
    from: &dyn BlockBackend,
    bufs: &mut [IoSliceMut<'_>],
    skip: usize,
    len: usize,
    pos: u64,
) -> io::Result<()> {
    let mut done = 0;
    while done < len {
        let mut window = iov::empty_window_mut();
        let (used, covered) = iov::window_mut(bufs, skip + done, len - done, &mut window);
        let n = from.readv(cx, &mut window[..used], pos + done as u64)?;
        if n < covered {
            zero_range(bufs, skip + done + n, len - done - n);
            return Ok(());
        }
        done += covered;
    }
    Ok(())
}

/// Zeroes `len` bytes of `bufs` from `skip` on.
pub(super) fn zero_range(bufs: &mut [IoSliceMut<'_>], skip: usize, len: usize) {
    let mut done = 0;
    while done < len {
        let mut window = iov::empty_window_mut();
        let (used, covered) = iov::window_mut(bufs, skip + done, len - done, &mut window);
        iov::zero(&mut window[..used], covered);
        done += covered;
    }
}
