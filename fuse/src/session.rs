//! The INIT handshake, done once per mount on the session fd before queues start.

use std::io;

use crate::abi::FUSE_DIRECT_IO_ALLOW_MMAP;
use crate::dev::{FuseDev, Received};
use crate::init::{negotiate, InitConfig, InitReply, Negotiated};
use crate::{reply, Operation, Request};

/// Reads requests from `dev` (blocking) until INIT, answers it, and returns what was
/// negotiated. Anything before INIT is a protocol error.
pub fn handshake(dev: &FuseDev, config: &InitConfig) -> io::Result<Negotiated> {
    let mut buf = vec![0u64; crate::init::min_read_buffer(config.max_write).div_ceil(8)];
    loop {
        let n = match dev.read(zerocopy::IntoBytes::as_mut_bytes(&mut buf[..]))? {
            Received::Request(n) => n,
            Received::Retry => continue,
            Received::Unmounted => {
                return Err(io::Error::other("unmounted before the INIT handshake"))
            }
        };
        let bytes = zerocopy::IntoBytes::as_bytes(&buf[..]);
        let req = Request::decode(&bytes[..n], &[])
            .map_err(|e| io::Error::other(format!("first request undecodable: {e}")))?;
        let Operation::Init { arg } = req.op else {
            return Err(io::Error::other(format!("expected INIT, got {req}")));
        };
        let answer = negotiate(&arg, config);
        let _delivered_or_gone = reply::send(dev, &answer.reply(req.unique))?;
        match answer {
            InitReply::Accepted { negotiated, .. } => {
                log::info!("FUSE session: {negotiated}");
                let wanted = config.flags & FUSE_DIRECT_IO_ALLOW_MMAP != 0;
                if wanted && !negotiated.has(FUSE_DIRECT_IO_ALLOW_MMAP) {
                    log::warn!(
                        "this kernel (FUSE 7.{}) does not offer DIRECT_IO_ALLOW_MMAP: \
                         shared mappings of FOPEN_DIRECT_IO files fail with ENODEV",
                        negotiated.kernel_minor
                    );
                }
                return Ok(negotiated);
            }
            InitReply::Retry { .. } => continue,
            InitReply::Refused(errno) => {
                return Err(io::Error::other(format!(
                    "kernel FUSE protocol {}.{} is too old: {errno}",
                    arg.major, arg.minor
                )))
            }
        }
    }
}
