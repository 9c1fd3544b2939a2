//! Finds the `corofuse` binary under test, building it once per test process.
//!
//! A test of another package cannot use `env!("CARGO_BIN_EXE_corofuse")`, so: the binary
//! lives next to this test's own `deps/` directory (`target/<profile>/corofuse`). Before the
//! first use in a test process, if the binary is missing or older than any `.rs`, `.toml`
//! or `Cargo.lock` of the workspace (the mtimes cargo itself goes by), `cargo build -p
//! corofuse` runs for that profile and target directory. `cargo test --workspace` has built
//! it already, so usually nothing runs. `COROFUSE_BIN=/path` skips all this.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::SystemTime;

/// The `corofuse` binary: `$COROFUSE_BIN`, or `target/<profile>/corofuse`, built (once per
/// process) if missing or out of date. Panics with cargo's output if the build fails.
pub fn corofuse() -> &'static Path {
    // A failed build is kept too: every test then reports it without building again.
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let bin = BIN.get_or_init(|| match std::env::var_os("COROFUSE_BIN") {
        Some(bin) => Ok(PathBuf::from(bin)),
        None => build(),
    });
    match bin {
        Ok(bin) => bin,
        Err(e) => panic!("{e}"),
    }
}

/// `target/<profile>`: the parent of the `deps/` directory holding this test binary.
pub(crate) fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("test binary in a directory");
    let dir = if deps.file_name().is_some_and(|n| n == "deps") {
        deps.parent().expect("deps/ has a parent")
    } else {
        deps
    };
    dir.to_path_buf()
}

fn build() -> Result<PathBuf, String> {
    let profile_dir = profile_dir();
    let bin = profile_dir.join("corofuse");
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => "dev".to_string(),
        Some(name) => name.to_string(),
    };
    let target_dir = profile_dir.parent().expect("target/<profile> has a parent");
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    if is_fresh(&bin, workspace) {
        return Ok(bin);
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(&cargo)
        .args(["build", "--quiet", "-p", "corofuse", "--bin", "corofuse"])
        .arg("--profile")
        .arg(&profile)
        .arg("--target-dir")
        .arg(target_dir)
        .current_dir(workspace)
        .output();
    match output {
        Ok(out) if out.status.success() => {}
        Ok(out) => {
            return Err(format!(
                "`cargo build -p corofuse --profile {profile}` failed ({}):\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ))
        }
        // No cargo here (the test binary was run by hand): use what is there.
        Err(e) if bin.is_file() => {
            crate::require::note(&format!("not rebuilding corofuse ({cargo:?}: {e})"));
        }
        Err(e) => {
            return Err(format!(
                "cannot run {cargo:?} to build corofuse: {e}; set COROFUSE_BIN"
            ))
        }
    }
    if !bin.is_file() {
        let missing = bin.display();
        return Err(format!(
            "{missing} missing after the build; set COROFUSE_BIN"
        ));
    }
    Ok(bin)
}

/// Whether `bin` exists and is newer than every source of the workspace (this crate's own
/// tests aside).
fn is_fresh(bin: &Path, workspace: &Path) -> bool {
    let Ok(built) = fs::metadata(bin).and_then(|m| m.modified()) else {
        return false;
    };
    newest_source(workspace).is_some_and(|newest| newest < built)
}

/// The latest mtime of a `.rs`, `.toml` or `.lock` file under `dir`, skipping `target`,
/// hidden directories and the `tests` crate; `None` if a directory cannot be read.
fn newest_source(dir: &Path) -> Option<SystemTime> {
    let mut newest = SystemTime::UNIX_EPOCH;
    for entry in fs::read_dir(dir).ok()? {
        let entry = entry.ok()?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let kind = entry.file_type().ok()?;
        let time = if kind.is_dir() {
            let skip = name.starts_with('.') || name == "target" || entry.path() == tests_crate();
            if skip {
                continue;
            }
            newest_source(&entry.path())?
        } else if [".rs", ".toml", ".lock"]
            .iter()
            .any(|ext| name.ends_with(ext))
        {
            entry.metadata().ok()?.modified().ok()?
        } else {
            continue;
        };
        newest = newest.max(time);
    }
    Some(newest)
}

fn tests_crate() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}
