//! Reconnection (`--reconnect-delay`) against a scripted server in the test: each
//! connection it accepts behaves as its script says (serve an in-memory disk, accept and
//! say nothing, answer a flush with `ESHUTDOWN` as nbdkit does while it quits), and the
//! test cuts the served connections as a killed server would. What a real restarting
//! server does only sometimes (a process frozen after `listen`, a reply sent as it quits)
//! happens here on every run; in both contexts.
//!
//! A request that must come back hangs forever on the code these tests were written
//! against, so each check runs on a thread of its own and a hang fails the test after
//! [`HANG`] (a hang detector, far above any wait a check expects).

#[path = "util/nbd_handshake.rs"]
mod nbd_handshake;
mod util;

use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use backend::nbd::proto::*;
use backend::{BlockBackend, Ctx, NbdBackend, NbdOptions, OpenOptions};
use nbd_handshake::handshake;
use util::{errno, in_coroutine, pattern};

const SIZE: usize = 1 << 20;
const HANG: Duration = Duration::from_secs(120);

/// What one accepted connection does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Conduct {
    /// The handshake, then the disk's reads, writes and flushes.
    Serve,
    /// Accepts, and never sends a byte (a server frozen, or not serving yet).
    Silent,
    /// Serves, but answers a flush with `ESHUTDOWN` and closes, as nbdkit does with what
    /// it read as it quits.
    ShutDown,
    /// The handshake, then closes.
    Drop,
}

/// The scripted server on a unix socket: connection `i` behaves as `script[i]` (the last
/// entry for every later one).
struct Server {
    path: PathBuf,
    _dir: tempfile::TempDir,
    disk: Arc<Mutex<Vec<u8>>>,
    /// The server ends of the connections being served, for [`Server::cut`].
    live: Arc<Mutex<Vec<UnixStream>>>,
    stop: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
}

impl Server {
    fn start(script: &[Conduct]) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sock");
        let listener = UnixListener::bind(&path).unwrap();
        let disk = Arc::new(Mutex::new(vec![0u8; SIZE]));
        let live = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let acceptor = {
            let (script, disk, live, stop) =
                (script.to_vec(), disk.clone(), live.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut silent = Vec::new(); // held open, unanswered, until the end
                for i in 0.. {
                    let Ok((s, _)) = listener.accept() else {
                        return;
                    };
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    match script[i.min(script.len() - 1)] {
                        Conduct::Silent => silent.push(s),
                        conduct => {
                            live.lock().unwrap().push(s.try_clone().unwrap());
                            let disk = disk.clone();
                            std::thread::spawn(move || serve(s, &disk, conduct));
                        }
                    }
                }
            })
        };
        Server {
            path,
            _dir: dir,
            disk,
            live,
            stop,
            acceptor: Some(acceptor),
        }
    }

    fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.path.display())
    }

    /// Ends every connection being served, as a killed server does.
    fn cut(&self) {
        for s in self.live.lock().unwrap().drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    fn disk(&self, at: usize, len: usize) -> Vec<u8> {
        self.disk.lock().unwrap()[at..at + len].to_vec()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = UnixStream::connect(&self.path); // wakes the acceptor
        self.cut();
        let _ = self.acceptor.take().unwrap().join();
    }
}

