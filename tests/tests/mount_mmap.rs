//! The exported file mapped with mmap(2). The export opens its file `FOPEN_DIRECT_IO`, so
//! the kernel allows shared mappings only because INIT negotiates `DIRECT_IO_ALLOW_MMAP`
//! (without it mmap(MAP_SHARED) fails with ENODEV; kernels before 6.6 do not offer it, and
//! the tests that map shared skip there, saying so); private mappings always work.
//!
//! What the kernel promises for such a file (fs/fuse/file.c, `fuse_direct_io`): before
//! every read or write through an fd (O_DIRECT or not: the file is `FOPEN_DIRECT_IO` either
//! way, so a "buffered" read(2)/write(2) takes the same direct path) it writes back the
//! dirty mapped pages of that range and waits for them, and before a write it also drops
//! the cached pages of the range, unmapping them from every mapping. So, within one thread
//! and with nothing else touching the range meanwhile:
//! - a read(2) sees the stores made to a mapping before it, msync or not;
//! - once a write(2) has returned, every mapping, new or existing, sees its bytes (the next
//!   access faults the page in again, from the server);
//! - a store made before a write(2) cannot land over that write later (it was written back
//!   before the write was sent).
//!
//! Nothing is promised to a mapping touched *while* a write is in flight (the pages are
//! dropped before the write is sent, so a fault in between caches the old bytes): no test
//! here does that. Shared mappings reach the image on msync(MS_SYNC), which the tests call
//! before looking at the image; they never rely on writeback at munmap or unmount.

use std::fs::{self, File};
use std::os::unix::fs::FileExt;
use std::path::Path;

use corofuse_tests::require::report_skip;
use corofuse_tests::{
    assert_bytes_eq, dispatch_tests, errno_of, open_direct, open_rw, pattern, require_kernel,
    Access, AlignedBuf, Dispatch, Mapping, MountedExport, Rng, Sandbox, Seed, Sharing, KIB, MIB,
};

/// The image: 4 MiB, so that a whole-image check stays cheap.
const LEN: u64 = 4 * MIB;
const PAGE: u64 = 4096;

/// What shared mappings of the export need: `FUSE_DIRECT_IO_ALLOW_MMAP` (FUSE 7.39, first
/// as `DIRECT_IO_RELAX`, same bit).
const SHARED_MMAP: &str = "mmap(MAP_SHARED) of a FOPEN_DIRECT_IO file (FUSE_DIRECT_IO_ALLOW_MMAP)";

/// Maps the whole exported file; fails the test if it cannot (the kernel is new enough:
/// each test using this starts with `require_kernel!(6, 6, SHARED_MMAP)`).
fn map_export(export: &MountedExport, file: &File, access: Access, sharing: Sharing) -> Mapping {
    Mapping::map(file, 0, LEN as usize, access, sharing).unwrap_or_else(|e| {
        let hint = match e.raw_os_error() {
            Some(libc::ENODEV) => " (did INIT negotiate DIRECT_IO_ALLOW_MMAP?)",
            _ => "",
        };
        panic!(
            "mmap({access:?}, {sharing:?}) of the export: {e}{hint}; stderr:\n{}",
            export.stderr()
        )
    })
}

/// `len` bytes at `offset` through an O_DIRECT fd, read as the page-aligned span around
/// them into an aligned buffer.
fn read_direct(file: &File, offset: u64, len: usize) -> Vec<u8> {
    let start = offset / PAGE * PAGE;
    let end = (offset + len as u64).next_multiple_of(PAGE).min(LEN);
    let mut buf = AlignedBuf::zeroed((end - start) as usize);
    file.read_exact_at(&mut buf, start)
        .unwrap_or_else(|e| panic!("O_DIRECT read of {len} bytes at {offset}: {e}"));
    buf[(offset - start) as usize..][..len].to_vec()
}

/// `len` bytes at `offset` of the image file itself (not through the mount).
fn read_image(image: &Path, offset: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0; len];
    File::open(image)
        .and_then(|f| f.read_exact_at(&mut buf, offset))
        .unwrap_or_else(|e| panic!("read {len} bytes at {offset} of the image: {e}"));
    buf
}

/// A sandbox for the image: a disk-backed one for `--direct` (O_DIRECT then reaches the
/// device), else the default. `None` after saying why if there is no disk-backed one.
fn sandbox_for(args: &[&str]) -> Option<Sandbox> {
    if !args.contains(&"--direct") {
        return Some(Sandbox::new());
    }
    Sandbox::on_real_fs().map_err(|why| report_skip(&why)).ok()
}

