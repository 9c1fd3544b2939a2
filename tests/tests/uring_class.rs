//! `--uring-class`: the loops of FUSE over io_uring serve from the idle scheduling class
//! (so that a client at iodepth 1 stays on its CPU), and a guard takes a loop that other
//! work starves back to the normal class, and lets a loop that a deep client crowds float
//! while another CPU has room; `--uring-class normal` keeps them in the normal class. The
//! gains are measured in BENCHMARKS.md; these check the classes and the guard.

use std::fs;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use corofuse_tests::uring::EnableUring;
use corofuse_tests::{
    open_direct, pattern, require_fuse, AlignedBuf, Dispatch, MountedExport, Sandbox, MIB,
};
use runtime::affinity::{allowed_cpus, pin, CpuSet};

/// The daemon's loop threads (`fuse-loop-N`) and whether each is in the idle class.
fn loop_classes(pid: u32) -> Vec<(i32, bool)> {
    let mut loops = Vec::new();
    for entry in fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let path = entry.unwrap().path();
        let comm = fs::read_to_string(path.join("comm")).unwrap_or_default();
        if !comm.starts_with("fuse-loop-") {
            continue;
        }
        let tid: i32 = path.file_name().unwrap().to_str().unwrap().parse().unwrap();
        // SAFETY: no pointer is passed.
        let policy = unsafe { libc::sched_getscheduler(tid) };
        assert!(policy >= 0, "sched_getscheduler({tid}) failed");
        loops.push((tid, policy == libc::SCHED_IDLE));
    }
    loops
}

fn uring_export(sandbox: &Sandbox, args: &[&str]) -> MountedExport {
    let image = sandbox.file("disk.img", &pattern(3, 0, MIB as usize));
    let mut all = vec!["--transport", "uring", "--queues", "2", "-v"];
    all.extend_from_slice(args);
    MountedExport::start(
        &image,
        &sandbox.mountpoint("mnt"),
        Dispatch::Coroutine,
        &all,
    )
}

fn read_some(export: &MountedExport, n: u64) {
    let file = open_direct(export.path(), false).unwrap();
    let mut buf = AlignedBuf::zeroed(4096);
    for i in 0..n {
        let offset = (i * 4096) % MIB;
        file.read_exact_at(&mut buf, offset).unwrap();
        assert_eq!(&buf[..], &pattern(3, offset, 4096)[..], "block at {offset}");
    }
}

fn enable_uring() -> Option<EnableUring> {
    // SAFETY: geteuid(2) cannot fail and touches no memory.
    if unsafe { libc::geteuid() } != 0 {
        corofuse_tests::require::report_skip(
            "needs root: the idle class is left with CAP_SYS_NICE, and enable_uring is set",
        );
        return None;
    }
    match EnableUring::acquire() {
        Ok(on) => Some(on),
        Err(why) => {
            corofuse_tests::require::report_skip(&why);
            None
        }
    }
}

/// One test, not three: the hog of the second part would starve the loops of the first,
/// and the third needs an idle CPU.
#[test]
fn ring_loops_are_idle_normal_on_request_normal_when_starved_and_float_when_crowded() {
    require_fuse!();
    let Some(_on) = enable_uring() else { return };
    classes_as_asked();
    a_starved_loop_goes_back_to_the_normal_class();
    a_crowded_loop_floats_while_another_cpu_has_room();
}

fn classes_as_asked() {
    for (args, idle) in [(&[][..], true), (&["--uring-class", "normal"][..], false)] {
        let sandbox = Sandbox::new();
        let export = uring_export(&sandbox, args);
        read_some(&export, 200);
        let classes = loop_classes(export.pid());
        assert_eq!(classes.len(), 2, "two loops: {classes:?}");
        // A busy machine may starve or crowd an idle loop: the guard then says so.
        let stderr = export.stderr();
        let starved = stderr.contains("starved in the idle class")
            || stderr.contains("crowded in the idle class");
        assert!(
            classes
                .iter()
                .all(|&(_, is_idle)| is_idle == idle || starved),
            "{args:?}: every loop idle = {idle}: {classes:?}"
        );
        export.stop();
    }
}

