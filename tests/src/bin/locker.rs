//! `locker KIND TYPE WAIT PATH HOLD_MS [ALARM_MS]`: take one lock on PATH as a process of
//! its own, print one line, hold it HOLD_MS, exit (which lets it go). The lock tests
//! (tests/tests/mount_locks.rs) run two of these, through a mount and on its source.
//!
//! KIND: `posix` (classic `fcntl` F_SETLK / F_SETLKW), `ofd` (F_OFD_SETLK / F_OFD_SETLKW)
//! or `flock`. TYPE: `sh` or `ex`. WAIT: `wait` (blocking) or `nowait`. ALARM_MS: a
//! SIGALRM after that long interrupts a blocking wait (its handler does nothing and does
//! not restart the call). Prints `locked` (then holds), `busy` (exit 1), `interrupted`
//! (exit 2) or `err ERRNO` (exit 3), flushed at once.

use std::fs::OpenOptions;
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::time::Duration;

extern "C" fn on_alarm(_: libc::c_int) {}

fn say(line: &str) {
    let mut out = io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 5 {
        eprintln!("usage: locker posix|ofd|flock sh|ex wait|nowait PATH HOLD_MS [ALARM_MS]");
        std::process::exit(64);
    }
    let (kind, exclusive, wait) = (args[0].as_str(), args[1] == "ex", args[2] == "wait");
    let hold = Duration::from_millis(args[4].parse().expect("HOLD_MS"));
    let file = OpenOptions::new()
        .read(true)
        .write(exclusive)
        .open(&args[3])
        .unwrap_or_else(|e| {
            say(&format!("err {}", e.raw_os_error().unwrap_or(0)));
            std::process::exit(3)
        });
    if let Some(ms) = args.get(5) {
        let ms: u32 = ms.parse().expect("ALARM_MS");
        let timer = libc::itimerval {
            it_interval: libc::timeval {
                tv_sec: 0,
                tv_usec: 0,
            },
            it_value: libc::timeval {
                tv_sec: libc::time_t::from(ms / 1000),
                tv_usec: libc::suseconds_t::from(ms % 1000) * 1000,
            },
        };
        // SAFETY: a sigaction with a handler that does nothing, no SA_RESTART, so the
        // blocking call returns EINTR; setitimer arms a one-shot SIGALRM. Both read only
        // the structs passed.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_alarm as extern "C" fn(libc::c_int) as usize;
            libc::sigaction(libc::SIGALRM, &action, std::ptr::null_mut());
            libc::setitimer(libc::ITIMER_REAL, &timer, std::ptr::null_mut());
        }
    }
    let fd = file.as_raw_fd();
    let rc = if kind == "flock" {
        let op = if exclusive {
            libc::LOCK_EX
        } else {
            libc::LOCK_SH
        };
        let op = if wait { op } else { op | libc::LOCK_NB };
        // SAFETY: plain syscall on a descriptor open for the call.
        unsafe { libc::flock(fd, op) }
    } else {
        let cmd = match (kind, wait) {
            ("posix", false) => libc::F_SETLK,
            ("posix", true) => libc::F_SETLKW,
            ("ofd", false) => libc::F_OFD_SETLK,
            ("ofd", true) => libc::F_OFD_SETLKW,
            _ => panic!("KIND: posix, ofd or flock"),
        };
        let mut lock = libc::flock {
            l_type: (if exclusive {
                libc::F_WRLCK
            } else {
                libc::F_RDLCK
            }) as libc::c_short,
            l_whence: libc::SEEK_SET as libc::c_short,
            l_start: 0,
            l_len: 0,
            l_pid: 0,
        };
        // SAFETY: the descriptor is open and `lock` a valid struct flock for the call.
        unsafe { libc::fcntl(fd, cmd, &mut lock as *mut libc::flock) }
    };
    if rc < 0 {
        let e = io::Error::last_os_error().raw_os_error().unwrap_or(0);
        match e {
            libc::EAGAIN | libc::EACCES => {
                say("busy");
                std::process::exit(1)
            }
            libc::EINTR => {
                say("interrupted");
                std::process::exit(2)
            }
            _ => {
                say(&format!("err {e}"));
                std::process::exit(3)
            }
        }
    }
    say("locked");
    std::thread::sleep(hold);
}
