//! The backing file: what unallocated clusters read as, and the source of copy-on-write.
//! Raw or qcow2 (chains of them), opened read-only, with QEMU's reader locks when the image
//! gets locks (QEMU opens a backing file read-only and shares it with other readers).
//!
//! The name comes from the image's header, so it is resolved with care, never as a plain
//! path (`openat2(2)`):
//! - a relative name is resolved beneath the image's directory (as QEMU resolves it
//!   against that directory), and one that would leave it (`..` past it) is refused;
//! - no symbolic link is followed anywhere on the way, so a link planted in a directory
//!   along the path cannot send the daemon to another file. A chain that goes through
//!   links is refused with a message naming the way out (`qemu-img rebase -u`).
//!
//! The format comes from the backing format extension, or else from the backing file's
//! magic; a probed backing format is logged at warn level with the path opened. (Whether
//! the exported image's own header may be trusted to name a backing file at all is
//! decided in `mod.rs`: not when its format was probed.)

use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use crate::{sys, BlockBackend, Ctx, FileBackend, Format, OpenOptions};

use super::header::{invalid, unsupported, Header};
use super::hostio::Host;

/// Chains longer than this are refused (a loop, most likely).
const MAX_DEPTH: u32 = 16;

/// The backing file name in the header `h` of the image in `host`.
pub(crate) fn name(cx: &Ctx<'_>, host: &Host, h: &Header) -> io::Result<String> {
    let mut name = vec![0u8; h.backing_name_len as usize];
    host.read_exact(cx, &mut name, h.backing_name_at)?;
    String::from_utf8(name).map_err(|_| invalid("backing file name is not UTF-8"))
}

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
    let name = name(cx, host, h)?;
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
    let (file, path) = open_file(image, &name)?;
    let qcow2 = match format {
        Format::Raw => false,
        Format::Qcow2 => true,
        Format::Auto => {
            let qcow2 = super::file_starts_with_magic(&file);
            log::warn!(
                "image {}: backing file {} has no format in the image; probed as {}, \
                 opened as {} (name it with `qemu-img rebase -u -b NAME -F FORMAT`)",
                image.display(),
                name,
                if qcow2 { "qcow2" } else { "raw" },
                path.display()
            );
            qcow2
        }
    };
    let backing_opts = OpenOptions {
        writable: false,
        format,
        snapshot: None, // the top image's, not the backing file's
        ..opts.clone()
    };
    let file = FileBackend::from_backing(file, &path, &backing_opts)?;
    match qcow2 {
        true => super::open_qcow2(file, &path, &backing_opts, depth + 1, None),
        false => Ok(Arc::new(file)),
    }
}

/// Opens the backing file `name` of the image at `image`, read-only, without following a
/// symbolic link and, for a relative name, beneath the image's directory; returns it with
/// the path it stands for.
fn open_file(image: &Path, name: &str) -> io::Result<(File, PathBuf)> {
    let fail = |why: String| invalid(format_args!("backing file {name:?}: {why}"));
    if name.is_empty() {
        return Err(fail("the name is empty".into()));
    }
    let named = Path::new(name);
    let resolve = libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;
    let opened = if named.is_absolute() {
        sys::openat2(None, named, libc::O_RDONLY, resolve).map(|fd| (fd, named.to_owned()))
    } else {
        let dir = match image.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        };
        let dirfd = sys::openat2(None, dir, libc::O_PATH | libc::O_DIRECTORY, 0)
            .map_err(|e| fail(format!("the image's directory {}: {e}", dir.display())))?;
        let path = dir.join(named);
        if named.components().any(|c| c == Component::ParentDir) {
            return Err(fail(format!(
                "a relative name must stay in the image's directory {}, and this one \
                 goes up (..); name it by its absolute path (`qemu-img rebase -u -b PATH`)",
                dir.display()
            )));
        }
        let resolve = resolve | libc::RESOLVE_BENEATH;
        sys::openat2(Some(dirfd.as_fd()), named, libc::O_RDONLY, resolve).map(|fd| (fd, path))
    };
    match opened {
        Ok((fd, path)) => Ok((File::from(fd), path)),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => Err(fail(format!(
            "its path goes through a symbolic link, which is never followed for a name \
             read from an image; name the file it points to (`qemu-img rebase -u -b PATH`) \
             ({e})"
        ))),
        Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
            Err(fail(format!("it leaves the image's directory ({e})")))
        }
        Err(e) => Err(io::Error::new(
            e.kind(),
            format!(
                "cannot open backing file {name:?} of {}: {e}",
                image.display()
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(image: &Path, name: &str) -> String {
        open_file(image, name).unwrap_err().to_string()
    }

    #[test]
    fn relative_names_stay_beneath_the_image_directory_and_links_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("top.qcow2");
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/base.raw"), b"base").unwrap();
        std::fs::write(dir.path().join("secret"), b"secret").unwrap();
        let (_, path) = open_file(&image, "sub/base.raw").unwrap();
        assert_eq!(path, dir.path().join("sub/base.raw"));
        assert!(err(&image, "sub/../secret").contains("goes up (..)"));
        std::os::unix::fs::symlink(dir.path().join("secret"), dir.path().join("link")).unwrap();
        assert!(
            err(&image, "link").contains("symbolic link"),
            "{}",
            err(&image, "link")
        );
        let abs = dir.path().join("link");
        assert!(err(&image, abs.to_str().unwrap()).contains("symbolic link"));
        std::os::unix::fs::symlink(dir.path().join("sub"), dir.path().join("dirlink")).unwrap();
        assert!(err(&image, "dirlink/base.raw").contains("symbolic link"));
        assert!(err(&image, "missing").contains("No such file"));
        assert!(err(&image, "").contains("empty"));
    }
}