/// Stores at (offset, length): one byte, across a page boundary, several pages unaligned,
/// across the 1 MiB mark, and the last page.
const STORES: [(u64, usize); 5] = [
    (0, 1),
    (4095, 2),
    (10_000, 70_000),
    (MIB - 100, 8192 + 200),
    (LEN - PAGE, PAGE as usize),
];

/// (a) Stores through a shared writable mapping, then msync(MS_SYNC): an O_DIRECT read
/// through the mount and the image file itself both show them, range by range and whole.
fn check_shared_stores(mode: Dispatch, args: &[&str]) {
    require_kernel!(6, 6, SHARED_MMAP);
    let Some(sandbox) = sandbox_for(args) else {
        return;
    };
    let mut model = pattern(1, 0, LEN as usize);
    let image = sandbox.file("disk.img", &model);
    let export = MountedExport::start(&image, &sandbox.mountpoint("mnt"), mode, args);
    let file = open_rw(export.path()).unwrap();
    let direct = open_direct(export.path(), false).unwrap();
    let map = map_export(&export, &file, Access::ReadWrite, Sharing::Shared);
    for (i, (offset, len)) in STORES.into_iter().enumerate() {
        let data = pattern(100 + i as u64, offset, len);
        map.write(offset as usize, &data);
        model[offset as usize..][..len].copy_from_slice(&data);
        map.sync(offset as usize, len).expect("msync(MS_SYNC)");
        let what = format!("{len} bytes stored at {offset}, after msync");
        assert_bytes_eq(
            &read_direct(&direct, offset, len),
            &data,
            &format!("{what}: O_DIRECT read through the mount"),
        );
        assert_bytes_eq(
            &read_image(&image, offset, len),
            &data,
            &format!("{what}: the image file"),
        );
    }
    assert_bytes_eq(&map.read(0, LEN as usize), &model, "the mapping");
    assert_bytes_eq(
        &read_direct(&direct, 0, LEN as usize),
        &model,
        "the whole export, O_DIRECT",
    );
    assert_bytes_eq(
        &fs::read(&image).unwrap(),
        &model,
        "the image while mounted",
    );
    drop((map, file, direct));
    export.stop();
    assert_bytes_eq(
        &fs::read(&image).unwrap(),
        &model,
        "the image after unmount",
    );
}

dispatch_tests!(mount_shared_mapping_stores_reach_the_image);
fn mount_shared_mapping_stores_reach_the_image(mode: Dispatch) {
    check_shared_stores(mode, &["-w"]);
}

dispatch_tests!(mount_shared_mapping_stores_reach_a_direct_image);
/// As above, the image on disk and opened O_DIRECT (`--direct`).
fn mount_shared_mapping_stores_reach_a_direct_image(mode: Dispatch) {
    check_shared_stores(mode, &["-w", "--direct"]);
}

