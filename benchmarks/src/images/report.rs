//! What `image_app` shows: per transport the unloaded latency, the closed-loop peak, the
//! SLO (10× the unloaded latency), the throughput at SLO and the CPU per request with the tier
//! that takes most of it; every window's figures; the ratios to tcp; the same as JSON, and
//! the plot. It summarises windows it is given; it never measures.

use std::path::Path;

use plotters::prelude::*;
use serde::Serialize;

use super::client::{Measured, Transport};
use super::picture::{Picture, PictureInfo};
use super::tier::{Serving, Stage};
use super::Args;
use crate::harness::json::{self, Machine};
use crate::harness::plot::{self, Svg};
use crate::harness::table::{aligned_table, fmt_us};
use crate::harness::Peer;

/// The SLO: p99 within this many times the transport's unloaded latency.
///
/// The unloaded latency is the mean of the sequential calls, not their p50: the pictures
/// sent in turn cost from one to ten units of work, so the calls' latencies fall in as many
/// clusters, and the p50 of such a mix jumps between two of them from run to run.
pub const SLO_FACTOR: f64 = 10.0;

/// One open-loop window.
#[derive(Serialize, Debug)]
pub struct Point {
    pub transport: Transport,
    /// Of the transport's closed-loop peak.
    pub fraction: f64,
    pub offered_per_s: f64,
    pub measured: Measured,
}

/// Everything a run measured, and what it ran.
#[derive(Debug)]
pub struct Run {
    /// The tier processes, in the order of the CPU times of a window.
    pub tiers: Vec<(Serving, Stage)>,
    pub pictures: Vec<PictureInfo>,
    pub sizes: Vec<String>,
    pub in_flight: usize,
    pub window_ms: u64,
    pub spin_us: u64,
    pub unloaded: Vec<(Transport, Measured)>,
    pub peaks: Vec<(Transport, Measured)>,
    pub points: Vec<Point>,
}

/// A window's figures.
#[derive(Serialize, Debug, Clone)]
pub struct Figures {
    pub transport: Transport,
    pub fraction: f64,
    pub offered_per_s: f64,
    pub achieved_per_s: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    /// CPU time of every tier and the client over the window, per reply received in it.
    pub cpu_ms_per_request: f64,
    /// CPUs busy on average over the window (tiers and client).
    pub cpus_busy: f64,
    /// CPUs other processes kept busy on average over the window (the machine's busy time
    /// less the run's): above zero, the run did not have the machine to itself.
    pub other_cpus_busy: f64,
    /// Each tier's CPU time per request, in [`Stage::ALL`] order, then the client's.
    pub tier_cpu_ms_per_request: Vec<f64>,
    pub client_cpu_ms_per_request: f64,
    pub errors: u64,
    pub unfinished: u64,
    pub mismatches: u64,
}

/// A transport's summary.
#[derive(Serialize, Debug, Clone)]
pub struct Summary {
    pub transport: Transport,
    pub unloaded_p50_us: f64,
    pub unloaded_p99_us: f64,
    pub unloaded_mean_us: f64,
    pub slo_us: f64,
    pub closed_loop_peak_per_s: f64,
    /// The highest achieved throughput whose p99 is within the SLO (0: none was).
    pub throughput_at_slo_per_s: f64,
    /// The same within tcp's SLO (one latency bound for every transport).
    pub throughput_at_tcp_slo_per_s: f64,
    /// The window that gave it (else the transport's lowest load), whose CPU it reports.
    pub at: Figures,
    /// The tier with the most CPU per request in that window, and its share of the total.
    pub bounding_tier: String,
    pub bounding_share: f64,
    pub errors: u64,
    pub mismatches: u64,
}

impl Run {
    pub fn new(
        tiers: &[(Serving, Stage, Peer)],
        pictures: &[Picture],
        args: &Args,
        window_ms: u64,
    ) -> Run {
        Run {
            tiers: tiers.iter().map(|(s, t, _)| (*s, *t)).collect(),
            pictures: pictures.iter().map(Picture::info).collect(),
            sizes: args.sizes.clone(),
            in_flight: args.in_flight,
            window_ms,
            spin_us: args.spin_us,
            unloaded: Vec::new(),
            peaks: Vec::new(),
            points: Vec::new(),
        }
    }

    /// The closed-loop throughput of `transport` (0 if not measured).
    pub fn peak_per_s(&self, transport: Transport) -> f64 {
        self.peaks
            .iter()
            .find(|(t, _)| *t == transport)
            .map_or(0.0, |(_, m)| rate(m))
    }

