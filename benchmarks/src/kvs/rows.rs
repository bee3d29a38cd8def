//! What `slo_buffers` reports: what was measured before the sweep ([`Baseline`]), a [`Row`]
//! per load point of each configuration, and a [`Summary`] per configuration. Field names
//! and order are the JSON's, which other tools read. Nothing here measures.

use serde::Serialize;

use super::config::Config;
use super::load::{Latency, Window};
use super::store::{Calibration, ServerWindow, Stats};

/// What was measured before the sweep, and the settings derived from it.
#[derive(Clone, Copy, Debug, Serialize)]
pub(super) struct Baseline {
    /// Keys in the store.
    pub keys: u32,
    /// Computation added to each request, µs.
    pub work_us: f64,
    /// The key-value operation alone, timed in the server process.
    pub handler: Calibration,
    /// Zero-load latency at the server (send to end of handler): the service time.
    pub zero_load_server: Latency,
    /// Zero-load latency at the client (round trip).
    pub zero_load_client: Latency,
    /// The SLO on server-side p99 latency, µs: 10× the mean zero-load service time.
    pub slo_us: f64,
    /// The reference server's capacity: its accepted calls/s under a load it cannot serve.
    pub capacity_per_s: f64,
    /// Load the generator offered while measuring the capacity, calls/s.
    pub capacity_offered_per_s: f64,
}

/// One load point of one configuration.
#[derive(Clone, Debug, Serialize)]
pub(super) struct Row {
    #[serde(flatten)]
    pub config: Config,
    /// Receive-buffer bytes the server provisioned with all connections open.
    pub receive_buffer_bytes: u64,
    /// The server's queue-depth limit (0: none).
    pub depth_limit: u32,
    /// Planned load, as a fraction of the capacity.
    pub load_fraction: f64,
    /// Planned load, calls/s.
    pub planned_per_s: f64,
    /// Load the generator sent, calls/s.
    pub offered_per_s: f64,
    /// Offered load as a multiple of the capacity.
    pub offered_x_capacity: f64,
    /// Answered calls/s.
    pub throughput_per_s: f64,
    /// NACKed calls / sent calls.
    pub nack_rate: f64,
    /// Of the NACKs, the share for a queue deeper than the SLO allows (the rest: no room in
    /// the receive buffer).
    pub nack_depth_share: f64,
    /// The generator's window.
    pub client: Window,
    /// Server-side latency of the answered calls.
    pub server: Latency,
    /// Server-side p99 over all calls sent, NACKed and failed ones as infinitely late (µs;
    /// `None`: infinite, more than 1% unanswered).
    pub p99_all_us: Option<f64>,
    /// Whether this point meets the SLO.
    pub within_slo: bool,
    /// Requests the server answered in the window (its own count).
    pub server_requests: u64,
    /// What else took the cores during the window.
    pub noise: Noise,
    /// Which of the point's windows was kept (1-based): the first that met the SLO, else
    /// the best (see the module docs).
    pub window_kept: u32,
}

/// A configuration's figures.
#[derive(Clone, Debug, Serialize)]
pub(super) struct Summary {
    #[serde(flatten)]
    pub config: Config,
    pub receive_buffer_bytes: u64,
    pub depth_limit: u32,
    /// Highest accepted throughput of the sweep, calls/s.
    pub max_throughput_per_s: f64,
    /// Highest accepted throughput among the points within the SLO (0: none).
    pub throughput_within_slo_per_s: f64,
    /// The highest load point (≥ 2× capacity): offered multiple, NACK rate, server p99 of
    /// accepted calls, client p99.
    pub overload_x_capacity: f64,
    pub overload_nack_rate: f64,
    /// Of the NACKs at overload, the share a worker sent for a request that had waited too
    /// long (the rest: refused by the client before sending).
    pub overload_nack_late_share: f64,
    /// Client-side p99 time from a NACKed call's scheduled send to its NACK, µs.
    pub overload_nack_p99_us: f64,
    pub overload_p99_us: f64,
    pub overload_client_p99_us: f64,
    /// Calls that failed other than by NACK or local refusal, and wrong replies, over the
    /// sweep.
    pub errors: u64,
    pub wrong: u64,
}

