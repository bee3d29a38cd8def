//! `slo_buffers`: NEBULA §V-B, §VI–VII on one host. A MICA-like key-value service under
//! open-loop Poisson load over 16, 128 and 1024 connections: p99 latency against offered
//! load, throughput within the SLO, NACK rate and receive-buffer memory, for each
//! receive-buffer provisioning and dispatch mode.
//!
//! **Processes.** The server (the `server` peer role, `store`) preloads the store (1 Mi keys
//! of 16 B with 512 B values, 64 Ki with `--quick`) and serves `Get`/`Set` with one worker
//! pinned to the second CPU. The load generator (the `load` peer role, `load`) opens the
//! connections and runs the arrival process from one thread pinned to the first CPU: 50/50
//! `Get`/`Set`, uniform keys, uniform connections. This process drives both through their
//! stdin and stdout, sleeping meanwhile on the first CPU. Every configuration gets a fresh
//! server and generator; the peers die with this process (`PR_SET_PDEATHSIG`) and are stopped
//! (stdin closed, then killed) when its sweep ends or fails. The configurations the
//! acceptance compares (`shared`, `shared-slo` and `per-connection` at one connection count)
//! are swept together, their servers and generators all started: at each load point each is
//! measured in turn, in an order that alternates from point to point, so that the shared
//! host's drifts hit them alike.
//!
//! **Service time.** On two cores, one core of load generator must offer twice what one core
//! of server serves. The server's cost per request is mostly transport, not the key-value
//! operation (about 0.8 µs with 1 Mi keys, measured in-process and printed), and the
//! generator's cost per call grows with the connections (a submit on a connection that was
//! idle touches its cold state: about 1 µs each with 1024 connections). So each request also
//! busy-waits `--work-us` (2 µs by default) after its key-value operation, standing in for the
//! rest of a service: the server then serves about 300 000 calls/s, which the generator can
//! offer 2.5 times over with every connection count. Use `--work-us 0` for the bare store.
//!
//! **Latency and SLO.** As in NEBULA (§VI), latency is measured at the server: each request
//! carries its send time (`CLOCK_MONOTONIC`), and the handler records the time from send to
//! the end of its work, so queueing in the receive queue and the service are in it but not
//! the reply's trip back nor the generator's polling of 1024 connections (that end-to-end
//! client-side latency, from the scheduled send time, is reported too). The SLO is 10× the
//! mean zero-load service time: the mean server-side latency of 5000 calls made one at a
//! time. A load point meets the SLO when the 99th percentile over *all* calls sent, NACKed
//! and failed ones counted as infinitely late (NEBULA §VI), is within it; the throughput
//! within the SLO is the highest accepted throughput among the points that do.
//!
//! **Load.** The server's capacity is measured first: the accepted throughput of the
//! reference server (shared buffer, no SLO) under a load it cannot serve. Each configuration
//! is then swept from 0.1× to 2.5× that capacity (0.3× to 2.5× with `--quick`), one window per
//! point after a warm-up. The offered load reported is what the generator actually sent.
//!
//! **Configurations.** Every server with an SLO declares it with the measured service time,
//! so the runtime publishes its queue-depth limit (8 requests for one worker) and NACKs calls
//! that would queue deeper. Receive buffers:
//! - `shared`: one buffer for every connection, sized for that depth limit: (limit + workers)
//!   requests of the largest size (640 B with header), doubled because a request needs
//!   contiguous blocks in a ring that fragments; rounded up to a power of two (16 KiB).
//! - `shared-slo`: one buffer sized by the runtime from the SLO (10 × E\[Nq\] mean requests,
//!   NEBULA §IV-C, at least 64 blocks: 4 KiB), to show what that sizing does here.
//! - `per-connection`: 64 KiB per connection, HTTP/2's initial window, as most stacks do.
//! - `per-connection-noslo`: the same without SLO, so without queue limit (128 connections).
//! - `per-worker`: one depth-sized buffer per worker (in the dispatch part).
//!
//! Dispatch (`single`, `jbsq2`, `partitioned`) only differs with several workers. This
//! machine has two cores, one for the load, so the dispatch part runs two workers that share
//! the server's core (each sleeps as soon as it is idle, so that an idle worker does not
//! spin on the core the busy one needs): it shows how each mode copes with a worker that is
//! descheduled with requests of its own (a partitioned queue waits for its worker, a single
//! queue does not), not how they scale over cores.
//!
//! **Noise.** The machine is shared. Each point records the involuntary context switches of
//! the server and the generator during its window and the time the generator's schedule was
//! shifted because it was held up; a point whose figures look wrong can be told apart.

mod config;
mod load;
mod render;
mod rows;
mod store;
mod sweep;

use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};

use crate::harness::json::Machine;
use crate::harness::{cpu, CommonArgs, RunDir};
use config::Config;
use rows::Summary;
use sweep::Ctx;

