//! `netless bench dagger`: Dagger's request batching (§3.3–3.4, Figs. 5 and 6 left) on one
//! host: pipelined 64 B echo throughput by batch size, and latency against offered load.
//!
//! The server is its own process (`netless bench-peer dagger`), serving an echo in a socket
//! directory of this run alone; the clients are threads of this process, each with its own
//! [`netless::Pipeline`] connection. Batching is Dagger's soft reconfiguration: the
//! replica's `batch` and `batch_mode` registers, set through `netless.ctl/Set` between
//! windows and read by the pipeline on every submit. `B = N` is `fixed` batching (a batch is
//! published when it holds N requests); `adaptive(32)` lets the pipeline size each batch from
//! the load it sees, from 1 when idle up to 32 (see [`netless::Pipeline`] for the rule).
//!
//! 1. **Throughput** (Fig. 5): one client thread (pinned to the first allowed CPU) keeps
//!    `--in-flight` calls outstanding against one server worker (pinned to the second),
//!    both spinning, for B = 1, 4, 16, 32 and adaptive(32). The settings are interleaved
//!    over `--rounds` rounds, each round in a rotated order, and the median per setting is
//!    reported with the mean batch size the client published and the server took.
//! 2. **Latency against offered load** (Fig. 6 left): the same pair, open loop: Poisson
//!    arrivals at 5%–95% of the best setting's peak; each call is timed from its scheduled
//!    send time to its reply, so a late send (window full, generator behind) counts. B = 1,
//!    B = 4 and adaptive(32); a setting is not driven past 1.15 × its own peak (except at
//!    the lowest load), and a point whose arrivals it could not keep up with is marked
//!    saturated.
//! 3. **Two client threads** (Fig. 6 right, reported as is): two pipelines, one per client
//!    thread, against a server with two workers; client thread i and worker i are pinned to
//!    CPU i, so each core hosts a client and a worker: the workers sleep after a short spin
//!    (`--pair-spin-us`) and the clients yield when a poll finds nothing.
//!
//! The host is shared and noisy, so every row also says what else took the cores while it
//! was measured: involuntary context switches of the client threads and of the server, and
//! the hypervisor's steal time. A p99 of milliseconds at low load comes with them.
//!
//! Neither says how fast the two cores pass cache lines to each other, which on a shared
//! host moves several-fold from minute to minute (where the hypervisor runs the two vCPUs,
//! what the other guests do) and which every figure here follows. So before each window of
//! the single-client sweep the client times 500 lone calls (one at a time, nothing else in
//! flight, under B=1 whatever the window's setting) and the table reports their median
//! round trip; when the windows' paces differ enough, the acceptance block splits the
//! windows by it, as context for the medians.
//!
//! Last in the single-client part, "reading stats never slows the data path": the best
//! fixed setting's closed loop with and without a thread of this process reading the
//! replica's stats every millisecond, the two interleaved round by round.

mod load;
mod noise;
mod render;

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use hdrhistogram::Histogram;
use netless::{
    control, CallOptions, Client, ClientConfig, Request, ResponseBuilder, Server, ServerConfig,
    Status, WaitMode, WaitPolicy,
};
use serde::Serialize;

use super::clock::Stopwatch;
use super::peer::{Peer, Stop};
use super::report;
use super::{CommonArgs, RunDir};
use load::{mean, Counts, Driver};

/// The single-client service (one spinning worker).
const SERVICE: &str = "dagger.Echo";
/// The two-client service (two workers sharing the cores with the clients).
const SERVICE_PAIRS: &str = "dagger.Echo2";
/// The method every call names (the echo ignores it).
const METHOD: &str = "Echo";
/// Payload of every request and reply.
const PAYLOAD_BYTES: usize = 64;
/// Largest batch of the adaptive setting.
const ADAPTIVE_MAX: u32 = 32;
/// The throughput sweeps' settings (Fig. 5).
const THROUGHPUT_SETTINGS: [Setting; 5] = [
    Setting::Fixed(1),
    Setting::Fixed(4),
    Setting::Fixed(16),
    Setting::Fixed(32),
    Setting::Adaptive(ADAPTIVE_MAX),
];
/// The latency curves' settings (Fig. 6 left).
const LATENCY_SETTINGS: [Setting; 3] = [
    Setting::Fixed(1),
    Setting::Fixed(4),
    Setting::Adaptive(ADAPTIVE_MAX),
];
/// Offered loads, as fractions of the best setting's closed-loop peak.
const LOADS: [f64; 9] = [0.05, 0.10, 0.20, 0.30, 0.45, 0.60, 0.75, 0.85, 0.95];
/// The same with `--quick`.
const QUICK_LOADS: [f64; 3] = [0.05, 0.50, 0.95];
/// A setting is not offered more than this times its own peak (it would only queue).
const BEYOND_PEAK: f64 = 1.15;
/// Loads up to this fraction of the peak count as low load for the acceptance figures.
const LOW_LOAD: f64 = 0.10;
/// Lone calls timed before each window of the single-client sweep (the host's pace).
const LONE_CALLS: u32 = 500;
/// The pace split is printed only when the windows' lone calls differ by this factor at
/// least; below it the halves differ by noise, not by pace.
const PACE_SPREAD: f64 = 1.3;
/// How often the stats reader of the reader comparison reads the replica's stats: a
/// thousand times what `netless stat` does.
const READER_PERIOD: Duration = Duration::from_millis(1);

