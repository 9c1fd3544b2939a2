//! End to end: mount a temp file, serve the kernel from a plain thread with a
//! tiny blocking loop built from this crate, and use the file from the test.
//!
//! The loop answers INIT, GETATTR (STATX with ENOSYS, so the kernel falls
//! back), OPEN, READ and WRITE against the image fd opened *before* mounting
//! over the image itself, FLUSH/RELEASE/FSYNC, and ENOSYS to everything else.
//! Test names start with `mount_` so the group can be selected or skipped.

mod util;

use fuse::abi::*;
use fuse::dev::{split_read, FuseDev, Received};
use fuse::init::{self, InitConfig, InitReply, Negotiated};
use fuse::mount::{self, MountOptions};
use fuse::{reply, Errno, Operation, Reply, Request};
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::sync::{mpsc, Arc};
use std::time::Duration;
use zerocopy::{FromZeros, IntoBytes};

/// Image size: not a multiple of the page size, to exercise EOF.
const SIZE: u64 = (2 << 20) + 12345;
/// Mode and inode we report, different from the temp file's 0600.
const MODE: u32 = libc::S_IFREG | 0o640;
const INO: u64 = 0x1234;

fn pattern(len: u64) -> Vec<u8> {
    (0..len).map(|i| (i * 7 % 251) as u8).collect()
}

/// What the server thread saw, for the test to check.
#[derive(Debug, Default)]
struct Report {
    negotiated: Option<Negotiated>,
    init_bytes: Vec<u8>,
    opcodes: Vec<u32>,
    largest_write: usize,
    write_used_tail: bool,
}

fn attr() -> fuse_attr {
    let mut attr = fuse_attr::new_zeroed();
    (attr.ino, attr.size, attr.blocks, attr.mode, attr.nlink) =
        (INO, SIZE, SIZE.div_ceil(512), MODE, 1);
    attr.blksize = 4096;
    attr
}

/// Serves one request other than INIT, replying on `dev`.
fn handle(
    dev: &FuseDev,
    req: &Request<'_>,
    image: &File,
    buf: &mut [u8],
    report: &mut Report,
) -> io::Result<()> {
    let unique = req.unique;
    let sent = match req.op {
        Operation::Getattr { .. } => {
            let out = fuse_attr_out {
                attr_valid: 0,
                attr_valid_nsec: 0,
                dummy: 0,
                attr: attr(),
            };
            reply::send(dev, &Reply::arg(unique, &out))
        }
        Operation::Open { .. } => {
            let open_flags = FOPEN_DIRECT_IO | FOPEN_PARALLEL_DIRECT_WRITES;
            let out = fuse_open_out {
                fh: 1,
                open_flags,
                backing_id: 0,
            };
            reply::send(dev, &Reply::arg(unique, &out))
        }
        Operation::Read { arg } => {
            let len = (arg.size as usize).min(buf.len());
            match image.read_at(&mut buf[..len], arg.offset) {
                Ok(n) => reply::send(dev, &Reply::data(unique, &buf[..n])),
                Err(err) => reply::send(dev, &Reply::error(unique, err.into())),
            }
        }
        Operation::Write { arg, data } => {
            report.largest_write = report.largest_write.max(data.len());
            report.write_used_tail |= data.uses_tail();
            let (head, tail) = data.parts();
            let res = image
                .write_all_at(head, arg.offset)
                .and_then(|()| image.write_all_at(tail, arg.offset + head.len() as u64));
            let out = fuse_write_out {
                size: arg.size,
                padding: 0,
            };
            match res {
                Ok(()) => reply::send(dev, &Reply::arg(unique, &out)),
                Err(err) => reply::send(dev, &Reply::error(unique, err.into())),
            }
        }
        Operation::Flush { .. } | Operation::Release { .. } => {
            reply::send(dev, &Reply::empty(unique))
        }
        Operation::Fsync { .. } => reply::send(
            dev,
            &Reply::status(unique, image.sync_data().map_err(Errno::from)),
        ),
        Operation::Lookup { .. } => reply::send(dev, &Reply::error(unique, Errno::ENOENT)),
        Operation::Forget { .. } | Operation::BatchForget { .. } => return Ok(()),
        _ => reply::send(dev, &Reply::error(unique, Errno::ENOSYS)),
    };
    sent.map(drop)
}

