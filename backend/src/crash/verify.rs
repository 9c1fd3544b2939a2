//! One crash state: the image file built from the durable part and the records kept, and
//! the checks it must pass.

use std::fmt;
use std::fs::{self, File};
use std::io::{self, IoSliceMut};
use std::path::Path;
use std::process::Command;

use super::model::{first_difference, Expect};
use super::plan::{is_pinned, modifies, State};
use crate::record::{replay, Record};
use crate::{BlockBackend, Ctx, Format, OpenOptions};

/// Builds the state's image at `path` from `durable` (the image with every record below
/// the window applied): the window's durable writes in log order, then the kept pieces.
pub fn build(records: &[Record], durable: &Path, state: &State, path: &Path) -> io::Result<()> {
    fs::copy(durable, path)?;
    let image = fs::OpenOptions::new().write(true).open(path)?;
    let w = state.window;
    for (i, r) in records.iter().enumerate().take(w.end).skip(w.start) {
        if modifies(r) && is_pinned(records, w, i) {
            replay::apply(&image, r, 0, r.head.len)?;
        }
    }
    for k in &state.kept {
        let r = &records[k.index];
        for p in &k.pieces {
            replay::apply(&image, r, p.start, p.end)?;
        }
    }
    Ok(())
}

/// Why a crash state fails: the check that failed, with what it found.
#[derive(Debug)]
pub enum StateError {
    /// The state's image could not be built.
    Build(io::Error),
    /// `qemu-img` would not run.
    QemuImgRun(io::Error),
    /// `qemu-img check` found corruption.
    QemuImgCheck {
        /// When it ran (after the crash, or after corofuse reopened the image).
        when: &'static str,
        /// Its exit code.
        code: Option<i32>,
        /// What it printed.
        output: String,
    },
    /// The image's path is not UTF-8 (corofuse opens images by name).
    PathNotUtf8,
    /// corofuse could not open the image writable.
    Open(io::Error),
    /// The disk is shorter than the flushed writes made it.
    Short {
        /// The disk's length.
        len: u64,
        /// The length the flushed writes made it.
        flushed: u64,
    },
    /// Reading the disk failed.
    Read(io::Error),
    /// Reading the disk came short.
    ShortRead {
        /// Bytes read.
        got: usize,
        /// Bytes asked for.
        wanted: u64,
    },
    /// A byte of the disk is not what the model says.
    Differs {
        /// Its offset.
        at: u64,
        /// What it reads.
        got: u8,
        /// What it must read.
        want: u8,
        /// The last completed flush (its record's number), if any.
        flush: Option<usize>,
    },
}

impl fmt::Display for StateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StateError::Build(e) => write!(f, "building the state: {e}"),
            StateError::QemuImgRun(e) => write!(f, "cannot run qemu-img: {e}"),
            StateError::QemuImgCheck { when, code, output } => {
                write!(f, "qemu-img check {when}: exit {code:?}: {output}")
            }
            StateError::PathNotUtf8 => f.write_str("the path is not UTF-8"),
            StateError::Open(e) => write!(f, "corofuse cannot open it writable: {e}"),
            StateError::Short { len, flushed } => write!(
                f,
                "the disk is {len} bytes, the flushed writes made it {flushed}"
            ),
            StateError::Read(e) => write!(f, "reading the disk: {e}"),
            StateError::ShortRead { got, wanted } => {
                write!(f, "reading the disk: {got} bytes of {wanted}")
            }
            StateError::Differs {
                at,
                got,
                want,
                flush,
            } => {
                write!(
                    f,
                    "byte {at} of the disk reads {got:#04x} where it must read {want:#04x} ("
                )?;
                match flush {
                    Some(r) => write!(f, "what the last completed flush (record #{r}) covers)"),
                    None => f.write_str("as before the log: no flush completed)"),
                }
            }
        }
    }
}