impl Summary {
    pub(super) fn of(config: &Config, rows: &[Row]) -> Option<Summary> {
        let top = rows
            .iter()
            .max_by(|a, b| a.load_fraction.total_cmp(&b.load_fraction))?;
        Some(Summary {
            config: config.clone(),
            receive_buffer_bytes: top.receive_buffer_bytes,
            depth_limit: top.depth_limit,
            max_throughput_per_s: rows.iter().map(|r| r.throughput_per_s).fold(0.0, f64::max),
            throughput_within_slo_per_s: rows
                .iter()
                .filter(|r| r.within_slo)
                .map(|r| r.throughput_per_s)
                .fold(0.0, f64::max),
            overload_x_capacity: top.offered_x_capacity,
            overload_nack_rate: top.nack_rate,
            overload_nack_late_share: if top.client.nacks > 0 {
                top.client.nacks_late as f64 / top.client.nacks as f64
            } else {
                0.0
            },
            overload_nack_p99_us: top.client.nack_latency.p99_us,
            overload_p99_us: top.server.p99_us,
            overload_client_p99_us: top.client.latency.p99_us,
            errors: rows.iter().map(|r| r.client.errors).sum(),
            wrong: rows.iter().map(|r| r.client.wrong).sum(),
        })
    }
}

/// What else took the cores during a window.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub(super) struct Noise {
    /// Involuntary context switches of the server's workers and of the generator's thread.
    pub server_preemptions: u64,
    pub generator_preemptions: u64,
    /// Time the hypervisor gave the server's CPU to other guests, ms.
    pub server_cpu_steal_ms: f64,
}

/// One window's measurements: the generator's, then the server's for the same calls.
#[derive(Debug)]
pub(super) struct Measurement {
    /// What the generator counted.
    pub client: Window,
    /// The server-side latency of the window's recorded calls.
    pub server: ServerWindow,
    /// The server's counters over the window (`requests`: answered in it).
    pub stats: Stats,
    /// What else took the cores meanwhile.
    pub noise: Noise,
}

/// A load point: its planned load as a fraction of the capacity, and in calls/s.
#[derive(Clone, Copy, Debug)]
pub(super) struct LoadPoint {
    /// Planned load, as a fraction of the capacity.
    pub fraction: f64,
    /// Planned load, calls/s.
    pub planned_per_s: f64,
}

impl Row {
    /// A load point's row from its measurements, for `config` with `open` its counters with
    /// every connection open.
    pub(super) fn new(
        config: &Config,
        open: &Stats,
        base: &Baseline,
        point: LoadPoint,
        m: Measurement,
    ) -> Row {
        let Measurement {
            client: w,
            server: sw,
            stats,
            noise,
        } = m;
        let sent = w.sent.max(1) as f64;
        let unanswered = w.sent.saturating_sub(w.accepted);
        let p99_all_us = (unanswered as f64 <= 0.01 * sent).then_some(sw.at_quantile_us);
        let offered = w.sent as f64 / w.window_s;
        Row {
            config: config.clone(),
            receive_buffer_bytes: open.receive_buffer_bytes,
            depth_limit: open.depth_limit,
            load_fraction: point.fraction,
            planned_per_s: point.planned_per_s,
            offered_per_s: offered,
            offered_x_capacity: offered / base.capacity_per_s,
            throughput_per_s: w.accepted as f64 / w.window_s,
            nack_rate: w.nacks as f64 / sent,
            nack_depth_share: if w.nacks > 0 {
                w.nacks_depth as f64 / w.nacks as f64
            } else {
                0.0
            },
            within_slo: p99_all_us.is_some_and(|p| p <= base.slo_us),
            p99_all_us,
            client: w,
            server: sw.latency,
            server_requests: stats.requests,
            noise,
            window_kept: 1,
        }
    }

    /// Order of preference among windows of the same point: within the SLO first, then the
    /// least time stolen by the hypervisor from the server's CPU, then the lowest p99 over all
    /// calls (unanswered calls beyond 1% last), then the lowest p99.
    pub(super) fn rank(&self) -> (bool, u64, u64, u64) {
        (
            !self.within_slo,
            self.noise.server_cpu_steal_ms as u64,
            self.p99_all_us.map_or(u64::MAX, |p| (p * 1e3) as u64),
            (self.server.p99_us * 1e3) as u64,
        )
    }
}