/// Whether `fraction` of the peak counts as low load ([`LOW_LOAD`]).
fn is_low_load(fraction: f64) -> bool {
    fraction <= LOW_LOAD + 1e-9
}

/// Rounds of the latency point at `fraction` of the peak: more at low load, whose paired
/// ratios decide an acceptance figure and move with the host's pace round by round.
fn rounds_at(fraction: f64, latency_rounds: u32, low_load_rounds: u32) -> u32 {
    if is_low_load(fraction) {
        low_load_rounds
    } else {
        latency_rounds
    }
}

/// `netless bench dagger`.
#[derive(clap::Args, Debug)]
#[command(
    mut_arg("json", |a| a.help(
        "Write every row, the configuration and the acceptance figures as JSON to this file"
    )),
    mut_arg("plot", |a| a.help(
        "Draw p50 and p99 latency against offered load, per batching setting, to this SVG file"
    )),
    mut_arg("quick", |a| a.help(
        "A few seconds instead of about 1.5 min: 50 ms windows, one round, three loads (tests)"
    )),
)]
pub struct Args {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Calls in flight per client thread at most (each pipeline's `max_in_flight`).
    #[arg(long, default_value_t = 256)]
    pub in_flight: u32,
    /// Measured time per window, ms [default: 400, or 50 with --quick].
    #[arg(long)]
    pub window_ms: Option<u64>,
    /// Interleaved rounds of each throughput sweep [default: 9, or 1 with --quick].
    #[arg(long)]
    pub rounds: Option<u32>,
    /// Rounds of each latency point, their histograms merged [default: 3, or 1 with --quick].
    #[arg(long)]
    pub latency_rounds: Option<u32>,
    /// Rounds of each latency point at or under 10% of the peak, where adaptive is judged
    /// against B=1 by the median of the rounds' ratios [default: 9, or 1 with --quick].
    #[arg(long)]
    pub low_load_rounds: Option<u32>,
    /// How long the two-client server's workers spin before they sleep, µs (they share
    /// their cores with the client threads).
    #[arg(long, default_value_t = 50)]
    pub pair_spin_us: u64,
    /// Offered loads of the latency sweep, as fractions of the best setting's peak
    /// [default: 0.05,0.1,0.2,0.3,0.45,0.6,0.75,0.85,0.95, or 0.05,0.5,0.95 with --quick].
    #[arg(long, value_delimiter = ',')]
    pub loads: Vec<f64>,
    /// Pin nothing: leave every thread's placement to the kernel.
    #[arg(long)]
    pub no_pin: bool,
}

/// `netless bench-peer dagger`: the echo server of the benchmark, until stdin closes.
#[derive(clap::Args, Debug)]
pub struct PeerArgs {
    /// The run's socket directory.
    #[arg(long)]
    pub dir: PathBuf,
    /// The service to serve.
    #[arg(long)]
    pub service: String,
    /// Worker threads.
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    /// Pin worker i to CPU `pin_cpus[i % len]` (none: unpinned).
    #[arg(long, value_delimiter = ',')]
    pub pin_cpus: Vec<usize>,
    /// Idle workers spin this long, µs, then sleep on their futex (absent: spin forever).
    #[arg(long)]
    pub spin_us: Option<u64>,
}

/// A batching setting: the replica's `batch_mode` and `batch` registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Setting {
    /// Publish a batch when it holds this many requests.
    Fixed(u32),
    /// Let the pipeline size batches from the load, up to this many.
    Adaptive(u32),
}

impl Setting {
    /// `B=4`, `adaptive(32)`.
    fn label(self) -> String {
        match self {
            Setting::Fixed(b) => format!("B={b}"),
            Setting::Adaptive(b) => format!("adaptive({b})"),
        }
    }

    fn mode(self) -> &'static str {
        match self {
            Setting::Fixed(_) => "fixed",
            Setting::Adaptive(_) => "adaptive",
        }
    }

    fn batch(self) -> u32 {
        match self {
            Setting::Fixed(b) | Setting::Adaptive(b) => b,
        }
    }

    /// Sets the server's registers (no call may be in flight on a pipeline meanwhile).
    fn apply(self, ctl: &Client) -> anyhow::Result<()> {
        let options = CallOptions::new().timeout(Duration::from_secs(5));
        for setting in [
            format!("batch_mode={}", self.mode()),
            format!("batch={}", self.batch()),
        ] {
            ctl.call(control::SET, setting.as_bytes(), &options)
                .with_context(|| format!("setting the register `{setting}`"))?;
        }
        Ok(())
    }
}

/// The echo: the reply is the request's payload, copied once into the reply ring.
fn echo<'a>(req: &Request<'a>, resp: &mut ResponseBuilder<'a>) -> Result<(), Status> {
    resp.reply_with(req.payload);
    Ok(())
}

/// `bench-peer dagger`: serves the echo until stdin reaches EOF.
pub fn peer(args: PeerArgs) -> anyhow::Result<()> {
    let wait = match args.spin_us {
        None => load::spin_policy(),
        Some(us) => WaitPolicy {
            mode: WaitMode::Adaptive,
            spin: Duration::from_micros(us),
        },
    };
    let config = ServerConfig {
        workers: args.workers,
        pin_cpus: args.pin_cpus,
        wait,
        dir: Some(args.dir),
        ..Default::default()
    };
    let server = Server::bind(&args.service, config, echo)
        .with_context(|| format!("serving `{}`", args.service))?;
    println!("LISTENING {}", args.service);
    std::io::stdout().flush()?;
    let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut Vec::new());
    drop(server);
    Ok(())
}