/// One connection: the handshake (simple replies only), then requests as `conduct` says,
/// until the client leaves or the test cuts it.
fn serve(mut s: UnixStream, disk: &Mutex<Vec<u8>>, conduct: Conduct) -> Option<()> {
    handshake(&mut s, false, SIZE as u64)?;
    if conduct == Conduct::Drop {
        let _ = s.shutdown(std::net::Shutdown::Both); // `live` holds a clone: end it
        return None;
    }
    loop {
        let mut req = [0u8; REQUEST_LEN];
        s.read_exact(&mut req).ok()?;
        let be = |a: usize, b: usize| req[a..b].iter().fold(0u64, |x, &y| x << 8 | u64::from(y));
        let (kind, cookie, offset, len) = (
            be(6, 8) as u16,
            be(8, 16),
            be(16, 24) as usize,
            be(24, 28) as usize,
        );
        let reply = |error: i32| {
            [
                &NBD_SIMPLE_REPLY_MAGIC.to_be_bytes()[..],
                &(error as u32).to_be_bytes(),
                &cookie.to_be_bytes(),
            ]
            .concat()
        };
        match kind {
            NBD_CMD_WRITE => {
                let mut data = vec![0u8; len];
                s.read_exact(&mut data).ok()?;
                disk.lock().unwrap()[offset..offset + len].copy_from_slice(&data);
                s.write_all(&reply(0)).ok()?;
            }
            NBD_CMD_READ => {
                let data = disk.lock().unwrap()[offset..offset + len].to_vec();
                s.write_all(&[reply(0), data].concat()).ok()?;
            }
            NBD_CMD_FLUSH if conduct == Conduct::ShutDown => {
                s.write_all(&reply(libc::ESHUTDOWN)).ok()?;
                return None; // and closes
            }
            NBD_CMD_FLUSH => s.write_all(&reply(0)).ok()?,
            NBD_CMD_DISC => return None,
            _ => s.write_all(&reply(libc::EINVAL)).ok()?,
        }
    }
}

fn open(server: &Server, delay: Duration) -> Arc<NbdBackend> {
    let nbd = NbdOptions {
        reconnect_delay: delay,
        ..NbdOptions::default()
    };
    let opts = OpenOptions {
        writable: true,
        ..OpenOptions::default()
    };
    Arc::new(backend::nbd::open(&server.uri(), &opts, &nbd).unwrap())
}

