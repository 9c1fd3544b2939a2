//! The null backend: a disk of a given size with no storage behind it, like QEMU's
//! `null-co` driver with `read-zeroes=on`. It measures everything but the storage.
//!
//! - Reads fill the caller's buffers with zeroes (up to the size: short at the end).
//! - Writes, flush, discard and write_zeroes succeed and change nothing; writes never
//!   extend it. On a read-only null disk they fail with `EROFS`, like every backend.
//! - Resize changes the reported size; the disk is virtual.
//! - block_status reports one hole from any offset to the end, as null-co does (it reports
//!   zeroes, not data), and nothing is allocated.

use std::fmt;
use std::io::{self, IoSlice, IoSliceMut};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::{iov, BlockBackend, Ctx, Extent};

/// A virtual disk that reads as zeroes and drops writes.
pub struct NullBackend {
    len: AtomicU64,
    writable: bool,
}

impl NullBackend {
    /// A null disk of `len` bytes.
    pub fn new(len: u64, writable: bool) -> NullBackend {
        NullBackend {
            len: AtomicU64::new(len),
            writable,
        }
    }

    fn check_writable(&self) -> io::Result<()> {
        match self.writable {
            true => Ok(()),
            false => Err(io::Error::from_raw_os_error(libc::EROFS)),
        }
    }
}

impl BlockBackend for NullBackend {
    fn len(&self) -> u64 {
        self.len.load(Ordering::Acquire)
    }

    fn readv(&self, _cx: &Ctx<'_>, bufs: &mut [IoSliceMut<'_>], offset: u64) -> io::Result<usize> {
        let left = self.len().saturating_sub(offset);
        let n = (iov::total(bufs) as u64).min(left) as usize;
        iov::zero(bufs, n);
        Ok(n)
    }

    fn writev(&self, _cx: &Ctx<'_>, _bufs: &[IoSlice<'_>], _offset: u64) -> io::Result<()> {
        self.check_writable()
    }

    fn flush(&self, _cx: &Ctx<'_>) -> io::Result<()> {
        Ok(())
    }

    /// Nothing waits at all.
    fn waits_are_bounded(&self) -> bool {
        true
    }

    fn discard(&self, _cx: &Ctx<'_>, _offset: u64, _len: u64) -> io::Result<()> {
        self.check_writable()
    }

    fn write_zeroes(
        &self,
        _cx: &Ctx<'_>,
        _offset: u64,
        _len: u64,
        _may_unmap: bool,
    ) -> io::Result<()> {
        self.check_writable()
    }

    fn resize(&self, _cx: &Ctx<'_>, new_len: u64) -> io::Result<()> {
        self.check_writable()?;
        self.len.store(new_len, Ordering::Release);
        Ok(())
    }

    fn block_status(&self, _cx: &Ctx<'_>, offset: u64) -> io::Result<Extent> {
        match self.len() {
            len if offset < len => Ok(Extent::hole(len)),
            _ => Err(io::Error::from_raw_os_error(libc::ENXIO)),
        }
    }

    fn allocated_bytes(&self) -> io::Result<u64> {
        Ok(0)
    }

    fn read_only(&self) -> bool {
        !self.writable
    }

    fn describe(&self) -> String {
        let ro = if self.writable { "" } else { ", read-only" };
        format!("null:{} (reads zeroes, drops writes{ro})", self.len())
    }
}

/// Parses a size: bytes ("4096", "1073741824") or a binary suffix K, M, G or T, optionally
/// followed by "iB" or "B" ("512M", "1G", "1GiB", "4KB"); letters in any case. At most
/// `i64::MAX` (the largest file offset).
///
/// ```
/// assert_eq!(backend::parse_size("1G"), Ok(1 << 30));
/// assert_eq!(backend::parse_size("512MiB"), Ok(512 << 20));
/// assert!(backend::parse_size("1X").unwrap_err().to_string().contains("unknown suffix"));
/// ```
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    if text.is_empty() {
        return Err(SizeError::Empty);
    }
    let (digits, suffix) = text.split_at(
        text.find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len()),
    );
    if digits.is_empty() {
        return Err(SizeError::NoNumber(text.to_owned()));
    }
    let shift = suffix_shift(suffix).ok_or_else(|| SizeError::UnknownSuffix {
        text: text.to_owned(),
        suffix: suffix.to_owned(),
    })?;
    let too_large = || SizeError::TooLarge(text.to_owned());
    let number: u64 = digits.parse().map_err(|_| too_large())?;
    number
        .checked_mul(1 << shift)
        .filter(|&n| n <= i64::MAX as u64)
        .ok_or_else(too_large)
}

