//! The `--inject` grammar: what a rule says, parsed once at start, checked whole.
//!
//! ```text
//! SPEC     := ITEM[,ITEM]...
//! ITEM     := OP[@RANGE]:ERRNO[:WHEN]            fail matching operations with ERRNO
//!           | delay:OP[@RANGE]:DURATION[:WHEN]   hold them for DURATION, then run them
//!           | seed=N                             the seed of every N/M rule (default 0)
//! OP       := read | write | flush | discard | zeroes | resize | any
//! RANGE    := START-END | START-                 bytes [START, END) of the image
//! ERRNO    := EIO | ENOSPC | EROFS | EDQUOT | ... | a number from 1 to 511
//! WHEN     := always (default) | once | nth=N | N/M | after=SIZE
//! DURATION := N{ns,us,ms,s}                      at most 60s
//! ```
//!
//! Every error is one line that names the rule and what is wrong with it.

use std::fmt;
use std::time::Duration;

use super::error::{RuleError, SpecError};
use crate::parse_size;

/// A backend operation a rule can match (`any` matches them all).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Op {
    /// `readv` (READ).
    Read,
    /// `writev` (WRITE).
    Write,
    /// `flush` (FSYNC, FLUSH on close, the final flush at exit).
    Flush,
    /// `discard`, and `write_zeroes` that may deallocate (fallocate PUNCH_HOLE).
    Discard,
    /// `write_zeroes` that keeps the range allocated (fallocate ZERO_RANGE, preallocation).
    Zeroes,
    /// `resize` (truncate).
    Resize,
}

impl Op {
    /// Every operation, in the order of [`Op::index`].
    pub const ALL: [Op; 6] = [
        Op::Read,
        Op::Write,
        Op::Flush,
        Op::Discard,
        Op::Zeroes,
        Op::Resize,
    ];

    /// As written in a rule.
    pub fn name(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
            Op::Flush => "flush",
            Op::Discard => "discard",
            Op::Zeroes => "zeroes",
            Op::Resize => "resize",
        }
    }

    /// Position in [`Op::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

/// What a rule does to an operation it fires on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Fail it with this errno, without running it.
    Fail(i32),
    /// Sleep this long, then run it (and the rules after this one).
    Delay(Duration),
}

/// Which of the matching operations a rule fires on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum When {
    /// Every one.
    Always,
    /// Only the N-th (counting from 1); `once` is `nth=1`.
    Nth(u64),
    /// Each with probability `num/den`, drawn from the seeded generator.
    Chance {
        /// Numerator.
        num: u64,
        /// Denominator, at least 1.
        den: u64,
    },
    /// Every one that would take the bytes of matching operations past this many: at most
    /// SIZE bytes succeed.
    After(u64),
}

/// Bytes `[start, end)` of the image.
pub type Range = (u64, u64);

/// One rule of a spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// The rule as written.
    pub text: String,
    /// The operation it matches (`None`: `any`).
    pub op: Option<Op>,
    /// Only operations overlapping `[start, end)`.
    pub range: Option<Range>,
    /// Fail or delay.
    pub action: Action,
    /// Which matching operations it fires on.
    pub when: When,
}

/// A whole `--inject` spec: its rules in order, and the seed of the `N/M` rules.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Spec {
    /// Tried in order for each operation.
    pub rules: Vec<Rule>,
    /// Seeds the deterministic generator of `N/M` rules.
    pub seed: u64,
}

impl fmt::Display for Spec {
    /// The rules as given, then the seed if any rule draws from it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let texts: Vec<&str> = self.rules.iter().map(|r| r.text.as_str()).collect();
        f.write_str(&texts.join(","))?;
        let random = self
            .rules
            .iter()
            .any(|r| matches!(r.when, When::Chance { .. }));
        if random {
            write!(f, ",seed={}", self.seed)?;
        }
        Ok(())
    }
}

