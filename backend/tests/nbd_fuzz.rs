//! Hostile NBD replies, property-based: byte streams go through the reply parser the
//! connection's reader uses (`backend::nbd::reply::read_one`), against a table of
//! requests in flight that checks every call the parser makes.
//!
//! Properties: no panic; payload only inside the range its request asked for (a block
//! status request's one descriptor), never twice over the same byte; a request completes
//! at most once, and a read or block status that completes successfully had every byte
//! delivered; an unmodified stream of valid
//! replies (simple or structured, chunks of different requests interleaved) completes
//! every request with exactly the server's data. Random and mutated streams must end in
//! an error (the connection ends) or in valid completions, never anything else.
//!
//! The long run, outside CI: `PROPTEST_CASES=1000000 cargo test --release -p
//! corofuse-backend --test nbd_fuzz`.

use std::collections::HashMap;
use std::io;

use backend::nbd::proto::*;
use backend::nbd::reply::{read_one, reply_len, Expect, Progress, Table, Wire};
use proptest::prelude::*;

/// The id the tables give `base:allocation`.
const CONTEXT: u32 = 7;

/// Requests whose reply delivers bytes to the caller.
fn delivers(kind: u16) -> bool {
    kind == NBD_CMD_READ || kind == NBD_CMD_BLOCK_STATUS
}

/// The bytes a test feeds, as the socket.
struct Bytes<'a>(&'a [u8]);

impl Wire for Bytes<'_> {
    fn read_exact(&mut self, buf: &mut [u8]) -> io::Result<()> {
        if buf.len() > self.0.len() {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let (head, rest) = self.0.split_at(buf.len());
        buf.copy_from_slice(head);
        self.0 = rest;
        Ok(())
    }
}

/// One request in flight, with what the parser did to it.
struct Pending {
    expect: Expect,
    progress: Progress,
    data: Vec<u8>,
    delivered: Vec<bool>,
    done: Option<Result<(), i32>>,
}

/// The requests in flight; asserts what the parser may do.
#[derive(Default)]
struct Checked(HashMap<u64, Pending>);

impl Checked {
    fn new(reqs: &[(u64, Expect)]) -> Checked {
        let map = reqs.iter().map(|&(cookie, expect)| {
            let len = reply_len(&expect);
            let p = Pending {
                expect,
                progress: Progress::default(),
                data: vec![0xEE; len],
                delivered: vec![false; len],
                done: None,
            };
            (cookie, p)
        });
        Checked(map.collect())
    }

    fn mark(&mut self, cookie: u64, at: usize, len: usize) -> &mut Pending {
        let p = self
            .0
            .get_mut(&cookie)
            .expect("a cookie the parser was told exists");
        assert!(p.done.is_none(), "payload for a completed request");
        assert!(
            delivers(p.expect.kind),
            "payload for a request without data"
        );
        assert!(
            at + len <= reply_len(&p.expect),
            "payload outside the request"
        );
        for d in &mut p.delivered[at..at + len] {
            assert!(!*d, "the same byte delivered twice");
            *d = true;
        }
        p
    }
}

impl Table for Checked {
    fn expect(&mut self, cookie: u64) -> Option<(Expect, Progress)> {
        let p = self.0.get(&cookie).filter(|p| p.done.is_none())?;
        Some((p.expect, p.progress))
    }

    fn allocation_context(&mut self) -> Option<u32> {
        Some(CONTEXT)
    }

    fn data(&mut self, cookie: u64, at: usize, len: usize, wire: &mut dyn Wire) -> io::Result<()> {
        let p = self.mark(cookie, at, len);
        wire.read_exact(&mut p.data[at..at + len])
    }

    fn hole(&mut self, cookie: u64, at: usize, len: usize) {
        self.mark(cookie, at, len).data[at..at + len].fill(0);
    }

    fn progress(&mut self, cookie: u64, progress: Progress) {
        self.0.get_mut(&cookie).unwrap().progress = progress;
    }

    fn done(&mut self, cookie: u64, result: Result<(), i32>) {
        let p = self.0.get_mut(&cookie).unwrap();
        assert!(p.done.is_none(), "completed twice");
        if result.is_ok() && delivers(p.expect.kind) {
            assert!(
                p.delivered.iter().all(|&d| d),
                "a read or block status completed with bytes missing"
            );
        }
        p.done = Some(result);
    }
}

/// Parses `stream` to its end or its first error; the table asserts along the way.
fn parse_all(stream: &[u8], table: &mut Checked, structured: bool) {
    let mut wire = Bytes(stream);
    while !wire.0.is_empty() {
        if read_one(&mut wire, table, structured).is_err() {
            return;
        }
    }
}

