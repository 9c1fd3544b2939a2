//! Concurrent O_DIRECT writes through a `--direct -w` export of an image on real storage
//! (a disk-backed file system: O_DIRECT there has the device's alignment rules, 512 bytes
//! on a virtio disk, so the daemon's backend must bounce and read-modify-write whatever
//! breaks them). Several threads write at random into a small region, mixing page-aligned
//! writes of 4-64 KiB, 512-aligned ones (offset and length multiples of 512, not of 4096)
//! and unaligned ones. All go through O_DIRECT fds: FUSE accepts unaligned O_DIRECT on a
//! `FOPEN_DIRECT_IO` file and sends each write to the daemon as it is. (Were one refused
//! with EINVAL, the thread would use a plain fd for it: the file is `FOPEN_DIRECT_IO`, so
//! that write reaches the daemon unchanged too.)
//!
//! Two checks, each as its own test:
//! - overlapping writes: every byte must end up as some serial order of the writes would
//!   leave it. Each write records when it started and returned (a shared counter); a write
//!   that returned before another covering the same byte started cannot be the one that
//!   byte shows. So each byte must hold the payload of a covering write that no later
//!   covering write followed, or what it held before if none covered it. A backend whose
//!   read-modify-write races with another write (say an aligned one that skips its lock)
//!   puts back older bytes: caught here. Since only the last writes of a byte can show,
//!   the writes come in many short rounds (all threads write, all return, the region is
//!   read through the mount and checked, the next round starts from what was read).
//! - disjoint writes in shared blocks: threads own interleaved byte ranges (25-byte slices
//!   of every 100 bytes, and every fourth 512-byte sector), so no two writes share a byte
//!   but most share a 512- or 4096-byte block. The result is then exact: every thread's
//!   last bytes. A read-modify-write that is not ordered with the others loses bytes here.
//!
//! Both check through the mount and, after the export stops, the image file itself.

use std::fs::{self, File};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};

use corofuse_tests::require::{note, report_skip};
use corofuse_tests::{
    assert_bytes_eq, dispatch_tests, open_direct, open_rw, pattern, AlignedBuf, Dispatch,
    MountedExport, Rng, Sandbox, Seed, KIB, MIB,
};

const LEN: u64 = MIB;
const THREADS: usize = 4;
const ARGS: &[&str] = &["--direct", "-w"];

/// A disk-backed sandbox, or `None` after saying why there is none.
fn real_fs_sandbox() -> Option<Sandbox> {
    Sandbox::on_real_fs().map_err(|why| report_skip(&why)).ok()
}

/// One thread's fds on the mount: O_DIRECT, and a plain one in case the kernel refuses an
/// unaligned O_DIRECT write.
struct Writer {
    direct: File,
    plain: File,
}

/// Set once an unaligned O_DIRECT write was refused: from then on they use the plain fd.
static UNALIGNED_DIRECT_REFUSED: AtomicBool = AtomicBool::new(false);

impl Writer {
    fn open(mount: &Path) -> Writer {
        Writer {
            direct: open_direct(mount, true).expect("open the mount O_DIRECT"),
            plain: open_rw(mount).expect("open the mount"),
        }
    }

    /// Writes all of `data` at `offset`, O_DIRECT (see the module comment for the plain fd).
    fn write(&self, data: &[u8], offset: u64) {
        let buf = AlignedBuf::from_slice(data);
        let aligned = offset % 512 == 0 && data.len() % 512 == 0;
        if aligned || !UNALIGNED_DIRECT_REFUSED.load(SeqCst) {
            match self.direct.write_at(&buf, offset) {
                Ok(n) => {
                    assert_eq!(
                        n,
                        data.len(),
                        "O_DIRECT write of {} at {offset}",
                        data.len()
                    );
                    return;
                }
                Err(e) if !aligned && e.raw_os_error() == Some(libc::EINVAL) => {
                    if !UNALIGNED_DIRECT_REFUSED.swap(true, SeqCst) {
                        note("unaligned O_DIRECT writes refused (EINVAL): using a plain fd");
                    }
                }
                Err(e) => panic!("O_DIRECT write of {} bytes at {offset}: {e}", data.len()),
            }
        }
        let n = self
            .plain
            .write_at(&buf, offset)
            .unwrap_or_else(|e| panic!("plain write of {} bytes at {offset}: {e}", data.len()));
        assert_eq!(n, data.len(), "plain write of {} at {offset}", data.len());
    }

