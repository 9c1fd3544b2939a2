//! The lab's statistics, in one place: every median, range and ratio its reports print
//! (the image lab's cells, `--dir`'s rows, `bench switch`'s cases, the switch cost of
//! every report) is taken here. (The daemon's per-request counters are [`crate::stats`].)
//!
//! Why two medians: the reports' [`median`] is the textbook one (the mean of the middle
//! two for an even count); `bench switch` reports [`middle`], the upper of the two, a time
//! that one run measured and a ratio taken within one round. Each keeps the numbers it
//! has always printed.

/// The median of `v` (the mean of the middle two for an even count); 0 when empty.
pub fn median(v: impl IntoIterator<Item = f64>) -> f64 {
    let v = sorted(v);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The median of a figure that a run may lack: `None` when some run (or every run) does.
pub fn median_of_all(v: impl IntoIterator<Item = Option<f64>>) -> Option<f64> {
    let v: Vec<f64> = v.into_iter().collect::<Option<_>>()?;
    (!v.is_empty()).then(|| median(v))
}

/// The upper median: the middle value for an odd count, the upper of the middle two for
/// an even one; NaN when empty.
pub fn middle(v: impl IntoIterator<Item = f64>) -> f64 {
    let v = sorted(v);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The fewest, the [`median`] and the most of a figure over runs (all 0 when none ran).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spread {
    pub min: f64,
    pub median: f64,
    pub max: f64,
}

impl Spread {
    pub fn of(v: impl IntoIterator<Item = f64>) -> Spread {
        let v = sorted(v);
        Spread {
            min: v.first().copied().unwrap_or(0.0),
            median: median(v.iter().copied()),
            max: v.last().copied().unwrap_or(0.0),
        }
    }
}

/// `a / b`, NaN unless `b` is positive: the ratio to a row that did nothing is no number.
pub fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        f64::NAN
    }
}

/// The runs of a figure that disagree with the others (indices into `v`): with three
/// runs or more, each below half or above twice their [`median`] (which one run cannot
/// move far); with
/// two, both when one is more than twice the other (which one is off cannot be told).
/// None with one run.
pub fn outliers(v: &[f64]) -> Vec<usize> {
    match v {
        [a, b] if a.max(*b) > 2.0 * a.min(*b) => vec![0, 1],
        [_, _, _, ..] => {
            let m = median(v.iter().copied());
            (0..v.len())
                .filter(|&i| v[i] < m / 2.0 || v[i] > m * 2.0)
                .collect()
        }
        _ => Vec::new(),
    }
}

fn sorted(v: impl IntoIterator<Item = f64>) -> Vec<f64> {
    let mut v: Vec<f64> = v.into_iter().collect();
    v.sort_by(f64::total_cmp);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_ranges_and_ratios() {
        assert_eq!(median([3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median([4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median([]), 0.0);
        assert_eq!(
            middle([4.0, 1.0, 2.0, 3.0]),
            3.0,
            "the upper of the middle two"
        );
        assert_eq!(middle([5.0, 1.0, 3.0]), 3.0);
        assert!(middle([]).is_nan());
        assert_eq!(median_of_all([Some(1.0), Some(3.0)]), Some(2.0));
        assert_eq!(median_of_all([Some(1.0), None]), None);
        assert_eq!(median_of_all([]), None);
        let s = Spread::of([110.0, 90.0, 100.0]);
        assert_eq!((s.min, s.median, s.max), (90.0, 100.0, 110.0));
        assert_eq!(ratio(3.0, 2.0), 1.5);
        // Issue 37's cliff: one run of three at a tenth.
        assert_eq!(outliers(&[3457.0, 368.0, 4099.0]), [1]);
        assert_eq!(outliers(&[3457.0, 2000.0, 4099.0]), [] as [usize; 0]);
        assert_eq!(outliers(&[368.0, 3457.0]), [0, 1]);
        assert_eq!(outliers(&[1900.0, 3457.0]), [] as [usize; 0]);
        assert_eq!(outliers(&[368.0]), [] as [usize; 0]);
        assert!(ratio(1.0, 0.0).is_nan());
    }
}
