//! Growing the virtual disk (truncate through a writable export), as QEMU's
//! `qcow2_co_truncate` does without preallocation: the new space is unallocated.
//!
//! - Within what the L1 table maps: one header write of the size, synced.
//! - Past it: a new, larger L1 table at the end of the file (old entries, then zeroes),
//!   synced; then one 24-byte header write switches size, `l1_size` and `l1_table_offset`
//!   together (bytes 24-47: size, crypt_method, which is 0, then the two L1 fields),
//!   synced; then the old table's clusters are freed (after the next flush). A kill before
//!   the switch leaves the old size and table in force (the new one leaked).
//! - Refused: shrinking (`EOPNOTSUPP`, as QEMU without `--shrink`), growing a v2 image
//!   with internal snapshots (`EOPNOTSUPP`, as QEMU: its snapshot entries cannot record
//!   the size they were taken at), a size that is not a
//!   multiple of 512 (`EINVAL`: QEMU counts the disk in sectors), an L1 table past QEMU's
//!   32 MiB (`EFBIG`), and growing over a backing file that is longer than the disk
//!   (`EOPNOTSUPP`: its bytes would show through the new space, which QEMU zeroes).

use std::io;
use std::sync::atomic::Ordering;

use crate::range_lock::{Mode, Span};
use crate::{BlockBackend, Ctx};

use super::header::SIZE_FIELD;
use super::Qcow2Backend;

/// QEMU's limit on the L1 table.
const MAX_L1_BYTES: u64 = 32 << 20;

impl Qcow2Backend {
    /// Sets the size to `new_len`; with `at_least`, a size already that large is kept (a
    /// growable export's write, which may race another that grew the disk further).
    pub(super) fn resize_to(&self, cx: &Ctx<'_>, new_len: u64, at_least: bool) -> io::Result<()> {
        let one = Span {
            start: u64::MAX - 1,
            end: u64::MAX,
        };
        let _one_at_a_time = self.l1_locks.lock(cx, one, Mode::Exclusive);
        let size = self.len();
        let refuse = |errno, why: &str| {
            log::warn!("qcow2 {}: resize to {new_len}: {why}", self.path.display());
            Err(io::Error::from_raw_os_error(errno))
        };
        let per_l1_entry = self.h.l2_entries() * self.cluster_size();
        let needed = new_len.div_ceil(per_l1_entry);
        if new_len == size || (at_least && new_len < size) {
            return Ok(());
        }
        if new_len % 512 != 0 {
            return refuse(libc::EINVAL, "not a multiple of 512 bytes");
        }
        if new_len < size {
            return refuse(libc::EOPNOTSUPP, "shrinking a qcow2 image is not supported");
        }
        if self.h.version == 2 && self.snapshots.load(Ordering::Relaxed) > 0 {
            // As QEMU: a v2 snapshot entry cannot record the size it was taken at.
            return refuse(libc::EOPNOTSUPP, "a v2 image with snapshots cannot grow");
        }
        if needed * 8 > MAX_L1_BYTES {
            return refuse(libc::EFBIG, "the L1 table would pass 32 MiB");
        }
        if self.backing.as_ref().is_some_and(|b| b.len() > size) {
            return refuse(
                libc::EOPNOTSUPP,
                "the backing file would show through the new space",
            );
        }
        if needed as usize > self.l1.len() {
            self.grow_l1(cx, new_len, needed)?;
        } else {
            self.host.write_u64(cx, new_len, SIZE_FIELD)?;
            self.host.file.flush(cx)?;
        }
        self.size.store(new_len, Ordering::Release);
        Ok(())
    }

    /// Moves the L1 table to a new place with `entries` entries, and sets the size.
    fn grow_l1(&self, cx: &Ctx<'_>, new_len: u64, entries: u64) -> io::Result<()> {
        let alloc = self.check_writable()?;
        // No L2 table is made (no L1 entry written) while the table moves.
        let all = Span {
            start: 0,
            end: u64::MAX - 1,
        };
        let _entries = self.l1_locks.lock(cx, all, Mode::Exclusive);
        let cs = self.cluster_size();
        let clusters = (entries * 8).div_ceil(cs);
        let at = alloc.contiguous(cx, &self.host, clusters)?;
        let mut raw = vec![0u8; (clusters * cs) as usize]; // once per growth
        let (old_offset, old_len) = {
            let t = self.l1.read();
            for (e, out) in t.entries.iter().zip(raw.chunks_exact_mut(8)) {
                out.copy_from_slice(&e.load(Ordering::Acquire).to_be_bytes());
            }
            (t.offset, t.entries.len() as u64)
        };
        self.host.write(cx, &raw, at)?;
        self.host.file.flush(cx)?;
        let mut fields = [0u8; 24];
        fields[..8].copy_from_slice(&new_len.to_be_bytes());
        fields[12..16].copy_from_slice(&(entries as u32).to_be_bytes());
        fields[16..].copy_from_slice(&at.to_be_bytes());
        self.host.write(cx, &fields, SIZE_FIELD)?;
        self.host.file.flush(cx)?;
        self.l1.replace(&raw[..entries as usize * 8], at);
        let first = old_offset / cs;
        alloc.free_later(first..first + (old_len * 8).div_ceil(cs));
        Ok(())
    }
}