    /// `len` bytes at `offset`, read O_DIRECT.
    fn read(&self, offset: u64, len: usize) -> Vec<u8> {
        let mut buf = AlignedBuf::zeroed(len);
        self.direct
            .read_exact_at(&mut buf, offset)
            .unwrap_or_else(|e| panic!("O_DIRECT read of {len} bytes at {offset}: {e}"));
        buf.to_vec()
    }
}

/// The whole export, O_DIRECT, and after stopping it the image file: both must pass
/// `check`.
fn check_mount_then_image(export: MountedExport, image: &Path, mut check: impl FnMut(&[u8], &str)) {
    let through_mount = Writer::open(export.path()).read(0, LEN as usize);
    check(&through_mount, "read through the mount");
    export.stop();
    check(&fs::read(image).unwrap(), "the image after unmount");
}

// ---------------------------------------------------------------------------------------
// Overlapping writes.

/// The region the overlapping writes land in: small, so that they overlap heavily.
const REGION: u64 = 256 * KIB;
/// Rounds of concurrent writes, each checked on its own once all its writes returned: a
/// check only sees the last writes of each byte, so many small rounds catch far more
/// than one long one.
const ROUNDS: usize = 25;
/// Writes per thread and round.
const ROUND_WRITES: usize = 10;

/// One completed write.
#[derive(Clone, Copy, Debug)]
struct Write {
    thread: usize,
    seq: usize,
    kind: Kind,
    offset: u64,
    len: usize,
    /// Ticks of the shared clock just before the pwrite(2), and just after it returned.
    started: u64,
    returned: u64,
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    /// Offset and length multiples of 4096, 4-64 KiB.
    Page,
    /// Offset and length multiples of 512, neither of 4096.
    Sector,
    /// Any offset and length (1 byte to 12 KiB).
    Unaligned,
}

impl Write {
    fn payload(&self, seed: u64) -> Vec<u8> {
        pattern(
            payload_seed(seed, self.thread, self.seq),
            self.offset,
            self.len,
        )
    }

    fn end(&self) -> u64 {
        self.offset + self.len as u64
    }

    fn covers(&self, b: usize) -> bool {
        (self.offset..self.end()).contains(&(b as u64))
    }
}

