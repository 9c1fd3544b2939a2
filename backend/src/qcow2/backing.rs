//! The backing file: what unallocated clusters read as, and the source of copy-on-write.
//! Raw or qcow2 (chains of them), opened read-only, with QEMU's reader locks when the image
//! gets locks (QEMU opens a backing file read-only and shares it with other readers).
//!
//! A relative name is relative to the image's directory, as in QEMU. The format comes from
//! the backing format extension, or else from the backing file's magic.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::{BlockBackend, Ctx, Format, OpenOptions};

use super::header::{invalid, unsupported, Header};
use super::hostio::Host;

/// Chains longer than this are refused (a loop, most likely).
const MAX_DEPTH: u32 = 16;

/// Opens the backing file of the image at `image` (whose header is `h`), read-only.
pub(crate) fn open(
    cx: &Ctx<'_>,
    host: &Host,
    h: &Header,
    image: &Path,
    opts: &OpenOptions,
    depth: u32,
) -> io::Result<Arc<dyn BlockBackend>> {
    if depth >= MAX_DEPTH {
        return Err(invalid(format_args!(
            "backing chain longer than {MAX_DEPTH}"
        )));
    }
    let mut name = vec![0u8; h.backing_name_len as usize];
    host.read_exact(cx, &mut name, h.backing_name_at)?;
    let name = String::from_utf8(name).map_err(|_| invalid("backing file name is not UTF-8"))?;
    let path = resolve(image, &name);
    let format = match h.backing_format.as_deref() {
        None => Format::Auto,
        Some("raw") => Format::Raw,
        Some("qcow2") => Format::Qcow2,
        Some(other) => {
            return Err(unsupported(format_args!(
                "a backing file in format {other}"
            )))
        }
    };
    let backing_opts = OpenOptions {
        writable: false,
        format,
        snapshot: None, // the top image's, not the backing file's
        ..opts.clone()
    };
    super::open_image(&path, &backing_opts, depth + 1, None)
}

/// `name` as QEMU finds it: absolute, or relative to the image's directory.
fn resolve(image: &Path, name: &str) -> PathBuf {
    let name = Path::new(name);
    match image.parent() {
        Some(dir) if name.is_relative() => dir.join(name),
        _ => name.to_owned(),
    }
}
