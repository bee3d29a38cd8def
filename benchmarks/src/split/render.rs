//! How `split_offload` shows its points: the table with each setup's knee and the
//! comparison at 20 µs, and the throughput curves as SVG. It computes nothing that is not
//! already in the points but the knee.

use std::path::Path;

use plotters::prelude::*;

use super::Point;
use crate::harness::plot::{self, Svg};
use crate::harness::table::fmt_bytes;

/// The first work level whose throughput is below 80% of the best at smaller work levels.
fn knee(points: &[&Point]) -> Option<u64> {
    let mut best: f64 = 0.0;
    for p in points {
        if best > 0.0 && p.throughput_calls_per_s < 0.8 * best {
            return Some(p.work_us);
        }
        best = best.max(p.throughput_calls_per_s);
    }
    None
}

/// Prints every point, then each setup's knee and the two setups at 20 µs.
pub(super) fn print_table(points: &[Point], in_flight: usize, sizes: &[usize]) {
    println!("split_offload: business logic of W µs, {in_flight} calls in flight (closed loop)");
    println!("baseline: one tonic process does HTTP/2 and the logic (core B);");
    println!("split: netless gateway (core A) → netless → logic process (core B);");
    println!("the load generator (h2, one thread) runs on core A in both");
    println!();
    println!(
        "{:>8} {:>6} {:>9} {:>11} {:>9} {:>9} {:>9}  cpu % of a core",
        "message", "W µs", "setup", "calls/s", "p50 µs", "p90 µs", "p99 µs"
    );
    for p in points {
        let cpu: Vec<String> = p
            .cpu_percent
            .iter()
            .map(|(name, pct)| format!("{name} {pct:.0}"))
            .collect();
        println!(
            "{:>8} {:>6} {:>9} {:>11.0} {:>9.1} {:>9.1} {:>9.1}  {}",
            fmt_bytes(p.payload_bytes),
            p.work_us,
            p.setup,
            p.throughput_calls_per_s,
            p.p50_us,
            p.p90_us,
            p.p99_us,
            cpu.join(", ")
        );
    }
    println!();
    for &size in sizes {
        for setup in ["baseline", "split"] {
            let series: Vec<&Point> = points
                .iter()
                .filter(|p| p.payload_bytes == size && p.setup == setup)
                .collect();
            match knee(&series) {
                Some(w) => println!(
                    "knee ({}, {setup}): throughput drops below 80% of its plateau at {w} µs",
                    fmt_bytes(size)
                ),
                None => println!(
                    "knee ({}, {setup}): none up to {} µs",
                    fmt_bytes(size),
                    series.last().map_or(0, |p| p.work_us)
                ),
            }
        }
        let at = |setup: &str| {
            points
                .iter()
                .find(|p| p.payload_bytes == size && p.setup == setup && p.work_us == 20)
                .map(|p| p.throughput_calls_per_s)
        };
        if let (Some(b), Some(s)) = (at("baseline"), at("split")) {
            println!(
                "at 20 µs ({}): split {s:.0} calls/s vs baseline {b:.0} calls/s ({:.2}×)",
                fmt_bytes(size),
                s / b
            );
        }
    }
}

/// Draws throughput against business-logic time, one panel per message size.
pub(super) fn plot(points: &[Point], path: &Path, sizes: &[usize]) -> anyhow::Result<()> {
    let svg = Svg::create(path, (900, 420))?;
    for (panel, &size) in svg.panels(sizes.len()).iter().zip(sizes) {
        let mine: Vec<&Point> = points.iter().filter(|p| p.payload_bytes == size).collect();
        let top = mine
            .iter()
            .map(|p| p.throughput_calls_per_s)
            .fold(1.0, f64::max)
            * 1.1;
        let right = mine.iter().map(|p| p.work_us as f64).fold(1.0, f64::max) * 1.04;
        let mut chart = plot::chart(panel, &format!("{} message", fmt_bytes(size)), 18)
            .build_cartesian_2d(0f64..right, 0f64..top)?;
        chart
            .configure_mesh()
            .x_desc("business logic (µs)")
            .y_desc("calls/s")
            .draw()?;
        for (setup, color) in [("baseline", RED), ("split", BLUE)] {
            let series: Vec<(f64, f64)> = mine
                .iter()
                .filter(|p| p.setup == setup)
                .map(|p| (p.work_us as f64, p.throughput_calls_per_s))
                .collect();
            plot::line_with_points(&mut chart, &series, color, setup)?;
        }
        plot::legend(&mut chart, SeriesLabelPosition::MiddleRight)?;
    }
    svg.finish()
}
