//! `--compare-qsd`: qemu-storage-daemon's FUSE export, the reference corofuse is measured
//! against, started on the same mount point and image with the options CONTEXT.md gives.
//!
//! Why this configuration: `null-co` with `read-zeroes=on` matches `null:1G` (reads
//! return zeroes, writes are dropped), and `driver=file,aio=io_uring` is QEMU's fastest
//! path to a raw image. The cache mode matches corofuse's export of the same row: the
//! default (page cache) for `file` and `disk`, `cache.direct=on` (O_DIRECT) for
//! `disk-direct`, as `corofuse mount --direct`. The qcow2 rows stack QEMU's `qcow2`
//! driver on the same `file` node (buffered, as `disk`), and export the qcow2 node. The
//! nbd row gives qsd QEMU's NBD client, `driver=nbd` with `server.type=unix` on the
//! socket of the qemu-nbd that corofuse mounts on its runs ([`super::nbd`]): one
//! connection (QEMU's client has no multi-conn), the export name left to the server's
//! default, as corofuse's `nbd+unix:///?socket=SOCK`. qsd
//! writes no statistics, so its per-request columns are "-"; the `device` row has no
//! qsd run.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::daemon::Paths;
use super::export::{ExportKind, EXPORT_SIZE};

/// The binary on the PATH, the default.
pub const PROGRAM: &str = "qemu-storage-daemon";

/// Which qemu-storage-daemon runs, and how (`--qsd`, `--qsd-iothreads`).
#[derive(Clone, Debug)]
pub struct Qsd {
    /// Its binary.
    pub program: PathBuf,
    /// Iothreads for the FUSE export, in the list form of QEMU's multi-threaded export
    /// (`iothread.0=iot0,iothread.1=iot1,...`); 0: none (the main loop, as it ships).
    pub iothreads: u32,
}

/// Its first line of `--version`, or an error saying how to install it.
pub fn version(qsd: &Qsd) -> Result<String, String> {
    let program = qsd.program.display();
    let first = crate::child::version_line(&qsd.program, |e| {
        format!("{program} cannot run ({e}); install it (apt-get install qemu-utils) or name one with --qsd PATH")
    })?;
    Ok(match qsd.iothreads {
        0 => first,
        n => format!("{first} ({program}, {n} iothreads)"),
    })
}

/// The `--blockdev` arguments for an export, the exported node (`f`) last; none for the
/// rows without FUSE. `image` is the image, or for the nbd row qemu-nbd's socket.
pub fn blockdevs(export: ExportKind, image: &Path) -> Vec<String> {
    let file = |node: &str| {
        format!(
            "node-name={node},driver=file,filename={},aio=io_uring",
            escape(image)
        )
    };
    match export {
        ExportKind::Null => vec![format!(
            "node-name=f,driver=null-co,size={EXPORT_SIZE},read-zeroes=on"
        )],
        ExportKind::File | ExportKind::Disk => vec![file("f")],
        ExportKind::DiskDirect => vec![file("f") + ",cache.direct=on"],
        ExportKind::Qcow2 | ExportKind::Qcow2Alloc => vec![
            file("file"),
            "node-name=f,driver=qcow2,file=file".to_string(),
        ],
        ExportKind::Nbd => vec![format!(
            "node-name=f,driver=nbd,server.type=unix,server.path={}",
            escape(image)
        )],
        ExportKind::Device | ExportKind::Local | ExportKind::DiskPt | ExportKind::DiskDirectPt => {
            Vec::new()
        }
    }
}

/// The whole command line.
pub fn command(
    qsd: &Qsd,
    export: ExportKind,
    image: &Path,
    paths: &Paths,
) -> Result<Command, String> {
    let blockdevs = blockdevs(export, image);
    if blockdevs.is_empty() {
        return Err(format!("the {} row has no qsd run", export.name()));
    }
    let mut cmd = Command::new(&qsd.program);
    for b in blockdevs {
        cmd.arg("--blockdev").arg(b);
    }
    for i in 0..qsd.iothreads {
        cmd.arg("--object").arg(format!("iothread,id=iot{i}"));
    }
    cmd.arg("--export")
        .arg(export_option(qsd, paths.mountpoint))
        .arg("--pidfile")
        .arg(paths.pidfile);
    Ok(cmd)
}

