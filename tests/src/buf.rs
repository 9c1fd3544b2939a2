//! Page-aligned buffers for O_DIRECT, deterministic byte patterns, and the seeds of
//! randomised tests.

/// A zeroed, page-aligned heap buffer: the backend's own ([`backend::AlignedBuf`]).
pub use backend::AlignedBuf;

/// Alignment of [`AlignedBuf::zeroed`]: a page, enough for O_DIRECT anywhere.
pub const ALIGN: usize = backend::PAGE_ALIGN;

/// splitmix64, a small deterministic generator so that failures reproduce: the crash
/// checker's own ([`backend::crash::plan::Rng`]), the same numbers for the same seed.
pub use backend::crash::plan::Rng;

/// The environment variable that fixes the seed of randomised tests ([`Seed`]).
pub const SEED_ENV: &str = "COROFUSE_TEST_SEED";

/// The seed of a randomised test: `$COROFUSE_TEST_SEED` (decimal or `0x` hex) if set,
/// else a fresh one per run (from the clock), so that runs cover different sequences. If
/// the test panics while this is alive, dropping it prints the seed and how to re-run with
/// it. Keep it alive for the whole test: `let seed = Seed::choose();` first.
#[derive(Debug)]
pub struct Seed(u64);

impl Seed {
    /// Chooses the seed (see [`Seed`]); panics on a value of [`SEED_ENV`] it cannot parse.
    pub fn choose() -> Seed {
        if let Some(seed) = Self::from_env() {
            return seed;
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        // Tests start in parallel: mix in the thread's id so that two get different seeds.
        let thread = format!("{:?}", std::thread::current().id());
        let salt = thread
            .bytes()
            .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(b.into()));
        Seed(Rng::new(now.as_nanos() as u64 ^ salt.rotate_left(32)).next_u64())
    }

    /// `$COROFUSE_TEST_SEED` if set, else `default`: for a test whose CI runs should
    /// repeat one sequence (an outside tool's, say), replayable with another.
    pub fn fixed(default: u64) -> Seed {
        Self::from_env().unwrap_or(Seed(default))
    }

    /// `$COROFUSE_TEST_SEED` (decimal or `0x` hex), if set; panics on a value it cannot
    /// parse.
    fn from_env() -> Option<Seed> {
        let value = std::env::var(SEED_ENV)
            .ok()
            .filter(|v| !v.trim().is_empty())?;
        let v = value.trim();
        let parsed = match v.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16),
            None => v.parse(),
        };
        Some(Seed(
            parsed.unwrap_or_else(|e| panic!("{SEED_ENV}={value:?}: {e}")),
        ))
    }

    /// The seed.
    pub fn value(&self) -> u64 {
        self.0
    }

    /// A generator seeded with it.
    pub fn rng(&self) -> Rng {
        Rng::new(self.0)
    }
}

impl Drop for Seed {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let thread = std::thread::current();
            crate::require::note(&format!(
                "{} failed with seed {:#x}: re-run with {SEED_ENV}={:#x}",
                thread.name().unwrap_or("the test"),
                self.0,
                self.0
            ));
        }
    }
}

/// The bytes at `[offset, offset + len)` of an endless pattern named by `seed`: every
/// 8-byte word depends on the seed and its absolute position, so a misplaced block shows.
pub fn pattern(seed: u64, offset: u64, len: usize) -> Vec<u8> {
    let words = (offset / 8)..(offset + len as u64).div_ceil(8);
    let mut out = Vec::with_capacity(len + 16);
    for word in words {
        let value = Rng::new(seed ^ word.wrapping_mul(0x2545_F491_4F6C_DD1D)).next_u64();
        out.extend_from_slice(&value.to_le_bytes());
    }
    out.drain(..(offset % 8) as usize);
    out.truncate(len);
    out
}

/// The first offset where `a` and `b` differ (or where the shorter one ends).
pub fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    let common = a.len().min(b.len());
    (0..common)
        .find(|&i| a[i] != b[i])
        .or((a.len() != b.len()).then_some(common))
}

/// Asserts `actual == expected` without printing megabytes: names the first difference.
#[track_caller]
pub fn assert_bytes_eq(actual: &[u8], expected: &[u8], what: &str) {
    if let Some(at) = first_difference(actual, expected) {
        panic!(
            "{what}: differs at byte {at} (lengths {} and {}): got {:02x?}, expected {:02x?}",
            actual.len(),
            expected.len(),
            &actual[at..actual.len().min(at + 16)],
            &expected[at..expected.len().min(at + 16)],
        );
    }
}