/// Why a size was refused ([`parse_size`]); the text quotes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SizeError {
    /// Nothing given.
    Empty,
    /// No digits before the suffix.
    NoNumber(String),
    /// A suffix other than K, M, G or T (with iB or B).
    UnknownSuffix {
        /// The size as given.
        text: String,
        /// What follows its digits.
        suffix: String,
    },
    /// More than `i64::MAX` bytes.
    TooLarge(String),
}

impl fmt::Display for SizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SizeError::Empty => f.write_str("empty size (expected e.g. 4096, 512M or 1G)"),
            SizeError::NoNumber(text) => write!(
                f,
                "invalid size {text:?}: expected a number of bytes with an optional K, M, G or T \
                 suffix (e.g. 512M)"
            ),
            SizeError::UnknownSuffix { text, suffix } => write!(
                f,
                "invalid size {text:?}: unknown suffix {suffix:?} (use K, M, G or T, optionally \
                 followed by iB or B)"
            ),
            SizeError::TooLarge(text) => {
                write!(f, "size {text:?} is too large (at most {} bytes)", i64::MAX)
            }
        }
    }
}

impl std::error::Error for SizeError {}

/// The power of two a size suffix stands for.
fn suffix_shift(suffix: &str) -> Option<u32> {
    let upper = suffix.to_ascii_uppercase();
    let (unit, binary) = match upper.strip_suffix("IB") {
        Some(unit) => (unit, true),
        None => (upper.strip_suffix('B').unwrap_or(&upper), false),
    };
    match unit {
        "" if !binary => Some(0),
        "K" => Some(10),
        "M" => Some(20),
        "G" => Some(30),
        "T" => Some(40),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::{parse_size, SizeError};

    #[test]
    fn sizes() {
        let good = [
            ("0", 0),
            ("4096", 4096),
            ("1073741824", 1 << 30),
            ("512B", 512),
            ("4k", 4096),
            ("4KB", 4096),
            ("512M", 512 << 20),
            ("1G", 1 << 30),
            ("1GiB", 1 << 30),
            ("2T", 2 << 40),
        ];
        for (text, size) in good {
            assert_eq!(parse_size(text), Ok(size), "{text}");
        }
    }

    #[test]
    fn size_errors() {
        let bad = [
            ("", "empty size"),
            ("G", "invalid size \"G\": expected a number"),
            ("-1", "invalid size \"-1\": expected a number"),
            ("1.5G", "unknown suffix \".5G\""),
            ("1X", "invalid size \"1X\": unknown suffix \"X\""),
            ("1iB", "unknown suffix \"iB\""),
            ("1 G", "unknown suffix \" G\""),
            ("9999999T", "size \"9999999T\" is too large"),
            ("99999999999999999999", "is too large"),
        ];
        for (text, error) in bad {
            let got = parse_size(text).unwrap_err().to_string();
            assert!(
                got.starts_with(error) || got.contains(error),
                "{text}: {got}"
            );
        }
    }

    #[test]
    fn size_errors_say_which_case() {
        assert_eq!(parse_size(""), Err(SizeError::Empty));
        assert_eq!(parse_size("G"), Err(SizeError::NoNumber("G".into())));
        assert_eq!(
            parse_size("1X"),
            Err(SizeError::UnknownSuffix {
                text: "1X".into(),
                suffix: "X".into()
            })
        );
        assert_eq!(
            parse_size("9999999T"),
            Err(SizeError::TooLarge("9999999T".into()))
        );
    }
}