impl std::error::Error for StateError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StateError::Build(e)
            | StateError::QemuImgRun(e)
            | StateError::Open(e)
            | StateError::Read(e) => Some(e),
            _ => None,
        }
    }
}

/// Runs every check on the image at `path`; `Err` says what failed.
pub fn check(path: &Path, qcow2: bool, recheck: bool, expect: &Expect) -> Result<(), StateError> {
    if qcow2 {
        qemu_img_check(path, "after the crash")?;
    }
    read_back(path, qcow2, expect)?;
    if qcow2 && recheck {
        qemu_img_check(path, "after corofuse opened it writable and closed it")?;
    }
    Ok(())
}

/// `qemu-img check`: no corruption (exit 0, or 3: leaked clusters only).
fn qemu_img_check(path: &Path, when: &'static str) -> Result<(), StateError> {
    let out = Command::new("qemu-img")
        .args(["check", "-f", "qcow2"])
        .arg(path)
        .output()
        .map_err(StateError::QemuImgRun)?;
    let text = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    match out.status.code() {
        Some(0 | 3) if !text.contains("ERROR") => Ok(()),
        code => Err(StateError::QemuImgCheck {
            when,
            code,
            output: text.trim().to_owned(),
        }),
    }
}

/// Opens the image in corofuse, writable (a dirty image is repaired), and compares the
/// disk with the model.
fn read_back(path: &Path, qcow2: bool, expect: &Expect) -> Result<(), StateError> {
    let opts = OpenOptions {
        writable: true,
        direct: false,
        lock: false,
        format: if qcow2 { Format::Qcow2 } else { Format::Raw },
        snapshot: None,
    };
    let disk = crate::open(path.to_str().ok_or(StateError::PathNotUtf8)?, &opts)
        .map_err(StateError::Open)?;
    compare(&*disk, expect)
}

fn compare(disk: &dyn BlockBackend, expect: &Expect) -> Result<(), StateError> {
    let len = disk.len();
    if len < expect.len && !expect.len_uncertain {
        return Err(StateError::Short {
            len,
            flushed: expect.len,
        });
    }
    let upto = len.min(expect.bytes.len() as u64);
    let mut got = vec![0u8; upto as usize];
    let n = disk
        .readv(&Ctx::Blocking, &mut [IoSliceMut::new(&mut got)], 0)
        .map_err(StateError::Read)?;
    if (n as u64) < upto {
        return Err(StateError::ShortRead {
            got: n,
            wanted: upto,
        });
    }
    match first_difference(&expect.bytes, &got, upto, &expect.uncertain) {
        None => Ok(()),
        Some(at) => Err(StateError::Differs {
            at,
            got: got[at as usize],
            want: expect.bytes[at as usize],
            flush: expect.flush,
        }),
    }
}

/// Whether `path` starts with the qcow2 magic.
pub fn is_qcow2(path: &Path) -> io::Result<bool> {
    let mut magic = [0u8; 4];
    let f = File::open(path)?;
    match std::os::unix::fs::FileExt::read_exact_at(&f, &mut magic, 0) {
        Ok(()) => Ok(magic == crate::qcow2::MAGIC),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_state_says_what_it_found_and_keeps_the_io_error() {
        let differs = StateError::Differs {
            at: 4096,
            got: 0,
            want: 0xab,
            flush: Some(7),
        };
        assert_eq!(
            differs.to_string(),
            "byte 4096 of the disk reads 0x00 where it must read 0xab (what the last \
             completed flush (record #7) covers)"
        );
        let before = StateError::Differs {
            at: 0,
            got: 0,
            want: 1,
            flush: None,
        };
        assert!(before
            .to_string()
            .ends_with("(as before the log: no flush completed)"));
        let read = StateError::Read(io::Error::from_raw_os_error(libc::EIO));
        let source = std::error::Error::source(&read).expect("the io::Error");
        assert!(source.is::<io::Error>());
    }
}
