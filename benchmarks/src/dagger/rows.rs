//! What `batching` reports: a row per batching setting of each throughput sweep
//! ([`ThroughputRow`]), per setting and offered load of the latency sweep ([`LatencyRow`]),
//! the stats-reader comparison ([`StatsReader`]) and the JSON document that holds them
//! ([`Doc`]). Field names and order are the JSON's, which other tools read. Nothing here
//! measures or prints.

use serde::Serialize;

use super::acceptance::Acceptance;
use crate::harness::json::Machine;

/// A throughput row: one setting of one sweep, over its rounds.
#[derive(Clone, Debug, Serialize)]
pub(super) struct ThroughputRow {
    /// `single` (one client thread, one worker) or `pairs` (two of each).
    pub(super) experiment: &'static str,
    /// `B=4`, `adaptive(32)`.
    pub(super) setting: String,
    /// `fixed` or `adaptive`.
    pub(super) batch_mode: &'static str,
    /// The `batch` register.
    pub(super) batch: u32,
    pub(super) client_threads: usize,
    pub(super) server_workers: usize,
    /// Median over the rounds, millions of replies a second.
    pub(super) median_mrps: f64,
    pub(super) min_mrps: f64,
    pub(super) max_mrps: f64,
    /// Each round's throughput, in the order run.
    pub(super) round_mrps: Vec<f64>,
    /// The host's pace (single client only): the median round trip of the lone calls timed
    /// just before each window (`Driver::lone_call_ns`), µs; its median over the rounds.
    pub(super) lone_call_us: Option<f64>,
    /// Each round's, in the order run.
    pub(super) round_lone_call_us: Vec<f64>,
    /// Replies counted over all rounds.
    pub(super) calls: u64,
    /// Requests per batch the clients published (measured windows).
    pub(super) client_mean_batch: f64,
    /// Requests per queue entry the server took (measured windows).
    pub(super) server_mean_batch: f64,
    /// Median throughput / B=1's in the same sweep.
    pub(super) vs_b1: f64,
    /// Involuntary context switches of the client threads over the rounds (with two client
    /// threads these include yielding the core to the worker beside them).
    pub(super) client_preemptions: u64,
    /// Involuntary context switches of the server's threads over the rounds.
    pub(super) server_preemptions: u64,
    /// CPU time the hypervisor gave to other guests over the rounds, both CPUs, ms.
    pub(super) steal_ms: f64,
}

/// A latency row: one setting at one offered load.
#[derive(Clone, Debug, Serialize)]
pub(super) struct LatencyRow {
    pub(super) setting: String,
    pub(super) batch_mode: &'static str,
    pub(super) batch: u32,
    /// Offered load / the best setting's closed-loop peak.
    pub(super) load_fraction: f64,
    /// Poisson arrival rate, millions a second.
    pub(super) offered_mrps: f64,
    /// Replies received in the measured windows, per second.
    pub(super) achieved_mrps: f64,
    /// Calls timed (scheduled in the measured windows and answered).
    pub(super) calls: u64,
    pub(super) mean_us: f64,
    pub(super) p50_us: f64,
    pub(super) p99_us: f64,
    pub(super) p999_us: f64,
    /// Each round's p50 and p99 alone, µs (a round with a stall of the host shows here).
    pub(super) round_p50_us: Vec<f64>,
    pub(super) round_p99_us: Vec<f64>,
    /// Scheduled to actual send time, p99, µs (how far the generator fell behind).
    pub(super) send_lag_p99_us: f64,
    /// Arrivals scheduled in the measured windows, and those never sent.
    pub(super) scheduled: u64,
    pub(super) unsent: u64,
    /// The client could not keep up with the arrivals (some unsent, or < 90% achieved).
    pub(super) saturated: bool,
    pub(super) client_mean_batch: f64,
    pub(super) server_mean_batch: f64,
    /// Involuntary context switches of the client thread and of the server over the
    /// windows: other processes taking the cores (each costs a time slice, ~ms, of latency).
    pub(super) client_preemptions: u64,
    pub(super) server_preemptions: u64,
    /// CPU time the hypervisor gave to other guests over the windows, both CPUs, ms.
    pub(super) steal_ms: f64,
}

/// How the run was made.
#[derive(Serialize)]
pub(super) struct Config {
    pub(super) payload_bytes: usize,
    pub(super) in_flight: u32,
    pub(super) window_ms: u64,
    pub(super) warmup_ms: u64,
    pub(super) rounds: u32,
    pub(super) latency_rounds: u32,
    pub(super) low_load_rounds: u32,
    pub(super) load_fractions: Vec<f64>,
    /// The latency sweep's reference: the best setting's median, Mrps.
    pub(super) peak_mrps: f64,
    pub(super) single: String,
    pub(super) pairs: String,
    /// How the two-client server dispatches: `cpu-local` or `shared`.
    pub(super) pairs_dispatch: String,
    pub(super) clock: &'static str,
    pub(super) quick: bool,
    pub(super) elapsed_s: f64,
}

/// The JSON document.
#[derive(Serialize)]
pub(super) struct Doc<'a> {
    pub(super) experiment: &'static str,
    pub(super) machine: Machine,
    pub(super) config: Config,
    pub(super) throughput: &'a [ThroughputRow],
    pub(super) latency: &'a [LatencyRow],
    pub(super) acceptance: &'a Acceptance,
    pub(super) stats_reader: &'a StatsReader,
}

/// The best fixed setting's closed loop with a stats reader running and without.
#[derive(Clone, Debug, Serialize)]
pub(super) struct StatsReader {
    pub(super) setting: String,
    /// Between two reads, µs.
    pub(super) period_us: u64,
    /// Reads made over all the windows with the reader.
    pub(super) reads: u64,
    pub(super) without_mrps: f64,
    pub(super) with_mrps: f64,
    /// With a thread that wakes as often and reads nothing: what a third thread costs on
    /// two CPUs whatever it does.
    pub(super) waker_mrps: f64,
    /// with / without: the median of the rounds' ratios.
    pub(super) with_over_without: f64,
    pub(super) round_ratios: Vec<f64>,
    /// with / the idle waker: the median of the rounds' ratios, the cost of the reads.
    pub(super) with_over_waker: f64,
    pub(super) waker_round_ratios: Vec<f64>,
}
