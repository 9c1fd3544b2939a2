//! `--fio`: the same matrix driven by fio instead of the built-in load, for a second
//! opinion from the tool everyone else quotes (CONTEXT.md's figures are fio's).
//!
//! fio runs with `--lat_percentiles=1`, so its percentiles cover submission to completion
//! (`lat_ns`), as the built-in load's do; when a fio build reports only completion
//! latency (`clat_ns`), those are used instead.
//!
//! The nbd row's limit is fio too, whatever the load of the other cells: its nbd engine
//! (libnbd, `--ioengine=nbd --uri=...`) speaks NBD to qemu-nbd with the workload's
//! depth in flight (iodepth 1 for the psync workloads), no FUSE and no page cache of
//! its own ([`Target::Nbd`]). Not every fio build has the engine ([`has_nbd_engine`]).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use super::load::LoadResult;
use super::workload::Workload;
use super::{child, interrupt};

/// An error saying how to install fio, unless it runs.
pub fn version() -> Result<String, String> {
    let out = Command::new("fio")
        .arg("--version")
        .output()
        .map_err(|_| "fio is not installed: apt-get install fio".to_string())?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// What fio drives.
#[derive(Clone, Copy, Debug)]
pub enum Target<'a> {
    /// A file (a mount point, the image, /dev/zero), with the workload's engine.
    File(&'a Path),
    /// An NBD export by URI, with fio's nbd engine.
    Nbd(&'a str),
}

/// Whether this machine's fio has the nbd engine (`fio --enghelp=nbd` lists its `uri`
/// option); false without fio.
pub fn has_nbd_engine() -> bool {
    Command::new("fio")
        .arg("--enghelp=nbd")
        .output()
        .is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).contains("uri"))
}

/// Runs one workload with `jobs` fio jobs (reported as one) against the first `size`
/// bytes of `target` for `seconds`, pinned to `cpu` if given.
#[allow(clippy::too_many_arguments)]
pub fn run(
    target: Target,
    size: u64,
    w: &Workload,
    jobs: u32,
    seconds: f64,
    cpu: Option<usize>,
    out: &Path,
    err: &Path,
) -> Result<LoadResult, String> {
    let mut cmd = Command::new("fio");
    cmd.args(args(target, size, w, jobs, seconds));
    let mut c = child::spawn_load(&mut cmd, cpu, out, err)?
        .map_err(|_| "fio is not installed: apt-get install fio".to_string())?;
    let timeout = Duration::from_secs_f64(seconds + 60.0);
    let status = child::wait(&mut c, timeout, "fio")?;
    // fio exits 0 on Ctrl-C with partial results: do not report them as a run.
    interrupt::check()?;
    let stdout = std::fs::read_to_string(out).unwrap_or_default();
    if !status.success() {
        return Err(format!("fio failed ({status}):{}", child::tail(err, 10)));
    }
    parse(&stdout)
}

/// A character device (the local row's /dev/zero and /dev/null) refuses O_DIRECT and
/// has no page cache: fio runs buffered there, as the built-in load does. An NBD target
/// has no file and no page cache: `--uri` replaces `--filename` and `--direct`.
fn args(target: Target, size: u64, w: &Workload, jobs: u32, seconds: f64) -> Vec<String> {
    use std::os::unix::fs::FileTypeExt;
    let mut a: Vec<String> = vec!["--name=corofuse-bench".into()];
    match target {
        Target::File(file) => {
            let char_device = std::fs::metadata(file).is_ok_and(|m| m.file_type().is_char_device());
            a.extend([
                format!("--filename={}", file.display()),
                format!("--direct={}", u8::from(!char_device)),
                format!("--ioengine={}", w.engine.name()),
            ]);
        }
        Target::Nbd(uri) => a.extend(["--ioengine=nbd".into(), format!("--uri={uri}")]),
    }
    a.extend([
        format!("--rw={}", w.rw.name()),
        format!("--bs={}", w.bs),
        format!("--iodepth={}", w.iodepth),
        "--time_based".into(),
        format!("--runtime={}ms", (seconds * 1000.0).round() as u64),
        format!("--size={size}"),
        "--norandommap".into(),
        "--randrepeat=0".into(),
        "--lat_percentiles=1".into(),
        "--output-format=json".into(),
    ]);
    if jobs > 1 {
        a.push(format!("--numjobs={jobs}"));
        a.push("--group_reporting".into());
    }
    a
}

