//! Who serves `--dir`'s source tree: `corofuse mount-dir` in each configuration, and
//! libfuse's passthrough_hp when its binary is given, with the like-for-like flags.
//!
//! Why these flags: passthrough_hp run with `--nopassthrough` sends every READ and WRITE
//! through its daemon (without it the kernel's FUSE passthrough does the I/O itself and
//! no daemon is measured), and then, by its own defaults, answers with 86400 s entry and
//! attribute timeouts, keeps the page cache across opens and turns on the writeback
//! cache. corofuse gets the same: `--timeout 86400 --cache always --writeback`. What
//! still differs is printed in the report's header ([`DIFFERENCES`]). The project never
//! builds or ships a peer: the binary is the user's (`--passthrough-hp PATH`).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::daemon::Paths;
use crate::variant::Variant;

/// corofuse's like-for-like options, as (option, value) pairs; a `--mount-opt` naming
/// the option replaces it.
pub const COROFUSE_LIKE_FOR_LIKE: [(&str, Option<&str>); 3] = [
    ("--timeout", Some("86400")),
    ("--cache", Some("always")),
    ("--writeback", None),
];

/// passthrough_hp's like-for-like options; it also runs with its defaults (kernel FUSE
/// passthrough), as users run it. `--hp-opt` replaces both.
pub const HP_LIKE_FOR_LIKE: [&str; 1] = ["--nopassthrough"];

/// What the like-for-like flags leave different, for the report's header.
pub const DIFFERENCES: &str = "passthrough_hp splices data between /dev/fuse and the \
    source by default (--hp-opt \"--nopassthrough --nosplice\" copies, as corofuse does), \
    runs libfuse's thread pool (corofuse: its loops, one per CPU up to the default) and \
    marks O_DIRECT opens FOPEN_DIRECT_IO with parallel direct writes";

/// One server of the table.
#[derive(Clone, Debug)]
pub enum Server {
    /// `corofuse mount-dir` with these options (before the pidfile, stats and paths).
    Corofuse { variant: Variant, args: Vec<String> },
    /// passthrough_hp with these options (before `--foreground SOURCE MOUNTPOINT`).
    Hp { path: PathBuf, args: Vec<String> },
    /// No FUSE: fio straight on the source file, the ceiling of the fio rows (it runs
    /// only those).
    Source,
}

impl Server {
    /// The column's name: `corofuse`, `corofuse q2`, `passthrough_hp` (with its options
    /// when they are not the like-for-like ones; "(its defaults)" with none: the kernel's
    /// FUSE passthrough does the data I/O).
    pub fn name(&self) -> String {
        match self {
            Server::Corofuse { variant, .. } => variant.label(),
            Server::Hp { args, .. } if args.iter().eq(HP_LIKE_FOR_LIKE.iter()) => {
                "passthrough_hp".into()
            }
            Server::Hp { args, .. } if args.is_empty() => "passthrough_hp (its defaults)".into(),
            Server::Hp { args, .. } => format!("passthrough_hp {}", args.join(" ")),
            Server::Source => "source (no FUSE)".into(),
        }
    }

    pub fn is_corofuse(&self) -> bool {
        matches!(self, Server::Corofuse { .. })
    }

    /// The command as the header shows it (without the paths).
    pub fn command_line(&self) -> String {
        match self {
            Server::Corofuse { args, .. } => {
                format!("corofuse mount-dir {}", args.join(" "))
            }
            Server::Hp { path, args } => {
                let mut s = path.display().to_string();
                for a in args {
                    s.push(' ');
                    s.push_str(a);
                }
                s
            }
            Server::Source => "fio on the source file itself".into(),
        }
    }

    /// The command that exports `source` on `paths.mountpoint`.
    pub fn command(&self, source: &Path, paths: &Paths) -> Result<Command, String> {
        match self {
            Server::Corofuse { args, .. } => {
                let exe = std::env::current_exe()
                    .map_err(|e| format!("cannot find my own binary: {e}"))?;
                let mut cmd = Command::new(exe);
                cmd.arg("mount-dir")
                    .args(args)
                    .arg("--pidfile")
                    .arg(paths.pidfile);
                if let Some(stats) = paths.stats {
                    cmd.arg("--stats").arg(stats);
                }
                cmd.arg(source).arg(paths.mountpoint);
                Ok(cmd)
            }
            Server::Hp { path, args } => {
                let mut cmd = Command::new(path);
                cmd.args(args)
                    .arg("--foreground")
                    .arg(source)
                    .arg(paths.mountpoint);
                Ok(cmd)
            }
            Server::Source => Err("the source row has no daemon".into()),
        }
    }
}

/// corofuse's options for `variant`: the like-for-like ones not named in `mount_opts`,
/// the variant's, then `mount_opts`.
pub fn corofuse_args(variant: Variant, mount_opts: &[String]) -> Vec<String> {
    let mut args = Vec::new();
    for (opt, value) in COROFUSE_LIKE_FOR_LIKE {
        if mount_opts.iter().any(|o| o == opt) {
            continue;
        }
        args.push(opt.to_string());
        args.extend(value.map(String::from));
    }
    args.extend(variant.mount_args());
    args.extend(mount_opts.iter().cloned());
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn like_for_like_flags_and_their_overrides() {
        let base = corofuse_args(Variant::default(), &[]);
        assert_eq!(
            base,
            ["--timeout", "86400", "--cache", "always", "--writeback"]
        );
        let opts: Vec<String> = ["--timeout", "1", "--queues", "1"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let v = Variant::all(&[], &[crate::variant::Transport::Uring])[0];
        assert_eq!(
            corofuse_args(v, &opts),
            [
                "--cache",
                "always",
                "--writeback",
                "--transport",
                "uring",
                "--timeout",
                "1",
                "--queues",
                "1"
            ]
        );
        let s = Server::Corofuse {
            variant: Variant::default(),
            args: base,
        };
        assert_eq!(
            s.command_line(),
            "corofuse mount-dir --timeout 86400 --cache always --writeback"
        );
        let paths = Paths {
            mountpoint: Path::new("/m"),
            pidfile: Path::new("/p"),
            log: Path::new("/l"),
            stats: Some(Path::new("/s")),
        };
        let cmd = s.command(Path::new("/src"), &paths).expect("command");
        let argv = crate::child::args_of(&cmd);
        assert_eq!(
            argv[argv.len() - 6..],
            ["--pidfile", "/p", "--stats", "/s", "/src", "/m"]
        );
        let hp = Server::Hp {
            path: "/hp".into(),
            args: vec!["--nopassthrough".into()],
        };
        let argv = crate::child::args_of(&hp.command(Path::new("/src"), &paths).expect("command"));
        assert_eq!(argv, ["--nopassthrough", "--foreground", "/src", "/m"]);
        assert!(!hp.is_corofuse() && s.is_corofuse());
    }
}
