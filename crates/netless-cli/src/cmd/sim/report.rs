//! The results of `netless sim` as rows, the tables they print as and the JSON document they
//! are written to; nothing here simulates.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context as _;
use serde::Serialize;

use super::engine::{Dispatch, Distribution, Measured};

/// One point of a load sweep.
#[derive(Clone, Debug, Serialize)]
pub(super) struct PointRow {
    /// Workers, `k`.
    pub workers: u32,
    /// Service-time distribution.
    pub distribution: Distribution,
    /// Dispatch policy.
    pub dispatch: Dispatch,
    /// Utilisation ρ.
    pub load: f64,
    /// What the run measured.
    #[serde(flatten)]
    pub measured: Measured,
    /// Whether the p99 latency is within the SLO.
    pub meets_slo: bool,
}

/// The highest load at which a server meets the SLO (a row of NEBULA Table I).
#[derive(Clone, Debug, Serialize)]
pub(super) struct SloRow {
    /// Workers, `k`.
    pub workers: u32,
    /// Service-time distribution.
    pub distribution: Distribution,
    /// Dispatch policy.
    pub dispatch: Dispatch,
    /// The SLO on the p99 latency, in units of S.
    pub slo: f64,
    /// Highest utilisation found to meet the SLO (a lower bound within `load_resolution`);
    /// `None` if not even the lowest load tried does.
    pub max_load: Option<f64>,
    /// Width of the final bisection interval.
    pub load_resolution: f64,
    /// The run at `max_load`.
    pub at_max_load: Option<Measured>,
    /// For exponential service on a single queue, the highest load at which Erlang C puts the
    /// p99 wait within the SLO less one mean service time (`netless::sizing::max_load_for_slo`
    /// over k), to compare `max_load` with.
    pub erlang_c_max_load: Option<f64>,
}

/// One row of the self-check against Erlang-C (M/M/k, single queue).
#[derive(Clone, Debug, Serialize)]
pub(super) struct CheckRow {
    /// Workers, `k`.
    pub workers: u32,
    /// Utilisation ρ.
    pub load: f64,
    /// Offered load A = k·ρ, in Erlangs.
    pub offered_load: f64,
    /// Requests measured.
    pub requests: u64,
    /// Simulated mean queue length.
    pub simulated_mean_queue: f64,
    /// `C_k(A) · A / (k − A)`.
    pub erlang_c_mean_queue: f64,
    /// (simulated − Erlang-C) / Erlang-C.
    pub relative_error: f64,
    /// `|relative_error|` within the tolerance.
    pub pass: bool,
}

/// Everything one `netless sim` invocation found.
#[derive(Clone, Debug, Serialize)]
pub(super) struct Report {
    /// Always `"sim"`.
    pub experiment: &'static str,
    /// Unit of every time in the report.
    pub time_unit: &'static str,
    /// What the queue lengths count.
    pub queue_measure: &'static str,
    /// Seed of every run.
    pub seed: u64,
    /// Requests measured per sweep and bisection run.
    pub requests: u64,
    /// Requests simulated before each of those runs' measurement.
    pub warmup: u64,
    /// Length of each Erlang-C check run, in mean service times (of 16 workers at least).
    pub check_length: f64,
    /// The SLO on the p99 latency, in units of S.
    pub slo: f64,
    /// Allowed relative error of the Erlang-C check.
    pub check_tolerance: f64,
    /// Load sweeps, by workers, distribution and dispatch.
    pub points: Vec<PointRow>,
    /// Highest load meeting the SLO, by workers, dispatch and distribution.
    pub max_load_at_slo: Vec<SloRow>,
    /// The Erlang-C check, empty if it did not apply.
    pub erlang_c_check: Vec<CheckRow>,
    /// Whether every check row passed; `None` if the check did not run.
    pub check_passed: Option<bool>,
}

impl Report {
    /// Writes the report as pretty-printed JSON to `path`.
    pub(super) fn write_json(&self, path: &Path) -> anyhow::Result<()> {
        let text = serde_json::to_string_pretty(self).expect("a report always serialises");
        std::fs::write(path, text + "\n")
            .with_context(|| format!("writing the JSON report to {}", path.display()))
    }