/// Errno names a rule may use, with their Linux values.
const ERRNOS: &[(&str, i32)] = &[
    ("EPERM", libc::EPERM),
    ("EINTR", libc::EINTR),
    ("EIO", libc::EIO),
    ("ENXIO", libc::ENXIO),
    ("EBADF", libc::EBADF),
    ("EAGAIN", libc::EAGAIN),
    ("ENOMEM", libc::ENOMEM),
    ("EACCES", libc::EACCES),
    ("EFAULT", libc::EFAULT),
    ("EBUSY", libc::EBUSY),
    ("ENODEV", libc::ENODEV),
    ("EINVAL", libc::EINVAL),
    ("EFBIG", libc::EFBIG),
    ("ENOSPC", libc::ENOSPC),
    ("EROFS", libc::EROFS),
    ("ENODATA", libc::ENODATA),
    ("ETIME", libc::ETIME),
    ("ENOLINK", libc::ENOLINK),
    ("EOVERFLOW", libc::EOVERFLOW),
    ("EOPNOTSUPP", libc::EOPNOTSUPP),
    ("ENOTSUP", libc::ENOTSUP),
    ("ETIMEDOUT", libc::ETIMEDOUT),
    ("ESTALE", libc::ESTALE),
    ("EDQUOT", libc::EDQUOT),
    ("ENOMEDIUM", libc::ENOMEDIUM),
    ("EMEDIUMTYPE", libc::EMEDIUMTYPE),
    ("ECANCELED", libc::ECANCELED),
];

/// The name of `errno` as rules spell it (`E<n>` for one without a name here).
pub fn errno_name(errno: i32) -> String {
    match ERRNOS.iter().find(|(_, v)| *v == errno) {
        Some((name, _)) => (*name).to_owned(),
        None => format!("E{errno}"),
    }
}

/// Parses a whole spec (see the module docs). The error is one line naming the bad rule.
///
/// ```
/// use backend::inject::{parse, Action, Op, When};
///
/// let spec = parse("write@1M-2M:ENOSPC:once,delay:read:2ms,seed=7").unwrap();
/// assert_eq!(spec.seed, 7);
/// assert_eq!(spec.rules[0].op, Some(Op::Write));
/// assert_eq!(spec.rules[0].range, Some((1 << 20, 2 << 20)));
/// assert_eq!(spec.rules[0].action, Action::Fail(libc::ENOSPC));
/// assert_eq!(spec.rules[0].when, When::Nth(1));
/// let refused = parse("reed:EIO").unwrap_err();
/// assert!(refused.to_string().contains("unknown operation \"reed\""));
/// ```
pub fn parse(text: &str) -> Result<Spec, SpecError> {
    let mut spec = Spec::default();
    let mut seed = None;
    for item in text.split(',').map(str::trim) {
        if let Some(value) = item.strip_prefix("seed=") {
            if seed.is_some() {
                return Err(SpecError::SeedTwice(item.to_owned()));
            }
            let n = value
                .parse()
                .map_err(|_| SpecError::BadSeed(item.to_owned()))?;
            seed = Some(n);
            continue;
        }
        let rule = parse_rule(item).map_err(|why| SpecError::Rule {
            rule: item.to_owned(),
            why,
        })?;
        spec.rules.push(rule);
    }
    if spec.rules.len() > super::MAX_RULES {
        return Err(SpecError::TooManyRules(spec.rules.len()));
    }
    if spec.rules.is_empty() {
        return Err(SpecError::NoRule(text.to_owned()));
    }
    spec.seed = seed.unwrap_or(0);
    Ok(spec)
}

fn parse_rule(item: &str) -> Result<Rule, RuleError> {
    if item.is_empty() {
        return Err(RuleError::Empty);
    }
    let mut fields: Vec<&str> = item.split(':').collect();
    let delay = fields[0] == "delay";
    if delay {
        fields.remove(0);
    }
    let (target, what, when) = match fields[..] {
        [target, what] => (target, what, None),
        [target, what, when] => (target, what, Some(when)),
        _ => return Err(RuleError::Shape { delay }),
    };
    let (op, range) = parse_target(target)?;
    let action = match delay {
        true => Action::Delay(parse_duration(what)?),
        false => Action::Fail(parse_errno(what)?),
    };
    let when = when.map_or(Ok(When::Always), parse_when)?;
    check_fits(op, range, when)?;
    Ok(Rule {
        text: item.to_owned(),
        op,
        range,
        action,
        when,
    })
}

/// `OP[@RANGE]`.
fn parse_target(target: &str) -> Result<(Option<Op>, Option<Range>), RuleError> {
    let (name, range) = match target.split_once('@') {
        Some((name, range)) => (name, Some(parse_range(range)?)),
        None => (target, None),
    };
    let op = match name {
        "any" => None,
        _ => Some(
            Op::ALL
                .into_iter()
                .find(|op| op.name() == name)
                .ok_or_else(|| RuleError::UnknownOp(name.to_owned()))?,
        ),
    };
    Ok((op, range))
}

