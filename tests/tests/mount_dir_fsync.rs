//! The directory export's durability: fsync, fdatasync, and O_SYNC and O_DSYNC writes on
//! a file of the mount reach the source file as a real sync before they return.
//!
//! Observed where it cannot be faked: the source tree is an ext4 file system on a loop
//! device (mounted `commit=600`, so its journal never commits by itself during the test),
//! and a sync of an ext4 file sends the device a cache flush, which
//! `/sys/block/loopN/stat` counts (its 16th field, "flush requests completed"). Each call
//! through the mount must raise that count before it returns; a plain write must not (the
//! check that the count moves only when something syncs). The daemon's own syncs go
//! through io_uring in coroutine mode, where strace would not see them.
//! (`sync_file_range` never reaches a FUSE server; reported, not required.)

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use corofuse_tests::{dispatch_tests, require_tool, Dispatch, MountedExport, Sandbox};

/// An ext4 file system in a loop device, mounted; unmounted and detached on drop.
struct LoopExt4 {
    device: String,
    mountpoint: PathBuf,
}

fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd).args(args).output().expect(cmd);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

impl LoopExt4 {
    fn new(sandbox: &Sandbox) -> LoopExt4 {
        let image = sandbox.sparse("ext4.img", 64 << 20);
        let image = image.to_str().unwrap();
        run("mkfs.ext4", &["-q", "-F", image]);
        let device = run("losetup", &["-f", "--show", image]).trim().to_owned();
        let mountpoint = sandbox.path("ext4");
        fs::create_dir(&mountpoint).unwrap();
        let fs = LoopExt4 { device, mountpoint };
        let at = fs.mountpoint.to_str().unwrap();
        run("mount", &["-o", "commit=600", &fs.device, at]);
        fs
    }

    /// Cache flushes the device completed so far.
    fn flushes(&self) -> u64 {
        let name = self.device.trim_start_matches("/dev/");
        let stat = fs::read_to_string(format!("/sys/block/{name}/stat")).unwrap();
        let fields: Vec<&str> = stat.split_whitespace().collect();
        assert!(fields.len() >= 17, "no flush count in {name}/stat: {stat}");
        fields[15].parse().unwrap()
    }
}

impl Drop for LoopExt4 {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mountpoint).status();
        let _ = Command::new("losetup").args(["-d", &self.device]).status();
    }
}

/// A way to ask for durability of `data` written at `at`.
#[derive(Clone, Copy, Debug)]
enum Way {
    None,
    Fsync,
    Fdatasync,
    OSync,
    ODsync,
    SyncFileRange,
}

impl Way {
    fn write(self, path: &Path, data: &[u8], at: u64) -> File {
        let flags = match self {
            Way::OSync => libc::O_SYNC,
            Way::ODsync => libc::O_DSYNC,
            _ => 0,
        };
        let file = OpenOptions::new()
            .write(true)
            .custom_flags(flags)
            .open(path)
            .unwrap();
        file.write_all_at(data, at).unwrap();
        match self {
            Way::Fsync => file.sync_all().unwrap(),
            Way::Fdatasync => file.sync_data().unwrap(),
            Way::SyncFileRange => {
                let how = libc::SYNC_FILE_RANGE_WAIT_BEFORE
                    | libc::SYNC_FILE_RANGE_WRITE
                    | libc::SYNC_FILE_RANGE_WAIT_AFTER;
                let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
                // SAFETY: a plain syscall on an fd we own; no memory is passed.
                let rc = unsafe { libc::sync_file_range(fd, at as i64, data.len() as i64, how) };
                assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
            }
            Way::None | Way::OSync | Way::ODsync => {}
        }
        file
    }
}

dispatch_tests!(mount_dir_fsync_reaches_the_source_device [coroutine, threads]);
fn mount_dir_fsync_reaches_the_source_device(mode: Dispatch) {
    require_tool!("mkfs.ext4");
    require_tool!("losetup");
    let sandbox = Sandbox::new();
    let ext4 = LoopExt4::new(&sandbox);
    let names = ["none", "fsync", "fdatasync", "osync", "odsync", "sfr"];
    for name in names {
        fs::write(ext4.mountpoint.join(name), vec![0u8; 64 << 10]).unwrap();
    }
    run("sync", &[]);
    let mnt = sandbox.path("mnt");
    fs::create_dir(&mnt).unwrap();
    let export = MountedExport::start_dir(&ext4.mountpoint, &mnt, mode, &[]);
    let ways = [
        Way::None,
        Way::Fsync,
        Way::Fdatasync,
        Way::OSync,
        Way::ODsync,
        Way::SyncFileRange,
    ];
    for (way, name) in ways.into_iter().zip(names) {
        let path = export.path().join(name);
        for round in 0..3u8 {
            let before = ext4.flushes();
            let file = way.write(&path, &[round + 1; 4096], 4096 * round as u64);
            let after = ext4.flushes();
            match way {
                Way::None => assert_eq!(
                    after, before,
                    "{mode}: a plain write flushed the device: the count cannot tell"
                ),
                Way::SyncFileRange => eprintln!("{mode}: sync_file_range: {before} -> {after}"),
                _ => assert!(
                    after > before,
                    "{mode}: {way:?} returned with no flush of the source's device \
                     ({before} flushes before and after)"
                ),
            }
            drop(file);
        }
    }
    export.stop();
}