/// The blocking server loop; returns when the kernel reports ENODEV.
fn serve(dev: &FuseDev, image: File) -> Report {
    let config = InitConfig::new().with_system_limits();
    let mut head = vec![0u64; init::RECOMMENDED_HEAD_SIZE / 8];
    let mut tail = vec![0u8; init::tail_size(init::RECOMMENDED_HEAD_SIZE, config.max_write)];
    let mut data = vec![0u8; config.max_write as usize];
    let mut report = Report::default();
    loop {
        let n = match dev
            .read_split(head.as_mut_bytes(), &mut tail)
            .expect("read /dev/fuse")
        {
            Received::Request(n) => n,
            Received::Retry => continue,
            Received::Unmounted => return report,
        };
        let (h, t) = split_read(head.as_bytes(), &tail, n);
        let req = Request::decode(h, t).expect("the kernel sends valid requests");
        log::debug!("{req}");
        report.opcodes.push(req.opcode);
        if let Operation::Init { arg } = req.op {
            report.init_bytes = h.to_vec();
            let init = init::negotiate(&arg, &config);
            if let InitReply::Accepted { negotiated, .. } = init {
                log::info!("{negotiated}");
                report.negotiated = Some(negotiated);
            }
            let _ = reply::send(dev, &init.reply(req.unique)).expect("INIT reply");
            continue;
        }
        handle(dev, &req, &image, &mut data, &mut report).expect("reply");
    }
}

#[test]
fn mount_serve_read_write_unmount() {
    if !util::require_mount() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("disk image.raw");
    fs::write(&path, pattern(SIZE)).unwrap();
    let image = File::options().read(true).write(true).open(&path).unwrap();
    let opts = MountOptions {
        fsname: path.display().to_string(),
        ..MountOptions::default()
    };
    let (dev, guard) = mount::mount(&path, &opts).expect("mount over the image file");
    let (done_tx, done) = mpsc::channel();
    let dev = Arc::new(dev);
    let session = Arc::clone(&dev);
    let server = std::thread::spawn(move || done_tx.send(serve(&session, image)));

    let meta = fs::metadata(&path).unwrap();
    assert_eq!(
        (meta.len(), meta.mode(), meta.ino(), meta.nlink()),
        (SIZE, MODE, INO, 1)
    );
    assert!(meta.file_type().is_file());
    assert_eq!(
        fs::read(&path).unwrap(),
        pattern(SIZE),
        "reads return the image through the mount"
    );

    let mut buf = vec![0u8; (1 << 20) + 4096];
    let new_data = page_aligned(&mut buf, 1 << 20);
    new_data
        .iter_mut()
        .enumerate()
        .for_each(|(i, b)| *b = (i % 13) as u8 + 1);
    let file = File::options().write(true).open(&path).unwrap();
    file.write_all_at(new_data, 4096).unwrap();
    file.sync_data().unwrap();
    drop(file);
    let mut back = vec![0u8; new_data.len()];
    File::open(&path)
        .unwrap()
        .read_exact_at(&mut back, 4096)
        .unwrap();
    assert!(
        back == *new_data,
        "a 1 MiB write reads back through the mount"
    );

    let again = mount::mount(&path, &opts).unwrap_err().to_string();
    assert!(
        again.contains("is already a FUSE mountpoint; unmount it first"),
        "{again}"
    );
    drop(
        dev.clone_queue(true)
            .expect("FUSE_DEV_IOC_CLONE on the live session"),
    );

    guard.unmount().expect("unmount");
    let report = done
        .recv_timeout(Duration::from_secs(10))
        .expect("server thread exits on ENODEV after unmount");
    server.join().unwrap().unwrap();
    check_report(&report);
    assert!(
        !mount::is_fuse_mountpoint(&path).unwrap() && !util::in_proc_mounts(&path),
        "no mount left behind"
    );
    let underneath = fs::read(&path).unwrap();
    assert_eq!(
        &underneath[4096..4096 + new_data.len()],
        &new_data[..],
        "writes reached the image file"
    );
}

/// A page-aligned `len`-byte slice of `buf`: the kernel fills a WRITE from
/// at most `max_pages` user pages, so an unaligned 1 MiB buffer would arrive
/// as two requests (1 MiB minus the misalignment, then the rest).
fn page_aligned(buf: &mut [u8], len: usize) -> &mut [u8] {
    let skip = buf.as_ptr().align_offset(4096);
    &mut buf[skip..skip + len]
}

fn check_report(report: &Report) {
    let n = report.negotiated.expect("INIT was accepted");
    eprintln!("negotiated: {n}");
    eprintln!("INIT request: {:02x?}", report.init_bytes);
    eprintln!("opcodes: {:?}", report.opcodes);
    assert_eq!(report.opcodes.first(), Some(&FUSE_INIT));
    assert!(n.has(FUSE_BIG_WRITES | FUSE_MAX_PAGES | FUSE_ASYNC_READ));
    assert_eq!(
        report.largest_write, n.max_write as usize,
        "writes arrive max_write at a time"
    );
    assert!(
        report.write_used_tail,
        "large writes spill from the head into the tail"
    );
}
