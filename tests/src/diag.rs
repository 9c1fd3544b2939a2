//! What a hung daemon is doing, from /proc: for failure messages.

use std::fs;

/// Each thread of `pid` with its name and wait channel, e.g.
/// "812 (corofuse) in io_cqring_wait, 815 (iou-wrk-812) in io_wq_worker".
pub fn threads(pid: u32) -> String {
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return "(gone)".into();
    };
    let describe = |task: fs::DirEntry| {
        let read = |what| fs::read_to_string(task.path().join(what)).unwrap_or_default();
        let tid = task.file_name();
        format!(
            "{} ({}) in {}",
            tid.to_string_lossy(),
            read("comm").trim(),
            read("wchan")
        )
    };
    let threads: Vec<String> = dir.flatten().map(describe).collect();
    threads.join(", ")
}

/// The operations armed for readiness in each io_uring of `pid`, from the "PollList"
/// section of its fdinfo (`op=1` READV, `op=6` POLL_ADD, `op=22` READ, ...).
pub fn ring_polls(pid: u32) -> String {
    let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return "(gone)".into();
    };
    let is_ring = |fd: &fs::DirEntry| {
        fs::read_link(fd.path()).is_ok_and(|t| t.to_string_lossy().contains("io_uring"))
    };
    let polls = |fd: fs::DirEntry| {
        let name = fd.file_name().to_string_lossy().into_owned();
        let info = fs::read_to_string(format!("/proc/{pid}/fdinfo/{name}")).unwrap_or_default();
        let list: Vec<&str> = info
            .lines()
            .skip_while(|l| !l.starts_with("PollList"))
            .skip(1)
            .take_while(|l| l.starts_with(' '))
            .map(str::trim)
            .collect();
        format!("fd {name}: [{}]", list.join("; "))
    };
    let rings: Vec<String> = fds.flatten().filter(is_ring).map(polls).collect();
    rings.join(", ")
}