    fn figures(&self, transport: Transport, fraction: f64, offered: f64, m: &Measured) -> Figures {
        let calls = m.calls.max(1) as f64;
        let mut per_tier = vec![0.0; Stage::ALL.len()];
        for ((_, stage), ms) in self.tiers.iter().zip(&m.cpu_ms) {
            if let Some(i) = Stage::ALL.iter().position(|s| s == stage) {
                per_tier[i] += ms / calls;
            }
        }
        let client = m.client_cpu_ms / calls;
        let total: f64 = per_tier.iter().sum::<f64>() + client;
        let busy_ms: f64 = m.cpu_ms.iter().sum::<f64>() + m.client_cpu_ms;
        Figures {
            transport,
            fraction,
            offered_per_s: offered,
            achieved_per_s: rate(m),
            p50_us: m.p50_us,
            p99_us: m.p99_us,
            cpu_ms_per_request: total,
            cpus_busy: busy_ms / 1e3 / m.window_s.max(1e-9),
            other_cpus_busy: (m.machine_cpu_ms - busy_ms).max(0.0) / 1e3 / m.window_s.max(1e-9),
            tier_cpu_ms_per_request: per_tier,
            client_cpu_ms_per_request: client,
            errors: m.errors,
            unfinished: m.unfinished,
            mismatches: m.mismatches,
        }
    }

    /// Every open-loop window's figures.
    pub fn all_figures(&self) -> Vec<Figures> {
        self.points
            .iter()
            .map(|p| self.figures(p.transport, p.fraction, p.offered_per_s, &p.measured))
            .collect()
    }

    pub fn summaries(&self) -> Vec<Summary> {
        let figures = self.all_figures();
        let slo_of = |t: Transport| {
            self.unloaded
                .iter()
                .find(|(u, _)| *u == t)
                .map(|(_, m)| SLO_FACTOR * m.mean_us)
        };
        let tcp_slo = slo_of(Transport::Tcp).unwrap_or(0.0);
        Transport::ALL
            .iter()
            .filter_map(|&t| {
                let (_, unloaded) = self.unloaded.iter().find(|(u, _)| *u == t)?;
                let slo = slo_of(t)?;
                let mine: Vec<&Figures> = figures.iter().filter(|f| f.transport == t).collect();
                let best_within = |slo: f64| {
                    mine.iter()
                        .filter(|f| f.p99_us <= slo && f.errors == 0 && f.achieved_per_s > 0.0)
                        .max_by(|a, b| a.achieved_per_s.total_cmp(&b.achieved_per_s))
                };
                let within = best_within(slo);
                let at = within
                    .or_else(|| mine.iter().min_by(|a, b| a.fraction.total_cmp(&b.fraction)))?;
                let (bounding, cpu) = Stage::ALL
                    .iter()
                    .zip(&at.tier_cpu_ms_per_request)
                    .max_by(|a, b| a.1.total_cmp(b.1))?;
                Some(Summary {
                    transport: t,
                    unloaded_p50_us: unloaded.p50_us,
                    unloaded_p99_us: unloaded.p99_us,
                    unloaded_mean_us: unloaded.mean_us,
                    slo_us: slo,
                    closed_loop_peak_per_s: self.peak_per_s(t),
                    throughput_at_slo_per_s: within.map_or(0.0, |f| f.achieved_per_s),
                    throughput_at_tcp_slo_per_s: best_within(tcp_slo)
                        .map_or(0.0, |f| f.achieved_per_s),
                    at: (*at).clone(),
                    bounding_tier: bounding.name().to_lowercase(),
                    bounding_share: cpu / at.cpu_ms_per_request.max(1e-9),
                    errors: mine.iter().map(|f| f.errors).sum::<u64>()
                        + unloaded.errors
                        + self.peak_errors(t),
                    mismatches: mine.iter().map(|f| f.mismatches).sum::<u64>()
                        + unloaded.mismatches,
                })
            })
            .collect()
    }

    fn peak_errors(&self, t: Transport) -> u64 {
        self.peaks
            .iter()
            .filter(|(p, _)| *p == t)
            .map(|(_, m)| m.errors + m.mismatches)
            .sum()
    }

    /// Throughput at SLO of `num` over `den`'s: each within its own SLO, or (`common`) both
    /// within tcp's.
    fn slo_ratio(
        summaries: &[Summary],
        num: Transport,
        den: Transport,
        common: bool,
    ) -> Option<f64> {
        let of = |t| summaries.iter().find(|s: &&Summary| s.transport == t);
        let at = |s: &Summary| {
            if common {
                s.throughput_at_tcp_slo_per_s
            } else {
                s.throughput_at_slo_per_s
            }
        };
        let (n, d) = (at(of(num)?), at(of(den)?));
        (d > 0.0).then(|| n / d)
    }

