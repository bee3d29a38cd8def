//! `batching`: Dagger's request batching (§3.3–3.4, Figs. 5 and 6 left) on one host:
//! pipelined 64 B echo throughput by batch size, and latency against offered load.
//!
//! The server is its own process (the `echo-server` peer role, `server`), serving an echo in
//! a socket directory of this run alone; the clients are threads of this process, each with its own
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
//!    CPU i, so each core hosts a client and a worker, four busy threads on two CPUs. The
//!    server dispatches by `--pairs-dispatch`: `cpu-local` (the default) serves each
//!    client's connection on the worker beside it (`Dispatch::CpuLocal`), `shared` puts
//!    every request in one queue both workers take from. The workers wait by the adaptive
//!    policy (`--pair-spin-us` of polls, then a sleep), whose polls yield the CPU while
//!    another thread is queued for it (`netless_ring::contention`); the clients yield when a
//!    poll finds nothing.
//!
//! The host is shared and noisy, so every row also says what else took the cores while it
//! was measured: involuntary context switches of the client threads and of the server, and
//! the hypervisor's steal time. A p99 of milliseconds at low load comes with them. A yield
//! that hands the CPU to another thread counts as an involuntary switch too, so the
//! two-thread rows, whose threads yield to each other, count their own hand-overs there.
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

mod acceptance;
mod load;
mod render;
mod rows;
mod server;
mod sweeps;

use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use netless::{control, CallOptions, Client};

use crate::harness::clock::Stopwatch;
use crate::harness::json::{self, Machine};
use crate::harness::{cpu, CommonArgs, RunDir};
use rows::{Config, Doc};
use sweeps::Ctx;

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
pub(super) fn is_low_load(fraction: f64) -> bool {
    fraction <= LOW_LOAD + 1e-9
}

/// Rounds of the latency point at `fraction` of the peak: more at low load, whose paired
/// ratios decide an acceptance figure and move with the host's pace round by round.
pub(super) fn rounds_at(fraction: f64, latency_rounds: u32, low_load_rounds: u32) -> u32 {
    if is_low_load(fraction) {
        low_load_rounds
    } else {
        latency_rounds
    }
}

/// `batching`'s options.
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
    /// How the two-client server hands requests to its workers: each client's to the worker
    /// on its CPU (`cpu-local`), or all through one queue (`shared`).
    #[arg(long, value_enum, default_value_t = server::PairsDispatch::CpuLocal)]
    pub pairs_dispatch: server::PairsDispatch,
    /// Offered loads of the latency sweep, as fractions of the best setting's peak
    /// [default: 0.05,0.1,0.2,0.3,0.45,0.6,0.75,0.85,0.95, or 0.05,0.5,0.95 with --quick].
    #[arg(long, value_delimiter = ',')]
    pub loads: Vec<f64>,
    /// Pin nothing: leave every thread's placement to the kernel.
    #[arg(long)]
    pub no_pin: bool,
}

/// The peer processes `batching` spawns.
#[derive(clap::Subcommand, Debug)]
pub enum Role {
    /// The echo server of the benchmark.
    EchoServer(server::ServerArgs),
}

/// Runs a peer process.
pub fn peer(role: Role) -> anyhow::Result<()> {
    match role {
        Role::EchoServer(args) => server::serve(args),
    }
}

/// A batching setting: the replica's `batch_mode` and `batch` registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Setting {
    /// Publish a batch when it holds this many requests.
    Fixed(u32),
    /// Let the pipeline size batches from the load, up to this many.
    Adaptive(u32),
}

impl Setting {
    /// `B=4`, `adaptive(32)`.
    pub(super) fn label(self) -> String {
        match self {
            Setting::Fixed(b) => format!("B={b}"),
            Setting::Adaptive(b) => format!("adaptive({b})"),
        }
    }

