//! The one helper every raw libc call goes through (like mio's `syscall!`).
//!
//! Call sites keep their own `unsafe { libc::... }` block, each with its own
//! `// SAFETY:` comment, and wrap the result: `cvt(unsafe { libc::read(..) })`.
//! This module itself has no unsafe code.

use std::io;

/// Return types of syscalls that signal failure with -1.
pub(crate) trait MinusOne: Copy + PartialEq {
    /// The failure value.
    const MINUS_ONE: Self;
}

impl MinusOne for i32 {
    const MINUS_ONE: i32 = -1;
}

impl MinusOne for isize {
    const MINUS_ONE: isize = -1;
}

/// Turns a syscall's -1 into `io::Error::last_os_error()`.
pub(crate) fn cvt<T: MinusOne>(res: T) -> io::Result<T> {
    if res == T::MINUS_ONE {
        Err(io::Error::last_os_error())
    } else {
        Ok(res)
    }
}

/// An error of the same kind with a message saying what to do next, keeping
/// the OS error text (the raw code itself is lost in `io::Error::new`).
pub(crate) fn explain(err: io::Error, what: impl std::fmt::Display) -> io::Error {
    io::Error::new(err.kind(), format!("{what} ({err})"))
}