/// A request: READ, WRITE or BLOCK_STATUS (cookie i + 1) at an offset, up to 64 KiB, and
/// for a read the server's data and where its structured reply cuts it into chunks; for a
/// block status, its one descriptor.
#[derive(Clone, Debug)]
struct Case {
    kind: u16,
    offset: u64,
    /// Bytes asked about.
    range: u32,
    data: Vec<u8>,
    cuts: Vec<usize>,
    holes: Vec<bool>,
}

fn case() -> impl Strategy<Value = Case> {
    (0u8..3, 0u64..1 << 40, 1usize..65536, any::<u8>()).prop_flat_map(
        |(which, offset, len, seed)| {
            let data: Vec<u8> = (0..len)
                .map(|i| (i as u8).wrapping_mul(seed) ^ 0x5a)
                .collect();
            (
                Just(which),
                Just(offset),
                Just(data),
                proptest::collection::vec(1..len.max(2), 0..4),
                proptest::collection::vec(any::<bool>(), 5),
            )
                .prop_map(move |(which, offset, data, mut cuts, holes)| {
                    cuts.sort_unstable();
                    cuts.dedup();
                    cuts.retain(|&c| c < data.len());
                    let mut data = data;
                    let mut bounds = vec![0];
                    bounds.extend(&cuts);
                    bounds.push(data.len());
                    for (i, w) in bounds.windows(2).enumerate() {
                        if holes[i % 5] {
                            data[w[0]..w[1]].fill(0); // served as a hole
                        }
                    }
                    let range = data.len() as u32;
                    let (kind, data) = match which {
                        0 => (NBD_CMD_READ, data),
                        1 => (NBD_CMD_WRITE, data),
                        // One extent of 1..=range bytes, its state from the seed.
                        _ => {
                            let extent = 1 + u32::from(seed) % range;
                            let state = u32::from(seed) & 3;
                            let d = [extent.to_be_bytes(), state.to_be_bytes()].concat();
                            (NBD_CMD_BLOCK_STATUS, d)
                        }
                    };
                    Case {
                        kind,
                        offset,
                        range,
                        data,
                        cuts,
                        holes,
                    }
                })
        },
    )
}

fn chunk(out: &mut Vec<u8>, flags: u16, kind: u16, cookie: u64, payload: &[u8]) {
    out.extend(NBD_STRUCTURED_REPLY_MAGIC.to_be_bytes());
    out.extend(flags.to_be_bytes());
    out.extend(kind.to_be_bytes());
    out.extend(cookie.to_be_bytes());
    out.extend((payload.len() as u32).to_be_bytes());
    out.extend(payload);
}

/// Each request's reply as a list of messages (each a byte vector), in order.
fn replies(case: &Case, cookie: u64, structured: bool) -> Vec<Vec<u8>> {
    let mut msgs = Vec::new();
    if case.kind == NBD_CMD_BLOCK_STATUS {
        let mut m = Vec::new();
        let payload = [&CONTEXT.to_be_bytes()[..], &case.data].concat();
        let flags = NBD_REPLY_FLAG_DONE;
        chunk(&mut m, flags, NBD_REPLY_TYPE_BLOCK_STATUS, cookie, &payload);
        return vec![m];
    }
    if !structured || case.kind != NBD_CMD_READ {
        let mut m = Vec::new();
        m.extend(NBD_SIMPLE_REPLY_MAGIC.to_be_bytes());
        m.extend(0u32.to_be_bytes());
        m.extend(cookie.to_be_bytes());
        if case.kind == NBD_CMD_READ {
            m.extend(&case.data);
        }
        return vec![m];
    }
    let mut starts = vec![0];
    starts.extend(&case.cuts);
    starts.push(case.data.len());
    for (i, w) in starts.windows(2).enumerate() {
        let (a, b) = (w[0], w[1]);
        let offset = (case.offset + a as u64).to_be_bytes();
        let mut m = Vec::new();
        // A hole only where the data is zero: the property checks the bytes.
        if case.holes[i % 5] && case.data[a..b].iter().all(|&x| x == 0) {
            let payload = [&offset[..], &((b - a) as u32).to_be_bytes()].concat();
            chunk(&mut m, 0, NBD_REPLY_TYPE_OFFSET_HOLE, cookie, &payload);
        } else {
            let payload = [&offset[..], &case.data[a..b]].concat();
            chunk(&mut m, 0, NBD_REPLY_TYPE_OFFSET_DATA, cookie, &payload);
        }
        msgs.push(m);
    }
    let mut last = Vec::new();
    chunk(
        &mut last,
        NBD_REPLY_FLAG_DONE,
        NBD_REPLY_TYPE_NONE,
        cookie,
        &[],
    );
    msgs.push(last);
    msgs
}