dispatch_tests!(mount_mappings_and_read_write_stay_coherent);
/// (b) Only what the kernel promises (see the module comment), one step at a time:
/// writes through the mount show in new and existing mappings, and stores not yet synced
/// show in reads and never land over a later write.
fn mount_mappings_and_read_write_stay_coherent(mode: Dispatch) {
    require_kernel!(6, 6, SHARED_MMAP);
    let sandbox = Sandbox::new();
    let mut model = pattern(2, 0, LEN as usize);
    let image = sandbox.file("disk.img", &model);
    let export = MountedExport::start(&image, &sandbox.mountpoint("mnt"), mode, &["-w"]);
    let plain = open_rw(export.path()).unwrap();
    let direct = open_direct(export.path(), true).unwrap();
    let old = map_export(&export, &plain, Access::ReadWrite, Sharing::Shared);
    // Fault every page in: the page cache now holds the whole file.
    assert_bytes_eq(&old.read(0, LEN as usize), &model, "a fresh mapping");

    // An O_DIRECT write: a new mapping, and the existing one, show it.
    let (at, len) = (128 * KIB, 64 * KIB as usize);
    let data = pattern(20, at, len);
    direct
        .write_all_at(&AlignedBuf::from_slice(&data), at)
        .unwrap();
    model[at as usize..][..len].copy_from_slice(&data);
    let new = map_export(&export, &plain, Access::Read, Sharing::Shared);
    let what = "after an O_DIRECT write through the mount";
    assert_bytes_eq(
        &new.read(at as usize, len),
        &data,
        &format!("a new mapping {what}"),
    );
    assert_bytes_eq(
        &old.read(at as usize, len),
        &data,
        &format!("the existing mapping {what}"),
    );
    drop(new);

    // A plain (not O_DIRECT), unaligned write: the existing mapping's cached pages of that
    // range are dropped, so it shows the new bytes.
    let (at, len) = (300_001, 5000);
    let data = pattern(21, at, len);
    plain.write_all_at(&data, at).unwrap();
    model[at as usize..][..len].copy_from_slice(&data);
    assert_bytes_eq(
        &old.read(at as usize, len),
        &data,
        "the existing mapping after a plain write through the mount",
    );

    // A store without msync: reads through the mount, plain and O_DIRECT, show it (the
    // kernel writes the dirty pages of a range back before reading it).
    let (at, len) = (600_000, 3000);
    let data = pattern(22, at, len);
    old.write(at as usize, &data);
    model[at as usize..][..len].copy_from_slice(&data);
    let mut got = vec![0; len];
    plain.read_exact_at(&mut got, at).unwrap();
    assert_bytes_eq(&got, &data, "a plain read after a store (no msync)");
    assert_bytes_eq(
        &read_direct(&direct, at, len),
        &data,
        "an O_DIRECT read after a store (no msync)",
    );

    // A store without msync over two pages, then a write overlapping both: the store is
    // written back first, so the write's bytes win where they overlap, the store's
    // elsewhere, in the mapping and, after msync, in the image.
    let (store_at, store_len) = (MIB, 2 * PAGE as usize);
    let store = pattern(23, store_at, store_len);
    old.write(store_at as usize, &store);
    model[store_at as usize..][..store_len].copy_from_slice(&store);
    let (at, len) = (MIB + 4000, 1000);
    let data = pattern(24, at, len);
    plain.write_all_at(&data, at).unwrap();
    model[at as usize..][..len].copy_from_slice(&data);
    let span = &model[store_at as usize..][..store_len];
    assert_bytes_eq(
        &old.read(store_at as usize, store_len),
        span,
        "the mapping after a store then an overlapping write",
    );
    old.sync_all().expect("msync(MS_SYNC)");
    assert_bytes_eq(
        &read_image(&image, store_at, store_len),
        span,
        "the image after a store, an overlapping write and msync",
    );

    assert_bytes_eq(&old.read(0, LEN as usize), &model, "the mapping at the end");
    assert_bytes_eq(
        &read_direct(&direct, 0, LEN as usize),
        &model,
        "the export at the end, O_DIRECT",
    );
    drop((old, plain, direct));
    export.stop();
    assert_bytes_eq(
        &fs::read(&image).unwrap(),
        &model,
        "the image after unmount",
    );
}

dispatch_tests!(mount_private_mapping_stores_stay_private);
/// (c) Stores into a MAP_PRIVATE mapping are copy-on-write: the mapping shows them, the
/// file never does, during the mapping or after munmap.
fn mount_private_mapping_stores_stay_private(mode: Dispatch) {
    let sandbox = Sandbox::new();
    let before = pattern(3, 0, LEN as usize);
    let image = sandbox.file("disk.img", &before);
    let export = MountedExport::start(&image, &sandbox.mountpoint("mnt"), mode, &["-w"]);
    let file = open_rw(export.path()).unwrap();
    let direct = open_direct(export.path(), false).unwrap();
    let private = Mapping::map(&file, 0, LEN as usize, Access::ReadWrite, Sharing::Private)
        .expect("mmap(MAP_PRIVATE) of the export");
    let mut mine = before.clone();
    for (i, (offset, len)) in STORES.into_iter().enumerate() {
        let data = pattern(200 + i as u64, offset, len);
        private.write(offset as usize, &data);
        mine[offset as usize..][..len].copy_from_slice(&data);
    }
    // msync on a private mapping writes nothing back.
    private
        .sync_all()
        .expect("msync(MS_SYNC) of a private mapping");
    assert_bytes_eq(&private.read(0, LEN as usize), &mine, "the private mapping");
    assert_bytes_eq(
        &read_direct(&direct, 0, LEN as usize),
        &before,
        "the export while privately mapped",
    );
    assert_bytes_eq(
        &fs::read(&image).unwrap(),
        &before,
        "the image while mapped",
    );
    drop(private);
    assert_bytes_eq(
        &read_direct(&direct, 0, LEN as usize),
        &before,
        "the export after munmap",
    );
    assert_bytes_eq(
        &fs::read(&image).unwrap(),
        &before,
        "the image after munmap",
    );
    drop((file, direct));
    export.stop();
    assert_bytes_eq(
        &fs::read(&image).unwrap(),
        &before,
        "the image after unmount",
    );
}

