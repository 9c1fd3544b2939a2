//! The coroutine queue against a hostile request stream, without the kernel: a
//! SOCK_SEQPACKET socket pair stands in for /dev/fuse (one message per read, like the
//! kernel's one request per read), the test writes requests into one end and reads the
//! replies from it.
//!
//! What must hold: a request whose declared length disagrees with the bytes read gets an
//! EIO reply with its `unique` and the queue goes on serving; a read shorter than a request
//! header (a stream that no longer carries requests) stops the queue with a failure the
//! daemon turns into unmount + non-zero exit, counted in `stream_errors`.
//!
//! And how requests are read: one already queued is taken with `read(2)` at once, with no
//! ring submission and no suspension of the reader (a read on the ring cost both for every
//! request: 0.7-0.75x the IOPS at iodepth 1); and a shallow client's lone request queued
//! behind a deep client's is taken into the backlog and served next, not last
//! (`transport::backlog`).

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::net::UnixDatagram;
use std::sync::Arc;

use fuse::abi::{
    fuse_in_header, fuse_out_header, fuse_read_in, FUSE_GETATTR, FUSE_READ, FUSE_ROOT_ID,
};
use fuse::dev::FuseDev;
use fuse::{Reply, Request};
use runtime::Ctx;
use runtime::{Config, Runtime};
use transport::{FileSystem, Operations, Queue, QueueConfig};
use zerocopy::{FromBytes, FromZeros, IntoBytes};

/// Answers every request that takes a reply with an empty success.
struct Echo;

impl Operations for Echo {
    type Scratch = ();
}

impl FileSystem for Echo {
    fn handle<'b>(
        &self,
        _cx: &Ctx<'_>,
        req: &Request<'_>,
        _scratch: &'b mut (),
        _data: &'b mut [u8],
    ) -> Option<Reply<'b>> {
        req.expects_reply().then(|| Reply::empty(req.unique))
    }

    fn flush(&self, _cx: &Ctx<'_>) -> io::Result<()> {
        Ok(())
    }

    fn describe(&self) -> String {
        "echo".into()
    }
}

/// A connected SOCK_SEQPACKET pair: the queue's end (non-blocking, as the queue needs)
/// and the test's end.
fn socket_pair() -> (FuseDev, UnixDatagram) {
    let mut fds = [0; 2];
    // SAFETY: `fds` is a writable array of two ints, filled by the call.
    let rc = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    assert_eq!(rc, 0, "socketpair: {}", io::Error::last_os_error());
    // SAFETY: both descriptors are fresh from socketpair and owned by nobody else.
    let (queue_end, test_end) =
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let queue_end = UnixDatagram::from(queue_end);
    queue_end.set_nonblocking(true).expect("O_NONBLOCK");
    (
        FuseDev::from(OwnedFd::from(queue_end)),
        UnixDatagram::from(test_end),
    )
}

/// A GETATTR whose header says `len` bytes (56 is right).
fn getattr(unique: u64, len: u32) -> Vec<u8> {
    let header = fuse_in_header {
        len,
        opcode: FUSE_GETATTR,
        unique,
        nodeid: FUSE_ROOT_ID,
        ..FromZeros::new_zeroed()
    };
    [header.as_bytes(), &[0u8; 16]].concat()
}

/// A READ of 4 KiB on file handle `fh`.
fn read(unique: u64, fh: u64) -> Vec<u8> {
    let arg = fuse_read_in {
        fh,
        size: 4096,
        ..FromZeros::new_zeroed()
    };
    let len = (size_of::<fuse_in_header>() + size_of::<fuse_read_in>()) as u32;
    let header = fuse_in_header {
        len,
        opcode: FUSE_READ,
        unique,
        nodeid: 2,
        ..FromZeros::new_zeroed()
    };
    [header.as_bytes(), arg.as_bytes()].concat()
}

/// Sends `request` and returns the reply's header.
fn round_trip(peer: &UnixDatagram, request: &[u8]) -> fuse_out_header {
    peer.send(request).expect("send a request");
    reply_header(peer)
}

