//! Latency histogram: log-linear buckets in a fixed array, shared by the load generator
//! and the server's per-request accounting.
//!
//! Why this shape: both record one value per I/O, up to a few hundred thousand a second,
//! so recording must not allocate and must cost a few instructions. Each power
//! of two is split into `SUB` linear buckets (as in HdrHistogram), which bounds the
//! relative error of a percentile to 1/`SUB` (about 3%) from 1 ns to `u64::MAX` ns with
//! 1,920 counters. Values below `2 * SUB` ns land in buckets one nanosecond wide, so
//! they are exact. Count, sum, min and max are kept exactly on the side.

/// log2 of the number of linear buckets per power of two.
const SUB_BITS: u32 = 5;
/// Linear buckets per power of two.
const SUB: u64 = 1 << SUB_BITS;
/// Buckets needed to cover every `u64`.
const BUCKETS: usize = ((64 - SUB_BITS + 1) as usize) << SUB_BITS;

/// Counts of nanosecond values; see the module docs for the bucket layout.
pub struct Histogram {
    counts: Box<[u64; BUCKETS]>,
    count: u64,
    sum: u128,
    min: u64,
    max: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new()
    }
}

impl Histogram {
    /// An empty histogram; the only allocation it ever makes.
    pub fn new() -> Histogram {
        Histogram {
            counts: Box::new([0; BUCKETS]),
            count: 0,
            sum: 0,
            min: u64::MAX,
            max: 0,
        }
    }

    /// Records one value (nanoseconds).
    #[inline]
    pub fn record(&mut self, ns: u64) {
        self.counts[index(ns)] += 1;
        self.count += 1;
        self.sum += u128::from(ns);
        self.min = self.min.min(ns);
        self.max = self.max.max(ns);
    }

    /// Values recorded.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Exact mean, 0 when empty.
    pub fn mean(&self) -> f64 {
        if self.count == 0 {
            return 0.0;
        }
        self.sum as f64 / self.count as f64
    }

    /// Exact maximum, 0 when empty.
    pub fn max(&self) -> u64 {
        self.max
    }

    /// Adds every value recorded in `other` (e.g. the histograms of several threads).
    pub fn merge(&mut self, other: &Histogram) {
        for (mine, theirs) in self.counts.iter_mut().zip(other.counts.iter()) {
            *mine += theirs;
        }
        self.count += other.count;
        self.sum += other.sum;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
    }

    /// Count, mean, p50, p99 and max, in nanoseconds.
    pub fn summary(&self) -> Summary {
        Summary {
            count: self.count,
            mean_ns: self.mean() as u64,
            p50_ns: self.quantile(0.50),
            p99_ns: self.quantile(0.99),
            max_ns: self.max,
        }
    }

    /// The value at quantile `q` (0.0..=1.0): the middle of the bucket holding the
    /// `ceil(q * count)`-th smallest value, clamped to the exact min and max.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.count as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, &n) in self.counts.iter().enumerate() {
            seen += n;
            if seen >= rank {
                let (low, width) = bucket(i);
                return (low + (width - 1) / 2).clamp(self.min, self.max);
            }
        }
        self.max
    }
}

/// A histogram in five numbers (nanoseconds), for reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Summary {
    /// Values recorded.
    pub count: u64,
    /// Exact mean.
    pub mean_ns: u64,
    /// Median (within 1/32 of the true value).
    pub p50_ns: u64,
    /// 99th percentile (within 1/32).
    pub p99_ns: u64,
    /// Exact maximum.
    pub max_ns: u64,
}

/// The bucket of `v`: exact below `2 * SUB`, then `SUB` buckets per power of two.
#[inline(always)]
fn index(v: u64) -> usize {
    if v < 2 * SUB {
        return v as usize;
    }
    let shift = 63 - v.leading_zeros() - SUB_BITS;
    let sub = (v >> shift) - SUB;
    (((shift + 1) as u64) << SUB_BITS) as usize + sub as usize
}

/// Lowest value and width of bucket `i` (the inverse of [`index`]).
fn bucket(i: usize) -> (u64, u64) {
    let i = i as u64;
    if i < 2 * SUB {
        return (i, 1);
    }
    let shift = (i >> SUB_BITS) - 1;
    let sub = i & (SUB - 1);
    ((SUB + sub) << shift, 1 << shift)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_contiguous_and_invert_index() {
        let mut expected_low = 0u64;
        for i in 0..BUCKETS {
            let (low, width) = bucket(i);
            assert_eq!(low, expected_low, "bucket {i}");
            assert_eq!(index(low), i);
            assert_eq!(index(low + (width - 1)), i);
            expected_low = low.wrapping_add(width);
        }
        assert_eq!(expected_low, 0, "the last bucket ends at u64::MAX");
        assert_eq!(index(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn small_values_are_exact() {
        let mut h = Histogram::new();
        for v in [3, 1, 2, 4, 5] {
            h.record(v);
        }
        assert_eq!(h.quantile(0.5), 3);
        assert_eq!(h.quantile(0.0), 1);
        assert_eq!(h.quantile(1.0), 5);
        assert_eq!(h.mean(), 3.0);
    }

    #[test]
    fn percentiles_of_a_uniform_range_within_bucket_error() {
        let mut h = Histogram::new();
        for v in 1..=100_000u64 {
            h.record(v * 10); // 10 ns .. 1 ms
        }
        for (q, want) in [(0.5, 500_000.0), (0.99, 990_000.0), (0.01, 10_000.0)] {
            let got = h.quantile(q) as f64;
            assert!(
                (got - want).abs() / want < 1.0 / SUB as f64,
                "q={q}: {got} vs {want}"
            );
        }
        assert_eq!(h.max(), 1_000_000);
        assert_eq!(h.count(), 100_000);
        assert!((h.mean() - 500_005.0).abs() < 1e-6);
    }

    #[test]
    fn a_tail_shows_in_p99_not_p50() {
        let mut h = Histogram::new();
        for _ in 0..980 {
            h.record(5_000);
        }
        for _ in 0..20 {
            h.record(2_000_000);
        }
        let p50 = h.quantile(0.5);
        assert!((4_900..=5_100).contains(&p50), "p50 {p50}");
        let p99 = h.quantile(0.99);
        assert!(p99 > 1_900_000, "p99 {p99}");
        assert_eq!(h.quantile(1.0), 2_000_000);
    }

    #[test]
    fn empty_is_zero() {
        let h = Histogram::new();
        assert_eq!((h.quantile(0.5), h.max(), h.mean()), (0, 0, 0.0));
    }
}
