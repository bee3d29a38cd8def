//! The figures `batching` is judged by ([`Acceptance`], reported, not asserted): adaptive
//! batching against the best fixed setting at the peak, and against B=1 at low load, by the
//! median of the rounds' paired ratios; and the host's pace as context ([`Pace`]). It
//! computes from the rows; it never measures.

use serde::Serialize;

use super::rows::{LatencyRow, ThroughputRow};
use super::{is_low_load, Setting, ADAPTIVE_MAX, PACE_SPREAD};
use crate::harness::stats::{median, median_or, paired_ratios};

/// The figures the acceptance criteria name (reported, not asserted).
#[derive(Clone, Debug, Serialize)]
pub(super) struct Acceptance {
    /// The best fixed setting of the single-client sweep and its median throughput.
    pub(super) best_fixed: String,
    pub(super) best_fixed_mrps: f64,
    /// The best setting overall (the latency sweep's reference peak).
    pub(super) best: String,
    pub(super) best_mrps: f64,
    pub(super) b1_mrps: f64,
    pub(super) adaptive_mrps: f64,
    /// adaptive(32) / best fixed: the median of the rounds' ratios (each round measures
    /// both side by side, so the host's drifts cancel); holds at ≥ 0.9.
    pub(super) adaptive_over_best_fixed: f64,
    /// The same from the two settings' median throughputs.
    pub(super) adaptive_over_best_fixed_medians: f64,
    pub(super) adaptive_peak_within_10pct: bool,
    /// At each load ≤ 10% of the peak: adaptive p50 / B=1 p50; holds at ≤ 1.1 everywhere.
    pub(super) low_load: Vec<LowLoad>,
    pub(super) adaptive_low_load_p50_within_10pct: Option<bool>,
    /// Dagger's figures: 12.4 Mrps best (UPI, B = 4), 4 Mrps with B = 1 (doorbells ~4.3).
    pub(super) best_reaches_12_4_mrps: bool,
    pub(super) b1_reaches_4_mrps: bool,
    /// The two-client sweep's best setting and median throughput.
    pub(super) pairs_best: String,
    pub(super) pairs_best_mrps: f64,
    /// The two-client sweep's slowest setting, and its median throughput over B=1's with
    /// one client thread: four busy threads on two CPUs hold at ≥ 0.5.
    pub(super) pairs_worst: String,
    pub(super) pairs_worst_over_single_b1: f64,
    pub(super) pairs_hold_half_of_single_b1: bool,
    /// Context only; not an acceptance criterion.
    pub(super) pace: Option<Pace>,
}

/// How the host's pace moved the single-client throughput.
#[derive(Clone, Debug, Serialize)]
pub(super) struct Pace {
    /// The windows' lone-call medians (one per window of the sweep): least, median, most.
    pub(super) lone_call_us_min: f64,
    pub(super) lone_call_us_median: f64,
    pub(super) lone_call_us_max: f64,
    /// Only when the most is at least `PACE_SPREAD` times the least: the windows split at
    /// the median lone call into quick (at most it) and slow ones.
    pub(super) split: Option<PaceSplit>,
}

/// Median throughput (Mrps) and windows on each side of the pace split; `None` for a side
/// with no window of that setting.
#[derive(Clone, Debug, Serialize)]
pub(super) struct PaceSplit {
    pub(super) best_quick_mrps: Option<f64>,
    pub(super) best_slow_mrps: Option<f64>,
    pub(super) best_quick_windows: usize,
    pub(super) best_slow_windows: usize,
    pub(super) b1_quick_mrps: Option<f64>,
    pub(super) b1_slow_mrps: Option<f64>,
    pub(super) b1_quick_windows: usize,
    pub(super) b1_slow_windows: usize,
}

impl Pace {
    fn of(single: &[ThroughputRow], best: &str) -> Option<Pace> {
        let all: Vec<f64> = single
            .iter()
            .flat_map(|r| r.round_lone_call_us.iter().copied())
            .collect();
        if all.is_empty() {
            return None;
        }
        let threshold = median(&all);
        let least = all.iter().copied().fold(f64::INFINITY, f64::min);
        let most = all.iter().copied().fold(0.0, f64::max);
        // One setting's windows: (quick median, quick windows, slow median, slow windows).
        let side = |setting: &str| {
            let (mut quick, mut slow) = (Vec::new(), Vec::new());
            if let Some(r) = single.iter().find(|r| r.setting == setting) {
                for (&mrps, &us) in r.round_mrps.iter().zip(&r.round_lone_call_us) {
                    if us <= threshold {
                        quick.push(mrps);
                    } else {
                        slow.push(mrps);
                    }
                }
            }
            let of = |v: &[f64]| (!v.is_empty()).then(|| median(v));
            (of(&quick), quick.len(), of(&slow), slow.len())
        };
        let split = (most >= PACE_SPREAD * least).then(|| {
            let best = side(best);
            let b1 = side(&Setting::Fixed(1).label());
            PaceSplit {
                best_quick_mrps: best.0,
                best_quick_windows: best.1,
                best_slow_mrps: best.2,
                best_slow_windows: best.3,
                b1_quick_mrps: b1.0,
                b1_quick_windows: b1.1,
                b1_slow_mrps: b1.2,
                b1_slow_windows: b1.3,
            }
        });
        Some(Pace {
            lone_call_us_min: least,
            lone_call_us_median: threshold,
            lone_call_us_max: most,
            split,
        })
    }
}

