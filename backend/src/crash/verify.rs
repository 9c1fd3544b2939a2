//! One crash state: the image file built from the durable part and the records kept, and
//! the checks it must pass.

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

/// Runs every check on the image at `path`; `Err` says what failed.
pub fn check(path: &Path, qcow2: bool, recheck: bool, expect: &Expect) -> Result<(), String> {
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
fn qemu_img_check(path: &Path, when: &str) -> Result<(), String> {
    let out = Command::new("qemu-img")
        .args(["check", "-f", "qcow2"])
        .arg(path)
        .output()
        .map_err(|e| format!("cannot run qemu-img: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    match out.status.code() {
        Some(0 | 3) if !text.contains("ERROR") => Ok(()),
        code => Err(format!(
            "qemu-img check {when}: exit {code:?}: {}",
            text.trim()
        )),
    }
}

/// Opens the image in corofuse, writable (a dirty image is repaired), and compares the
/// disk with the model.
fn read_back(path: &Path, qcow2: bool, expect: &Expect) -> Result<(), String> {
    let opts = OpenOptions {
        writable: true,
        direct: false,
        lock: false,
        format: if qcow2 { Format::Qcow2 } else { Format::Raw },
        snapshot: None,
    };
    let disk = crate::open(path.to_str().ok_or("the path is not UTF-8")?, &opts)
        .map_err(|e| format!("corofuse cannot open it writable: {e}"))?;
    compare(&*disk, expect)
}

fn compare(disk: &dyn BlockBackend, expect: &Expect) -> Result<(), String> {
    let len = disk.len();
    if len < expect.len && !expect.len_uncertain {
        return Err(format!(
            "the disk is {len} bytes, the flushed writes made it {}",
            expect.len
        ));
    }
    let upto = len.min(expect.bytes.len() as u64);
    let mut got = vec![0u8; upto as usize];
    let n = disk
        .readv(&Ctx::Blocking, &mut [IoSliceMut::new(&mut got)], 0)
        .map_err(|e| format!("reading the disk: {e}"))?;
    if (n as u64) < upto {
        return Err(format!("reading the disk: {n} bytes of {upto}"));
    }
    match first_difference(&expect.bytes, &got, upto, &expect.uncertain) {
        None => Ok(()),
        Some(at) => {
            let covered = match expect.flush {
                Some(f) => format!("what the last completed flush (record #{f}) covers"),
                None => "as before the log: no flush completed".into(),
            };
            Err(format!(
                "byte {at} of the disk reads {:#04x} where it must read {:#04x} ({covered})",
                got[at as usize], expect.bytes[at as usize]
            ))
        }
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