    pub(super) fn mode(self) -> &'static str {
        match self {
            Setting::Fixed(_) => "fixed",
            Setting::Adaptive(_) => "adaptive",
        }
    }

    pub(super) fn batch(self) -> u32 {
        match self {
            Setting::Fixed(b) | Setting::Adaptive(b) => b,
        }
    }

    /// Sets the server's registers (no call may be in flight on a pipeline meanwhile).
    pub(super) fn apply(self, ctl: &Client) -> anyhow::Result<()> {
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

/// How the threads were placed, in words: (single, pairs).
fn placements(
    cpus: Option<(usize, usize)>,
    pair_spin_us: u64,
    dispatch: server::PairsDispatch,
) -> (String, String) {
    let dispatch = match dispatch {
        server::PairsDispatch::CpuLocal => "each client served by the worker on its CPU",
        server::PairsDispatch::Shared => "one queue for both workers",
    };
    let pairs_waits = format!(
        "{dispatch}; workers poll {pair_spin_us} µs (yielding while their CPU is contended) then sleep, clients yield when a poll is empty"
    );
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

/// Runs the benchmark.
pub fn run(args: Args) -> anyhow::Result<()> {
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
    let cpus = cpu::two_cpus().filter(|_| !args.no_pin);
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
    let bar = indicatif::ProgressBar::new(windows).with_message("batching");
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} windows, {eta} left")
            .expect("valid template"),
    );
    let ctx = Ctx {
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
        pairs_dispatch: args.pairs_dispatch,
        bar,
    };

    // 1 and 2: one client thread, one spinning worker.
    let server = ctx.spawn_server(
        SERVICE,
        1,
        &cpus.map_or(vec![], |c| vec![c.1]),
        None,
        server::PairsDispatch::Shared,
    )?;
    if let Some((mine, _)) = cpus {
        // After the spawn, which would otherwise inherit it.
        netless_shm::pin_current_thread(mine)?;
    }
    let ctl = ctx.control(SERVICE)?;
    let mut driver = ctx.driver(SERVICE, false, cpus.map(|c| c.0))?;
    ctx.warm_up(&ctl, std::slice::from_mut(&mut driver))?;
    let single = sweeps::throughput_single(&ctx, (&ctl, server.id()), &mut driver)?;
    let peak = single
        .iter()
        .map(|r| r.median_mrps * 1e6)
        .fold(0.0, f64::max);
    if peak <= 0.0 {
        bail!("no setting completed a call: nothing to offer a load against");
    }
    let latency = sweeps::latency_sweep(&ctx, (&ctl, server.id()), &mut driver, &single, peak)?;
    let reader = sweeps::stats_reader(&ctx, &ctl, &mut driver, &single)?;
    drop(driver);
    drop(ctl);
    drop(server);

    // 3: two client threads, two workers, sharing the two cores.
    let server = ctx.spawn_server(
        SERVICE_PAIRS,
        2,
        &cpus.map_or(vec![], |c| vec![c.0, c.1]),
        Some(ctx.pair_spin_us),
        ctx.pairs_dispatch,
    )?;
    let ctl = ctx.control(SERVICE_PAIRS)?;
    // Client thread i runs on the first or second CPU (see `throughput_pairs`).
    let mut drivers = vec![
        ctx.driver(SERVICE_PAIRS, true, cpus.map(|c| c.0))?,
        ctx.driver(SERVICE_PAIRS, true, cpus.map(|c| c.1))?,
    ];
    ctx.warm_up(&ctl, &mut drivers)?;
    let pairs = sweeps::throughput_pairs(&ctx, (&ctl, server.id()), &mut drivers)?;
    drop(drivers);
    drop(ctl);
    drop(server);
    ctx.bar.finish_and_clear();

    let acceptance = acceptance::acceptance(&single, &pairs, &latency);
    let (single_placement, pairs_placement) =
        placements(cpus, ctx.pair_spin_us, ctx.pairs_dispatch);
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
            machine: Machine::current(),
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
                pairs_dispatch: ctx.pairs_dispatch.name(),
                clock: ctx.watch.source(),
                quick,
                elapsed_s: elapsed.as_secs_f64(),
            },
            throughput: &[single.as_slice(), pairs.as_slice()].concat(),
            latency: &latency,
            acceptance: &acceptance,
            stats_reader: &reader,
        };
        json::write(path, &doc)?;
    }
    if let Some(path) = &args.common.plot {
        render::plot(path, &latency, &single, &LATENCY_SETTINGS)?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_named_as_the_paper_does() {
        assert_eq!(Setting::Fixed(4).label(), "B=4");
        assert_eq!(Setting::Adaptive(32).label(), "adaptive(32)");
        assert_eq!(Setting::Adaptive(32).mode(), "adaptive");
    }

    #[test]
    fn parses_the_shared_options_with_its_own_help() {
        crate::harness::args::assert_parses_common(
            |a: &Args| &a.common,
            "A few seconds instead of about 1.5 min: 50 ms windows, one round, three loads (tests)",
        );
    }
}