/// `START-END` or `START-`.
fn parse_range(text: &str) -> Result<Range, RuleError> {
    let range = || text.to_owned();
    let bad = |size| RuleError::RangeSize {
        range: range(),
        size,
    };
    let (start, end) = text
        .split_once('-')
        .ok_or_else(|| RuleError::RangeShape(range()))?;
    let start = parse_size(start).map_err(bad)?;
    let end = match end {
        "" => u64::MAX,
        end => parse_size(end).map_err(bad)?,
    };
    if end <= start {
        return Err(RuleError::RangeBackwards(range()));
    }
    Ok((start, end))
}

fn parse_errno(text: &str) -> Result<i32, RuleError> {
    let errno = match text.parse::<i32>() {
        _ if text == "ENOSYS" => libc::ENOSYS,
        Ok(n) if (1..=511).contains(&n) => n,
        Ok(_) => return Err(RuleError::ErrnoOutOfRange(text.to_owned())),
        Err(_) => ERRNOS
            .iter()
            .find(|(name, _)| *name == text)
            .map(|&(_, v)| v)
            .ok_or_else(|| RuleError::UnknownErrno(text.to_owned()))?,
    };
    if errno == libc::ENOSYS {
        return Err(RuleError::Enosys);
    }
    Ok(errno)
}

/// `N` followed by ns, us, ms or s.
fn parse_duration(text: &str) -> Result<Duration, RuleError> {
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(0);
    let (digits, unit) = text.split_at(split);
    let bad = || RuleError::BadDuration(text.to_owned());
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let duration = match unit {
        "ns" => Duration::from_nanos(n),
        "us" => Duration::from_micros(n),
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        _ => return Err(bad()),
    };
    if duration > Duration::from_secs(60) {
        return Err(RuleError::DelayTooLong(text.to_owned()));
    }
    Ok(duration)
}

fn parse_when(text: &str) -> Result<When, RuleError> {
    let count = |n: &str| match n.parse::<u64>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(RuleError::BadCount(text.to_owned())),
    };
    if text == "always" {
        return Ok(When::Always);
    }
    if text == "once" {
        return Ok(When::Nth(1));
    }
    if let Some(n) = text.strip_prefix("nth=") {
        return count(n).map(When::Nth);
    }
    if let Some(size) = text.strip_prefix("after=") {
        return parse_size(size)
            .map(When::After)
            .map_err(|size| RuleError::AfterSize {
                when: text.to_owned(),
                size,
            });
    }
    if let Some((num, den)) = text.split_once('/') {
        let bad = || RuleError::BadChance(text.to_owned());
        let (num, den): (u64, u64) = (num.parse().map_err(|_| bad())?, count(den)?);
        return match num <= den {
            true => Ok(When::Chance { num, den }),
            false => Err(bad()),
        };
    }
    Err(RuleError::UnknownWhen(text.to_owned()))
}