/// How [`Model`] reaches the file.
#[derive(Clone, Copy, Debug)]
enum Op {
    /// A store through the shared mapping, then msync(MS_SYNC) of its pages.
    MapStore,
    /// Loads through the shared mapping.
    MapLoad,
    /// pwrite(2) through an O_DIRECT fd on the mount.
    DirectWrite,
    /// pread(2) through an O_DIRECT fd on the mount.
    DirectRead,
    /// pwrite(2) through a plain fd on the mount.
    PlainWrite,
    /// pread(2) through a plain fd on the mount.
    PlainRead,
    /// pread(2) of the image file itself.
    ImageRead,
}

const OPS: [Op; 7] = [
    Op::MapStore,
    Op::MapLoad,
    Op::DirectWrite,
    Op::DirectRead,
    Op::PlainWrite,
    Op::PlainRead,
    Op::ImageRead,
];

/// (d) The model: what the image must hold.
struct Model<'a> {
    map: &'a Mapping,
    direct: &'a File,
    plain: &'a File,
    image: &'a Path,
    bytes: Vec<u8>,
    rng: Rng,
}

impl Model<'_> {
    /// A random range: lengths from one byte to 96 KiB, small ones more often; for
    /// `sectors`, offset and length multiples of 512.
    fn range(&mut self, sectors: bool) -> (u64, usize) {
        if sectors {
            let len = (1 + self.rng.below(192)) * 512;
            let offset = self.rng.below((LEN - len) / 512 + 1) * 512;
            return (offset, len as usize);
        }
        let max = [16, 600, 5000, 96 * KIB][self.rng.below(4) as usize];
        let len = 1 + self.rng.below(max);
        (self.rng.below(LEN - len + 1), len as usize)
    }

    fn run(&mut self, step: usize) {
        let op = OPS[self.rng.below(OPS.len() as u64) as usize];
        let sectors = matches!(op, Op::DirectWrite | Op::DirectRead) && self.rng.below(2) == 0;
        let (offset, len) = self.range(sectors);
        let what = format!("op {step}: {op:?} of {len} bytes at {offset}");
        let (at, n) = (offset as usize, len);
        match op {
            Op::MapStore | Op::DirectWrite | Op::PlainWrite => {
                let data = pattern(self.rng.next_u64(), offset, len);
                match op {
                    Op::MapStore => {
                        self.map.write(at, &data);
                        self.map
                            .sync(at, n)
                            .unwrap_or_else(|e| panic!("{what}: msync: {e}"));
                    }
                    Op::DirectWrite => self
                        .direct
                        .write_all_at(&AlignedBuf::from_slice(&data), offset)
                        .unwrap_or_else(|e| panic!("{what}: {e}")),
                    _ => self
                        .plain
                        .write_all_at(&data, offset)
                        .unwrap_or_else(|e| panic!("{what}: {e}")),
                }
                self.bytes[at..][..n].copy_from_slice(&data);
            }
            Op::MapLoad | Op::DirectRead | Op::PlainRead | Op::ImageRead => {
                let got = match op {
                    Op::MapLoad => self.map.read(at, n),
                    Op::DirectRead => {
                        let mut buf = AlignedBuf::zeroed(n);
                        self.direct
                            .read_exact_at(&mut buf, offset)
                            .unwrap_or_else(|e| panic!("{what}: {e}"));
                        buf.to_vec()
                    }
                    Op::PlainRead => {
                        let mut buf = vec![0; n];
                        self.plain
                            .read_exact_at(&mut buf, offset)
                            .unwrap_or_else(|e| panic!("{what}: {e}"));
                        buf
                    }
                    _ => read_image(self.image, offset, len),
                };
                assert_bytes_eq(&got, &self.bytes[at..][..n], &what);
            }
        }
    }
}