/// Parses fio's JSON output (possibly preceded by warnings) into the load's result.
pub fn parse(stdout: &str) -> Result<LoadResult, String> {
    let start = stdout.find('{').ok_or("fio printed no JSON")?;
    let doc: Value = serde_json::from_str(&stdout[start..])
        .map_err(|e| format!("cannot parse fio's JSON: {e}"))?;
    let job = doc.pointer("/jobs/0").ok_or("fio's JSON has no jobs[0]")?;
    if let Some(e) = job.get("error").and_then(Value::as_i64).filter(|&e| e != 0) {
        return Err(format!("fio job error {e}"));
    }
    let f = |dir: &str, path: &str| {
        job.get(dir)
            .and_then(|d| d.pointer(path))
            .and_then(Value::as_f64)
            .unwrap_or(0.0)
    };
    let dirs = ["read", "write"];
    let ops: f64 = dirs.iter().map(|d| f(d, "/total_ios")).sum();
    if ops == 0.0 {
        return Err("fio completed no I/O".into());
    }
    // The direction that did the work (the matrix never mixes reads and writes).
    let main = *dirs
        .iter()
        .max_by(|a, b| f(a, "/total_ios").total_cmp(&f(b, "/total_ios")))
        .unwrap_or(&"read");
    let lat = if job.pointer(&format!("/{main}/lat_ns/percentile")).is_some() {
        "lat_ns"
    } else {
        "clat_ns"
    };
    let us = |path: &str| f(main, &format!("/{lat}/{path}")) / 1000.0;
    let seconds = f(main, "/runtime") / 1000.0;
    let cpu = job
        .get("usr_cpu")
        .and_then(Value::as_f64)
        .zip(job.get("sys_cpu").and_then(Value::as_f64));
    Ok(LoadResult {
        ops: ops as u64,
        bytes: dirs.iter().map(|d| f(d, "/io_bytes")).sum::<f64>() as u64,
        seconds,
        iops: dirs.iter().map(|d| f(d, "/iops")).sum(),
        mb_s: dirs.iter().map(|d| f(d, "/bw_bytes")).sum::<f64>() / 1e6,
        mean_us: us("mean"),
        p50_us: us("percentile/50.000000"),
        p99_us: us("percentile/99.000000"),
        max_us: us("max"),
        cpu_pct: cpu.map(|(u, s)| u + s),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::ALL as WORKLOADS;

    /// fio-3.33, `--rw=randwrite --bs=4k --ioengine=io_uring --iodepth=64
    /// --lat_percentiles=1` on a corofuse null:1G export, trimmed.
    const URING_RANDWRITE: &str = r#"fio: this warning line precedes the JSON
{
 "fio version": "fio-3.33",
 "jobs": [
  {
   "jobname": "t", "error": 0,
   "read": {"io_bytes": 0, "bw_bytes": 0, "iops": 0.0, "runtime": 0, "total_ios": 0,
            "clat_ns": {"min": 0, "max": 0, "mean": 0.0, "N": 0},
            "lat_ns": {"min": 0, "max": 0, "mean": 0.0, "N": 0}},
   "write": {
    "io_bytes": 994099200, "bw_bytes": 993106093, "iops": 242457.542458,
    "runtime": 1001, "total_ios": 242700,
    "clat_ns": {"min": 201822, "max": 563186, "mean": 260258.251516, "N": 242700,
     "percentile": {"1.000000": 220160, "50.000000": 259072, "99.000000": 346112,
                    "99.900000": 501760}},
    "lat_ns": {"min": 205318, "max": 565611, "mean": 263187.646077, "N": 242700,
     "percentile": {"1.000000": 222208, "50.000000": 261120, "99.000000": 350208,
                    "99.900000": 505856}}
   },
   "job_runtime": 1000, "usr_cpu": 21.800000, "sys_cpu": 70.900000
  }
 ]
}"#;

    /// fio-3.33, `--rw=randread --bs=4k --ioengine=psync --iodepth=1` (no
    /// `--lat_percentiles`: percentiles only under `clat_ns`), trimmed.
    const PSYNC_RANDREAD: &str = r#"{
  "fio version" : "fio-3.33",
  "jobs" : [
    {
      "jobname" : "t", "error" : 0,
      "read" : {
        "io_bytes" : 496054272, "bw_bytes" : 495558713, "iops" : 120986.013986,
        "runtime" : 1001, "total_ios" : 121107,
        "clat_ns" : {"min" : 4683, "max" : 5193705, "mean" : 7941.881700, "N" : 121107,
          "percentile" : {"1.000000" : 4768, "50.000000" : 5024, "99.000000" : 21376}},
        "lat_ns" : {"min" : 4712, "max" : 5193733, "mean" : 7978.960960, "N" : 121107}
      },
      "write" : {"io_bytes" : 0, "bw_bytes" : 0, "iops" : 0.000000, "runtime" : 0,
                 "total_ios" : 0}
    }
  ]
}"#;

    #[test]
    fn parses_uring_write_with_total_latency_percentiles() {
        let r = parse(URING_RANDWRITE).expect("parses");
        assert_eq!(r.ops, 242_700);
        assert_eq!(r.bytes, 994_099_200);
        assert!((r.iops - 242_457.54).abs() < 0.01);
        assert!((r.mb_s - 993.106093).abs() < 1e-6);
        assert_eq!((r.p50_us, r.p99_us), (261.12, 350.208));
        assert!((r.mean_us - 263.187646).abs() < 1e-6);
        assert_eq!(r.max_us, 565.611);
        assert_eq!(r.seconds, 1.001);
        assert!((r.cpu_pct.expect("cpu") - 92.7).abs() < 1e-9);
    }

    #[test]
    fn parses_psync_read_with_completion_percentiles_only() {
        let r = parse(PSYNC_RANDREAD).expect("parses");
        assert_eq!(r.ops, 121_107);
        assert_eq!((r.p50_us, r.p99_us), (5.024, 21.376));
        assert_eq!(r.max_us, 5193.705);
        assert_eq!(r.cpu_pct, None);
    }

    #[test]
    fn rejects_errors_and_empty_runs() {
        assert!(parse("fio: engine io_uring not loadable").is_err());
        assert!(parse(r#"{"jobs": [{"error": 5, "read": {"total_ios": 1}}]}"#).is_err());
        assert!(parse(r#"{"jobs": [{"error": 0, "read": {"total_ios": 0}}]}"#).is_err());
    }

    #[test]
    fn command_line() {
        let a = args(
            Target::File(Path::new("/m")),
            1 << 30,
            &WORKLOADS[4],
            1,
            2.5,
        );
        for want in [
            "--rw=write",
            "--bs=1048576",
            "--ioengine=io_uring",
            "--iodepth=4",
            "--runtime=2500ms",
            "--size=1073741824",
            "--direct=1",
            "--output-format=json",
        ] {
            assert!(a.iter().any(|x| x == want), "{want} missing from {a:?}");
        }
        assert!(!a.iter().any(|x| x.starts_with("--numjobs")));
        let a = args(
            Target::File(Path::new("/dev/zero")),
            1 << 30,
            &WORKLOADS[2],
            2,
            1.0,
        );
        for want in ["--direct=0", "--numjobs=2", "--group_reporting"] {
            assert!(a.iter().any(|x| x == want), "{want} missing from {a:?}");
        }
        // randread-psync-qd1 on the nbd row's limit: the nbd engine at depth 1.
        let a = args(
            Target::Nbd("nbd+unix:///?socket=/m/nbd.sock"),
            8 << 20,
            &WORKLOADS[0],
            1,
            1.0,
        );
        assert_eq!(
            a[..6],
            [
                "--name=corofuse-bench",
                "--ioengine=nbd",
                "--uri=nbd+unix:///?socket=/m/nbd.sock",
                "--rw=randread",
                "--bs=4096",
                "--iodepth=1"
            ]
        );
        assert!(!a
            .iter()
            .any(|x| x.starts_with("--filename") || x.starts_with("--direct")));
        assert!(a.iter().any(|x| x == "--size=8388608"));
    }
}
