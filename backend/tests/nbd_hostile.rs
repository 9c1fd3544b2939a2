//! Hostile NBD servers: a scripted server in a thread of the test answers the handshake
//! properly, then breaks the protocol in one way. The request fails with EIO, so does every
//! later one (the connection is over), and nothing panics or hangs; in both contexts.

#[path = "util/nbd_handshake.rs"]
mod nbd_handshake;
mod util;

use std::io::{IoSliceMut, Read, Write};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use backend::nbd::proto::*;
use backend::{Ctx, OpenOptions};
use nbd_handshake::handshake;
use util::{errno, in_coroutine};

const SIZE: u64 = 1 << 20;

/// What the server sends for the first request: `(cookie, offset, len)` in, bytes out.
type Script = fn(u64, u64, u32) -> Vec<u8>;

struct Server {
    path: PathBuf,
    _dir: tempfile::TempDir,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    fn start(structured: bool, script: Script) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sock");
        let listener = UnixListener::bind(&path).unwrap();
        let thread = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            if handshake(&mut s, structured, SIZE).is_none() {
                return;
            }
            let mut req = [0u8; REQUEST_LEN];
            if s.read_exact(&mut req).is_err() {
                return;
            }
            let be =
                |a: usize, b: usize| req[a..b].iter().fold(0u64, |x, &y| x << 8 | u64::from(y));
            let reply = script(be(8, 16), be(16, 24), be(24, 28) as u32);
            let _ = s.write_all(&reply);
            // Hold the connection until the client closes it; a truncated reply (marked
            // by an odd length) is followed by the server's close instead.
            if reply.len() % 2 == 0 {
                let _ = s.read(&mut [0u8; 64]);
            }
        });
        Server {
            path,
            _dir: dir,
            thread: Some(thread),
        }
    }

    fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.path.display())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.thread.take().unwrap().join();
    }
}

fn simple(error: u32, cookie: u64) -> Vec<u8> {
    [
        &NBD_SIMPLE_REPLY_MAGIC.to_be_bytes()[..],
        &error.to_be_bytes(),
        &cookie.to_be_bytes(),
    ]
    .concat()
}

fn chunk(flags: u16, kind: u16, cookie: u64, payload: &[u8]) -> Vec<u8> {
    let head = [
        &NBD_STRUCTURED_REPLY_MAGIC.to_be_bytes()[..],
        &flags.to_be_bytes(),
        &kind.to_be_bytes(),
        &cookie.to_be_bytes(),
        &(payload.len() as u32).to_be_bytes(),
    ];
    [&head.concat()[..], payload].concat()
}

/// Opens the scripted server, reads 4 KiB (must fail with EIO, quickly), then once more.
fn expect_eio(structured: bool, script: Script) {
    for coroutine in [false, true] {
        let server = Server::start(structured, script);
        let b = backend::open(&server.uri(), &OpenOptions::default()).unwrap();
        let check = move |cx: &Ctx<'_>| {
            let started = Instant::now();
            for _ in 0..2 {
                let mut buf = [0u8; 4096];
                let e = b
                    .readv(cx, &mut [IoSliceMut::new(&mut buf)], 0)
                    .unwrap_err();
                assert_eq!(errno(&e), libc::EIO);
            }
            assert!(started.elapsed() < Duration::from_secs(5));
        };
        match coroutine {
            false => check(&Ctx::Blocking),
            true => in_coroutine(check),
        }
    }
}

#[test]
fn nbd_hostile_bad_magic() {
    expect_eio(false, |cookie, _, _| {
        let mut r = simple(0, cookie);
        r[0] ^= 1;
        r
    });
}

#[test]
fn nbd_hostile_structured_magic_not_negotiated() {
    expect_eio(false, |cookie, off, _| {
        chunk(
            NBD_REPLY_FLAG_DONE,
            NBD_REPLY_TYPE_NONE,
            cookie,
            &off.to_be_bytes()[..0],
        )
    });
}

#[test]
fn nbd_hostile_unknown_cookie() {
    expect_eio(false, |cookie, _, len| {
        [simple(0, cookie ^ 0x100), vec![0; len as usize]].concat()
    });
}

#[test]
fn nbd_hostile_undefined_error() {
    expect_eio(false, |cookie, _, _| simple(libc::ENOENT as u32, cookie));
}

#[test]
fn nbd_hostile_reply_longer_than_asked() {
    expect_eio(true, |cookie, off, len| {
        let payload = [&off.to_be_bytes()[..], &vec![1; len as usize + 1]].concat();
        chunk(
            NBD_REPLY_FLAG_DONE,
            NBD_REPLY_TYPE_OFFSET_DATA,
            cookie,
            &payload,
        )
    });
}

#[test]
fn nbd_hostile_read_reply_short() {
    expect_eio(true, |cookie, off, len| {
        let payload = [&off.to_be_bytes()[..], &vec![1; len as usize - 1]].concat();
        chunk(
            NBD_REPLY_FLAG_DONE,
            NBD_REPLY_TYPE_OFFSET_DATA,
            cookie,
            &payload,
        )
    });
}

#[test]
fn nbd_hostile_simple_reply_to_structured_read() {
    expect_eio(true, |cookie, _, len| {
        [simple(0, cookie), vec![1; len as usize]].concat()
    });
}

#[test]
fn nbd_hostile_closes_mid_reply() {
    expect_eio(false, |cookie, _, len| {
        [simple(0, cookie), vec![1; len as usize / 2 + 1]].concat()
    });
}

/// A defined error is the request's alone: EINVAL reaches the caller, the connection
/// stays (the next request is answered by nobody here, so only the first is checked).
#[test]
fn nbd_hostile_defined_error_is_passed_on() {
    let server = Server::start(true, |cookie, _, _| {
        let msg = b"no such luck";
        let payload = [
            &(libc::EINVAL as u32).to_be_bytes()[..],
            &(msg.len() as u16).to_be_bytes(),
            msg,
        ]
        .concat();
        chunk(NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_ERROR, cookie, &payload)
    });
    let b = backend::open(&server.uri(), &OpenOptions::default()).unwrap();
    let mut buf = [0u8; 4096];
    let e = b
        .readv(&Ctx::Blocking, &mut [IoSliceMut::new(&mut buf)], 0)
        .unwrap_err();
    assert_eq!(errno(&e), libc::EINVAL);
    assert_eq!(b.len(), SIZE);
}
