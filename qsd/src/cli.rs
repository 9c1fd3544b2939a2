//! qemu-storage-daemon's argument list, read as its getopt_long does: the options in the
//! order given (qsd applies them in that order, so a node must come before its export),
//! `--opt ARG` or `--opt=ARG`, and its sentences for what getopt refuses.

/// One option, with the argument text as given and where it came from (for errors:
/// "--blockdev driver=file: Parameter 'filename' is missing").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Arg {
    /// Which option.
    pub kind: Kind,
    /// Its argument (empty for flags).
    pub value: String,
    /// The command-line words, as error messages show them.
    pub shown: String,
}

/// The options qemu-storage-daemon has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `--blockdev`.
    Blockdev,
    /// `--export`.
    Export,
    /// `--object`.
    Object,
    /// `--chardev`.
    Chardev,
    /// `--monitor`.
    Monitor,
    /// `--nbd-server`.
    NbdServer,
    /// `--pidfile`.
    Pidfile,
    /// `--stats PATH`: corofuse's own, not qsd's: the serving statistics as JSON, a
    /// section per export, written on SIGUSR1 and at exit.
    Stats,
    /// `--daemonize`.
    Daemonize,
    /// `-T`, `--trace`.
    Trace,
    /// `-h`, `--help`.
    Help,
    /// `-V`, `--version`.
    Version,
}

const LONG: &[(&str, Kind, bool)] = &[
    ("blockdev", Kind::Blockdev, true),
    ("export", Kind::Export, true),
    ("object", Kind::Object, true),
    ("chardev", Kind::Chardev, true),
    ("monitor", Kind::Monitor, true),
    ("nbd-server", Kind::NbdServer, true),
    ("pidfile", Kind::Pidfile, true),
    ("stats", Kind::Stats, true),
    ("daemonize", Kind::Daemonize, false),
    ("trace", Kind::Trace, true),
    ("help", Kind::Help, false),
    ("version", Kind::Version, false),
];

/// Reads `args` (without the program name). Errors are getopt's and qsd's sentences
/// (without the program-name prefix): "unrecognized option '--bogus'", "option
/// '--pidfile' requires an argument", "foo: Unexpected argument".
pub fn parse(args: &[String]) -> Result<Vec<Arg>, String> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let word = &args[i];
        i += 1;
        let (kind, takes, inline) = match word.as_str() {
            "-h" => (Kind::Help, false, None),
            "-V" => (Kind::Version, false, None),
            "-T" => (Kind::Trace, true, None),
            w if w.starts_with("--") => {
                let (name, inline) = match w[2..].split_once('=') {
                    Some((n, v)) => (n, Some(v.to_string())),
                    None => (&w[2..], None),
                };
                let &(_, kind, takes) = LONG
                    .iter()
                    .find(|(n, _, _)| *n == name)
                    .ok_or_else(|| format!("unrecognized option '{w}'"))?;
                if !takes && inline.is_some() {
                    return Err(format!("option '--{name}' doesn't allow an argument"));
                }
                (kind, takes, inline)
            }
            w if w.starts_with('-') && w.len() > 1 => {
                return Err(format!("invalid option -- '{}'", &w[1..2]))
            }
            w => return Err(format!("{w}: Unexpected argument")),
        };
        let (value, shown) = match (takes, inline) {
            (false, _) => (String::new(), word.clone()),
            (true, Some(v)) => (v, word.clone()),
            (true, None) => {
                let v = args.get(i).ok_or_else(|| match word.as_str() {
                    "-T" => "option requires an argument -- 'T'".to_string(),
                    w => format!("option '{w}' requires an argument"),
                })?;
                i += 1;
                (v.clone(), format!("{word} {v}"))
            }
        };
        out.push(Arg { kind, value, shown });
    }
    Ok(out)
}

/// `--help`, in qemu-storage-daemon's layout, saying what corofuse serves.
pub const HELP: &str = "\
Usage: qemu-storage-daemon [options]
QEMU storage daemon (corofuse)

  -h, --help             display this help and exit
  -V, --version          output version information and exit

  --blockdev [driver=]<driver>[,node-name=<N>][,discard=ignore|unmap]
             [,cache.direct=on|off][,read-only=on|off]
             [,driver specific parameters...]
                         configure a block backend: file, raw, qcow2,
                         null-co or nbd

  --chardev socket,id=<id>,path=<socket>,server=on[,wait=off]
                         a unix socket for a monitor

  --daemonize            daemonize the process, and have the parent exit
                         once startup is complete

  --export [type=]fuse,id=<id>,node-name=<node-name>,mountpoint=<file>
           [,growable=on|off][,writable=on|off][,allow-other=on|off|auto]
           [,iothread=<id>|iothread.0=<id>,...][,fixed-iothread=on|off]
                         export the specified block node over FUSE

  --monitor [chardev=]name[,mode=control][,pretty[=on|off]]
                         configure a QMP monitor

  --object iothread,id=<id>[,poll-max-ns=<ns>]
  --object tls-creds-x509,id=<id>,dir=<dir>[,endpoint=client]
                         create a new object

  --pidfile <path>       write process ID to a file after startup

  --stats <path>         (corofuse) write the serving statistics as JSON, one
                         section per export id, on SIGUSR1 and at exit
";

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<String> {
        s.split(' ').map(String::from).collect()
    }

    #[test]
    fn options_in_order_both_forms() {
        let a = parse(&words(
            "--blockdev null-co,node-name=n --export=fuse,id=e --daemonize",
        ))
        .unwrap();
        assert_eq!(a[0].kind, Kind::Blockdev);
        assert_eq!(a[0].shown, "--blockdev null-co,node-name=n");
        assert_eq!(
            (a[1].kind, a[1].value.as_str()),
            (Kind::Export, "fuse,id=e")
        );
        assert_eq!(a[1].shown, "--export=fuse,id=e");
        assert_eq!(a[2].kind, Kind::Daemonize);
    }

    #[test]
    fn getopts_sentences() {
        assert_eq!(
            parse(&words("--bogus")).unwrap_err(),
            "unrecognized option '--bogus'"
        );
        assert_eq!(
            parse(&words("--pidfile")).unwrap_err(),
            "option '--pidfile' requires an argument"
        );
        assert_eq!(
            parse(&words("foo")).unwrap_err(),
            "foo: Unexpected argument"
        );
    }
}