/// A few hundred random operations mixing mapped stores and loads, O_DIRECT and plain
/// reads and writes through the mount and reads of the image; every read checked against
/// the model, then the whole export, and the image after the export stops.
fn check_model(mode: Dispatch, args: &[&str]) {
    const STEPS: usize = 400;
    require_kernel!(6, 6, SHARED_MMAP);
    let seed = Seed::choose();
    let Some(sandbox) = sandbox_for(args) else {
        return;
    };
    let mut rng = seed.rng();
    let before = pattern(rng.next_u64(), 0, LEN as usize);
    let image = sandbox.file("disk.img", &before);
    let export = MountedExport::start(&image, &sandbox.mountpoint("mnt"), mode, args);
    let plain = open_rw(export.path()).unwrap();
    let direct = open_direct(export.path(), true).unwrap();
    let map = map_export(&export, &plain, Access::ReadWrite, Sharing::Shared);
    let mut model = Model {
        map: &map,
        direct: &direct,
        plain: &plain,
        image: &image,
        bytes: before,
        rng,
    };
    for step in 0..STEPS {
        model.run(step);
    }
    let expected = std::mem::take(&mut model.bytes);
    assert_bytes_eq(
        &map.read(0, LEN as usize),
        &expected,
        "the mapping at the end",
    );
    assert_bytes_eq(
        &read_direct(&direct, 0, LEN as usize),
        &expected,
        "the export at the end, O_DIRECT",
    );
    drop((map, plain, direct));
    export.stop();
    assert_bytes_eq(
        &fs::read(&image).unwrap(),
        &expected,
        "the image after unmount",
    );
}

dispatch_tests!(mount_mapping_and_io_match_a_model);
fn mount_mapping_and_io_match_a_model(mode: Dispatch) {
    check_model(mode, &["-w"]);
}

dispatch_tests!(mount_mapping_and_io_match_a_model_with_passthrough[coroutine, threads]);
/// As above with `--passthrough`: the model's opens may write, so they are served as
/// without it (passthrough takes only read-only opens of an image).
fn mount_mapping_and_io_match_a_model_with_passthrough(mode: Dispatch) {
    check_model(mode, &["-w", "--format", "raw", "--passthrough"]);
}

dispatch_tests!(mount_mapping_and_io_match_a_model_on_a_direct_image);
/// As above, the image on disk and opened O_DIRECT (`--direct`): unaligned requests go
/// through the daemon's read-modify-write path.
fn mount_mapping_and_io_match_a_model_on_a_direct_image(mode: Dispatch) {
    check_model(mode, &["-w", "--direct"]);
}

dispatch_tests!(mount_read_only_export_maps_read_only);
/// (e) Without `-w`: a writable shared mapping of the O_RDONLY fd is refused (EACCES, by
/// the kernel, before the file system is asked), a read-only shared one shows the image,
/// and a private writable one works but keeps its stores.
fn mount_read_only_export_maps_read_only(mode: Dispatch) {
    require_kernel!(6, 6, SHARED_MMAP);
    let sandbox = Sandbox::new();
    let before = pattern(5, 0, LEN as usize);
    let image = sandbox.file("disk.img", &before);
    let export = MountedExport::start(&image, &sandbox.mountpoint("mnt"), mode, &[]);
    let file = File::open(export.path()).unwrap();
    let writable = Mapping::map(&file, 0, LEN as usize, Access::ReadWrite, Sharing::Shared);
    assert_eq!(
        errno_of(
            writable,
            "mmap(PROT_READ|PROT_WRITE, MAP_SHARED) of an O_RDONLY fd"
        ),
        libc::EACCES
    );
    let map = map_export(&export, &file, Access::Read, Sharing::Shared);
    assert_bytes_eq(&map.read(0, LEN as usize), &before, "a read-only mapping");
    let private = Mapping::map(&file, 0, LEN as usize, Access::ReadWrite, Sharing::Private)
        .expect("mmap(PROT_READ|PROT_WRITE, MAP_PRIVATE) of an O_RDONLY fd");
    let data = pattern(6, 5000, 10_000);
    private.write(5000, &data);
    assert_bytes_eq(&private.read(5000, 10_000), &data, "the private mapping");
    assert_bytes_eq(
        &map.read(0, LEN as usize),
        &before,
        "the shared mapping beside a private store",
    );
    drop((private, map, file));
    export.stop();
    assert_bytes_eq(
        &fs::read(&image).unwrap(),
        &before,
        "the image after unmount",
    );
}
