//! Compressed clusters: one cluster of guest data, compressed alone, stored at a byte offset
//! (docs/interop/qcow2.txt, "Compressed Clusters Descriptor"). Decompression stops when a
//! whole cluster is out; the input may go on with the sector padding or the next cluster.
//!
//! zlib here is raw deflate (no zlib header, as QEMU writes it: `-12` window bits), via
//! flate2's pure-Rust backend; zstd (compression type 1) via ruzstd, a pure-Rust decoder,
//! so the build compiles no C. Decoders are kept in small pools: they hold tens of KiB of
//! state that would otherwise be allocated for every compressed read.
//!
//! corofuse only reads compressed clusters: a write to one decompresses it into a newly
//! allocated cluster (see `alloc.rs`), as QEMU does.

use std::io::{self, Read};
use std::sync::Mutex;

use flate2::{Decompress, FlushDecompress, Status};
use ruzstd::decoding::{FrameDecoder, StreamingDecoder};

use super::header::{invalid, Compression};

/// Decoders kept idle at most.
const IDLE: usize = 8;

/// Pools of decoders for one image.
#[derive(Default)]
pub(crate) struct Decompressor {
    deflate: Mutex<Vec<Decompress>>,
    zstd: Mutex<Vec<FrameDecoder>>,
}

impl Decompressor {
    /// Decompresses `input` into all of `out` (one cluster).
    pub(crate) fn decompress(
        &self,
        kind: Compression,
        input: &[u8],
        out: &mut [u8],
    ) -> io::Result<()> {
        match kind {
            Compression::Deflate => {
                let mut d = pop(&self.deflate).unwrap_or_else(|| Decompress::new(false));
                d.reset(false);
                let done = inflate(&mut d, input, out);
                push(&self.deflate, d);
                done
            }
            Compression::Zstd => {
                let mut d = pop(&self.zstd).unwrap_or_default();
                let done = unzstd(&mut d, input, out);
                push(&self.zstd, d);
                done
            }
        }
    }
}

fn pop<T>(pool: &Mutex<Vec<T>>) -> Option<T> {
    pool.lock().unwrap_or_else(|e| e.into_inner()).pop()
}

fn push<T>(pool: &Mutex<Vec<T>>, item: T) {
    let mut pool = pool.lock().unwrap_or_else(|e| e.into_inner());
    if pool.len() < IDLE {
        pool.push(item);
    }
}

fn inflate(d: &mut Decompress, input: &[u8], out: &mut [u8]) -> io::Result<()> {
    let status = d
        .decompress(input, out, FlushDecompress::Finish)
        .map_err(|e| invalid(format_args!("compressed cluster: {e}")))?;
    let written = d.total_out() as usize;
    match status {
        _ if written == out.len() => Ok(()),
        Status::StreamEnd | Status::Ok | Status::BufError => Err(invalid(format_args!(
            "compressed cluster inflates to {written} of {} bytes",
            out.len()
        ))),
    }
}

fn unzstd(d: &mut FrameDecoder, mut input: &[u8], out: &mut [u8]) -> io::Result<()> {
    let mut stream = StreamingDecoder::new_with_decoder(&mut input, d)
        .map_err(|e| invalid(format_args!("zstd compressed cluster: {e}")))?;
    stream
        .read_exact(out)
        .map_err(|e| invalid(format_args!("zstd compressed cluster: {e}")))
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use flate2::write::DeflateEncoder;

    use super::*;

    #[test]
    fn inflates_raw_deflate_with_trailing_bytes() {
        let data: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
        let mut e = DeflateEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(&data).unwrap();
        let mut compressed = e.finish().unwrap();
        compressed.extend_from_slice(&[0xAA; 100]); // the next cluster's bytes
        let d = Decompressor::default();
        let mut out = vec![0u8; 4096];
        for _ in 0..2 {
            d.decompress(Compression::Deflate, &compressed, &mut out)
                .unwrap();
            assert_eq!(out, data);
        }
        let err = d.decompress(Compression::Deflate, &compressed[..10], &mut out);
        assert!(err.unwrap_err().to_string().contains("compressed cluster"));
    }
}