/// Runs `check` in each context, each on a thread of its own; a check still running
/// after [`HANG`] fails the test.
fn in_each_ctx(check: impl Fn(&Ctx<'_>) + Send + Sync + 'static) {
    let check = Arc::new(check);
    for coroutine in [false, true] {
        let (done, finished) = mpsc::channel();
        let check = check.clone();
        let worker = std::thread::spawn(move || {
            match coroutine {
                false => check(&Ctx::Blocking),
                true => in_coroutine(move |cx| check(cx)),
            }
            let _ = done.send(());
        });
        let ended = finished.recv_timeout(HANG);
        let ctx = if coroutine { "coroutine" } else { "blocking" };
        if ended == Err(mpsc::RecvTimeoutError::Timeout) {
            panic!("{ctx}: hung for {HANG:?}: the request never came back");
        }
        worker
            .join()
            .unwrap_or_else(|_| panic!("{ctx}: the check failed (see above)"));
    }
}

fn write(b: &NbdBackend, cx: &Ctx<'_>, data: &[u8], at: u64) -> std::io::Result<()> {
    b.writev(cx, &[IoSlice::new(data)], at)
}

fn read(b: &NbdBackend, cx: &Ctx<'_>, len: usize, at: u64) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    b.readv(cx, &mut [IoSliceMut::new(&mut buf)], at)?;
    Ok(buf)
}

/// The server is cut and the next connection it accepts says nothing (a server frozen
/// after `listen`, or a TCP peer that drops the SYN): that attempt gives up after
/// `ATTEMPT_LIMIT`, the next one is served, and the request waiting completes well within
/// the delay. Before, the silent attempt held the reconnection forever: the request hung.
#[test]
fn nbd_reconnect_past_a_server_that_accepts_and_says_nothing() {
    in_each_ctx(|cx| {
        let server = Server::start(&[Conduct::Serve, Conduct::Silent, Conduct::Serve]);
        let b = open(&server, Duration::from_secs(60));
        write(&b, cx, &pattern(4096, 1), 0).unwrap();
        server.cut();
        let data = pattern(4096, 2);
        write(&b, cx, &data, 8192).unwrap();
        assert_eq!(read(&b, cx, 4096, 8192).unwrap(), data);
        b.flush(cx).unwrap();
        assert_eq!(server.disk(8192, 4096), data);
    });
}

/// A request waiting when `--reconnect-delay` runs out fails with EIO then, even while an
/// attempt at a new connection is still waiting for a silent server; the next request
/// gives up once an attempt made since it came has failed. Before, the request waited for
/// the silent attempt, which never ended.
#[test]
fn nbd_requests_fail_when_the_delay_runs_out_during_an_attempt() {
    in_each_ctx(|cx| {
        let server = Server::start(&[Conduct::Serve, Conduct::Silent]);
        let b = open(&server, Duration::from_secs(1));
        write(&b, cx, &pattern(4096, 1), 0).unwrap();
        server.cut();
        let e = read(&b, cx, 4096, 0).unwrap_err();
        assert_eq!(errno(&e), libc::EIO);
        assert_eq!(
            errno(&b.flush(cx).unwrap_err()),
            libc::EIO,
            "and the next one"
        );
    });
}

/// A flush answered with `ESHUTDOWN` (nbdkit quitting: it did not flush) is not the
/// flush's failure but the connection's end: the flush is sent again on a new connection
/// and succeeds, with the default `--reconnect-delay 0` as with a delay; the same for the
/// last flush at close. Before, the caller got `ESHUTDOWN` ("Cannot send after transport
/// endpoint shutdown"), and a daemon stopping then exited 1.
#[test]
fn nbd_flush_answered_eshutdown_is_sent_again() {
    use Conduct::{Serve, ShutDown};
    for delay in [Duration::ZERO, Duration::from_secs(15)] {
        in_each_ctx(move |cx| {
            let data = pattern(8192, 3);
            let server = Server::start(&[ShutDown, Serve]);
            let b = open(&server, delay);
            write(&b, cx, &data, 4096).unwrap();
            b.flush(cx).unwrap();
            assert_eq!(server.disk(4096, 8192), data);
            let server = Server::start(&[ShutDown, Serve]);
            let b = open(&server, delay);
            write(&b, cx, &data, 65536).unwrap();
            b.close(cx).unwrap();
            assert_eq!(server.disk(65536, 8192), data);
        });
    }
}

/// The last flush at close while the server is away: it waits for the new connection
/// like any other request, and succeeds once the server is back.
#[test]
fn nbd_close_flushes_through_a_reconnection() {
    in_each_ctx(|cx| {
        let server = Server::start(&[Conduct::Serve]);
        let b = open(&server, Duration::from_secs(60));
        let data = pattern(4096, 4);
        write(&b, cx, &data, 0).unwrap();
        server.cut();
        b.close(cx).unwrap();
        assert_eq!(server.disk(0, 4096), data);
    });
}

/// A server that accepts every new connection and then drops it, or answers every flush
/// `ESHUTDOWN`: a request sent again on a new connection and lost again does not go round
/// for ever. With the default delay 0 it gets its one try and fails with EIO; with a delay
/// it fails when the delay runs out. Before, a dropped request went round for ever (new
/// connection, lost, new connection...), and a flush failed with ESHUTDOWN.
#[test]
fn nbd_a_request_lost_again_and_again_fails_with_eio() {
    use Conduct::{Drop, Serve, ShutDown};
    for delay in [Duration::ZERO, Duration::from_secs(1)] {
        in_each_ctx(move |cx| {
            let server = Server::start(&[Serve, Drop]);
            let b = open(&server, delay);
            write(&b, cx, &pattern(4096, 5), 0).unwrap();
            server.cut();
            let e = write(&b, cx, &pattern(4096, 6), 0).unwrap_err();
            assert_eq!(errno(&e), libc::EIO, "dropped on every new connection");
        });
        in_each_ctx(move |cx| {
            let server = Server::start(&[ShutDown]);
            let b = open(&server, delay);
            let e = b.flush(cx).unwrap_err();
            assert_eq!(errno(&e), libc::EIO, "ESHUTDOWN on every new connection");
        });
    }
}