    /// The sweep tables: p99 latency (and the rest) against load, one table per workers,
    /// distribution and dispatch.
    pub(super) fn sweep_tables(&self) -> String {
        let mut out = String::new();
        let mut rows = self.points.iter().peekable();
        while let Some(first) = rows.peek().cloned() {
            let _ = writeln!(
                out,
                "k = {}, {} service, {}",
                first.workers,
                first.distribution.title().to_lowercase(),
                first.dispatch.title()
            );
            let _ = writeln!(
                out,
                "  {:>5}  {:>12}  {:>11}  {:>10}  {:>9}  {:>9}  p99 ≤ {}·S",
                "load",
                "mean latency",
                "p99 latency",
                "mean queue",
                "p99 queue",
                "max queue",
                fmt_factor(self.slo)
            );
            while let Some(row) = rows.next_if(|row| same_series(row, first)) {
                let m = &row.measured;
                let _ = writeln!(
                    out,
                    "  {:>5.2}  {:>12.3}  {:>11.3}  {:>10.3}  {:>9}  {:>9}  {}",
                    row.load,
                    m.mean_latency,
                    m.p99_latency,
                    m.mean_queue,
                    m.p99_queue,
                    m.max_queue,
                    if row.meets_slo { "yes" } else { "no" }
                );
            }
            out.push('\n');
        }
        out
    }

    /// The highest load meeting the SLO and the p99 queue depth there, in the shape of
    /// NEBULA Table I: one table per workers and dispatch.
    pub(super) fn slo_tables(&self) -> String {
        let mut out = String::new();
        let Some(first) = self.max_load_at_slo.first() else {
            return out;
        };
        let _ = writeln!(
            out,
            "Highest load meeting the SLO (p99 latency ≤ {} × S), by bisection to {:.3} \
             (NEBULA Table I)",
            fmt_factor(self.slo),
            first.load_resolution
        );
        let mut rows = self.max_load_at_slo.iter().peekable();
        let mut erlang_c = None;
        while let Some(first) = rows.peek().cloned() {
            let _ = writeln!(out, "k = {}, {}", first.workers, first.dispatch.title());
            let _ = writeln!(
                out,
                "  {:<14} {:>15} {:>22}",
                "Distribution", "Max Load @ SLO", "99th% Q. Depth @ SLO"
            );
            while let Some(row) =
                rows.next_if(|row| row.workers == first.workers && row.dispatch == first.dispatch)
            {
                let (load, depth) = match (row.max_load, &row.at_max_load) {
                    (Some(load), Some(m)) => (format!("{load:.3}"), m.p99_queue.to_string()),
                    _ => ("none".to_string(), "-".to_string()),
                };
                let _ = writeln!(
                    out,
                    "  {:<14} {:>15} {:>22}",
                    row.distribution.title(),
                    load,
                    depth
                );
                if let Some(theory) = row.erlang_c_max_load {
                    erlang_c = Some(theory);
                }
            }
            if let Some(theory) = erlang_c.take() {
                let _ = writeln!(
                    out,
                    "  (Erlang C, exponential: p99 wait ≤ {} × S up to a load of {theory:.3})",
                    fmt_factor(self.slo - 1.0)
                );
            }
            out.push('\n');
        }
        out
    }

    /// The Erlang-C check rows with PASS/FAIL.
    pub(super) fn check_table(&self) -> String {
        let mut out = String::new();
        if self.erlang_c_check.is_empty() {
            return out;
        }
        let _ = writeln!(
            out,
            "Erlang-C check (M/M/k: exponential service, single queue; runs of {} × S): \
             simulated mean queue vs C_k(A)·A/(k − A), within {}%",
            self.check_length,
            self.check_tolerance * 100.0
        );
        let _ = writeln!(
            out,
            "  {:>4}  {:>5}  {:>7}  {:>11}  {:>10}  {:>10}  {:>7}",
            "k", "load", "A", "requests", "simulated", "Erlang-C", "error"
        );
        for row in &self.erlang_c_check {
            let _ = writeln!(
                out,
                "  {:>4}  {:>5.2}  {:>7.2}  {:>11}  {:>10.4}  {:>10.4}  {:>+6.2}%  {}",
                row.workers,
                row.load,
                row.offered_load,
                row.requests,
                row.simulated_mean_queue,
                row.erlang_c_mean_queue,
                row.relative_error * 100.0,
                if row.pass { "PASS" } else { "FAIL" }
            );
        }
        out
    }
}

fn same_series(a: &PointRow, b: &PointRow) -> bool {
    (a.workers, a.distribution, a.dispatch) == (b.workers, b.distribution, b.dispatch)
}

/// `10` rather than `10.0`, `2.5` as is.
fn fmt_factor(x: f64) -> String {
    if x.fract() == 0.0 {
        format!("{x:.0}")
    } else {
        x.to_string()
    }
}
