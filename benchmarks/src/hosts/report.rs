//! What `cross_host` shows: the chain table (by value against by reference, per hops and
//! size) and the local-against-remote latency table, and the same figures as JSON. It
//! summarises rounds it is given; it never measures.

use std::path::Path;

use serde::Serialize;

use super::client::{Measured, Via};
use super::Args;
use crate::harness::json::{self, Machine};
use crate::harness::stats::{median_of, median_of_ratios};
use crate::harness::table::{aligned_table, fmt_bytes, fmt_us};

/// One point of the chain: its rounds by value and by reference (paired by index).
#[derive(Serialize, Debug)]
pub struct ChainPoint {
    pub hops: u32,
    pub size: usize,
    pub by_value: Vec<Measured>,
    pub by_ref: Vec<Measured>,
}

/// One path of the latency table and its rounds.
#[derive(Serialize, Debug)]
pub struct LatencyPoint {
    pub via: Via,
    pub rounds: Vec<Measured>,
}

fn rps(m: &Measured) -> f64 {
    if m.elapsed_s > 0.0 {
        m.calls as f64 / m.elapsed_s
    } else {
        0.0
    }
}

/// Medians over a variant's rounds.
#[derive(Serialize, Debug, Clone, Copy)]
pub struct Summary {
    pub calls_per_s: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub errors: u64,
}

fn summary(rounds: &[Measured]) -> Summary {
    let of = |f: fn(&Measured) -> f64| {
        median_of(&rounds.iter().map(f).collect::<Vec<_>>()).unwrap_or(0.0)
    };
    Summary {
        calls_per_s: of(rps),
        p50_us: of(|m| m.p50_us),
        p99_us: of(|m| m.p99_us),
        errors: rounds.iter().map(|m| m.errors).sum(),
    }
}

/// A chain point's figures: medians, and the medians of the rounds' ratios.
#[derive(Serialize, Debug)]
pub struct ChainSummary {
    pub hops: u32,
    pub size: usize,
    pub by_value: Summary,
    pub by_ref: Summary,
    /// Throughput by reference / by value.
    pub throughput_ratio: Option<f64>,
    /// p50 by value / by reference (above 1: by reference is faster).
    pub p50_ratio: Option<f64>,
}

fn chain_summary(point: &ChainPoint) -> ChainSummary {
    let tput = |ms: &[Measured]| ms.iter().map(rps).collect::<Vec<_>>();
    let p50 = |ms: &[Measured]| ms.iter().map(|m| m.p50_us).collect::<Vec<_>>();
    ChainSummary {
        hops: point.hops,
        size: point.size,
        by_value: summary(&point.by_value),
        by_ref: summary(&point.by_ref),
        throughput_ratio: median_of_ratios(&tput(&point.by_ref), &tput(&point.by_value)),
        p50_ratio: median_of_ratios(&p50(&point.by_value), &p50(&point.by_ref)),
    }
}

fn fmt_ratio(r: Option<f64>) -> String {
    r.map_or("-".into(), |r| format!("{r:.2}x"))
}

/// Prints both tables.
pub fn print(points: &[ChainPoint], latency: &[LatencyPoint], args: &Args) {
    println!(
        "cross_host: nested chain across two hosts, {} calls in flight, {} round(s) of {} ms",
        args.in_flight, args.rounds, args.window_ms
    );
    let header = [
        "size",
        "hops",
        "value/s",
        "value p50",
        "value p99",
        "ref/s",
        "ref p50",
        "ref p99",
        "tput ref/value",
        "p50 value/ref",
        "errors",
    ];
    let body: Vec<Vec<String>> = points
        .iter()
        .map(chain_summary)
        .map(|s| {
            vec![
                fmt_bytes(s.size),
                s.hops.to_string(),
                format!("{:.0}", s.by_value.calls_per_s),
                fmt_us(s.by_value.p50_us),
                fmt_us(s.by_value.p99_us),
                format!("{:.0}", s.by_ref.calls_per_s),
                fmt_us(s.by_ref.p50_us),
                fmt_us(s.by_ref.p99_us),
                fmt_ratio(s.throughput_ratio),
                fmt_ratio(s.p50_ratio),
                (s.by_value.errors + s.by_ref.errors).to_string(),
            ]
        })
        .collect();
    println!("{}\n", aligned_table(&header, &body));
    println!("one 64 B call through the same Channel type (p50/p99 in µs, medians of rounds)");
    let p50s = |l: &LatencyPoint| l.rounds.iter().map(|m| m.p50_us).collect::<Vec<_>>();
    let local = latency.iter().find(|l| l.via == Via::Local).map(p50s);
    let body: Vec<Vec<String>> = latency
        .iter()
        .map(|l| {
            let s = summary(&l.rounds);
            let vs_local = local
                .as_ref()
                .and_then(|local| median_of_ratios(&p50s(l), local));
            vec![
                via_name(l.via).into(),
                fmt_us(s.p50_us),
                fmt_us(s.p99_us),
                fmt_ratio(vs_local),
                s.errors.to_string(),
            ]
        })
        .collect();
    println!(
        "{}",
        aligned_table(&["path", "p50", "p99", "p50 vs local", "errors"], &body)
    );
}

fn via_name(via: Via) -> &'static str {
    match via {
        Via::Local => "local tier (netless)",
        Via::Egress => "remote tier via this host's gateway",
        Via::Direct => "remote tier via HTTP/2 to its gateway",
    }
}

#[derive(Serialize)]
struct Doc<'a> {
    experiment: &'static str,
    machine: Machine,
    in_flight: usize,
    rounds: usize,
    window_ms: u64,
    chain: Vec<ChainSummary>,
    chain_rounds: &'a [ChainPoint],
    latency: &'a [LatencyPoint],
}

/// Writes the figures and every round as JSON.
pub fn write_json(
    path: &Path,
    points: &[ChainPoint],
    latency: &[LatencyPoint],
    args: &Args,
) -> anyhow::Result<()> {
    let doc = Doc {
        experiment: "cross_host",
        machine: Machine::current(),
        in_flight: args.in_flight,
        rounds: args.rounds,
        window_ms: args.window_ms,
        chain: points.iter().map(chain_summary).collect(),
        chain_rounds: points,
        latency,
    };
    json::write(path, &doc)
}