/// The payload of write `seq` of `thread`: a pattern that also depends on the position,
/// so that a byte of one write cannot pass for the same byte of another.
fn payload_seed(seed: u64, thread: usize, seq: usize) -> u64 {
    seed ^ ((thread as u64) << 48 | seq as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// A random write: a third of each kind.
fn random_write(rng: &mut Rng) -> (Kind, u64, usize) {
    match rng.below(3) {
        0 => {
            let pages = 1 + rng.below(16);
            let offset = rng.below(REGION / 4096 - pages + 1) * 4096;
            (Kind::Page, offset, (pages * 4096) as usize)
        }
        1 => {
            let not_page = |rng: &mut Rng, max: u64| loop {
                let n = 1 + rng.below(max);
                if n % 8 != 0 {
                    return n;
                }
            };
            let sectors = not_page(rng, 127);
            let offset = loop {
                let s = rng.below(REGION / 512 - sectors + 1);
                if s % 8 != 0 {
                    break s * 512;
                }
            };
            (Kind::Sector, offset, (sectors * 512) as usize)
        }
        _ => {
            let len = 1 + rng.below(12 * KIB);
            (Kind::Unaligned, rng.below(REGION - len + 1), len as usize)
        }
    }
}

/// One thread's writes of round `round`.
fn overlapping_round(
    writer: &Writer,
    rng: &mut Rng,
    seed: u64,
    (thread, round): (usize, usize),
    clock: &AtomicU64,
) -> Vec<Write> {
    (0..ROUND_WRITES)
        .map(|i| {
            let seq = round * ROUND_WRITES + i;
            let (kind, offset, len) = random_write(rng);
            let data = pattern(payload_seed(seed, thread, seq), offset, len);
            let started = clock.fetch_add(1, SeqCst);
            writer.write(&data, offset);
            let returned = clock.fetch_add(1, SeqCst);
            Write {
                thread,
                seq,
                kind,
                offset,
                len,
                started,
                returned,
            }
        })
        .collect()
}

/// Checks `after` (the region once all of `writes` returned) against `before` (the region
/// before any of them started): see the module comment. Describes the first byte that no
/// serial order of the writes explains.
fn serial_order_violation(
    after: &[u8],
    before: &[u8],
    writes: &[Write],
    seed: u64,
) -> Option<String> {
    // The latest start among the writes covering each byte (0: none; ticks start at 1).
    let mut latest_start = vec![0u64; after.len()];
    for w in writes {
        for s in &mut latest_start[w.offset as usize..w.end() as usize] {
            *s = (*s).max(w.started);
        }
    }
    // A byte is explained by a write covering it, not followed by another covering it,
    // that wrote the value it holds.
    let mut explained = vec![false; after.len()];
    for w in writes {
        let at = w.offset as usize;
        for (i, byte) in w.payload(seed).into_iter().enumerate() {
            if w.returned > latest_start[at + i] && after[at + i] == byte {
                explained[at + i] = true;
            }
        }
    }
    let unexplained = |b: &usize| match latest_start[*b] {
        0 => after[*b] != before[*b],
        _ => !explained[*b],
    };
    let bad = (0..after.len()).find(unexplained)?;
    let mut lines = vec![format!(
        "byte {bad} holds {:#04x}, which no serial order of the writes leaves there \
         (before them: {:#04x}; {} such bytes in all); of the writes covering it, the \
         latest and any whose byte it holds:",
        after[bad],
        before[bad],
        (0..after.len()).filter(unexplained).count()
    )];
    for w in writes.iter().filter(|w| w.covers(bad)) {
        let byte = w.payload(seed)[bad - w.offset as usize];
        let latest = w.returned > latest_start[bad];
        if latest || byte == after[bad] {
            lines.push(format!(
                "  thread {} write {} ({:?}, {} bytes at {}), ticks {}..{}, wrote {byte:#04x}{}",
                w.thread,
                w.seq,
                w.kind,
                w.len,
                w.offset,
                w.started,
                w.returned,
                if latest {
                    ""
                } else {
                    " (superseded: it returned before a later one started)"
                }
            ));
        }
    }
    Some(lines.join("\n"))
}

dispatch_tests!(mount_direct_overlapping_writes_leave_a_serial_order);
fn mount_direct_overlapping_writes_leave_a_serial_order(mode: Dispatch) {
    let seed_guard = Seed::choose();
    let seed = seed_guard.value();
    let Some(sandbox) = real_fs_sandbox() else {
        return;
    };
    let original = pattern(seed ^ 0xF111, 0, LEN as usize);
    let image = sandbox.file("disk.img", &original);
    let export = MountedExport::start(&image, &sandbox.mountpoint("mnt"), mode, ARGS);
    let writers: Vec<Writer> = (0..THREADS).map(|_| Writer::open(export.path())).collect();
    let mut rngs: Vec<Rng> = (0..THREADS)
        .map(|t| Rng::new(seed ^ (t as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03)))
        .collect();
    let clock = AtomicU64::new(1);
    let mut region = original[..REGION as usize].to_vec();
    for round in 0..ROUNDS {
        let writes: Vec<Write> = std::thread::scope(|s| {
            let threads: Vec<_> = writers
                .iter()
                .zip(&mut rngs)
                .enumerate()
                .map(|(t, (writer, rng))| {
                    let clock = &clock;
                    s.spawn(move || overlapping_round(writer, rng, seed, (t, round), clock))
                })
                .collect();
            threads
                .into_iter()
                .flat_map(|t| t.join().expect("a writer thread panicked"))
                .collect()
        });
        let after = writers[0].read(0, REGION as usize);
        if let Some(why) = serial_order_violation(&after, &region, &writes, seed) {
            panic!("round {round}, read through the mount: {why}");
        }
        region = after;
    }
    let mut expected = original;
    expected[..REGION as usize].copy_from_slice(&region);
    drop(writers);
    check_mount_then_image(export, &image, |bytes, what| {
        assert_bytes_eq(bytes, &expected, &format!("{what}, after the last round"));
    });
}

// ---------------------------------------------------------------------------------------
// Disjoint writes in shared blocks.

/// Region A: thread `t` owns bytes `[k*100 + t*25, k*100 + t*25 + 25)` for every `k`.
const SLICES_AT: u64 = 256 * KIB;
const STRIDE: u64 = 100;
const SLICE: u64 = STRIDE / THREADS as u64;
const STRIDES: u64 = 64 * KIB / STRIDE;
/// Region B: thread `t` owns the 512-byte sectors `s` with `s % THREADS == t`.
const SECTORS_AT: u64 = 384 * KIB;
const SECTORS: u64 = 128;
const DISJOINT_WRITES: usize = 400;

/// The thread owning byte `b`, if it lies in region A or B.
fn owner(b: u64) -> Option<usize> {
    if (SLICES_AT..SLICES_AT + STRIDES * STRIDE).contains(&b) {
        return Some(((b - SLICES_AT) % STRIDE / SLICE) as usize);
    }
    if (SECTORS_AT..SECTORS_AT + SECTORS * 512).contains(&b) {
        return Some(((b - SECTORS_AT) / 512 % THREADS as u64) as usize);
    }
    None
}

/// A random write of thread `t` into bytes it owns, and the range it owns around it (to
/// read back): part of one slice of region A, or a whole or partial own sector of region B.
fn random_own_write(rng: &mut Rng, t: usize) -> ((u64, usize), (u64, usize)) {
    let t = t as u64;
    let (unit_at, unit) = if rng.below(3) < 2 {
        (SLICES_AT + rng.below(STRIDES) * STRIDE + t * SLICE, SLICE)
    } else {
        let s = rng.below(SECTORS / THREADS as u64) * THREADS as u64 + t;
        (SECTORS_AT + s * 512, 512)
    };
    let write = if unit == 512 && rng.below(2) == 0 {
        (unit_at, 512)
    } else {
        let start = rng.below(unit);
        let len = 1 + rng.below(unit - start);
        (unit_at + start, len as usize)
    };
    (write, (unit_at, unit as usize))
}

/// Thread `t`'s writes; returns its view of the image (exact for the bytes it owns).
fn disjoint_thread(mount: &Path, seed: u64, t: usize, original: &[u8]) -> Vec<u8> {
    let writer = Writer::open(mount);
    let mut rng = Rng::new(seed ^ (t as u64 + 1).wrapping_mul(0xA24B_AED4_963E_E407));
    let mut mine = original.to_vec();
    for seq in 0..DISJOINT_WRITES {
        let ((offset, len), (unit_at, unit)) = random_own_write(&mut rng, t);
        let data = pattern(payload_seed(seed, t, seq), offset, len);
        writer.write(&data, offset);
        mine[offset as usize..][..len].copy_from_slice(&data);
        // Nobody else writes these bytes: a read of them is exact at any time.
        if rng.below(4) == 0 {
            let got = writer.read(unit_at, unit);
            let what = format!(
                "thread {t}, after write {seq} ({len} bytes at {offset}): its {unit} bytes at \
                 {unit_at} read back"
            );
            assert_bytes_eq(&got, &mine[unit_at as usize..][..unit], &what);
        }
    }
    mine
}

dispatch_tests!(mount_direct_disjoint_writes_in_shared_blocks_lose_nothing);
fn mount_direct_disjoint_writes_in_shared_blocks_lose_nothing(mode: Dispatch) {
    let seed_guard = Seed::choose();
    let seed = seed_guard.value();
    let Some(sandbox) = real_fs_sandbox() else {
        return;
    };
    let original = pattern(seed ^ 0xD15, 0, LEN as usize);
    let image = sandbox.file("disk.img", &original);
    let export = MountedExport::start(&image, &sandbox.mountpoint("mnt"), mode, ARGS);
    let views: Vec<Vec<u8>> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                let (mount, original) = (export.path(), &original);
                s.spawn(move || disjoint_thread(mount, seed, t, original))
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("a writer thread panicked"))
            .collect()
    });
    let expected: Vec<u8> = (0..LEN)
        .map(|b| match owner(b) {
            Some(t) => views[t][b as usize],
            None => original[b as usize],
        })
        .collect();
    check_mount_then_image(export, &image, |bytes, what| {
        if let Some(at) = (0..bytes.len()).find(|&b| bytes[b] != expected[b]) {
            let b = at as u64;
            let (block, sector) = (b / 4096 * 4096, b / 512 * 512);
            panic!(
                "{what}: byte {at} (owned by thread {:?}; sector at {sector}, block at \
                 {block}) holds {:#04x}, expected {:#04x} (original {:#04x}); {} bytes differ",
                owner(b),
                bytes[at],
                expected[at],
                original[at],
                (0..bytes.len())
                    .filter(|&i| bytes[i] != expected[i])
                    .count(),
            );
        }
        assert_bytes_eq(bytes, &expected, what);
    });
}
