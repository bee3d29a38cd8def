//! How `batching` shows its rows: aligned tables on stdout (throughput per setting,
//! latency per offered load with the settings side by side, the acceptance figures) and the
//! latency-against-load curves as SVG. It computes nothing that is not already in the rows.

use std::path::Path;

use plotters::prelude::*;

use super::acceptance::Acceptance;
use super::rows::{LatencyRow, StatsReader, ThroughputRow};
use super::{Setting, BEYOND_PEAK, LONE_CALLS, PACE_SPREAD};
use crate::harness::plot::{self, Svg};
use crate::harness::table::{aligned_table, fmt_us};

fn strings(xs: &[&str]) -> Vec<String> {
    xs.iter().map(|s| s.to_string()).collect()
}

/// `1.23×`, or `-` for a missing ratio.
fn times(x: f64) -> String {
    if x > 0.0 {
        format!("{x:.2}×")
    } else {
        "-".into()
    }
}

/// Prints a throughput sweep: median, range, batch sizes, ratio to B=1.
pub(super) fn print_throughput(title: &str, rows: &[ThroughputRow]) {
    let paced = rows.iter().any(|r| r.lone_call_us.is_some());
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let mut row = vec![
                r.setting.clone(),
                format!("{:.2}", r.median_mrps),
                format!("{:.2}–{:.2}", r.min_mrps, r.max_mrps),
                format!("{:.2}", r.client_mean_batch),
                format!("{:.2}", r.server_mean_batch),
                times(r.vs_b1),
                format!("{}/{}", r.client_preemptions, r.server_preemptions),
                format!("{:.0}", r.steal_ms),
            ];
            if paced {
                row.push(r.lone_call_us.map_or("-".into(), fmt_us));
            }
            row
        })
        .collect();
    let mut header = strings(&[
        "setting",
        "Mrps (median)",
        "min–max",
        "client batch",
        "server batch",
        "vs B=1",
        "preempted c/s",
        "steal ms",
    ]);
    if paced {
        header.push("lone call µs".into());
    }
    println!();
    println!("{title}");
    println!("{}", aligned_table(&header, &body));
    if paced {
        println!("  lone call µs: the host's pace, the median round trip of {LONE_CALLS} calls sent one at a time before each window; median over the rounds");
    }
}

/// Prints the latency sweep as one line per offered load, the settings side by side.
pub(super) fn print_latency(
    rows: &[LatencyRow],
    single: &[ThroughputRow],
    peak: f64,
    settings: &[Setting],
    loads: &[f64],
) {
    let mut header = strings(&["load", "offered Mrps"]);
    for s in settings {
        header.push(format!("{} p50", s.label()));
        header.push(format!("{} p99", s.label()));
    }
    let adaptive = settings
        .iter()
        .find(|s| matches!(s, Setting::Adaptive(_)))
        .map(|s| s.label());
    if let Some(a) = &adaptive {
        header.push(format!("{a} batch"));
    }
    header.push("preempted c/s".into());
    header.push("steal ms".into());
    let find = |label: &str, f: f64| {
        rows.iter()
            .find(|r| r.setting == label && r.load_fraction == f)
    };
    let body: Vec<Vec<String>> = loads
        .iter()
        .map(|&f| {
            let mut line = vec![
                format!("{:.0}%", f * 100.0),
                format!("{:.3}", f * peak / 1e6),
            ];
            for s in settings {
                match find(&s.label(), f) {
                    Some(r) => {
                        let mark = if r.saturated { "*" } else { "" };
                        line.push(format!("{}{mark}", fmt_us(r.p50_us)));
                        line.push(format!("{}{mark}", fmt_us(r.p99_us)));
                    }
                    None => line.extend(["-".to_string(), "-".to_string()]),
                }
            }
            if let Some(a) = &adaptive {
                line.push(find(a, f).map_or("-".into(), |r| format!("{:.2}", r.client_mean_batch)));
            }
            let at_load = rows.iter().filter(|r| r.load_fraction == f);
            let (c, s, steal) = at_load.fold((0, 0, 0.0), |(c, s, steal), r| {
                (
                    c + r.client_preemptions,
                    s + r.server_preemptions,
                    steal + r.steal_ms,
                )
            });
            line.push(format!("{c}/{s}"));
            line.push(format!("{steal:.0}"));
            line
        })
        .collect();
    let peaks: Vec<String> = settings
        .iter()
        .filter_map(|s| {
            let r = single.iter().find(|r| r.setting == s.label())?;
            Some(format!("{} {:.2}", r.setting, r.median_mrps))
        })
        .collect();
    println!();
    println!(
        "Fig. 6 (left): latency (µs) against offered load, open loop (Poisson arrivals), scheduled send → reply; load = fraction of the best peak, {:.2} Mrps",
        peak / 1e6
    );
    println!("{}", aligned_table(&header, &body));
    println!(
        "  * saturated (arrivals left unsent or < 90% achieved); - not run (offered > {BEYOND_PEAK} × the setting's peak). Peaks, Mrps: {}.\n  preempted c/s: involuntary context switches of the client thread / the server (yields included); steal ms: CPU time the hypervisor gave other guests (both CPUs); over all windows of the load",
        peaks.join(", ")
    );
}

