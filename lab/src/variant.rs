//! The corofuse configurations a lab run compares: `--queues` and `--transport` lists,
//! multiplied out, each run through every cell beside the others (and qsd).
//!
//! Why a dimension of its own rather than `--mount-opt`: the scale-out questions (do two
//! loops beat one, does FUSE over io_uring beat /dev/fuse, at what CPU cost) are ratios
//! between configurations, and a ratio is only worth quoting when both sides ran
//! interleaved in the same run on the same machine. `--mount-opt` still adds options to
//! every variant alike.
//!
//! A variant that uses FUSE over io_uring needs the fuse module's `enable_uring` switch;
//! [`UringSwitch`] turns it on for the lab's run and puts it back afterwards.

use serde::Serialize;

/// How requests reach the daemon's loops (`corofuse mount --transport`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// Reads of /dev/fuse (the daemon's default).
    Dev,
    /// FUSE over io_uring, one queue of ring entries per CPU.
    Uring,
}

impl Transport {
    pub fn name(self) -> &'static str {
        match self {
            Transport::Dev => "dev",
            Transport::Uring => "uring",
        }
    }
}

/// One corofuse configuration; `None` leaves the daemon's default.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize)]
pub struct Variant {
    pub queues: Option<u16>,
    pub transport: Option<Transport>,
}

impl Variant {
    /// Every combination of the lists, queues outer; one default variant when both are
    /// empty, and an empty list leaves that option at the daemon's default.
    pub fn all(queues: &[u16], transports: &[Transport]) -> Vec<Variant> {
        let queues: Vec<Option<u16>> = if queues.is_empty() {
            vec![None]
        } else {
            queues.iter().copied().map(Some).collect()
        };
        let transports: Vec<Option<Transport>> = if transports.is_empty() {
            vec![None]
        } else {
            transports.iter().copied().map(Some).collect()
        };
        let mut out = Vec::new();
        for &q in &queues {
            for &t in &transports {
                let v = Variant {
                    queues: q,
                    transport: t,
                };
                if !out.contains(&v) {
                    out.push(v);
                }
            }
        }
        out
    }

    /// The options `corofuse mount` gets for this variant.
    pub fn mount_args(self) -> Vec<String> {
        let mut args = Vec::new();
        if let Some(q) = self.queues {
            args.extend(["--queues".to_string(), q.to_string()]);
        }
        if let Some(t) = self.transport {
            args.extend(["--transport".to_string(), t.name().to_string()]);
        }
        args
    }

    /// Short name for the table: `corofuse`, `corofuse q2`, `corofuse q1 uring`.
    pub fn label(self) -> String {
        let mut s = String::from("corofuse");
        if let Some(q) = self.queues {
            s += &format!(" q{q}");
        }
        if let Some(t) = self.transport {
            s += &format!(" {}", t.name());
        }
        s
    }

    pub fn uses_uring(self) -> bool {
        self.transport == Some(Transport::Uring)
    }
}

use fuse::mount::ENABLE_URING;

/// While alive, `enable_uring` is Y; dropping it writes back what it found.
pub struct UringSwitch {
    _on: crate::setting::Setting,
}

impl UringSwitch {
    /// Turns the switch on (saying so on stderr) if it is off.
    pub fn enable() -> Result<UringSwitch, String> {
        let need = "the uring transport (Linux 6.14+ with FUSE over io_uring)";
        let on = crate::setting::Setting::ensure(ENABLE_URING, "Y", |v| v == "Y", need)?;
        Ok(UringSwitch { _on: on })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variants_multiply_out_queues_first() {
        assert_eq!(Variant::all(&[], &[]), [Variant::default()]);
        let v = Variant::all(&[1, 2], &[Transport::Dev, Transport::Uring]);
        let labels: Vec<String> = v.iter().map(|v| v.label()).collect();
        assert_eq!(
            labels,
            [
                "corofuse q1 dev",
                "corofuse q1 uring",
                "corofuse q2 dev",
                "corofuse q2 uring"
            ]
        );
        assert_eq!(v[3].mount_args(), ["--queues", "2", "--transport", "uring"]);
        assert!(v[3].uses_uring() && !v[2].uses_uring());
        let only_t = Variant::all(&[], &[Transport::Uring]);
        assert_eq!(only_t[0].label(), "corofuse uring");
        assert_eq!(Variant::all(&[2, 2], &[]).len(), 1, "duplicates dropped");
        assert!(Variant::default().mount_args().is_empty());
    }
}
