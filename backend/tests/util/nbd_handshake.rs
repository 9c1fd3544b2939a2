//! The server side of the NBD handshake, for the scripted servers of the NBD tests
//! (`#[path]`-included by the test files that script one).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;

use backend::nbd::proto::*;

/// Fixed newstyle: greeting, STRUCTURED_REPLY (acked if `structured`), every other option
/// but GO refused, GO answered with `size` and the flags (flush). `None` if the client
/// went away.
pub fn handshake(s: &mut UnixStream, structured: bool, size: u64) -> Option<()> {
    let mut greet = Vec::new();
    greet.extend(NBDMAGIC.to_be_bytes());
    greet.extend(IHAVEOPT.to_be_bytes());
    greet.extend((NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES).to_be_bytes());
    s.write_all(&greet).ok()?;
    s.read_exact(&mut [0u8; 4]).ok()?;
    loop {
        let mut head = [0u8; 16];
        s.read_exact(&mut head).ok()?;
        let option = u32::from_be_bytes(head[8..12].try_into().unwrap());
        let len = u32::from_be_bytes(head[12..16].try_into().unwrap());
        s.read_exact(&mut vec![0u8; len as usize]).ok()?;
        let reply = |kind: u32, data: &[u8]| {
            let mut r = Vec::new();
            r.extend(OPT_REPLY_MAGIC.to_be_bytes());
            r.extend(option.to_be_bytes());
            r.extend(kind.to_be_bytes());
            r.extend((data.len() as u32).to_be_bytes());
            r.extend(data);
            r
        };
        match option {
            NBD_OPT_STRUCTURED_REPLY if structured => s.write_all(&reply(NBD_REP_ACK, &[])).ok()?,
            NBD_OPT_GO => {
                let flags = NBD_FLAG_HAS_FLAGS | NBD_FLAG_SEND_FLUSH;
                let info = [
                    &NBD_INFO_EXPORT.to_be_bytes()[..],
                    &size.to_be_bytes(),
                    &flags.to_be_bytes(),
                ]
                .concat();
                s.write_all(&reply(NBD_REP_INFO, &info)).ok()?;
                s.write_all(&reply(NBD_REP_ACK, &[])).ok()?;
                return Some(());
            }
            _ => s.write_all(&reply(NBD_REP_ERR_UNSUP, &[])).ok()?,
        }
    }
}