    /// Prints the summary, the windows and the CPU per tier.
    pub fn print(&self) {
        let pictures: Vec<String> = self
            .pictures
            .iter()
            .map(|p| {
                format!(
                    "{}x{} {} ({} KiB)",
                    p.width,
                    p.height,
                    p.format,
                    p.bytes >> 10
                )
            })
            .collect();
        println!(
            "image_app: 7-tier image service, {} in flight at most, {} ms windows; pictures: {}",
            self.in_flight,
            self.window_ms,
            pictures.join(", ")
        );
        let summaries = self.summaries();
        let body: Vec<Vec<String>> = summaries
            .iter()
            .map(|s| {
                vec![
                    s.transport.name().into(),
                    fmt_us(s.unloaded_p50_us),
                    fmt_us(s.unloaded_p99_us),
                    fmt_us(s.unloaded_mean_us),
                    fmt_us(s.slo_us),
                    format!("{:.1}", s.closed_loop_peak_per_s),
                    format!("{:.1}", s.throughput_at_slo_per_s),
                    format!("{:.1}", s.throughput_at_tcp_slo_per_s),
                    format!("{:.2}", s.at.cpu_ms_per_request),
                    format!("{} ({:.0}%)", s.bounding_tier, s.bounding_share * 100.0),
                    (s.errors + s.mismatches).to_string(),
                ]
            })
            .collect();
        let header = [
            "transport",
            "unloaded p50 µs",
            "p99 µs",
            "mean µs",
            "SLO µs",
            "peak/s",
            "at SLO/s",
            "at tcp SLO/s",
            "CPU ms/req",
            "top tier (CPU share)",
            "errors",
        ];
        println!("{}\n", aligned_table(&header, &body));
        for (num, label) in [
            (Transport::ByRef, "by_ref / tcp"),
            (Transport::ByValue, "by_value / tcp"),
        ] {
            let ratio = |common| {
                Run::slo_ratio(&summaries, num, Transport::Tcp, common)
                    .map_or("- (tcp met its SLO at no load)".to_string(), |r| {
                        format!("{r:.2}x")
                    })
            };
            println!(
                "throughput at SLO, {label}: {} (each within its own SLO), {} (both within tcp's)",
                ratio(false),
                ratio(true)
            );
        }
        println!();
        let mut header: Vec<String> = [
            "transport",
            "load",
            "offered/s",
            "achieved/s",
            "p50 µs",
            "p99 µs",
            "CPU ms/req",
            "CPUs busy",
            "others",
        ]
        .map(String::from)
        .to_vec();
        header.extend(Stage::ALL.iter().map(|s| s.name().to_lowercase()));
        header.extend(["client".into(), "err/unf/bad".into()]);
        let body: Vec<Vec<String>> = self
            .all_figures()
            .iter()
            .map(|f| {
                let mut row = vec![
                    f.transport.name().into(),
                    format!("{:.0}%", f.fraction * 100.0),
                    format!("{:.1}", f.offered_per_s),
                    format!("{:.1}", f.achieved_per_s),
                    fmt_us(f.p50_us),
                    fmt_us(f.p99_us),
                    format!("{:.2}", f.cpu_ms_per_request),
                    format!("{:.2}", f.cpus_busy),
                    format!("{:.2}", f.other_cpus_busy),
                ];
                row.extend(f.tier_cpu_ms_per_request.iter().map(|c| format!("{c:.2}")));
                row.push(format!("{:.2}", f.client_cpu_ms_per_request));
                row.push(format!("{}/{}/{}", f.errors, f.unfinished, f.mismatches));
                row
            })
            .collect();
        println!(
            "every window (CPU per tier and client in ms per request; CPUs busy: this run's \
             processes, others: the rest of the machine's)"
        );
        println!("{}", aligned_table(&header, &body));
    }

