//! How `pass_by_reference` shows its rows: a table per experiment, the acceptance figures,
//! and the nested chain's curves as SVG. It computes nothing that is not already in the
//! rows and the summary.

use std::path::Path;

use plotters::prelude::*;

use super::experiments::Ctx;
use super::report::{find, Row, SizeRatio, Summary};
use super::{Forward, Placement, CHAIN_SIZES, LB_SIZES, MAX_HOPS};
use crate::harness::plot::{self, Svg};
use crate::harness::table::{aligned_table, fmt_bytes, fmt_us};

/// "1024", or "1024 (64 with 1 MiB)" when large arrays keep fewer in flight.
fn in_flight_note(ctx: &Ctx, sizes: &[usize]) -> String {
    let capped: Vec<String> = sizes
        .iter()
        .filter(|&&s| ctx.in_flight_for(s) < ctx.in_flight)
        .map(|&s| format!("{} with {}", ctx.in_flight_for(s), fmt_bytes(s)))
        .collect();
    if capped.is_empty() {
        ctx.in_flight.to_string()
    } else {
        format!("{} ({})", ctx.in_flight, capped.join(", "))
    }
}

fn bytes(x: f64) -> String {
    fmt_bytes(x.round() as usize)
}

fn times(x: Option<f64>) -> String {
    match x {
        Some(x) if x < 10.0 => format!("{x:.2}×"),
        Some(x) => format!("{x:.1}×"),
        None => "-".into(),
    }
}

/// Prints `title` and the table, unless `body` is empty (an experiment left out with --only).
fn section(title: &str, header: &[&str], body: &[Vec<String>]) {
    if !body.is_empty() {
        println!();
        println!("{title}");
        println!("{}", aligned_table(header, body));
    }
}