/// Prints the stats reader comparison.
pub(super) fn print_stats_reader(r: &StatsReader) {
    println!(
        "  stats read every {} µs from another thread ({} reads): {} with / without, median of the rounds' ratios: {} ({:.2} / {:.2} Mrps); with / a thread waking as often and reading nothing: {} ({:.2} Mrps)",
        r.period_us,
        r.reads,
        r.setting,
        times(r.with_over_without),
        r.with_mrps,
        r.without_mrps,
        times(r.with_over_waker),
        r.waker_mrps,
    );
}

/// Prints the acceptance figures with whether each holds.
pub(super) fn print_acceptance(a: &Acceptance) {
    let yes = |b: bool| if b { "holds" } else { "does not hold" };
    println!();
    println!("Acceptance figures (reported, not asserted):");
    for l in &a.low_load {
        println!(
            "  p50 at {:.0}% load: adaptive / B=1, median of the {} rounds' ratios: {} (≤ 1.10: {}); pooled {} µs / {} µs = {}",
            l.load_fraction * 100.0,
            l.round_ratios.len(),
            times(l.adaptive_over_b1),
            yes(l.adaptive_over_b1 <= 1.1),
            fmt_us(l.adaptive_p50_us),
            fmt_us(l.b1_p50_us),
            times(l.adaptive_over_b1_pooled),
        );
    }
    if a.low_load.is_empty() {
        println!("  p50 at low load: no load ≤ 10% of the peak was measured for both settings");
    }
    println!(
        "  peak: adaptive(32) / best fixed ({}), median of the rounds' ratios: {} (≥ 0.90: {}); medians {:.2} / {:.2} Mrps = {}",
        a.best_fixed,
        times(a.adaptive_over_best_fixed),
        yes(a.adaptive_peak_within_10pct),
        a.adaptive_mrps,
        a.best_fixed_mrps,
        times(a.adaptive_over_best_fixed_medians),
    );
    println!(
        "  best single-core throughput: {} {:.2} Mrps (Dagger: 12.4 Mrps; ≥ 12.4: {})",
        a.best,
        a.best_mrps,
        yes(a.best_reaches_12_4_mrps)
    );
    println!(
        "  B=1 throughput: {:.2} Mrps (≥ 4: {})",
        a.b1_mrps,
        yes(a.b1_reaches_4_mrps)
    );
    println!(
        "  two client threads: best {} {:.2} Mrps; slowest {} at {} B=1's single-thread rate (≥ 0.50: {})",
        a.pairs_best,
        a.pairs_best_mrps,
        a.pairs_worst,
        times(a.pairs_worst_over_single_b1),
        yes(a.pairs_hold_half_of_single_b1)
    );
    let Some(p) = &a.pace else { return };
    println!(
        "  host pace (context only): the windows' lone-call medians ranged {}–{} µs (median {})",
        fmt_us(p.lone_call_us_min),
        fmt_us(p.lone_call_us_max),
        fmt_us(p.lone_call_us_median),
    );
    let Some(s) = &p.split else {
        println!("    one pace throughout (less than {PACE_SPREAD}× apart): not split");
        return;
    };
    let mrps = |m: Option<f64>, n: usize| match m {
        Some(m) => format!("{m:.2} Mrps ({n} windows)"),
        None => "-".into(),
    };
    println!(
        "    windows at or under the median: {} {}, B=1 {}; over it: {} {}, B=1 {}",
        a.best,
        mrps(s.best_quick_mrps, s.best_quick_windows),
        mrps(s.b1_quick_mrps, s.b1_quick_windows),
        a.best,
        mrps(s.best_slow_mrps, s.best_slow_windows),
        mrps(s.b1_slow_mrps, s.b1_slow_windows),
    );
}