/// Receives the next reply and returns its header.
fn reply_header(peer: &UnixDatagram) -> fuse_out_header {
    let mut reply = [0u8; 256];
    let n = peer.recv(&mut reply).expect("read the reply");
    let (header, _) = fuse_out_header::read_from_prefix(&reply[..n]).expect("a reply header");
    assert_eq!(
        header.len as usize, n,
        "the reply's length is what was sent"
    );
    header
}

fn hostile_stream(inline: bool) {
    let (dev, peer) = socket_pair();
    let rt = Runtime::new(Config::default()).expect("runtime");
    let client = std::thread::spawn(move || {
        let ok = round_trip(&peer, &getattr(2, 56));
        assert_eq!((ok.unique, ok.error), (2, 0), "a good request");
        for (unique, len) in [(4, 57), (6, 40), (8, 0), (10, u32::MAX)] {
            let bad = round_trip(&peer, &getattr(unique, len));
            assert_eq!(
                (bad.unique, bad.error),
                (unique, -libc::EIO),
                "header len {len} for 56 bytes"
            );
        }
        let ok = round_trip(&peer, &getattr(12, 56));
        assert_eq!((ok.unique, ok.error), (12, 0), "still serving");
        // Ten bytes: not even a header. The stream is unusable.
        peer.send(&[7; 10]).expect("send");
        peer
    });
    let config = QueueConfig {
        inline,
        ..QueueConfig::default()
    };
    let queue = Queue::new(dev, Arc::new(Echo), 1 << 20, config);
    let (failure, stats) = rt
        .block_on(move |co| {
            queue.start(co).expect("start the readers");
            queue.wait_finished(co);
            (queue.failure(), queue.stats())
        })
        .expect("block_on");
    let _peer = client.join().expect("the client side");
    let failure = failure.expect("a short read is a failure of the stream");
    assert!(failure.contains("less than a request header"), "{failure}");
    assert_eq!(stats.stream_errors, 1);
    // The four EIO answers count as malformed requests, not as replies.
    assert_eq!((stats.malformed, stats.replies), (4, 2));
}

#[test]
fn coroutine_queue_answers_bad_lengths_and_stops_on_a_broken_stream() {
    hostile_stream(false);
}

#[test]
fn inline_queue_answers_bad_lengths_and_stops_on_a_broken_stream() {
    hostile_stream(true);
}

/// 64 requests queued before the queue starts are each taken by `read(2)` and answered
/// without the reader suspending: the ring sees only the wait once the stream is empty
/// (one poll per reader), not a read per request.
#[test]
fn queued_requests_are_read_without_the_ring() {
    const QUEUED: u64 = 64;
    let (dev, peer) = socket_pair();
    for unique in 1..=QUEUED {
        peer.send(&getattr(unique * 2, 56))
            .expect("queue a request");
    }
    let rt = Runtime::new(Config::default()).expect("runtime");
    let config = QueueConfig::default();
    let readers = config.readers as u64;
    let queue = Queue::new(dev, Arc::new(Echo), 1 << 20, config);
    let (stats, (counted, yields)) = rt
        .block_on(move |co| {
            let before = co.counters();
            queue.start(co).expect("start the readers");
            let mut yields = 0;
            while queue.stats().replies < QUEUED {
                co.yield_now();
                yields += 1;
            }
            let counted = co.counters().since(&before);
            queue.stop(co);
            queue.wait_finished(co);
            (queue.stats(), (counted, yields))
        })
        .expect("block_on");
    for unique in 1..=QUEUED {
        let header = reply_header(&peer);
        assert_eq!((header.unique, header.error), (unique * 2, 0));
    }
    assert_eq!(stats.requests, QUEUED);
    assert!(
        counted.sqes_submitted <= readers,
        "at most one poll per reader for {QUEUED} requests: {counted:?}"
    );
    assert!(
        counted.suspends <= readers + yields,
        "a reader suspends only to wait, not per request ({yields} yields): {counted:?}"
    );
}