/// A CPU hog on every CPU: the idle loops would get almost no CPU (59 reads a second,
/// measured); the guard puts the starved loop back in the normal class, and the reads go
/// on.
fn a_starved_loop_goes_back_to_the_normal_class() {
    let sandbox = Sandbox::new();
    let export = uring_export(&sandbox, &[]);
    read_some(&export, 50);
    // Two spinning threads a CPU: the scheduler spreads them over every CPU.
    let hogs = 2 * std::thread::available_parallelism().map_or(2, |n| n.get());
    let stop = AtomicBool::new(false);
    let some_normal = std::thread::scope(|scope| {
        for _ in 0..hogs {
            let stop = &stop;
            scope.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            });
        }
        // Reads until the guard has acted (it looks every 50 ms), 30 s at most.
        let started = Instant::now();
        let mut normal = false;
        while !normal && started.elapsed() < Duration::from_secs(30) {
            read_some(&export, 20);
            normal = loop_classes(export.pid()).iter().any(|&(_, idle)| !idle);
        }
        stop.store(true, Ordering::Relaxed);
        normal
    });
    assert!(
        some_normal,
        "no loop back in the normal class beside the hogs: {}",
        export.stderr()
    );
    // The hogs gone, the hold (1 s the first time) ends and the loops go idle again.
    let started = Instant::now();
    let mut classes = loop_classes(export.pid());
    while !classes.iter().all(|&(_, idle)| idle) && started.elapsed() < Duration::from_secs(30) {
        read_some(&export, 20);
        std::thread::sleep(Duration::from_millis(50));
        classes = loop_classes(export.pid());
    }
    assert!(
        classes.iter().all(|&(_, idle)| idle),
        "loops not idle again after the hogs: {classes:?}"
    );
    read_some(&export, 50);
    export.stop();
}

/// The CPUs each loop thread may run on.
fn loop_cpus(pid: u32) -> Vec<usize> {
    loop_classes(pid)
        .iter()
        .filter_map(|&(tid, _)| CpuSet::of_thread(tid).ok())
        .map(|set| set.count())
        .collect()
}

/// Sixteen readers pinned to the first CPU: its loop serves only while all of them wait,
/// and the second CPU idles. The guard lets that loop float on both CPUs (the normal class,
/// for a second at a time); the reads stay correct throughout, and once they stop every
/// loop is pinned to its one CPU again.
fn a_crowded_loop_floats_while_another_cpu_has_room() {
    let cpus = allowed_cpus().unwrap();
    if cpus.len() < 2 {
        corofuse_tests::require::report_skip("a crowded loop floats only with a second CPU");
        return;
    }
    let sandbox = Sandbox::new();
    let export = uring_export(&sandbox, &[]);
    read_some(&export, 50);
    assert_eq!(
        loop_cpus(export.pid()),
        [1, 1],
        "each loop pinned to one CPU"
    );
    let (first, stop) = (cpus[0], AtomicBool::new(false));
    let floated = std::thread::scope(|scope| {
        for _ in 0..16 {
            let (stop, export) = (&stop, &export);
            scope.spawn(move || {
                pin(0, first).unwrap();
                while !stop.load(Ordering::Relaxed) {
                    read_some(export, 20);
                }
            });
        }
        // The guard looks every 50 ms; 30 s at most.
        let started = Instant::now();
        let mut floated = false;
        while !floated && started.elapsed() < Duration::from_secs(30) {
            std::thread::sleep(Duration::from_millis(10));
            floated = loop_cpus(export.pid()).iter().any(|&n| n > 1);
        }
        stop.store(true, Ordering::Relaxed);
        floated
    });
    assert!(
        floated,
        "no loop floated beside the readers: {}",
        export.stderr()
    );
    assert!(
        export.stderr().contains("crowded in the idle class"),
        "the guard says why: {}",
        export.stderr()
    );
    // The readers gone, the hold (1 s) ends and the loop is pinned again.
    let started = Instant::now();
    while loop_cpus(export.pid()) != [1, 1] && started.elapsed() < Duration::from_secs(30) {
        read_some(&export, 20);
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        loop_cpus(export.pid()),
        [1, 1],
        "pinned again after the readers"
    );
    read_some(&export, 50);
    export.stop();
}