// ----------------------------------------------------------------------------------------
// Rows.

/// A throughput row: one setting of one sweep, over its rounds.
#[derive(Clone, Debug, Serialize)]
struct ThroughputRow {
    /// `single` (one client thread, one worker) or `pairs` (two of each).
    experiment: &'static str,
    /// `B=4`, `adaptive(32)`.
    setting: String,
    /// `fixed` or `adaptive`.
    batch_mode: &'static str,
    /// The `batch` register.
    batch: u32,
    client_threads: usize,
    server_workers: usize,
    /// Median over the rounds, millions of replies a second.
    median_mrps: f64,
    min_mrps: f64,
    max_mrps: f64,
    /// Each round's throughput, in the order run.
    round_mrps: Vec<f64>,
    /// The host's pace (single client only): the median round trip of the lone calls timed
    /// just before each window ([`Driver::lone_call_ns`]), µs; its median over the rounds.
    lone_call_us: Option<f64>,
    /// Each round's, in the order run.
    round_lone_call_us: Vec<f64>,
    /// Replies counted over all rounds.
    calls: u64,
    /// Requests per batch the clients published (measured windows).
    client_mean_batch: f64,
    /// Requests per queue entry the server took (measured windows).
    server_mean_batch: f64,
    /// Median throughput / B=1's in the same sweep.
    vs_b1: f64,
    /// Involuntary context switches of the client threads over the rounds (with two client
    /// threads these include yielding the core to the worker beside them).
    client_preemptions: u64,
    /// Involuntary context switches of the server's threads over the rounds.
    server_preemptions: u64,
    /// CPU time the hypervisor gave to other guests over the rounds, both CPUs, ms.
    steal_ms: f64,
}

/// A latency row: one setting at one offered load.
#[derive(Clone, Debug, Serialize)]
struct LatencyRow {
    setting: String,
    batch_mode: &'static str,
    batch: u32,
    /// Offered load / the best setting's closed-loop peak.
    load_fraction: f64,
    /// Poisson arrival rate, millions a second.
    offered_mrps: f64,
    /// Replies received in the measured windows, per second.
    achieved_mrps: f64,
    /// Calls timed (scheduled in the measured windows and answered).
    calls: u64,
    mean_us: f64,
    p50_us: f64,
    p99_us: f64,
    p999_us: f64,
    /// Each round's p50 and p99 alone, µs (a round with a stall of the host shows here).
    round_p50_us: Vec<f64>,
    round_p99_us: Vec<f64>,
    /// Scheduled to actual send time, p99, µs (how far the generator fell behind).
    send_lag_p99_us: f64,
    /// Arrivals scheduled in the measured windows, and those never sent.
    scheduled: u64,
    unsent: u64,
    /// The client could not keep up with the arrivals (some unsent, or < 90% achieved).
    saturated: bool,
    client_mean_batch: f64,
    server_mean_batch: f64,
    /// Involuntary context switches of the client thread and of the server over the
    /// windows: other processes taking the cores (each costs a time slice, ~ms, of latency).
    client_preemptions: u64,
    server_preemptions: u64,
    /// CPU time the hypervisor gave to other guests over the windows, both CPUs, ms.
    steal_ms: f64,
}

/// The figures the acceptance criteria name (reported, not asserted).
#[derive(Clone, Debug, Serialize)]
struct Acceptance {
    /// The best fixed setting of the single-client sweep and its median throughput.
    best_fixed: String,
    best_fixed_mrps: f64,
    /// The best setting overall (the latency sweep's reference peak).
    best: String,
    best_mrps: f64,
    b1_mrps: f64,
    adaptive_mrps: f64,
    /// adaptive(32) / best fixed: the median of the rounds' ratios (each round measures
    /// both side by side, so the host's drifts cancel); holds at ≥ 0.9.
    adaptive_over_best_fixed: f64,
    /// The same from the two settings' median throughputs.
    adaptive_over_best_fixed_medians: f64,
    adaptive_peak_within_10pct: bool,
    /// At each load ≤ 10% of the peak: adaptive p50 / B=1 p50; holds at ≤ 1.1 everywhere.
    low_load: Vec<LowLoad>,
    adaptive_low_load_p50_within_10pct: Option<bool>,
    /// Dagger's figures: 12.4 Mrps best (UPI, B = 4), 4 Mrps with B = 1 (doorbells ~4.3).
    best_reaches_12_4_mrps: bool,
    b1_reaches_4_mrps: bool,
    /// The two-client sweep's best setting and median throughput.
    pairs_best: String,
    pairs_best_mrps: f64,
    /// Context only; not an acceptance criterion.
    pace: Option<Pace>,
}

/// How the host's pace moved the single-client throughput.
#[derive(Clone, Debug, Serialize)]
struct Pace {
    /// The windows' lone-call medians (one per window of the sweep): least, median, most.
    lone_call_us_min: f64,
    lone_call_us_median: f64,
    lone_call_us_max: f64,
    /// Only when the most is at least `PACE_SPREAD` times the least: the windows split at
    /// the median lone call into quick (at most it) and slow ones.
    split: Option<PaceSplit>,
}