/// Rejects combinations that could never fire as written.
fn check_fits(op: Option<Op>, range: Option<Range>, when: When) -> Result<(), RuleError> {
    if op == Some(Op::Flush) && range.is_some() {
        return Err(RuleError::FlushRange);
    }
    if op == Some(Op::Flush) && matches!(when, When::After(_)) {
        return Err(RuleError::FlushAfter);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: u64 = 1 << 20;

    #[test]
    fn rules() {
        let spec =
            parse("read:EIO:1/100,write:ENOSPC:after=64M,flush:EIO:once,delay:read:2ms").unwrap();
        let got: Vec<(Option<Op>, Action, When)> = spec
            .rules
            .iter()
            .map(|r| (r.op, r.action, r.when))
            .collect();
        let expected = [
            (
                Some(Op::Read),
                Action::Fail(libc::EIO),
                When::Chance { num: 1, den: 100 },
            ),
            (
                Some(Op::Write),
                Action::Fail(libc::ENOSPC),
                When::After(64 * M),
            ),
            (Some(Op::Flush), Action::Fail(libc::EIO), When::Nth(1)),
            (
                Some(Op::Read),
                Action::Delay(Duration::from_millis(2)),
                When::Always,
            ),
        ];
        assert_eq!(got, expected);
        assert_eq!(spec.seed, 0);
        assert_eq!(
            spec.to_string(),
            "read:EIO:1/100,write:ENOSPC:after=64M,flush:EIO:once,delay:read:2ms,seed=0"
        );
    }

    #[test]
    fn ranges_numbers_and_any() {
        let spec = parse("any@4K-:28:nth=3, zeroes@0-512:EDQUOT ,seed=42").unwrap();
        assert_eq!(spec.seed, 42);
        let (a, z) = (&spec.rules[0], &spec.rules[1]);
        assert_eq!(
            (a.op, a.range, a.action),
            (None, Some((4096, u64::MAX)), Action::Fail(28))
        );
        assert_eq!(a.when, When::Nth(3));
        assert_eq!((z.op, z.range), (Some(Op::Zeroes), Some((0, 512))));
        assert_eq!(z.action, Action::Fail(libc::EDQUOT));
        let d = parse("delay:write@1M-2M:500us:once").unwrap().rules[0].clone();
        assert_eq!(d.action, Action::Delay(Duration::from_micros(500)));
        assert_eq!((d.range, d.when), (Some((M, 2 * M)), When::Nth(1)));
    }

    #[test]
    fn errors_name_the_rule_and_the_problem() {
        let bad = [
            ("bogus", "rule \"bogus\": expected OP[@RANGE]:ERRNO[:WHEN]"),
            ("reed:EIO", "rule \"reed:EIO\": unknown operation \"reed\""),
            ("read:EIOO", "unknown errno \"EIOO\""),
            ("read:0", "errno 0 is out of range"),
            ("read:ENOSYS", "ENOSYS cannot be injected"),
            ("read:38", "ENOSYS cannot be injected"),
            ("read:EIO:twice", "unknown condition \"twice\""),
            ("read:EIO:3/2", "probability \"3/2\""),
            ("read:EIO:1/0", "\"1/0\": N must be a number from 1"),
            ("read:EIO:nth=0", "\"nth=0\": N must be"),
            ("write:ENOSPC:after=64Q", "\"after=64Q\": invalid size"),
            (
                "read@2M-1M:EIO",
                "byte range \"@2M-1M\": it ends before it starts",
            ),
            ("read@1M:EIO", "expected @START-END"),
            ("flush@0-1M:EIO", "flush has no byte range"),
            ("flush:EIO:after=1M", "use nth=N"),
            ("delay:read:2", "bad duration \"2\""),
            ("delay:read:2h", "bad duration \"2h\""),
            ("delay:read:61s", "longer than 60s"),
            ("delay:read", "expected delay:OP[@RANGE]:DURATION[:WHEN]"),
            ("read:EIO,,write:EIO", "empty rule"),
            ("seed=1", "has no rule"),
            ("read:EIO,seed=x", "\"seed=x\": the seed must be a number"),
            ("read:EIO,seed=1,seed=2", "seed given twice"),
            (
                "read:EIO:once:again",
                "rule \"read:EIO:once:again\": expected",
            ),
        ];
        let many = vec!["read:EIO"; 65].join(",");
        assert_eq!(
            parse(&many).unwrap_err().to_string(),
            "65 rules, at most 64"
        );
        for (text, error) in bad {
            let got = parse(text).unwrap_err().to_string();
            assert!(got.contains(error), "{text}: {got}");
            assert_eq!(got.lines().count(), 1, "{text}: {got}");
        }
    }

    #[test]
    fn errors_say_which_case_and_keep_the_size_error() {
        assert_eq!(parse("seed=1"), Err(SpecError::NoRule("seed=1".into())));
        let refused = parse("write:ENOSPC:after=64Q").unwrap_err();
        let SpecError::Rule { rule, why } = &refused else {
            panic!("{refused:?}");
        };
        assert_eq!(rule, "write:ENOSPC:after=64Q");
        let RuleError::AfterSize { size, .. } = why else {
            panic!("{why:?}");
        };
        assert!(matches!(size, crate::SizeError::UnknownSuffix { .. }));
        use std::error::Error;
        let source = refused.source().and_then(Error::source).expect("the size");
        assert!(source.is::<crate::SizeError>());
    }

    #[test]
    fn errno_names_round_trip() {
        for &(name, value) in ERRNOS {
            assert_eq!(parse_errno(name), Ok(value), "{name}");
            // ENOTSUP is EOPNOTSUPP on Linux: the first name wins.
            assert!(name == "ENOTSUP" || errno_name(value) == name, "{name}");
        }
        assert_eq!(errno_name(200), "E200");
    }
}