/// Prints the three experiments' tables (those that ran).
pub(super) fn print_tables(rows: &[Row], ctx: &Ctx) {
    let pair = |experiment: &str, a: &str, b: &str| -> Vec<(&Row, &Row)> {
        rows.iter()
            .filter(|r| r.experiment == experiment && r.variant == a)
            .filter_map(|x| {
                let y = find(rows, experiment, b, x.size_bytes, x.hops, x.write_fraction)?;
                Some((x, y))
            })
            .collect()
    };
    println!(
        "pass_by_reference: DmRPC §VI on one host; every tier a process in one domain; \
         {} ms windows × {} interleaved rounds; waiters spin {} µs then sleep{}; {} forwarding",
        ctx.window.as_millis(),
        ctx.rounds,
        ctx.spin_us,
        match (ctx.cpus, ctx.placement) {
            (None, _) | (_, Placement::None) => "",
            (_, Placement::Alternate) => "; pinned, tiers alternate between two CPUs",
            (_, Placement::Reader) => {
                "; pinned, the tier that reads the array on the second CPU, the client and forwarders on the first"
            }
            (_, Placement::Client) => "; client pinned, tiers on two CPUs as the kernel balances",
        },
        match ctx.forward {
            Forward::Pipelined => "pipelined",
            Forward::Async => "asynchronous",
            Forward::Blocking => "blocking",
        }
    );
    let body: Vec<Vec<String>> = pair("nested_chain", "by_value", "by_ref")
        .into_iter()
        .map(|(v, r)| {
            vec![
                fmt_bytes(v.size_bytes),
                v.hops.unwrap_or(0).to_string(),
                format!("{:.0}", v.throughput_per_s),
                format!("{:.0}", r.throughput_per_s),
                times(r.ratio_median_of_rounds),
                fmt_us(v.avg_latency_us),
                fmt_us(r.avg_latency_us),
                bytes(v.bytes_copied_per_call),
                bytes(r.bytes_copied_per_call),
                bytes(r.handle_bytes_per_call),
            ]
        })
        .collect();
    section(
        &format!(
            "(a) nested chain (Fig. 5): {} calls in flight; the last tier sums the array; \
             copied = payload + pool bytes per call, all processes",
            in_flight_note(ctx, &ctx.chain_sizes)
        ),
        &[
            "array",
            "hops",
            "value calls/s",
            "ref calls/s",
            "ref/value",
            "value avg µs",
            "ref avg µs",
            "value copied",
            "ref copied",
            "ref handles",
        ],
        &body,
    );
    let body: Vec<Vec<String>> = pair("cow", "cow", "copy")
        .into_iter()
        .map(|(c, p)| {
            let us = |x: Option<f64>| fmt_us(x.unwrap_or(0.0));
            vec![
                fmt_bytes(c.size_bytes),
                format!("{:.0}%", c.write_fraction.unwrap_or(0.0) * 100.0),
                format!("{:.0}", c.throughput_per_s),
                format!("{:.0}", p.throughput_per_s),
                times(c.ratio_median_of_rounds),
                fmt_us(c.avg_latency_us),
                fmt_us(p.avg_latency_us),
                us(c.create_ref_us),
                us(p.create_ref_us),
                us(p.copy_us),
                bytes(c.bytes_copied_per_call),
                bytes(p.bytes_copied_per_call),
                format!("{:.1}", c.pages_copied_per_call),
                format!("{:.1}", p.pages_copied_per_call),
            ]
        })
        .collect();
    section(
        "(b) copy-on-write vs copy (Figs. 7, 8): one operation at a time; create_ref = share() \
         + the callee's map (+ its copy, for copy); copied/pages = pool counters per op",
        &[
            "buffer",
            "written",
            "cow ops/s",
            "copy ops/s",
            "cow/copy",
            "cow avg µs",
            "copy avg µs",
            "cow create_ref µs",
            "copy create_ref µs",
            "of which copy µs",
            "cow copied",
            "copy copied",
            "cow pages",
            "copy pages",
        ],
        &body,
    );
    let body: Vec<Vec<String>> = pair("load_balancer", "by_value", "by_ref")
        .into_iter()
        .map(|(v, r)| {
            let b = |x: Option<f64>| bytes(x.unwrap_or(0.0));
            vec![
                fmt_bytes(v.size_bytes),
                format!("{:.0}", v.throughput_per_s),
                format!("{:.0}", r.throughput_per_s),
                times(r.ratio_median_of_rounds),
                fmt_us(v.avg_latency_us),
                fmt_us(r.avg_latency_us),
                b(v.forwarder_bytes_copied_per_call),
                b(r.forwarder_bytes_copied_per_call),
                b(r.forwarder_pool_bytes_copied_per_call),
                b(r.forwarder_handle_bytes_per_call),
                format!("{:.1}", v.forwarder_cpu_us_per_call.unwrap_or(0.0)),
                format!("{:.1}", r.forwarder_cpu_us_per_call.unwrap_or(0.0)),
            ]
        })
        .collect();
    section(
        &format!(
            "(c) load balancer (Fig. 6): client → lb → w0/w1 round robin, {} calls in flight; \
             copied/handles/cpu = per request inside the forwarder",
            in_flight_note(ctx, &LB_SIZES)
        ),
        &[
            "payload",
            "value req/s",
            "ref req/s",
            "ref/value",
            "value avg µs",
            "ref avg µs",
            "value copied",
            "ref copied",
            "ref pool copied",
            "ref handles",
            "value lb cpu µs",
            "ref lb cpu µs",
        ],
        &body,
    );
    let retries: u64 = rows.iter().map(|r| r.retries).sum();
    if retries > 0 {
        println!(
            "\n{retries} calls were retried after RESOURCE_EXHAUSTED (see `retries` in the JSON)"
        );
    }
}