/// A deep client's 32 READs queued, with a shallow client's one READ 13th among them: the
/// queue drains what is queued into its backlog and serves the lone request second (in
/// arrival order it would be 13th); the deep client's requests keep their order.
#[test]
fn a_lone_request_behind_a_deep_queue_is_served_next() {
    const DEEP: u64 = 256;
    const SHALLOW: u64 = 512;
    const LONE: u64 = 1_000;
    let (dev, peer) = socket_pair();
    let rt = Runtime::new(Config::default()).expect("runtime");
    let queue = Queue::new(dev, Arc::new(Echo), 1 << 20, QueueConfig::default());
    for unique in 1..=32 {
        peer.send(&read(unique, DEEP)).expect("queue a request");
        if unique == 12 {
            peer.send(&read(LONE, SHALLOW))
                .expect("queue the lone request");
        }
    }
    // The first drain, a probe, comes transport::read_ahead::PROBE_EVERY after the queue
    // is made.
    std::thread::sleep(transport::read_ahead::PROBE_EVERY * 2);
    let stats = rt
        .block_on(move |co| {
            queue.start(co).expect("start the readers");
            while queue.stats().replies < 33 {
                co.yield_now();
            }
            queue.stop(co);
            queue.wait_finished(co);
            queue.stats()
        })
        .expect("block_on");
    let order: Vec<u64> = (0..33).map(|_| reply_header(&peer).unique).collect();
    let lone_at = order
        .iter()
        .position(|&u| u == LONE)
        .expect("the lone reply");
    assert_eq!(lone_at, 1, "the lone request is served second: {order:?}");
    let deep: Vec<u64> = order.into_iter().filter(|&u| u != LONE).collect();
    assert_eq!(
        deep,
        (1..=32).collect::<Vec<_>>(),
        "the deep client's order"
    );
    assert!(stats.backlogged >= 8, "taken into the backlog: {stats:?}");
}

/// Once a queue found a shallow client, each of its requests counts
/// `SHALLOW_WEIGHT` times for the loop placement (the others once), and the finding is
/// shared: the handle given to `share_shallow_client` names the client.
#[test]
fn a_shallow_clients_requests_weigh_more_for_the_placement() {
    use std::sync::atomic::{AtomicU64, Ordering};
    use transport::read_ahead::SHALLOW_WEIGHT;
    const DEEP: u64 = 256;
    const SHALLOW: u64 = 512;
    let (dev, peer) = socket_pair();
    let rt = Runtime::new(Config::default()).expect("runtime");
    let queue = Queue::new(dev, Arc::new(Echo), 1 << 20, QueueConfig::default());
    let (counted, shared) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(u64::MAX)),
    );
    queue.count_into(Arc::clone(&counted));
    queue.share_shallow_client(Arc::clone(&shared));
    for unique in 1..=15 {
        peer.send(&read(unique, DEEP)).expect("queue a request");
        if unique == 12 {
            peer.send(&read(100, SHALLOW))
                .expect("queue the lone request");
        }
    }
    std::thread::sleep(transport::read_ahead::PROBE_EVERY * 2);
    let sender = peer.try_clone().expect("a second handle on the socket");
    let counts = rt
        .block_on(move |co| {
            queue.start(co).expect("start the readers");
            let served = |n| {
                while queue.stats().replies < n {
                    co.yield_now();
                }
            };
            served(16);
            let first = (
                counted.load(Ordering::Relaxed),
                shared.load(Ordering::Relaxed),
            );
            sender
                .send(&read(101, SHALLOW))
                .expect("the shallow client again");
            sender.send(&read(16, DEEP)).expect("the deep one again");
            served(18);
            queue.stop(co);
            queue.wait_finished(co);
            (first, counted.load(Ordering::Relaxed))
        })
        .expect("block_on");
    assert_eq!(
        counts.0,
        (16, SHALLOW),
        "found by the first drain, counted once each"
    );
    assert_eq!(counts.1, 16 + SHALLOW_WEIGHT + 1, "then it weighs more");
}
