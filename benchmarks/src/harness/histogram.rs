//! Latency histograms (hdrhistogram, nanoseconds) and the figures read off them, in µs. It
//! owns their bounds and what an empty one reads as (zero); it never decides which
//! quantiles a benchmark reports.

use hdrhistogram::Histogram;

/// Highest value a latency histogram can hold: 60 s in nanoseconds.
pub const HISTOGRAM_MAX_NS: u64 = 60_000_000_000;

/// A latency histogram in nanoseconds, 1 ns .. 60 s, 3 significant figures.
///
/// Record with `hist.saturating_record(ns)` so an outlier above 60 s cannot fail a run.
pub fn new_histogram() -> Histogram<u64> {
    Histogram::<u64>::new_with_bounds(1, HISTOGRAM_MAX_NS, 3)
        .expect("valid histogram bounds (1 ns .. 60 s, 3 significant figures)")
}

/// The value at quantile `q` of a histogram of ns, in µs (0 when empty).
pub fn quantile_us(h: &Histogram<u64>, q: f64) -> f64 {
    if h.is_empty() {
        0.0
    } else {
        h.value_at_quantile(q) as f64 / 1e3
    }
}

/// The mean of a histogram of ns, in µs (0 when empty).
pub fn mean_us(h: &Histogram<u64>) -> f64 {
    if h.is_empty() {
        0.0
    } else {
        h.mean() / 1e3
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_in_microseconds_and_zero_when_empty() {
        let mut h = new_histogram();
        for ns in [1_000u64, 2_000, 3_000, 4_000] {
            h.record(ns).unwrap();
        }
        assert!((mean_us(&h) - 2.5).abs() < 0.01);
        assert!((quantile_us(&h, 0.5) - 2.0).abs() < 0.01);
        assert!((quantile_us(&h, 0.999) - 4.0).abs() < 0.01);
        let empty = new_histogram();
        assert_eq!((mean_us(&empty), quantile_us(&empty, 0.5)), (0.0, 0.0));
    }
}
