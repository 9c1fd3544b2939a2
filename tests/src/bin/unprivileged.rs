//! `unprivileged UID GID OP ARGS...`: become user UID and group GID (no supplementary
//! groups), do one file operation, and print what happened on one line: `ok`, `ok NAMES`
//! for `listxattr` (comma-separated), or `err ERRNO` (the number). The security tests
//! (tests/tests/security.rs) run the same operation this way on the source and through a
//! mount, and compare the lines and what each left behind.
//!
//! OPs, each on paths: `read FILE`, `write FILE` (one byte at offset 0, no truncation),
//! `write-from FILE SRC OFFSET` (all of SRC at OFFSET of FILE, no truncation, as
//! `dd conv=notrunc` writes),
//! `open-trunc FILE` (`O_WRONLY | O_TRUNC`), `truncate FILE LEN`, `copy FROM TO` (all of
//! FROM with copy_file_range(2), at offset 0 of TO, no truncation), `fallocate FILE MODE`
//! (MODE `alloc`, `keep`, `zero` or `punch`, the first 4 KiB), `whiteout FROM TO`
//! (renameat2 with `RENAME_WHITEOUT`), `unlink FILE`, `listxattr FILE`, `setxattr FILE
//! NAME` (value `v`), `mknod-dev FILE` (a character device 1:3), `link FROM TO`,
//! `create FILE` (a new file, mode 0644), `mkdir DIR` (mode 0755), `setacl FILE` (the
//! access ACL `u::rwx,g::r-x,o::r-x`, as `setfacl` would set it), `write-direct FILE`
//! (4 KiB at offset 0 through an `O_DIRECT` descriptor).
//!
//! `UNPRIVILEGED_GROUPS=G1,G2,...` gives the user those supplementary groups.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::Path;

use corofuse_tests::sys;

fn run(op: &str, args: &[String]) -> io::Result<Option<String>> {
    let arg = |i: usize| -> io::Result<&Path> {
        args.get(i).map(Path::new).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{op}: too few arguments"),
            )
        })
    };
    let writable = |path: &Path| OpenOptions::new().write(true).open(path);
    match op {
        "read" => File::open(arg(0)?)?
            .read_to_end(&mut Vec::new())
            .map(drop)?,
        "write" => writable(arg(0)?)?.write_all_at(b"x", 0)?,
        "write-from" => {
            let data = std::fs::read(arg(1)?)?;
            let offset = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(0);
            writable(arg(0)?)?.write_all_at(&data, offset)?
        }
        "open-trunc" => drop(
            OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_TRUNC)
                .open(arg(0)?)?,
        ),
        "truncate" => {
            let len = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(0);
            sys::truncate(arg(0)?, len)?
        }
        "copy" => {
            let from = File::open(arg(0)?)?;
            let to = writable(arg(1)?)?;
            let len = from.metadata()?.len();
            let mut done = 0;
            while done < len {
                let n = sys::copy_file_range(&from, done, &to, done, (len - done) as usize)?;
                if n == 0 {
                    break;
                }
                done += n as u64;
            }
        }
        "fallocate" => {
            let mode = match args.get(1).map(String::as_str) {
                Some("alloc") => 0,
                Some("keep") => libc::FALLOC_FL_KEEP_SIZE,
                Some("zero") => libc::FALLOC_FL_ZERO_RANGE,
                Some("punch") => libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                other => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("fallocate mode {other:?}"),
                    ))
                }
            };
            sys::fallocate(&writable(arg(0)?)?, mode, 0, 4096)?
        }
        "write-direct" => corofuse_tests::open_direct(arg(0)?, true)?
            .write_all_at(&corofuse_tests::AlignedBuf::zeroed(4096), 0)?,
        "whiteout" => sys::renameat2(arg(0)?, arg(1)?, libc::RENAME_WHITEOUT)?,
        "unlink" => std::fs::remove_file(arg(0)?)?,
        "listxattr" => return Ok(Some(sys::listxattr(arg(0)?)?.join(","))),
        "setxattr" => {
            let name = args.get(1).map_or("user.x", String::as_str);
            sys::setxattr(arg(0)?, name, b"v")?
        }
        "mknod-dev" => sys::mknod(arg(0)?, libc::S_IFCHR | 0o666, libc::makedev(1, 3))?,
        "link" => std::fs::hard_link(arg(0)?, arg(1)?)?,
        "create" => drop(
            OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o644)
                .open(arg(0)?)?,
        ),
        "mkdir" => std::fs::DirBuilder::new().mode(0o755).create(arg(0)?)?,
        "setacl" => {
            let none = u32::MAX;
            let acl = sys::posix_acl(&[(0x01, 7, none), (0x04, 5, none), (0x20, 5, none)]);
            sys::setxattr(arg(0)?, "system.posix_acl_access", &acl)?
        }
        _ => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("unknown operation {op:?}"),
            ))
        }
    }
    Ok(None)
}

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let (Some(uid), Some(gid), Some(op)) = (
        argv.first().and_then(|s| s.parse().ok()),
        argv.get(1).and_then(|s| s.parse().ok()),
        argv.get(2),
    ) else {
        eprintln!("usage: unprivileged UID GID OP ARGS...");
        std::process::exit(2);
    };
    let groups: Vec<u32> = std::env::var("UNPRIVILEGED_GROUPS")
        .unwrap_or_default()
        .split(',')
        .filter_map(|g| g.parse().ok())
        .collect();
    if let Err(e) = sys::become_user_in(uid, gid, &groups) {
        eprintln!("unprivileged: cannot become {uid}:{gid}: {e}");
        std::process::exit(2);
    }
    match run(op, &argv[3..]) {
        Ok(None) => println!("ok"),
        Ok(Some(names)) => println!("ok {names}"),
        Err(e) => match e.raw_os_error() {
            Some(errno) => println!("err {errno}"),
            None => {
                eprintln!("unprivileged: {e}");
                std::process::exit(2);
            }
        },
    }
}