/// Prints the acceptance figures.
pub(super) fn print_summary(s: &Summary) {
    let list = |v: &[SizeRatio], f: &dyn Fn(f64) -> String| -> String {
        v.iter()
            .map(|x| format!("{} {}", fmt_bytes(x.size_bytes), f(x.value)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let x = |v: f64| times(Some(v));
    let b = |v: f64| bytes(v);
    let us = |v: Option<f64>| v.map_or("-".into(), fmt_us);
    println!();
    println!(
        "Acceptance figures (ratios: median of the interleaved rounds; from totals in brackets)"
    );
    println!(
        "  nested chain, 7 hops, 64 KiB, by-ref / by-value throughput: {} ({})",
        times(s.chain_7hop_64k_ref_over_value),
        times(s.chain_7hop_64k_ref_over_value_totals)
    );
    println!(
        "  nested chain, 7-hop / 1-hop throughput, by ref: {}",
        list(&s.chain_ref_7hop_over_1hop, &x)
    );
    println!(
        "  nested chain, 7-hop / 1-hop throughput, by value: {}",
        list(&s.chain_value_7hop_over_1hop, &x)
    );
    println!(
        "  1 MiB, 0% written, cow / copy operations per second: {} ({})",
        times(s.cow_1m_0pct_ops_ratio),
        times(s.cow_1m_0pct_ops_ratio_totals)
    );
    println!(
        "  1 MiB create_ref: cow {} µs (share + map) vs copy {} µs (share + map + a {} µs \
         copy): {} faster",
        us(s.cow_1m_create_ref_us),
        us(s.copy_1m_create_ref_us),
        us(s.copy_1m_copy_us),
        times(s.create_ref_speedup_1m)
    );
    println!(
        "  load balancer, bytes the forwarder copies per request, by ref: {}",
        list(&s.lb_ref_forwarder_bytes_copied_per_call, &b)
    );
    println!(
        "  load balancer, Ref bytes the forwarder sends per request, by ref: {}",
        list(&s.lb_ref_forwarder_handle_bytes_per_call, &b)
    );
    println!(
        "  load balancer, bytes the forwarder copies per request, by value: {}",
        list(&s.lb_value_forwarder_bytes_copied_per_call, &b)
    );
}

/// Draws the nested-chain curves: throughput against hops, by value and by reference, one
/// panel per array size.
pub(super) fn plot(rows: &[Row], path: &Path) -> anyhow::Result<()> {
    let svg = Svg::create(path, (1200, 420))?;
    for (panel, &size) in svg.panels(CHAIN_SIZES.len()).iter().zip(&CHAIN_SIZES) {
        let mine: Vec<&Row> = rows
            .iter()
            .filter(|r| r.experiment == "nested_chain" && r.size_bytes == size)
            .collect();
        // Log scale: one hop is an order of magnitude above seven for small arrays.
        let top = mine.iter().map(|r| r.throughput_per_s).fold(1.0, f64::max) * 1.5;
        let bottom = mine
            .iter()
            .map(|r| r.throughput_per_s)
            .fold(top, f64::min)
            .max(1.0)
            / 1.5;
        let caption = format!("nested chain, {} array", fmt_bytes(size));
        let mut chart = plot::chart(panel, &caption, 18)
            .build_cartesian_2d(0.5f64..(MAX_HOPS as f64 + 0.5), (bottom..top).log_scale())?;
        chart
            .configure_mesh()
            .x_labels(MAX_HOPS as usize)
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| format!("{y:.0}"))
            .x_desc("nested RPC calls (hops)")
            .y_desc("calls/s (log scale)")
            .draw()?;
        for (variant, label, color) in [("by_value", "by value", RED), ("by_ref", "by ref", BLUE)] {
            let series: Vec<(f64, f64)> = mine
                .iter()
                .filter(|r| r.variant == variant)
                .map(|r| (f64::from(r.hops.unwrap_or(0)), r.throughput_per_s))
                .collect();
            plot::line_with_points(&mut chart, &series, color, label)?;
        }
        plot::legend(&mut chart, SeriesLabelPosition::MiddleRight)?;
    }
    svg.finish()
}