#[derive(Clone, Debug, Serialize)]
pub(super) struct LowLoad {
    pub(super) load_fraction: f64,
    /// p50 over all the rounds' calls pooled, µs.
    pub(super) b1_p50_us: f64,
    pub(super) adaptive_p50_us: f64,
    /// adaptive p50 / B=1 p50: the median of the rounds' ratios (the pooled ratio if the
    /// rounds do not pair up); holds at ≤ 1.1.
    pub(super) adaptive_over_b1: f64,
    /// The same from the pooled p50s.
    pub(super) adaptive_over_b1_pooled: f64,
    /// Each round's adaptive p50 / B=1 p50.
    pub(super) round_ratios: Vec<f64>,
}

/// The row of the highest median throughput (among the fixed settings only, if asked).
pub(super) fn best_row(rows: &[ThroughputRow], fixed_only: bool) -> Option<&ThroughputRow> {
    rows.iter()
        .filter(|r| !fixed_only || r.batch_mode == "fixed")
        .max_by(|a, b| a.median_mrps.total_cmp(&b.median_mrps))
}

/// The acceptance figures of a run, from its rows.
pub(super) fn acceptance(
    single: &[ThroughputRow],
    pairs: &[ThroughputRow],
    latency: &[LatencyRow],
) -> Acceptance {
    let by = |rows: &[ThroughputRow], s: Setting| {
        rows.iter()
            .find(|r| r.setting == s.label())
            .map_or(0.0, |r| r.median_mrps)
    };
    let best_of = |rows: &[ThroughputRow], fixed_only: bool| {
        best_row(rows, fixed_only)
            .map_or((String::new(), 0.0), |r| (r.setting.clone(), r.median_mrps))
    };
    let (best_fixed, best_fixed_mrps) = best_of(single, true);
    let (best, best_mrps) = best_of(single, false);
    let (pairs_best, pairs_best_mrps) = best_of(pairs, false);
    let adaptive_mrps = by(single, Setting::Adaptive(ADAPTIVE_MAX));
    let b1_mrps = by(single, Setting::Fixed(1));
    let (pairs_worst, pairs_worst_mrps) = pairs
        .iter()
        .min_by(|a, b| a.median_mrps.total_cmp(&b.median_mrps))
        .map_or((String::new(), 0.0), |r| (r.setting.clone(), r.median_mrps));
    let pairs_worst_over_single_b1 = if b1_mrps > 0.0 {
        pairs_worst_mrps / b1_mrps
    } else {
        0.0
    };
    let row = |s: Setting, fraction: f64| {
        latency
            .iter()
            .find(|r| r.setting == s.label() && r.load_fraction == fraction)
    };
    let mut fractions: Vec<f64> = latency
        .iter()
        .map(|r| r.load_fraction)
        .filter(|&f| is_low_load(f))
        .collect();
    fractions.dedup();
    let low_load: Vec<LowLoad> = fractions
        .into_iter()
        .filter_map(|f| {
            let b1 = row(Setting::Fixed(1), f)?;
            let adaptive = row(Setting::Adaptive(ADAPTIVE_MAX), f)?;
            let pooled = if b1.p50_us > 0.0 {
                adaptive.p50_us / b1.p50_us
            } else {
                0.0
            };
            // Round by round, as for the peak: the two settings ran back to back at this
            // load in each round (a setting runs at a load in every round or in none, so
            // equal counts pair up), and a drift of the host's pace between rounds cancels
            // instead of landing on one setting.
            let round_ratios = if adaptive.round_p50_us.len() == b1.round_p50_us.len() {
                paired_ratios(&adaptive.round_p50_us, &b1.round_p50_us)
            } else {
                Vec::new()
            };
            Some(LowLoad {
                load_fraction: f,
                b1_p50_us: b1.p50_us,
                adaptive_p50_us: adaptive.p50_us,
                adaptive_over_b1: median_or(&round_ratios, pooled),
                adaptive_over_b1_pooled: pooled,
                round_ratios,
            })
        })
        .collect();
    let adaptive_over_best_fixed_medians = if best_fixed_mrps > 0.0 {
        adaptive_mrps / best_fixed_mrps
    } else {
        0.0
    };
    // Round by round: adaptive and the best fixed setting were measured in the same round.
    let adaptive_row = single
        .iter()
        .find(|r| r.setting == Setting::Adaptive(ADAPTIVE_MAX).label());
    let round_ratios = match (adaptive_row, best_row(single, true)) {
        (Some(a), Some(b)) => paired_ratios(&a.round_mrps, &b.round_mrps),
        _ => Vec::new(),
    };
    let adaptive_over_best_fixed = median_or(&round_ratios, adaptive_over_best_fixed_medians);
    let pace = Pace::of(single, &best);
    Acceptance {
        best_fixed,
        best_fixed_mrps,
        best,
        best_mrps,
        b1_mrps,
        adaptive_mrps,
        adaptive_over_best_fixed,
        adaptive_over_best_fixed_medians,
        adaptive_peak_within_10pct: adaptive_over_best_fixed >= 0.9,
        adaptive_low_load_p50_within_10pct: (!low_load.is_empty())
            .then(|| low_load.iter().all(|l| l.adaptive_over_b1 <= 1.1)),
        low_load,
        best_reaches_12_4_mrps: best_mrps >= 12.4,
        b1_reaches_4_mrps: b1_mrps >= 4.0,
        pairs_best,
        pairs_best_mrps,
        pairs_worst,
        pairs_worst_over_single_b1,
        pairs_hold_half_of_single_b1: !pairs.is_empty() && pairs_worst_over_single_b1 >= 0.5,
        pace,
    }
}