/// The `--export` value: the FUSE export of node `f`, writable, with its iothreads.
fn export_option(qsd: &Qsd, mountpoint: &Path) -> String {
    let mut option = format!(
        "type=fuse,id=e,node-name=f,mountpoint={},writable=on",
        escape(mountpoint)
    );
    for i in 0..qsd.iothreads {
        option.push_str(&format!(",iothread.{i}=iot{i}"));
    }
    option
}

/// QEMU's option syntax doubles commas inside values.
fn escape(path: &Path) -> String {
    path.display().to_string().replace(',', ",,")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blockdevs() {
        let b = |e, p| super::blockdevs(e, Path::new(p));
        assert_eq!(
            b(ExportKind::Null, "unused"),
            ["node-name=f,driver=null-co,size=1073741824,read-zeroes=on"]
        );
        assert_eq!(
            b(ExportKind::File, "/dev/shm/a,b/image.raw"),
            ["node-name=f,driver=file,filename=/dev/shm/a,,b/image.raw,aio=io_uring"]
        );
        assert_eq!(
            b(ExportKind::Disk, "/var/tmp/i.raw"),
            ["node-name=f,driver=file,filename=/var/tmp/i.raw,aio=io_uring"],
            "buffered, as `corofuse mount` without --direct"
        );
        assert_eq!(
            b(ExportKind::DiskDirect, "/var/tmp/i.raw"),
            ["node-name=f,driver=file,filename=/var/tmp/i.raw,aio=io_uring,cache.direct=on"]
        );
        for e in [ExportKind::Qcow2, ExportKind::Qcow2Alloc] {
            assert_eq!(
                b(e, "/var/tmp/i.qcow2"),
                [
                    "node-name=file,driver=file,filename=/var/tmp/i.qcow2,aio=io_uring",
                    "node-name=f,driver=qcow2,file=file"
                ],
                "the qcow2 driver on a buffered file node, as disk"
            );
        }
        assert!(b(ExportKind::Device, "/var/tmp/i.raw").is_empty());
        assert_eq!(
            b(ExportKind::Nbd, "/dev/shm/l/nbd.sock"),
            ["node-name=f,driver=nbd,server.type=unix,server.path=/dev/shm/l/nbd.sock"],
            "QEMU's NBD client on qemu-nbd's socket, its default export"
        );
    }

    #[test]
    fn qcow2_command_line_exports_the_qcow2_node() {
        let (mnt, pid, log) = (Path::new("/m/mnt"), Path::new("/m/pid"), Path::new("/m/l"));
        let paths = Paths {
            mountpoint: mnt,
            pidfile: pid,
            log,
            stats: None,
        };
        let mut qsd = Qsd {
            program: PROGRAM.into(),
            iothreads: 0,
        };
        let cmd = command(&qsd, ExportKind::Qcow2, Path::new("/s/i.qcow2"), &paths).expect("qsd");
        let args = crate::child::args_of(&cmd);
        assert_eq!(
            args,
            [
                "--blockdev",
                "node-name=file,driver=file,filename=/s/i.qcow2,aio=io_uring",
                "--blockdev",
                "node-name=f,driver=qcow2,file=file",
                "--export",
                "type=fuse,id=e,node-name=f,mountpoint=/m/mnt,writable=on",
                "--pidfile",
                "/m/pid"
            ]
        );
        assert!(command(&qsd, ExportKind::Device, Path::new("/s/i"), &paths).is_err());
        qsd.iothreads = 2;
        let cmd = command(&qsd, ExportKind::Null, Path::new(""), &paths).expect("qsd");
        let args = crate::child::args_of(&cmd);
        assert_eq!(
            args[2..],
            [
                "--object",
                "iothread,id=iot0",
                "--object",
                "iothread,id=iot1",
                "--export",
                "type=fuse,id=e,node-name=f,mountpoint=/m/mnt,writable=on,\
                 iothread.0=iot0,iothread.1=iot1",
                "--pidfile",
                "/m/pid"
            ]
        );
    }
}
