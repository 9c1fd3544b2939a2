//! Why an `--inject` spec was refused ([`SpecError`]) and, for one rule, what is wrong
//! with it ([`RuleError`]): typed, so that a caller can tell the cases apart; their
//! `Display` is the one line the command line prints (it names the rule and the problem).

use std::error::Error;
use std::fmt;

use crate::SizeError;

/// Why a whole spec was refused ([`super::parse`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SpecError {
    /// `seed=N` given twice (the item).
    SeedTwice(String),
    /// A seed that is not a number (the item).
    BadSeed(String),
    /// A rule refused: its text and why.
    Rule {
        /// The rule as given.
        rule: String,
        /// What is wrong with it.
        why: RuleError,
    },
    /// More rules than [`super::MAX_RULES`].
    TooManyRules(usize),
    /// No rule at all (the spec).
    NoRule(String),
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SpecError::SeedTwice(item) => write!(f, "\"{item}\": seed given twice"),
            SpecError::BadSeed(item) => {
                write!(f, "\"{item}\": the seed must be a number from 0 to 2^64-1")
            }
            SpecError::Rule { rule, why } => write!(f, "rule \"{rule}\": {why}"),
            SpecError::TooManyRules(n) => write!(f, "{n} rules, at most {}", super::MAX_RULES),
            SpecError::NoRule(text) => write!(
                f,
                "\"{text}\" has no rule (expected e.g. read:EIO:once or delay:write:2ms)"
            ),
        }
    }
}

impl Error for SpecError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            SpecError::Rule { why, .. } => Some(why),
            _ => None,
        }
    }
}

/// What is wrong with one rule; each text quotes the part at fault.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RuleError {
    /// Nothing between two commas.
    Empty,
    /// Not as many fields as the grammar wants (a delay rule or not).
    Shape {
        /// A `delay:` rule.
        delay: bool,
    },
    /// An operation name not known.
    UnknownOp(String),
    /// `@RANGE` without a `-`.
    RangeShape(String),
    /// An end of `@RANGE` that is not a size.
    RangeSize {
        /// The range as given, without the `@`.
        range: String,
        /// Why the size was refused.
        size: SizeError,
    },
    /// `@RANGE` that ends before it starts.
    RangeBackwards(String),
    /// An errno number outside 1 to 511.
    ErrnoOutOfRange(String),
    /// An errno name not known.
    UnknownErrno(String),
    /// ENOSYS, which the kernel takes as "not implemented".
    Enosys,
    /// A duration not spelled N{ns,us,ms,s}.
    BadDuration(String),
    /// A delay longer than 60s.
    DelayTooLong(String),
    /// `nth=N` or `N/M` with a count below 1 (the condition).
    BadCount(String),
    /// `after=SIZE` whose size is refused.
    AfterSize {
        /// The condition as given.
        when: String,
        /// Why the size was refused.
        size: SizeError,
    },
    /// `N/M` with N above M.
    BadChance(String),
    /// A condition not known.
    UnknownWhen(String),
    /// flush with a byte range.
    FlushRange,
    /// flush with `after=SIZE`.
    FlushAfter,
}

impl fmt::Display for RuleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RuleError::Empty => {
                f.write_str("empty rule (expected OP:ERRNO[:WHEN] or delay:OP:DURATION[:WHEN])")
            }
            RuleError::Shape { delay: true } => {
                f.write_str("expected delay:OP[@RANGE]:DURATION[:WHEN]")
            }
            RuleError::Shape { delay: false } => f.write_str("expected OP[@RANGE]:ERRNO[:WHEN]"),
            RuleError::UnknownOp(name) => write!(
                f,
                "unknown operation \"{name}\" (use read, write, flush, discard, zeroes, resize or \
                 any)"
            ),
            RuleError::RangeShape(range) => write!(
                f,
                "byte range \"@{range}\": expected @START-END or @START- (e.g. @1M-2M)"
            ),
            RuleError::RangeSize { range, size } => write!(f, "byte range \"@{range}\": {size}"),
            RuleError::RangeBackwards(range) => {
                write!(f, "byte range \"@{range}\": it ends before it starts")
            }
            RuleError::ErrnoOutOfRange(text) => {
                write!(f, "errno {text} is out of range (1 to 511)")
            }
            RuleError::UnknownErrno(text) => write!(
                f,
                "unknown errno \"{text}\" (use a name such as EIO, ENOSPC, EROFS, EDQUOT, ENOMEM, \
                 EAGAIN, or a number)"
            ),
            RuleError::Enosys => f.write_str(
                "ENOSYS cannot be injected: the kernel takes it as \"not implemented\" and stops \
                 sending the operation (fsync then succeeds unseen)",
            ),
            RuleError::BadDuration(text) => {
                write!(
                    f,
                    "bad duration \"{text}\" (expected e.g. 500us, 2ms or 1s)"
                )
            }
            RuleError::DelayTooLong(text) => write!(f, "delay \"{text}\" is longer than 60s"),
            RuleError::BadCount(when) => write!(f, "\"{when}\": N must be a number from 1"),
            RuleError::AfterSize { when, size } => write!(f, "\"{when}\": {size}"),
            RuleError::BadChance(when) => write!(
                f,
                "probability \"{when}\" must be N/M with 0 <= N <= M and M >= 1"
            ),
            RuleError::UnknownWhen(when) => write!(
                f,
                "unknown condition \"{when}\" (use always, once, nth=N, N/M or after=SIZE)"
            ),
            RuleError::FlushRange => f.write_str("flush has no byte range: drop the @RANGE"),
            RuleError::FlushAfter => {
                f.write_str("flush moves no bytes, so after=SIZE never fires: use nth=N")
            }
        }
    }
}

impl Error for RuleError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            RuleError::RangeSize { size, .. } | RuleError::AfterSize { size, .. } => Some(size),
            _ => None,
        }
    }
}
