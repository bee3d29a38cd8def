//! Medians and the ratios of interleaved measurements: the robust summaries the benchmarks
//! report on a shared, noisy host. It owns the arithmetic only; which figures are compared
//! is each benchmark's business.

/// The median of `xs`, or `None` when it is empty.
pub fn median_of(xs: &[f64]) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// The median of `xs` (0 if empty).
pub fn median(xs: &[f64]) -> f64 {
    median_of(xs).unwrap_or(0.0)
}

/// The median of `xs`, or `otherwise` when it is empty.
pub fn median_or(xs: &[f64], otherwise: f64) -> f64 {
    median_of(xs).unwrap_or(otherwise)
}

/// `a / b`, or `None` unless `b` is positive.
pub fn ratio(a: f64, b: f64) -> Option<f64> {
    (b > 0.0).then(|| a / b)
}

/// Round by round `num / den`, for two settings measured side by side in each round (a
/// round whose `den` is not positive is left out): a drift of the host between rounds
/// cancels instead of landing on one setting.
pub fn paired_ratios(num: &[f64], den: &[f64]) -> Vec<f64> {
    num.iter()
        .zip(den)
        .filter_map(|(&n, &d)| ratio(n, d))
        .collect()
}

/// The median of the paired ratios of `num` over `den` ([`paired_ratios`]).
pub fn median_of_ratios(num: &[f64], den: &[f64]) -> Option<f64> {
    median_of(&paired_ratios(num, den))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_paired_ratios() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
        assert_eq!(median_or(&[], 7.0), 7.0);
        assert_eq!(
            paired_ratios(&[2.0, 3.0, 4.0], &[1.0, 0.0, 2.0]),
            [2.0, 2.0]
        );
        assert_eq!(
            median_of_ratios(&[2.0, 9.0, 3.0], &[1.0, 3.0, 1.0]),
            Some(3.0)
        );
        assert_eq!(median_of_ratios(&[1.0], &[0.0]), None);
        assert_eq!(ratio(1.0, 0.0), None);
    }
}
