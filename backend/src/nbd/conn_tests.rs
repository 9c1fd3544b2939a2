//! The connection's roles when it is lost, driven step by step: a scheduling order that a
//! test through the public API reaches only by chance (which of two completions the ring
//! delivers first), set up here exactly.

use std::io::IoSlice;
use std::os::unix::net::UnixListener;
use std::time::Duration;

use super::*;
use crate::nbd::proto::{NBD_CMD_WRITE, NBD_FLAG_HAS_FLAGS, NBD_FLAG_SEND_FLUSH};
use crate::nbd::uri::Address;

/// A connection over a unix socket whose server end is `listener`'s first connection
/// (kept in the returned tuple, never answering), made again at the same path.
fn conn_at(dir: &std::path::Path) -> (Conn, Redial, UnixListener, std::os::unix::net::UnixStream) {
    let path = dir.join("sock");
    let listener = UnixListener::bind(&path).unwrap();
    let stream = Stream::connect(&Address::Unix(path.clone()), None).unwrap();
    let (server, _) = listener.accept().unwrap();
    let info = Info {
        size: 1 << 20,
        flags: NBD_FLAG_HAS_FLAGS | NBD_FLAG_SEND_FLUSH,
        min_block: 1,
        pref_block: 4096,
        max_block: 32 << 20,
        structured: false,
        allocation: None,
    };
    let uri = super::super::uri::parse(&format!("nbd+unix:///?socket={}", path.display())).unwrap();
    let redial = Redial {
        uri,
        info,
        delay: Duration::from_secs(30),
        tls: None,
    };
    let conn = Conn::new(stream, &info, "test".into(), 4, Some(redial.clone())).unwrap();
    (conn, redial, listener, server)
}

/// A large write waits for its turn to send; the writer before it hands it the turn and
/// leaves; the connection is lost before the large write runs (its reader saw the server
/// close). The large write then finds itself lost and never sends: the turn must be free
/// again, since a new connection is made only while no one holds it. Before, the turn
/// stayed taken for good: no attempt at a new connection was ever made, and every request
/// waited forever (no error, no log line), however long `--reconnect-delay`.
#[test]
fn a_turn_to_send_handed_to_a_lost_request_is_freed() {
    let dir = tempfile::tempdir().unwrap();
    let (conn, redial, _listener, _server) = conn_at(dir.path());
    let cx = Ctx::Blocking;
    let cmd = Cmd {
        kind: NBD_CMD_WRITE,
        flags: 0,
        offset: 0,
        len: (STAGE_MAX * 2) as u32,
    };
    let _sender = conn.acquire(&cx, cmd).unwrap();
    let queued = conn.acquire(&cx, cmd).unwrap();
    {
        let mut st = conn.lock();
        st.writer = true; // `_sender` is sending
        st.write_queue.push_back(queued); // too large to stage: waits for its turn
        conn.next_writer(&mut st); // `_sender` is done: the turn goes to `queued`
        assert_eq!(st.slots[queued].phase, Phase::WriteTurn);
        assert!(st.writer);
    }
    conn.lose(&cx, 0, "the server closed the connection", &redial);
    let payload = vec![0u8; STAGE_MAX * 2];
    let sent = conn.send(&cx, queued, cmd, &[IoSlice::new(&payload)]);
    assert!(is_lost(&sent.unwrap_err()), "sent again once reconnected");
    let st = conn.lock();
    assert!(
        !st.writer,
        "the turn to send is free: a new connection can be made"
    );
    assert!(!st.reader && st.dialing.is_none());
}