/// Draws p50 (left) and p99 (right) latency against offered load per setting, log scale,
/// with each setting's closed-loop peak as a dashed vertical line (the paper's dotted
/// saturation lines); saturated points are hollow.
pub(super) fn plot(
    path: &Path,
    rows: &[LatencyRow],
    single: &[ThroughputRow],
    settings: &[Setting],
) -> anyhow::Result<()> {
    let colors = [RED, BLUE, RGBColor(0, 150, 0), MAGENTA, CYAN];
    let svg = Svg::create(path, (1200, 460))?;
    let peak = |s: &Setting| {
        single
            .iter()
            .find(|r| r.setting == s.label())
            .map_or(0.0, |r| r.median_mrps)
    };
    let x_max = rows
        .iter()
        .map(|r| r.offered_mrps)
        .chain(settings.iter().map(peak))
        .fold(0.0, f64::max)
        * 1.05;
    let values = rows.iter().flat_map(|r| [r.p50_us, r.p99_us]);
    let y_max = values.clone().fold(1.0, f64::max) * 1.5;
    let y_min = values.filter(|v| *v > 0.0).fold(y_max, f64::min) / 1.5;
    for (panel, (name, pick)) in svg.panels(2).iter().zip([
        ("p50", (|r: &LatencyRow| r.p50_us) as fn(&LatencyRow) -> f64),
        ("p99", |r: &LatencyRow| r.p99_us),
    ]) {
        let caption = format!("{name} latency against offered load, 64 B echo");
        let mut chart = plot::chart(panel, &caption, 18)
            .build_cartesian_2d(0.0..x_max.max(0.1), (y_min..y_max).log_scale())?;
        chart
            .configure_mesh()
            .x_desc("offered load (Mrps)")
            .y_desc(format!("{name} latency (µs, log scale)"))
            .y_label_formatter(&|y| {
                if *y >= 10.0 {
                    format!("{y:.0}")
                } else {
                    format!("{y:.1}")
                }
            })
            .draw()?;
        for (s, color) in settings.iter().zip(colors) {
            let mine: Vec<&LatencyRow> = rows.iter().filter(|r| r.setting == s.label()).collect();
            let series: Vec<(f64, f64)> = mine
                .iter()
                .map(|r| (r.offered_mrps, pick(r).max(y_min)))
                .collect();
            plot::line(&mut chart, &series, color, &s.label())?;
            // Saturated points hollow.
            chart.draw_series(mine.iter().map(|r| {
                let style = if r.saturated {
                    color.stroke_width(1)
                } else {
                    color.filled()
                };
                Circle::new((r.offered_mrps, pick(r).max(y_min)), 3, style)
            }))?;
            let p = peak(s);
            if p > 0.0 {
                chart.draw_series(DashedLineSeries::new(
                    vec![(p, y_min), (p, y_max)],
                    6,
                    4,
                    color.stroke_width(1),
                ))?;
            }
        }
        plot::legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
    }
    svg.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_read_as_times() {
        assert_eq!(times(0.0), "-");
        assert_eq!(times(1.234), "1.23×");
    }
}
