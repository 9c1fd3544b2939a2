//! `corofuse bench` run as a user runs it, with tiny sizes, for the tests of the lab's
//! opt-in rows: the command, its storage and scratch directories, and the table it prints.

use std::process::Command;

use tempfile::TempDir;

/// One `corofuse bench --only ROWS --compare-qsd` run with an 8 MiB storage image, 0.2 s
/// per run and two workloads (4 KiB random reads at iodepth 1, writes at 64), asserted to
/// succeed. Its directories live as long as this.
pub struct TinyBench {
    /// `--storage-dir`: on /var/tmp (a real file system, as the storage rows want).
    pub storage: TempDir,
    /// `--scratch-dir`.
    pub scratch: TempDir,
    /// The table.
    pub stdout: String,
    /// The progress lines and notes.
    pub stderr: String,
}

impl TinyBench {
    /// Runs the rows `only` (`--only`'s value).
    #[track_caller]
    pub fn run(only: &str) -> TinyBench {
        let storage = tempfile::Builder::new()
            .prefix("corofuse-bench-test")
            .tempdir_in("/var/tmp")
            .unwrap();
        let scratch = tempfile::tempdir().unwrap();
        let out = Command::new(crate::bin::corofuse())
            .args(["bench", "--only", only, "--compare-qsd"])
            .args(["--storage-mib", "8", "--seconds", "0.2"])
            .args(["--workload", "randread-psync-qd1"])
            .args(["--workload", "randwrite-uring-qd64"])
            .arg("--storage-dir")
            .arg(storage.path())
            .arg("--scratch-dir")
            .arg(scratch.path())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{}\n{stdout}\n{stderr}", out.status);
        TinyBench {
            storage,
            scratch,
            stdout,
            stderr,
        }
    }

    /// The whitespace-separated fields of the first table line that starts with `export`
    /// (then a space) and holds `workload` and `server`.
    #[track_caller]
    pub fn fields(&self, export: &str, workload: &str, server: &str) -> Vec<&str> {
        let table = &self.stdout;
        table
            .lines()
            .find(|l| {
                l.starts_with(&format!("{export} ")) && l.contains(workload) && l.contains(server)
            })
            .unwrap_or_else(|| panic!("no {export} {workload} {server} row in\n{table}"))
            .split_whitespace()
            .collect()
    }
}