/// The requests' replies, interleaved as `order` says (each request's own in order).
fn stream(cases: &[Case], structured: bool, order: &[usize]) -> (Vec<u8>, Vec<(u64, Expect)>) {
    let mut queues: Vec<std::collections::VecDeque<Vec<u8>>> = cases
        .iter()
        .enumerate()
        .map(|(i, c)| replies(c, i as u64 + 1, structured).into())
        .collect();
    let mut out = Vec::new();
    let mut pick = order.iter().cycle();
    while queues.iter().any(|q| !q.is_empty()) {
        let start = *pick.next().unwrap() % queues.len();
        let i = (0..queues.len())
            .map(|k| (start + k) % queues.len())
            .find(|&k| !queues[k].is_empty())
            .unwrap();
        out.extend(queues[i].pop_front().unwrap());
    }
    let reqs = cases
        .iter()
        .enumerate()
        .map(|(i, c)| {
            (
                i as u64 + 1,
                Expect {
                    kind: c.kind,
                    offset: c.offset,
                    len: c.range,
                },
            )
        })
        .collect();
    (out, reqs)
}

proptest! {
    /// Valid replies, interleaved: every request completes, reads with the server's bytes.
    #[test]
    fn valid_streams_complete_with_the_servers_data(
        cases in proptest::collection::vec(case(), 1..6),
        structured in any::<bool>(),
        order in proptest::collection::vec(any::<usize>(), 1..8),
    ) {
        // Block status needs structured replies (the handshake asks for it only then).
        let cases: Vec<Case> = cases
            .into_iter()
            .filter(|c| structured || c.kind != NBD_CMD_BLOCK_STATUS)
            .collect();
        prop_assume!(!cases.is_empty());
        let (bytes, reqs) = stream(&cases, structured, &order);
        let mut table = Checked::new(&reqs);
        let mut wire = Bytes(&bytes);
        while !wire.0.is_empty() {
            read_one(&mut wire, &mut table, structured).expect("a valid stream parses");
        }
        for (i, c) in cases.iter().enumerate() {
            let p = &table.0[&(i as u64 + 1)];
            prop_assert_eq!(p.done, Some(Ok(())));
            if delivers(c.kind) {
                prop_assert!(p.data == c.data, "request {} got other bytes", i + 1);
            }
        }
    }

    /// The same streams with bytes changed, cut or inserted: the table's checks hold.
    #[test]
    fn mutated_streams_never_break_the_rules(
        cases in proptest::collection::vec(case(), 1..4),
        structured in any::<bool>(),
        order in proptest::collection::vec(any::<usize>(), 1..8),
        edits in proptest::collection::vec((any::<usize>(), any::<u8>(), 0u8..3), 1..6),
    ) {
        let (mut bytes, reqs) = stream(&cases, structured, &order);
        for (at, byte, how) in edits {
            // Mostly in the headers, where the parser's decisions are.
            let at = if bytes.is_empty() { 0 } else { at % bytes.len().min(64 + at % 4096) };
            match how {
                0 if at < bytes.len() => bytes[at] ^= byte | 1,
                1 => bytes.truncate(at),
                _ => bytes.insert(at.min(bytes.len()), byte),
            }
        }
        parse_all(&bytes, &mut Checked::new(&reqs), structured);
    }

    /// Random bytes, after a valid magic now and then.
    #[test]
    fn random_streams_never_break_the_rules(
        cases in proptest::collection::vec(case(), 1..3),
        structured in any::<bool>(),
        magic in 0u8..3,
        noise in proptest::collection::vec(any::<u8>(), 0..512),
    ) {
        let (_, reqs) = stream(&cases, structured, &[0]);
        let mut bytes = match magic {
            0 => NBD_SIMPLE_REPLY_MAGIC.to_be_bytes().to_vec(),
            1 => NBD_STRUCTURED_REPLY_MAGIC.to_be_bytes().to_vec(),
            _ => Vec::new(),
        };
        if magic < 2 && noise.len() >= 12 {
            // A known cookie, so the parser goes past the header.
            let cookie = 1 + u64::from(noise[0]) % reqs.len() as u64;
            bytes.extend(&noise[..4]); // error, or flags and type
            bytes.extend(cookie.to_be_bytes());
            bytes.extend(&noise[12..]);
        } else {
            bytes.extend(&noise);
        }
        parse_all(&bytes, &mut Checked::new(&reqs), structured);
    }
}
