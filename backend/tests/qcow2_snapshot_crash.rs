//! Crash states of making and deleting an internal snapshot (`snapshot_create`,
//! `snapshot_delete`) while the image is written, replayed from a write log by the
//! crash-state checker (`backend::crash`): every state a power loss may leave opens, keeps
//! every flushed write, and passes `qemu-img check`.
//!
//! Regression: a first version followed QEMU's in-place order (clear COPIED in the active
//! tables, sync, add the references, sync, switch the snapshot table). The checker failed
//! it at the state between the two syncs: "qemu-img check after the crash: exit Some(2):
//! ERROR OFLAG_COPIED L2 cluster: l1_index=0 l1_entry=40000 refcount=1". Now the new state
//! is built past the end of the file and one header write switches to it
//! (`backend/src/qcow2/snapshot_edit.rs`).

use std::io::IoSlice;
use std::path::Path;
use std::sync::Arc;

use backend::crash;
use backend::record::{self, WriteLog};
use backend::{BlockBackend, Ctx, Format, OpenOptions};
use corofuse_tests::qcow2::{create, qemu_io};
use corofuse_tests::{pattern, require_tool, Rng, Seed};

const RW: OpenOptions = OpenOptions {
    writable: true,
    direct: false,
    lock: false,
    format: Format::Qcow2,
    snapshot: None,
};

fn scratch() -> tempfile::TempDir {
    match Path::new("/dev/shm").is_dir() {
        true => tempfile::tempdir_in("/dev/shm").unwrap(),
        false => tempfile::tempdir().unwrap(),
    }
}

fn writes(cx: &Ctx<'_>, disk: &dyn BlockBackend, rng: &mut Rng, n: u32) {
    for _ in 0..n {
        let at = rng.below(disk.len() - (64 << 10));
        let data = pattern(rng.next_u64(), at, 1 + rng.below(64 << 10) as usize);
        disk.writev(cx, &[IoSlice::new(&data)], at).unwrap();
    }
    disk.flush(cx).unwrap();
}

#[test]
fn crash_states_of_snapshot_create_and_delete() {
    require_tool!("qemu-img");
    require_tool!("qemu-io");
    let dir = scratch();
    for (name, opts) in [
        ("v3", "compat=1.1"),
        ("v2-512", "compat=0.10,cluster_size=512"),
    ] {
        let image = dir.path().join(format!("{name}.qcow2"));
        create(&image, opts, Some("2M"));
        qemu_io(&image, &["write -P 0x5a 0 1M"]);
        let base = dir.path().join(format!("base-{name}.qcow2"));
        std::fs::copy(&image, &base).unwrap();
        let log_path = image.with_extension("log");
        let log = Arc::new(WriteLog::create(&log_path, record::DEFAULT_CAP).unwrap());
        let disk = backend::open_recorded(image.to_str().unwrap(), &RW, &log).unwrap();
        let cx = Ctx::Blocking;
        let seed = Seed::choose().value();
        let mut rng = Rng::new(seed);
        writes(&cx, &*disk, &mut rng, 4);
        disk.snapshot_create(&cx, "a").unwrap();
        writes(&cx, &*disk, &mut rng, 4);
        disk.snapshot_create(&cx, "b").unwrap();
        writes(&cx, &*disk, &mut rng, 4);
        disk.snapshot_delete(&cx, None, Some("a")).unwrap();
        writes(&cx, &*disk, &mut rng, 4);
        drop(disk);
        let opts = crash::Options {
            states: 6,
            seed,
            sector: 512,
            recheck_every: 3,
        };
        match crash::check(&base, &log_path, &opts) {
            Ok(report) => eprintln!("{name}: {report}"),
            Err(e) => panic!("{name}: {e}"),
        }
    }
}