/// Load points, as fractions of the measured capacity.
const FRACTIONS: [f64; 10] = [0.1, 0.3, 0.5, 0.65, 0.8, 0.9, 1.0, 1.25, 1.75, 2.5];
/// Load points with `--quick`.
const QUICK_FRACTIONS: [f64; 4] = [0.3, 0.8, 1.2, 2.5];

/// `slo_buffers`' options.
#[derive(clap::Args, Debug)]
#[command(
    mut_arg("json", |a| a.help(
        "Write every load point, the summaries and the acceptance figures as JSON to this file"
    )),
    mut_arg("plot", |a| a.help("Draw p99 latency against offered load to this SVG file")),
    mut_arg("quick", |a| a.help(
        "About half a minute instead of about five: 64 Ki keys, four load points of short \
         windows, shared and per-connection buffers only (for tests)"
    )),
)]
pub struct Args {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Computation each request adds to its key-value operation, µs (see the module docs).
    #[arg(long, default_value_t = 3.0)]
    pub work_us: f64,
    /// Keys in the store [default: 1048576, or 65536 with --quick].
    #[arg(long)]
    pub keys: Option<u32>,
    /// Recorded time per window, ms [default: 250, or 120 with --quick].
    #[arg(long)]
    pub window_ms: Option<u64>,
    /// Windows a load point may take to meet the SLO [default: 4, or 1 with --quick].
    #[arg(long)]
    pub repeats: Option<u32>,
}

/// The peer processes `slo_buffers` spawns.
#[derive(clap::Subcommand, Debug)]
pub enum Role {
    /// The key-value server.
    Server(store::ServerArgs),
    /// The load generator.
    Load(load::LoadArgs),
}

/// Runs a peer process.
pub fn peer(role: Role) -> anyhow::Result<()> {
    match role {
        Role::Server(args) => store::serve(args),
        Role::Load(args) => load::generate(args),
    }
}

/// Runs the benchmark.
pub fn run(args: Args) -> anyhow::Result<()> {
    if !(args.work_us >= 0.0 && args.work_us < 1e6) || args.window_ms == Some(0) {
        bail!("--work-us must be 0..1e6 and --window-ms positive");
    }
    let quick = args.common.quick;
    let run_dir = RunDir::create("kvs")?;
    let cpus = cpu::two_cpus();
    if let Some((mine, _)) = cpus {
        // This process sleeps on the generator's CPU, never on the server's.
        netless_shm::pin_current_thread(mine)?;
    }
    let ctx = Ctx {
        dir: run_dir.to_str()?.to_string(),
        keys: args
            .keys
            .unwrap_or(if quick { 1 << 16 } else { 1 << 20 })
            .max(1),
        work_ns: (args.work_us * 1e3) as u64,
        cpus,
    };
    let fractions: &[f64] = if quick { &QUICK_FRACTIONS } else { &FRACTIONS };
    let window = Duration::from_millis(args.window_ms.unwrap_or(if quick { 120 } else { 250 }));
    let repeats = args.repeats.unwrap_or(if quick { 1 } else { 4 }).max(1);
    let plan = Config::plan(quick);
    let started = Instant::now();
    eprintln!(
        "slo_buffers: {} keys, {} µs of work per request, {} configurations × {} load points",
        ctx.keys,
        args.work_us,
        plan.len(),
        fractions.len()
    );
    let base = sweep::baseline(&ctx, quick, args.work_us)?;
    render::print_baseline(&base);
    let bar = indicatif::ProgressBar::new((plan.len() * fractions.len()) as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg:28} [{bar:30}] {pos}/{len} points, {eta} left",
        )
        .expect("valid template"),
    );
    let mut rows = Vec::new();
    let mut summaries = Vec::new();
    for group in config::groups(&plan) {
        let swept = sweep::sweep(&ctx, &base, &group, fractions, (window, repeats), &bar)?;
        for (config, mine) in group.into_iter().zip(swept) {
            summaries.extend(Summary::of(config, &mine));
            rows.extend(mine);
        }
    }
    bar.finish_and_clear();
    render::print_rows(&rows, &base);
    render::print_summaries(&summaries, &base);
    let acceptance = render::Acceptance::of(&summaries, &rows, &base);
    render::print_acceptance(&acceptance);
    let machine = Machine::current();
    println!(
        "(machine: {} CPUs, {}; {:.0} s)",
        machine.nproc,
        machine.cpu_model,
        started.elapsed().as_secs_f64()
    );
    if let Some(path) = &args.common.json {
        render::write_json(path, &base, &rows, &summaries, &acceptance)?;
    }
    if let Some(path) = &args.common.plot {
        render::plot(&rows, &base, path).with_context(|| format!("drawing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_the_shared_options_with_its_own_help() {
        crate::harness::args::assert_parses_common(
            |a: &super::Args| &a.common,
            "About half a minute instead of about five: 64 Ki keys, four load points of short \
             windows, shared and per-connection buffers only (for tests)",
        );
    }
}