/// Median throughput (Mrps) and windows on each side of the pace split; `None` for a side
/// with no window of that setting.
#[derive(Clone, Debug, Serialize)]
struct PaceSplit {
    best_quick_mrps: Option<f64>,
    best_slow_mrps: Option<f64>,
    best_quick_windows: usize,
    best_slow_windows: usize,
    b1_quick_mrps: Option<f64>,
    b1_slow_mrps: Option<f64>,
    b1_quick_windows: usize,
    b1_slow_windows: usize,
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
struct LowLoad {
    load_fraction: f64,
    /// p50 over all the rounds' calls pooled, µs.
    b1_p50_us: f64,
    adaptive_p50_us: f64,
    /// adaptive p50 / B=1 p50: the median of the rounds' ratios (the pooled ratio if the
    /// rounds do not pair up); holds at ≤ 1.1.
    adaptive_over_b1: f64,
    /// The same from the pooled p50s.
    adaptive_over_b1_pooled: f64,
    /// Each round's adaptive p50 / B=1 p50.
    round_ratios: Vec<f64>,
}

/// How the run was made.
#[derive(Serialize)]
struct Config {
    payload_bytes: usize,
    in_flight: u32,
    window_ms: u64,
    warmup_ms: u64,
    rounds: u32,
    latency_rounds: u32,
    low_load_rounds: u32,
    load_fractions: Vec<f64>,
    /// The latency sweep's reference: the best setting's median, Mrps.
    peak_mrps: f64,
    single: String,
    pairs: String,
    clock: &'static str,
    quick: bool,
    elapsed_s: f64,
}

/// The JSON document.
#[derive(Serialize)]
struct Doc<'a> {
    experiment: &'static str,
    machine: report::Machine,
    config: Config,
    throughput: &'a [ThroughputRow],
    latency: &'a [LatencyRow],
    acceptance: &'a Acceptance,
    stats_reader: &'a StatsReader,
}

/// The best fixed setting's closed loop with a stats reader running and without.
#[derive(Clone, Debug, Serialize)]
struct StatsReader {
    setting: String,
    /// Between two reads, µs.
    period_us: u64,
    /// Reads made over all the windows with the reader.
    reads: u64,
    without_mrps: f64,
    with_mrps: f64,
    /// With a thread that wakes as often and reads nothing: what a third thread costs on
    /// two CPUs whatever it does.
    waker_mrps: f64,
    /// with / without: the median of the rounds' ratios.
    with_over_without: f64,
    round_ratios: Vec<f64>,
    /// with / the idle waker: the median of the rounds' ratios, the cost of the reads.
    with_over_waker: f64,
    waker_round_ratios: Vec<f64>,
}

// ----------------------------------------------------------------------------------------
// Orchestration.

/// What every experiment needs.
struct Ctx {
    exe: PathBuf,
    dir: PathBuf,
    watch: Stopwatch,
    in_flight: u32,
    warmup: Duration,
    window: Duration,
    rounds: u32,
    latency_rounds: u32,
    low_load_rounds: u32,
    loads: Vec<f64>,
    /// (the client's CPU, the server worker's CPU), unless not pinning.
    cpus: Option<(usize, usize)>,
    pair_spin_us: u64,
    bar: indicatif::ProgressBar,
}

impl Ctx {
    /// See [`rounds_at`].
    fn rounds_at(&self, fraction: f64) -> u32 {
        rounds_at(fraction, self.latency_rounds, self.low_load_rounds)
    }

    /// Spawns the echo server of `service` with `workers` workers pinned to `cpus` in turn,
    /// spinning (`spin_us` None) or sleeping after `spin_us`.
    fn spawn_server(
        &self,
        service: &str,
        workers: usize,
        cpus: &[usize],
        spin_us: Option<u64>,
    ) -> anyhow::Result<Peer> {
        let dir = self.dir.to_str().context("socket directory is not UTF-8")?;
        let workers = workers.to_string();
        let cpus = cpus
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(",");
        let spin = spin_us.map(|us| us.to_string());
        let mut args = vec![
            "bench-peer",
            "dagger",
            "--dir",
            dir,
            "--service",
            service,
            "--workers",
            &workers,
        ];
        if !cpus.is_empty() {
            args.extend(["--pin-cpus", &cpus]);
        }
        if let Some(spin) = &spin {
            args.extend(["--spin-us", spin]);
        }
        let (peer, _) = Peer::spawn(&self.exe, &args, Stop::CloseStdin)?;
        Ok(peer)
    }

    /// A plain client of `service` to set its registers and read its counters.
    fn control(&self, service: &str) -> anyhow::Result<Client> {
        let config = ClientConfig {
            dir: Some(self.dir.clone()),
            default_timeout: Some(Duration::from_secs(5)),
            ..Default::default()
        };
        Client::connect_with(service, config).with_context(|| format!("connecting to `{service}`"))
    }

    fn driver(&self, service: &str, yield_when_idle: bool) -> anyhow::Result<Driver> {
        Driver::connect(
            service,
            &self.dir,
            self.in_flight,
            self.watch,
            yield_when_idle,
        )
    }

