//! Applying records to a file: the whole log ([`replay`], which must rebuild the image
//! byte for byte), or one record or part of it (the crash-state checker's torn writes).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use super::format::{Kind, Level, Record};

/// What [`replay`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Replayed {
    /// Records applied.
    pub applied: u64,
    /// Flushes seen.
    pub flushes: u64,
    /// Failed operations skipped (what they did is unknown).
    pub failed: u64,
}

/// Applies every record of `level` in `records` to `image`, in order.
pub fn replay(records: &[Record], level: Level, image: &File) -> io::Result<Replayed> {
    let mut done = Replayed::default();
    for rec in records.iter().filter(|r| r.head.level == level) {
        match rec.head.kind {
            Kind::Flush => done.flushes += 1,
            _ if rec.head.failed() => done.failed += 1,
            _ => {
                apply(image, rec, 0, rec.head.len)?;
                done.applied += 1;
            }
        }
    }
    Ok(done)
}

/// Applies bytes `[from, to)` of `rec`'s range (offsets relative to its start) to `image`:
/// the data of a write, zeroes for discard and write_zeroes (a discard never grows the
/// file); a resize (whole) sets the size; a flush does nothing.
pub fn apply(image: &File, rec: &Record, from: u64, to: u64) -> io::Result<()> {
    let h = &rec.head;
    let at = h.offset + from;
    match h.kind {
        Kind::Write | Kind::DurableWrite => {
            image.write_all_at(&rec.data[from as usize..to as usize], at)
        }
        Kind::Zeroes => write_zeroes(image, at, to - from),
        Kind::Discard => {
            let size = image.metadata()?.len();
            let end = (h.offset + to).min(size);
            match end > at {
                true => write_zeroes(image, at, end - at),
                false => Ok(()),
            }
        }
        Kind::Resize => image.set_len(h.offset),
        Kind::Flush => Ok(()),
    }
}

fn write_zeroes(image: &File, mut at: u64, mut len: u64) -> io::Result<()> {
    static ZEROES: [u8; 64 << 10] = [0; 64 << 10];
    while len > 0 {
        let n = len.min(ZEROES.len() as u64);
        image.write_all_at(&ZEROES[..n as usize], at)?;
        (at, len) = (at + n, len - n);
    }
    Ok(())
}
