//! `--dir`'s source tree: made directly on a real file system (`--storage-dir`), before
//! any mount, exported whole by every server, removed when the lab ends.
//!
//! What it holds: `readdir-N/` with N empty files for each readdir size (the largest is
//! also what `ls -l` lists), `find/` with the metadata rows' file count spread over up to
//! 100 subdirectories, `big`, the fio rows' file (pre-filled: no holes, so reads come from
//! the disk and writes overwrite), and the `meta-*` directories the create rows make
//! through the mount. Why on disk, not tmpfs: a passthrough's costs are the syscalls into
//! the source, and a file system in RAM would hide the ones a disk file system adds.
//!
//! # Cleanup contract
//! `Drop` removes the tree; [`Tree::create`] also removes trees left by labs that were
//! killed (their PID is gone).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use super::plan::{DirPlan, Job};
use crate::{fill, interrupt, lab, storage};

const PREFIX: &str = "corofuse-bench-tree-";

/// Subdirectories of `find/` at most.
const FIND_DIRS: u64 = 100;

pub struct Tree {
    root: PathBuf,
}

impl Tree {
    /// Makes what the plan's jobs need under `<storage_dir>/corofuse-bench-tree-<pid>/`.
    pub fn create(plan: &DirPlan) -> Result<Tree, String> {
        let parent = &plan.storage_dir;
        if let Some(fs) = storage::memory_fs(parent)? {
            return Err(format!(
                "--storage-dir {} is on {fs}, which is RAM: --dir measures a passthrough \
                 to a disk file system; pass --storage-dir DIR on one (default {})",
                parent.display(),
                storage::DEFAULT_DIR
            ));
        }
        std::fs::create_dir_all(parent)
            .map_err(|e| format!("cannot create --storage-dir {}: {e}", parent.display()))?;
        lab::remove_stale(parent, PREFIX);
        let root = parent.join(format!("{PREFIX}{}", std::process::id()));
        std::fs::create_dir(&root).map_err(|e| format!("{}: {e}", root.display()))?;
        let tree = Tree { root };
        // Every readdir size for the readdir rows; the largest alone for ls -l.
        let sizes: Vec<u64> = if plan.has(|j| matches!(j, Job::Readdir(_))) {
            plan.entries.clone()
        } else if plan.has(|j| matches!(j, Job::LsL)) {
            vec![plan.largest_dir()]
        } else {
            Vec::new()
        };
        for n in sizes {
            eprintln!("making {} ({n} files) ...", tree.readdir_dir(n).display());
            files(&tree.readdir_dir(n), n, 1)?;
        }
        if plan.has(|j| matches!(j, Job::Find)) {
            eprintln!(
                "making {} ({} files) ...",
                tree.find_dir().display(),
                plan.files
            );
            files(&tree.find_dir(), plan.files, FIND_DIRS)?;
        }
        if plan.has(|j| matches!(j, Job::Fio(_))) {
            lab::check_space(
                parent,
                plan.file_size,
                "free some space, pass another --storage-dir or a smaller --file-mib",
            )?;
            eprintln!(
                "writing {} ({} MiB) ...",
                tree.big().display(),
                plan.file_size >> 20
            );
            let f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .custom_flags(libc::O_DIRECT)
                .open(tree.big())
                .map_err(|e| format!("{}: {e}", tree.big().display()))?;
            fill::write_image(&f, &tree.big(), plan.file_size)?;
            f.sync_all()
                .map_err(|e| format!("fsync {}: {e}", tree.big().display()))?;
        }
        Ok(tree)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `readdir-N`, relative to the tree (or a mount of it).
    pub fn readdir_name(n: u64) -> String {
        format!("readdir-{n}")
    }

    pub fn readdir_dir(&self, n: u64) -> PathBuf {
        self.root.join(Tree::readdir_name(n))
    }

    pub const FIND: &'static str = "find";

    pub fn find_dir(&self) -> PathBuf {
        self.root.join(Tree::FIND)
    }

    pub const BIG: &'static str = "big";

    pub fn big(&self) -> PathBuf {
        self.root.join(Tree::BIG)
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.root) {
            eprintln!(
                "corofuse bench: cannot remove {}: {e}; remove it by hand",
                self.root.display()
            );
        }
    }
}

/// `n` empty files in `dir`, directly (or spread over up to `dirs` subdirectories).
fn files(dir: &Path, n: u64, dirs: u64) -> Result<(), String> {
    let dirs = dirs.min(n).max(1);
    std::fs::create_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let subdirs: Vec<PathBuf> = if dirs == 1 {
        vec![dir.to_path_buf()]
    } else {
        (0..dirs).map(|d| dir.join(format!("d{d:03}"))).collect()
    };
    for d in subdirs.iter().filter(|d| d.as_path() != dir) {
        std::fs::create_dir(d).map_err(|e| format!("{}: {e}", d.display()))?;
    }
    for i in 0..n {
        if i % 4096 == 0 {
            interrupt::check()?;
        }
        let path = subdirs[(i % dirs) as usize].join(format!("e{i:07}"));
        File::create(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}