    /// Faults in both ends' rings and buffers before anything is measured.
    fn warm_up(&self, ctl: &Client, drivers: &mut [Driver]) -> anyhow::Result<()> {
        Setting::Fixed(16).apply(ctl)?;
        for d in drivers {
            d.closed_loop(self.warmup * 2, self.warmup, None)?;
        }
        Ok(())
    }
}

/// `0..n` rotated left by `round`: each round runs the settings in another order, so a drift
/// of the shared host does not always hit the same one.
fn order(round: u32, n: usize) -> impl Iterator<Item = usize> {
    (0..n).map(move |i| (i + round as usize) % n)
}

/// The median of `xs` (0 if empty).
fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Round by round `num / den`, for two settings measured side by side in each round (a
/// round whose `den` is 0 is left out).
fn paired_ratios(num: &[f64], den: &[f64]) -> Vec<f64> {
    num.iter()
        .zip(den)
        .filter(|(_, d)| **d > 0.0)
        .map(|(n, d)| n / d)
        .collect()
}

/// The median of `ratios`, or `otherwise` when there is none.
fn median_or(ratios: &[f64], otherwise: f64) -> f64 {
    if ratios.is_empty() {
        otherwise
    } else {
        median(ratios)
    }
}

/// One setting's rounds of a throughput sweep.
#[derive(Default)]
struct Rounds {
    rates: Vec<f64>,
    /// Per round: the median lone call just before its window, µs (single client only).
    lone_us: Vec<f64>,
    counts: Counts,
    server_preempted: u64,
    steal_ms: f64,
}

impl Rounds {
    fn add_noise(&mut self, (server_preempted, steal_ms): (u64, f64)) {
        self.server_preempted += server_preempted;
        self.steal_ms += steal_ms;
    }
}

fn throughput_rows(experiment: &'static str, threads: usize, per: &[Rounds]) -> Vec<ThroughputRow> {
    let b1 = THROUGHPUT_SETTINGS
        .iter()
        .position(|s| *s == Setting::Fixed(1))
        .map(|i| median(&per[i].rates));
    THROUGHPUT_SETTINGS
        .iter()
        .zip(per)
        .map(|(s, r)| {
            let m = median(&r.rates);
            ThroughputRow {
                experiment,
                setting: s.label(),
                batch_mode: s.mode(),
                batch: s.batch(),
                client_threads: threads,
                server_workers: threads,
                median_mrps: m / 1e6,
                min_mrps: r.rates.iter().copied().fold(f64::INFINITY, f64::min) / 1e6,
                max_mrps: r.rates.iter().copied().fold(0.0, f64::max) / 1e6,
                round_mrps: r.rates.iter().map(|x| x / 1e6).collect(),
                lone_call_us: (!r.lone_us.is_empty()).then(|| median(&r.lone_us)),
                round_lone_call_us: r.lone_us.clone(),
                calls: r.counts.calls,
                client_mean_batch: mean(r.counts.batched, r.counts.batches),
                server_mean_batch: mean(r.counts.server_calls, r.counts.server_entries),
                vs_b1: b1.filter(|b| *b > 0.0).map_or(0.0, |b| m / b),
                client_preemptions: r.counts.preempted,
                server_preemptions: r.server_preempted,
                steal_ms: r.steal_ms,
            }
        })
        .collect()
}

/// Fig. 5: one client thread, one worker, closed loop, the settings interleaved.
fn throughput_single(
    ctx: &Ctx,
    (ctl, server): (&Client, u32),
    driver: &mut Driver,
) -> anyhow::Result<Vec<ThroughputRow>> {
    let mut per: Vec<Rounds> = THROUGHPUT_SETTINGS
        .iter()
        .map(|_| Rounds::default())
        .collect();
    for round in 0..ctx.rounds {
        for k in order(round, THROUGHPUT_SETTINGS.len()) {
            // The pace under one setting for every window: a fixed batch's lone call would
            // also take (and prefetch) a whole batch's run.
            Setting::Fixed(1).apply(ctl)?;
            let lone = driver.lone_call_ns(LONE_CALLS)?;
            per[k].lone_us.push(lone / 1e3);
            THROUGHPUT_SETTINGS[k].apply(ctl)?;
            let mark = noise::Mark::now(server);
            let c = driver.closed_loop(ctx.warmup, ctx.window, Some(ctl))?;
            per[k].add_noise(mark.since(server));
            per[k].rates.push(c.rate());
            per[k].counts.merge(&c);
            ctx.bar.inc(1);
        }
    }
    Ok(throughput_rows("single", 1, &per))
}

/// Reading stats while the data path runs: the best fixed setting's closed loop with a
/// thread reading the replica's stats every [`READER_PERIOD`] (from shared memory, as
/// `netless stat` does), with a thread waking as often and reading nothing (on two CPUs a
/// third thread takes one from the client or the worker at each wake-up), and with
/// neither, interleaved round by round.
fn stats_reader(
    ctx: &Ctx,
    ctl: &Client,
    driver: &mut Driver,
    single: &[ThroughputRow],
) -> anyhow::Result<StatsReader> {
    let best = best_row(single, true)
        .and_then(|row| {
            THROUGHPUT_SETTINGS
                .into_iter()
                .find(|s| s.label() == row.setting)
        })
        .context("no fixed setting was measured")?;
    best.apply(ctl)?;
    let reader = ctx.control(SERVICE)?;
    let (mut with, mut waker, mut without) = (Vec::new(), Vec::new(), Vec::new());
    let mut reads = 0u64;
    for round in 0..ctx.rounds {
        // 0: no other thread, 1: the reader, 2: the idle waker.
        for k in order(round, 3) {
            let reading = k == 1;
            let stop = AtomicBool::new(false);
            let c = std::thread::scope(|s| {
                let handle = (k > 0).then(|| {
                    s.spawn(|| {
                        let mut n = 0u64;
                        while !stop.load(Ordering::Relaxed) {
                            if reading {
                                std::hint::black_box(reader.replica_stats());
                                n += 1;
                            }
                            std::thread::sleep(READER_PERIOD);
                        }
                        n
                    })
                });
                let c = driver.closed_loop(ctx.warmup, ctx.window, Some(ctl));
                stop.store(true, Ordering::Relaxed);
                if let Some(h) = handle {
                    reads += h.join().expect("the stats reader does not panic");
                }
                c
            })?;
            [&mut without, &mut with, &mut waker][k].push(c.rate() / 1e6);
            ctx.bar.inc(1);
        }
    }
    let round_ratios = paired_ratios(&with, &without);
    let waker_round_ratios = paired_ratios(&with, &waker);
    Ok(StatsReader {
        setting: best.label(),
        period_us: READER_PERIOD.as_micros() as u64,
        reads,
        without_mrps: median(&without),
        with_mrps: median(&with),
        waker_mrps: median(&waker),
        with_over_without: median_or(&round_ratios, 0.0),
        round_ratios,
        with_over_waker: median_or(&waker_round_ratios, 0.0),
        waker_round_ratios,
    })
}

/// The same sweep with two client threads, each with its own pipeline, and two workers;
/// client thread i runs on CPU i (when pinning), as does worker i.
fn throughput_pairs(
    ctx: &Ctx,
    (ctl, server): (&Client, u32),
    drivers: &mut [Driver],
) -> anyhow::Result<Vec<ThroughputRow>> {
    let cpus: Vec<Option<usize>> = match ctx.cpus {
        Some((a, b)) => vec![Some(a), Some(b)],
        None => vec![None, None],
    };
    let mut per: Vec<Rounds> = THROUGHPUT_SETTINGS
        .iter()
        .map(|_| Rounds::default())
        .collect();
    for round in 0..ctx.rounds {
        for k in order(round, THROUGHPUT_SETTINGS.len()) {
            THROUGHPUT_SETTINGS[k].apply(ctl)?;
            let mark = noise::Mark::now(server);
            let results: Vec<anyhow::Result<Counts>> = std::thread::scope(|s| {
                let handles: Vec<_> = drivers
                    .iter_mut()
                    .zip(&cpus)
                    .enumerate()
                    .map(|(i, (d, cpu))| {
                        let stats = (i == 0).then_some(ctl);
                        let (warmup, window) = (ctx.warmup, ctx.window);
                        s.spawn(move || {
                            if let Some(cpu) = *cpu {
                                netless_shm::pin_current_thread(cpu)?;
                            }
                            d.closed_loop(warmup, window, stats)
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join()
                            .unwrap_or_else(|_| bail!("a client thread panicked"))
                    })
                    .collect()
            });
            let mut rate = 0.0;
            for c in results {
                let c = c?;
                rate += c.rate();
                per[k].counts.merge(&c);
            }
            per[k].rates.push(rate);
            per[k].add_noise(mark.since(server));
            ctx.bar.inc(1);
        }
    }
    Ok(throughput_rows("pairs", drivers.len(), &per))
}

/// One setting's windows at one load of the latency sweep.
struct LatencyAcc {
    counts: Counts,
    latency: Histogram<u64>,
    send_lag: Histogram<u64>,
    scheduled: u64,
    unsent: u64,
    server_preempted: u64,
    steal_ms: f64,
    round_p50_us: Vec<f64>,
    round_p99_us: Vec<f64>,
}

/// A quantile of a histogram of ns, in µs (0 when empty).
fn quantile_us(h: &Histogram<u64>, q: f64) -> f64 {
    if h.is_empty() {
        0.0
    } else {
        h.value_at_quantile(q) as f64 / 1e3
    }
}

/// Fig. 6 (left): open loop at each load for each latency setting, interleaved.
fn latency_sweep(
    ctx: &Ctx,
    (ctl, server): (&Client, u32),
    driver: &mut Driver,
    single: &[ThroughputRow],
    peak: f64,
) -> anyhow::Result<Vec<LatencyRow>> {
    let own_peak = |s: Setting| {
        single
            .iter()
            .find(|r| r.setting == s.label())
            .map_or(0.0, |r| r.median_mrps * 1e6)
    };
    let mut rows = Vec::new();
    for (p, &fraction) in ctx.loads.iter().enumerate() {
        let rate = fraction * peak;
        let mut acc: Vec<Option<LatencyAcc>> = LATENCY_SETTINGS.iter().map(|_| None).collect();
        for round in 0..ctx.rounds_at(fraction) {
            for k in order(round + p as u32, LATENCY_SETTINGS.len()) {
                let setting = LATENCY_SETTINGS[k];
                ctx.bar.inc(1);
                // The lowest load is always run: it is the low-load latency every setting is
                // compared at, and a noisy peak must not drop it.
                if p > 0 && rate > BEYOND_PEAK * own_peak(setting) {
                    continue;
                }
                setting.apply(ctl)?;
                let seed = 0x5eed_0000 ^ ((p as u64) << 16) ^ (u64::from(round) << 8) ^ k as u64;
                let mark = noise::Mark::now(server);
                let w = driver.open_loop(rate, seed, ctx.warmup, ctx.window, Some(ctl))?;
                let (server_preempted, steal_ms) = mark.since(server);
                let (p50, p99) = (quantile_us(&w.latency, 0.5), quantile_us(&w.latency, 0.99));
                match &mut acc[k] {
                    Some(a) => {
                        a.round_p50_us.push(p50);
                        a.round_p99_us.push(p99);
                        a.server_preempted += server_preempted;
                        a.steal_ms += steal_ms;
                        a.counts.merge(&w.counts);
                        a.latency.add(&w.latency)?;
                        a.send_lag.add(&w.send_lag)?;
                        a.scheduled += w.scheduled;
                        a.unsent += w.unsent;
                    }
                    slot => {
                        *slot = Some(LatencyAcc {
                            counts: w.counts,
                            latency: w.latency,
                            send_lag: w.send_lag,
                            scheduled: w.scheduled,
                            unsent: w.unsent,
                            server_preempted,
                            steal_ms,
                            round_p50_us: vec![p50],
                            round_p99_us: vec![p99],
                        })
                    }
                }
            }
        }
        for (setting, a) in LATENCY_SETTINGS.iter().zip(acc) {
            let Some(a) = a else { continue };
            let achieved = a.counts.rate();
            rows.push(LatencyRow {
                setting: setting.label(),
                batch_mode: setting.mode(),
                batch: setting.batch(),
                load_fraction: fraction,
                offered_mrps: rate / 1e6,
                achieved_mrps: achieved / 1e6,
                calls: a.latency.len(),
                mean_us: if a.latency.is_empty() {
                    0.0
                } else {
                    a.latency.mean() / 1e3
                },
                p50_us: quantile_us(&a.latency, 0.5),
                p99_us: quantile_us(&a.latency, 0.99),
                p999_us: quantile_us(&a.latency, 0.999),
                round_p50_us: a.round_p50_us,
                round_p99_us: a.round_p99_us,
                send_lag_p99_us: quantile_us(&a.send_lag, 0.99),
                scheduled: a.scheduled,
                unsent: a.unsent,
                saturated: a.unsent * 1000 > a.scheduled || achieved < 0.9 * rate,
                client_mean_batch: mean(a.counts.batched, a.counts.batches),
                server_mean_batch: mean(a.counts.server_calls, a.counts.server_entries),
                client_preemptions: a.counts.preempted,
                server_preemptions: a.server_preempted,
                steal_ms: a.steal_ms,
            });
        }
    }
    Ok(rows)
}

/// The row of the highest median throughput (among the fixed settings only, if asked).
fn best_row(rows: &[ThroughputRow], fixed_only: bool) -> Option<&ThroughputRow> {
    rows.iter()
        .filter(|r| !fixed_only || r.batch_mode == "fixed")
        .max_by(|a, b| a.median_mrps.total_cmp(&b.median_mrps))
}

fn acceptance(
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
        pace,
    }
}

/// How the threads were placed, in words: (single, pairs).
fn placements(cpus: Option<(usize, usize)>, pair_spin_us: u64) -> (String, String) {
    let pairs_waits =
        format!("workers spin {pair_spin_us} µs then sleep, clients yield when a poll is empty");
    match cpus {
        Some((a, b)) => (
            format!("client thread on CPU {a}, server worker on CPU {b}, both spinning"),
            format!(
                "client thread 0 and worker 0 on CPU {a}, client thread 1 and worker 1 on CPU {b}; {pairs_waits}"
            ),
        ),
        None => (
            "unpinned, both spinning".to_string(),
            format!("unpinned; {pairs_waits}"),
        ),
    }
}

/// `netless bench dagger`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let started = Instant::now();
    if args.in_flight == 0
        || args.window_ms == Some(0)
        || args.rounds == Some(0)
        || args.latency_rounds == Some(0)
        || args.low_load_rounds == Some(0)
    {
        bail!(
            "--in-flight, --window-ms, --rounds, --latency-rounds and --low-load-rounds must be positive"
        );
    }
    if args.in_flight < ADAPTIVE_MAX {
        bail!("--in-flight must be at least {ADAPTIVE_MAX}, the largest batch measured");
    }
    let quick = args.common.quick;
    let window = Duration::from_millis(args.window_ms.unwrap_or(if quick { 50 } else { 400 }));
    let run_dir = RunDir::create("dagger")?;
    let cpus = match netless_shm::allowed_cpus().as_slice() {
        [a, b, ..] if !args.no_pin => Some((*a, *b)),
        _ => None,
    };
    let rounds = args.rounds.unwrap_or(if quick { 1 } else { 9 });
    let latency_rounds = args.latency_rounds.unwrap_or(if quick { 1 } else { 3 });
    let low_load_rounds = args.low_load_rounds.unwrap_or(if quick { 1 } else { 9 });
    let loads = match (&args.loads[..], quick) {
        ([], false) => LOADS.to_vec(),
        ([], true) => QUICK_LOADS.to_vec(),
        (loads, _) if loads.iter().all(|f| *f > 0.0 && *f <= 2.0) => {
            let mut loads = loads.to_vec();
            loads.sort_by(f64::total_cmp);
            loads.dedup();
            loads
        }
        _ => bail!("--loads takes fractions of the peak in (0, 2]"),
    };
    let settings = THROUGHPUT_SETTINGS.len() as u64;
    let windows = 2 * u64::from(rounds) * settings
        + 3 * u64::from(rounds)
        + loads
            .iter()
            .map(|&f| u64::from(rounds_at(f, latency_rounds, low_load_rounds)))
            .sum::<u64>()
            * LATENCY_SETTINGS.len() as u64;
    let bar = indicatif::ProgressBar::new(windows).with_message("bench dagger");
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} windows, {eta} left")
            .expect("valid template"),
    );
    let ctx = Ctx {
        exe: crate::self_exe()?,
        dir: run_dir.path.clone(),
        watch: Stopwatch::calibrate(),
        in_flight: args.in_flight,
        warmup: (window / 8).max(Duration::from_millis(10)),
        window,
        rounds,
        latency_rounds,
        low_load_rounds,
        loads,
        cpus,
        pair_spin_us: args.pair_spin_us,
        bar,
    };

    // 1 and 2: one client thread, one spinning worker.
    let server = ctx.spawn_server(SERVICE, 1, &cpus.map_or(vec![], |c| vec![c.1]), None)?;
    if let Some((mine, _)) = cpus {
        // After the spawn, which would otherwise inherit it.
        netless_shm::pin_current_thread(mine)?;
    }
    let ctl = ctx.control(SERVICE)?;
    let mut driver = ctx.driver(SERVICE, false)?;
    ctx.warm_up(&ctl, std::slice::from_mut(&mut driver))?;
    let single = throughput_single(&ctx, (&ctl, server.id()), &mut driver)?;
    let peak = single
        .iter()
        .map(|r| r.median_mrps * 1e6)
        .fold(0.0, f64::max);
    if peak <= 0.0 {
        bail!("no setting completed a call: nothing to offer a load against");
    }
    let latency = latency_sweep(&ctx, (&ctl, server.id()), &mut driver, &single, peak)?;
    let reader = stats_reader(&ctx, &ctl, &mut driver, &single)?;
    drop(driver);
    drop(ctl);
    drop(server);

    // 3: two client threads, two workers, sharing the two cores.
    let server = ctx.spawn_server(
        SERVICE_PAIRS,
        2,
        &cpus.map_or(vec![], |c| vec![c.0, c.1]),
        Some(ctx.pair_spin_us),
    )?;
    let ctl = ctx.control(SERVICE_PAIRS)?;
    let mut drivers = vec![
        ctx.driver(SERVICE_PAIRS, true)?,
        ctx.driver(SERVICE_PAIRS, true)?,
    ];
    ctx.warm_up(&ctl, &mut drivers)?;
    let pairs = throughput_pairs(&ctx, (&ctl, server.id()), &mut drivers)?;
    drop(drivers);
    drop(ctl);
    drop(server);
    ctx.bar.finish_and_clear();

    let acceptance = acceptance(&single, &pairs, &latency);
    let (single_placement, pairs_placement) = placements(cpus, ctx.pair_spin_us);
    render::print_throughput(
        &format!(
            "Fig. 5: pipelined 64 B echo throughput, 1 client thread, 1 server worker ({single_placement}); {} in flight, median of {rounds} interleaved rounds of {} ms",
            ctx.in_flight,
            window.as_millis()
        ),
        &single,
    );
    render::print_latency(&latency, &single, peak, &LATENCY_SETTINGS, &ctx.loads);
    render::print_throughput(
        &format!(
            "Two client threads (a pipeline each), 2 server workers ({pairs_placement}); {} in flight per thread, median of {rounds} rounds",
            ctx.in_flight
        ),
        &pairs,
    );
    render::print_acceptance(&acceptance);
    render::print_stats_reader(&reader);
    let elapsed = started.elapsed();
    println!("\nran in {:.1} s", elapsed.as_secs_f64());

    if let Some(path) = &args.common.json {
        let doc = Doc {
            experiment: "dagger",
            machine: report::Machine::current(),
            config: Config {
                payload_bytes: PAYLOAD_BYTES,
                in_flight: ctx.in_flight,
                window_ms: window.as_millis() as u64,
                warmup_ms: ctx.warmup.as_millis() as u64,
                rounds,
                latency_rounds,
                low_load_rounds,
                load_fractions: ctx.loads.clone(),
                peak_mrps: peak / 1e6,
                single: single_placement,
                pairs: pairs_placement,
                clock: ctx.watch.source(),
                quick,
                elapsed_s: elapsed.as_secs_f64(),
            },
            throughput: &[single.as_slice(), pairs.as_slice()].concat(),
            latency: &latency,
            acceptance: &acceptance,
            stats_reader: &reader,
        };
        std::fs::write(path, serde_json::to_string_pretty(&doc)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    if let Some(path) = &args.common.plot {
        render::plot(path, &latency, &single, &LATENCY_SETTINGS)?;
        eprintln!("wrote {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_and_orders() {
        assert_eq!(Setting::Fixed(4).label(), "B=4");
        assert_eq!(Setting::Adaptive(32).label(), "adaptive(32)");
        assert_eq!(Setting::Adaptive(32).mode(), "adaptive");
        assert_eq!(order(0, 3).collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(order(4, 3).collect::<Vec<_>>(), [1, 2, 0]);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
    }
}