    /// Writes the summaries, the ratios and every window as JSON.
    pub fn write_json(&self, path: &Path) -> anyhow::Result<()> {
        #[derive(Serialize)]
        struct Doc<'a> {
            experiment: &'static str,
            machine: Machine,
            sizes: &'a [String],
            pictures: &'a [PictureInfo],
            in_flight: usize,
            window_ms: u64,
            spin_us: u64,
            slo_factor: f64,
            tiers: Vec<String>,
            summary: Vec<Summary>,
            by_ref_over_tcp_at_slo: Option<f64>,
            by_value_over_tcp_at_slo: Option<f64>,
            by_ref_over_tcp_at_tcp_slo: Option<f64>,
            by_value_over_tcp_at_tcp_slo: Option<f64>,
            windows: Vec<Figures>,
            unloaded: &'a [(Transport, Measured)],
            peaks: &'a [(Transport, Measured)],
            points: &'a [Point],
        }
        let summary = self.summaries();
        let doc = Doc {
            experiment: "image_app",
            machine: Machine::current(),
            sizes: &self.sizes,
            pictures: &self.pictures,
            in_flight: self.in_flight,
            window_ms: self.window_ms,
            spin_us: self.spin_us,
            slo_factor: SLO_FACTOR,
            tiers: Stage::ALL.iter().map(|s| s.name().to_lowercase()).collect(),
            by_ref_over_tcp_at_slo: Run::slo_ratio(
                &summary,
                Transport::ByRef,
                Transport::Tcp,
                false,
            ),
            by_value_over_tcp_at_slo: Run::slo_ratio(
                &summary,
                Transport::ByValue,
                Transport::Tcp,
                false,
            ),
            by_ref_over_tcp_at_tcp_slo: Run::slo_ratio(
                &summary,
                Transport::ByRef,
                Transport::Tcp,
                true,
            ),
            by_value_over_tcp_at_tcp_slo: Run::slo_ratio(
                &summary,
                Transport::ByValue,
                Transport::Tcp,
                true,
            ),
            summary,
            windows: self.all_figures(),
            unloaded: &self.unloaded,
            peaks: &self.peaks,
            points: &self.points,
        };
        json::write(path, &doc)
    }
}

fn rate(m: &Measured) -> f64 {
    if m.window_s > 0.0 {
        m.calls as f64 / m.window_s
    } else {
        0.0
    }
}

fn color(t: Transport) -> RGBColor {
    match t {
        Transport::Tcp => RGBColor(200, 60, 40),
        Transport::ByValue => RGBColor(40, 110, 200),
        Transport::ByRef => RGBColor(30, 150, 60),
    }
}

/// Two panels: p99 against achieved throughput (log), with each transport's SLO; achieved
/// against offered throughput.
pub fn plot(run: &Run, path: &Path) -> anyhow::Result<()> {
    let figures = run.all_figures();
    let summaries = run.summaries();
    let max_x = figures
        .iter()
        .map(|f| f.achieved_per_s.max(f.offered_per_s))
        .fold(1.0, f64::max)
        * 1.1;
    let p99_ms = |f: &Figures| (f.p99_us / 1e3).max(0.01);
    let lo = figures.iter().map(p99_ms).fold(f64::MAX, f64::min).min(1.0) * 0.5;
    let hi = figures
        .iter()
        .map(p99_ms)
        .chain(summaries.iter().map(|s| s.slo_us / 1e3))
        .fold(1.0, f64::max)
        * 2.0;
    let svg = Svg::create(path, (1200, 480))?;
    let panels = svg.panels(2);
    let mut left = plot::chart(
        &panels[0],
        "image_app: p99 vs throughput (dashed: SLO = 10x unloaded mean)",
        16,
    )
    .build_cartesian_2d(0f64..max_x, (lo..hi).log_scale())?;
    left.configure_mesh()
        .x_desc("achieved requests/s")
        .y_desc("p99 end to end (ms)")
        .draw()?;
    for &t in &Transport::ALL {
        // In order of offered load (past the peak, achieved throughput falls back).
        let mut mine: Vec<&Figures> = figures.iter().filter(|f| f.transport == t).collect();
        mine.sort_by(|a, b| a.fraction.total_cmp(&b.fraction));
        let series: Vec<(f64, f64)> = mine.iter().map(|f| (f.achieved_per_s, p99_ms(f))).collect();
        plot::line_with_points(&mut left, &series, color(t), t.name())?;
        if let Some(s) = summaries.iter().find(|s| s.transport == t) {
            let slo = s.slo_us / 1e3;
            left.draw_series(DashedLineSeries::new(
                [(0.0, slo), (max_x, slo)],
                6,
                4,
                color(t).stroke_width(1),
            ))?;
        }
    }
    plot::legend(&mut left, SeriesLabelPosition::UpperLeft)?;
    let mut right = plot::chart(&panels[1], "achieved vs offered load", 16)
        .build_cartesian_2d(0f64..max_x, 0f64..max_x)?;
    right
        .configure_mesh()
        .x_desc("offered requests/s")
        .y_desc("achieved requests/s")
        .draw()?;
    for &t in &Transport::ALL {
        let mut series: Vec<(f64, f64)> = figures
            .iter()
            .filter(|f| f.transport == t)
            .map(|f| (f.offered_per_s, f.achieved_per_s))
            .collect();
        series.sort_by(|a, b| a.0.total_cmp(&b.0));
        plot::line_with_points(&mut right, &series, color(t), t.name())?;
    }
    plot::legend(&mut right, SeriesLabelPosition::UpperLeft)?;
    svg.finish()?;
    eprintln!("wrote {}", path.display());
    Ok(())
}
