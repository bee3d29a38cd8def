//! `pass_by_reference`: DmRPC (§VI-B..D, Figures 5–7) on one host, with the domain page pool
//! (`netless-pool`) as the disaggregated memory and netless as the RPC layer.
//!
//! Every tier is its own process (the `dmrpc-tier` peer role, `tier`), and every process
//! (this one included) joins one domain, named and placed in a socket directory of this run
//! alone.
//! A tier serves one netless service; a call `value/N` or `ref/N` with N > 1 is forwarded to
//! its `--next` service (round robin when there are several) as `value/N-1` / `ref/N-1`,
//! asynchronously: the handler defers its reply, submits the next call with `call_async`
//! and a forwarding thread (a tokio runtime) sends the deferred reply when the next tier
//! answers, so calls in flight pipeline through a tier served by one worker thread. With
//! N = 1 the tier is the last one: it sums the array (little-endian u32 words, as u64) and
//! returns the sum, which the client checks on every call.
//!
//! - **(a) nested chain** (Fig. 5): tiers `tier1` → … → `tier7`; the client calls `tier1`
//!   with N = hops. By value the array is the netless payload and each tier re-sends the
//!   bytes it received; by reference the client wrote the array into a `SharedBuf` once and
//!   sends a fresh 32-byte Ref (`share()`) per call, the tiers forward those 32 bytes, and the
//!   last maps the Ref and sums the pages in place.
//! - **(b) copy-on-write vs copy** (Figs. 7, 8): per operation the client `share()`s a 32 KiB
//!   or 1 MiB buffer and a callee process maps it and writes 0%, 25% or 100% of it (`cow`);
//!   or maps it, copies it into a private buffer first and then writes (`copy`, the
//!   unconditional copy of DmRPC's `-copy` variants). One operation at a time, as in the
//!   paper. The callee times its map, copy and write; the client times `share()`.
//! - **(c) forwarding load balancer** (Fig. 6): the client calls `lb`, which forwards each
//!   request round robin to `w0` and `w1`; the workers sum the payload (or the mapped Ref).
//!
//! Bytes copied are counted, never assumed: every process counts the payload bytes it puts
//! into netless messages (a netless call copies its payload into the callee's shared receive
//! buffer) and the Ref bytes it sends ("handle bytes"), and reports its pool counters
//! (`PoolStats::bytes_copied`, `pages_copied`) through a `stats` call before and after each
//! measured window. The variants of a point alternate in interleaved rounds (by value, by
//! reference, then the other way round) so drifts of the shared host hit both alike; the
//! tables give the median of the rounds' ratios, the JSON also the ratio of the totals.
//! Warm-ups make at least 64 calls, so every tier's receive buffer has been used (and its
//! pages faulted in) before measuring; the cow callee touches every free pool page once at
//! start-up (`--prefault`), so that its copies do not pay first-touch page faults.
//!
//! The machine has two cores and up to nine processes: the servers' workers and this
//! process's calls spin for `--spin-us` (5 µs) and then sleep on their futex; a tier's calls
//! to the next tier sleep at once. This process is pinned to the first allowed CPU; by
//! default (`--pin reader`) the tier that reads the array (for each hop count, the chain's
//! last) runs alone on the second and the forwarding tiers share the first, which is as
//! close as two CPUs come to the paper's machine per tier (`--pin client`, `alternate` and
//! `none` place them otherwise).
//! `--forward blocking` makes each tier forward with blocking calls from as many worker
//! threads as there are calls in flight instead.

mod client;
mod data;
mod experiments;
mod render;
mod report;
mod tier;
mod transfer;

use std::path::Path;
use std::time::Duration;

use anyhow::bail;
use netless::{ClientConfig, WaitMode, WaitPolicy};
use netless_pool::{Domain, DomainConfig};
use serde::Serialize;

use crate::harness::json::{self, Machine};
use crate::harness::{cpu, CommonArgs, RunDir};
use experiments::Ctx;
use report::{Config, Doc, Summary};

/// Array sizes of the nested chain.
const CHAIN_SIZES: [usize; 3] = [4 << 10, 64 << 10, 1 << 20];
/// Longest chain (tiers spawned).
const MAX_HOPS: u32 = 7;
/// Buffer sizes of the copy-on-write experiment.
const COW_SIZES: [usize; 2] = [32 << 10, 1 << 20];
/// Parts of the buffer the callee writes, in thousandths.
const WRITE_PERMILLE: [usize; 3] = [0, 250, 1000];
/// Payload sizes of the load balancer.
const LB_SIZES: [usize; 4] = [4 << 10, 8 << 10, 16 << 10, 32 << 10];
/// Receive-buffer blocks of the tiers: 32 KiB, so a 1 MiB request goes in one run of blocks
/// (no fragments: fragmented requests would make `call_async` send on a helper thread).
const TIER_BLOCK: u32 = 32 << 10;
/// Receive buffer of each tier: room for many 1 MiB requests in flight.
const TIER_BUFFER: usize = 64 << 20;
/// Calls a warm-up makes at least (so that every tier's receive buffer has been used, and
/// its pages faulted in, before anything is measured), unless it takes over a second
/// (`--quick`: 8 calls or 100 ms).
const WARMUP_CALLS: u64 = 64;
/// The domain's name (unique per run because its socket directory is).
const DOMAIN: &str = "dmrpc";
/// The domain of the fabric rows (its pool lives in the region).
const FABRIC_DOMAIN: &str = "dmrpc-fabric";

/// `pass_by_reference`'s options.
#[derive(clap::Args, Debug)]
#[command(
    mut_arg("json", |a| a.help(
        "Write the rows (and the acceptance figures) as JSON to this file"
    )),
    mut_arg("plot", |a| a.help(
        "Draw the nested-chain curves (throughput against hops, by value and by reference, \
         per array size) to this SVG file"
    )),
    mut_arg("quick", |a| a.help(
        "A few seconds instead of about a minute: short windows, one round (for tests)"
    )),
)]
pub struct Args {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Calls kept in flight by the closed-loop client (nested chain and load balancer); fewer
    /// for large arrays: as many as fit a tier's 64 MiB receive buffer by value.
    #[arg(long, default_value_t = 1024)]
    pub in_flight: usize,
    /// Measured time per variant, point and round, in ms [default: 150, or 20 with --quick].
    #[arg(long)]
    pub window_ms: Option<u64>,
    /// Interleaved rounds per point [default: 6, or 1 with --quick].
    #[arg(long)]
    pub rounds: Option<u32>,
    /// How long every waiter polls before it sleeps on its futex, in µs (0: sleep at once).
    #[arg(long, default_value_t = 5)]
    pub spin_us: u64,
    /// How waiters poll before they sleep: `adaptive` (spinning) or `yield` (giving the CPU
    /// to other runnable processes between polls).
    #[arg(long, default_value = "adaptive")]
    pub wait: WaitMode,
    /// Where the processes run: `reader` (the tier that reads the array on the second CPU,
    /// this process and the forwarding tiers on the first), `client` (this process on the
    /// first CPU, the tiers on the first two wherever the kernel balances them), `alternate`
    /// (this process on the first CPU, each tier pinned, alternating between the first two)
    /// or `none`.
    #[arg(long, default_value = "reader")]
    pub pin: Placement,
    /// How a tier forwards: `pipelined` (one worker thread: deferred reply, the next call
    /// submitted on a `Pipeline`, its reply collected by the worker), `async` (deferred reply +
    /// `call_async`, replies sent from a tokio thread) or `blocking` (as many worker threads as
    /// calls in flight, each forwarding with `call`).
    #[arg(long, default_value = "pipelined")]
    pub forward: Forward,
    /// Run only these experiments (repeat or separate with commas) [default: all three].
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<Experiment>,
    /// Largest request batch a tier's callers publish at once (its `batch` soft register).
    #[arg(long, default_value_t = 256)]
    pub batch: u32,
    /// Nested chain: only these array sizes, in bytes [default: 4 KiB, 64 KiB, 1 MiB].
    #[arg(long, value_delimiter = ',')]
    pub chain_sizes: Vec<usize>,
    /// Nested chain: only these hop counts, 1 to 7 [default: all].
    #[arg(long, value_delimiter = ',')]
    pub hops: Vec<u32>,
}

/// The three experiments.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Experiment {
    /// (a) the nested chain.
    Chain,
    /// (b) copy-on-write vs copy.
    Cow,
    /// (c) the forwarding load balancer.
    Lb,
    /// (d) the by-value / by-reference crossover of automatic transfer.
    Transfer,
}

/// Where the benchmark's processes run.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Placement {
    /// This process (the load generator) on the first CPU; the tiers may use the first two,
    /// and the kernel balances them.
    Client,
    /// This process on the first CPU; each tier pinned to one of the first two, alternating.
    Alternate,
    /// The tiers that read the array (the chain's last tier for each hop count, the
    /// copy-on-write callee, the load balancer's workers) pinned to the second CPU; this
    /// process and the forwarding tiers share the first. In the paper every tier has a
    /// machine of its own, so throughput is that of the slowest tier; on two CPUs this is
    /// the placement that comes closest: the reader, the slowest tier by reference, gets a
    /// core, and the forwarders share what the load generator leaves.
    Reader,
    /// Nothing pinned.
    None,
}

/// How the tiers forward calls.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Forward {
    /// One worker thread runs everything: the handler defers its reply and submits the next
    /// call to a `Pipeline`; the worker collects the replies (`Handler::poll`), sleeping on
    /// its queue and the pipeline at once.
    Pipelined,
    /// The handler defers and forwards with `call_async`; a tokio thread sends the reply.
    Async,
    /// As many worker threads as calls in flight, each forwarding with a blocking call.
    Blocking,
}

/// The peer processes `pass_by_reference` spawns.
#[derive(clap::Subcommand, Debug)]
pub enum Role {
    /// A tier: serves a service, forwards to `--next` or does the work.
    DmrpcTier(tier::TierArgs),
    /// The server of the by-value / by-reference crossover.
    TransferServer(transfer::ServerArgs),
}

/// Runs a peer process.
pub fn peer(role: Role) -> anyhow::Result<()> {
    match role {
        Role::DmrpcTier(args) => tier::serve_tier(args),
        Role::TransferServer(args) => transfer::serve(args),
    }
}

// The connection settings the tiers and the client share.

/// `mode` for `spin_us` µs, or a plain futex sleep if either says so.
fn wait_policy(mode: WaitMode, spin_us: u64) -> WaitPolicy {
    if spin_us == 0 || mode == WaitMode::Futex {
        WaitPolicy {
            mode: WaitMode::Futex,
            spin: Duration::ZERO,
        }
    } else {
        WaitPolicy {
            mode,
            spin: Duration::from_micros(spin_us),
        }
    }
}

fn client_config(dir: &Path, wait: WaitPolicy) -> ClientConfig {
    ClientConfig {
        wait,
        dir: Some(dir.to_path_buf()),
        default_timeout: Some(Duration::from_secs(60)),
        ..Default::default()
    }
}

fn domain_config(name: &str, dir: &Path) -> DomainConfig {
    let mut config = DomainConfig::new(name);
    config.dir = Some(dir.to_path_buf());
    config
}

/// Runs the benchmark.
pub fn run(args: Args) -> anyhow::Result<()> {
    if args.in_flight == 0 || args.window_ms == Some(0) || args.rounds == Some(0) {
        bail!("--in-flight, --window-ms and --rounds must be positive");
    }
    let quick = args.common.quick;
    let window = Duration::from_millis(args.window_ms.unwrap_or(if quick { 20 } else { 150 }));
    let rounds = args.rounds.unwrap_or(if quick { 1 } else { 6 });
    let run_dir = RunDir::create("dmrpc")?;
    let cpus = cpu::two_cpus().filter(|_| args.pin != Placement::None);
    if let Some((mine, _)) = cpus {
        // The peers pin themselves; this thread (and the domain's coordinator thread that
        // joining starts) stays on the first CPU.
        netless_shm::pin_current_thread(mine)?;
    }
    // This process founds the domain; the tiers join it.
    let domain = Domain::join(&domain_config(DOMAIN, &run_dir.path))?;
    let runs = |e: Experiment| args.only.is_empty() || args.only.contains(&e);
    let chain_sizes = if args.chain_sizes.is_empty() {
        CHAIN_SIZES.to_vec()
    } else {
        args.chain_sizes.clone()
    };
    let hops = if args.hops.is_empty() {
        (1..=MAX_HOPS).collect()
    } else {
        args.hops.clone()
    };
    if let Some(bad) = hops.iter().find(|&&h| h == 0 || h > MAX_HOPS) {
        bail!("--hops takes 1 to {MAX_HOPS}, not {bad}");
    }
    if chain_sizes.iter().any(|&s| s < 4 || s % 4 != 0) {
        bail!("--chain-sizes takes multiples of 4 bytes");
    }
    let points = usize::from(runs(Experiment::Chain)) * chain_sizes.len() * hops.len()
        + usize::from(runs(Experiment::Cow)) * COW_SIZES.len() * WRITE_PERMILLE.len()
        + usize::from(runs(Experiment::Lb)) * LB_SIZES.len();
    let bar = indicatif::ProgressBar::new((points * 2 * (rounds as usize + 1)) as u64)
        .with_message("pass_by_reference");
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} windows, {eta} left")
            .expect("valid template"),
    );
    let ctx = Ctx {
        dir: run_dir.path.clone(),
        domain,
        spin_us: args.spin_us,
        wait: args.wait,
        cpus,
        placement: args.pin,
        forward: args.forward,
        in_flight: args.in_flight,
        batch: args.batch,
        chain_sizes,
        hops,
        window,
        warmup: (window / 5).max(Duration::from_millis(4)),
        warmup_calls: if quick { 8 } else { WARMUP_CALLS },
        warmup_cap: Duration::from_millis(if quick { 100 } else { 1000 }),
        rounds,
        bar,
    };
    let mut rows = Vec::new();
    if runs(Experiment::Chain) {
        rows.extend(experiments::nested_chain(&ctx)?);
    }
    if runs(Experiment::Cow) {
        rows.extend(experiments::copy_on_write(&ctx)?);
    }
    if runs(Experiment::Lb) {
        rows.extend(experiments::load_balancer(&ctx)?);
    }
    let transfer = if runs(Experiment::Transfer) {
        let sizes: &[usize] = if quick {
            &[4 << 10, 64 << 10]
        } else {
            &[
                1 << 10,
                4 << 10,
                8 << 10,
                16 << 10,
                32 << 10,
                64 << 10,
                256 << 10,
                1 << 20,
            ]
        };
        let calls = if quick { 100 } else { 2000 };
        ctx.bar.inc_length(sizes.len() as u64 * calls);
        transfer::measure(
            (&ctx.dir, DOMAIN, &ctx.domain),
            None,
            sizes,
            calls,
            cpus.map(|c| c.1),
            &ctx.bar,
        )?
    } else {
        Vec::new()
    };
    // The same through a memory fabric: segments and the pool in a region.
    let transfer_fabric = if runs(Experiment::Transfer) {
        let sizes: Vec<usize> = transfer.iter().map(|r| r.payload_bytes).collect();
        let calls = if quick { 100 } else { 2000 };
        ctx.bar.inc_length(sizes.len() as u64 * calls);
        let (_file, fabric, domain) = transfer::fabric_domain(FABRIC_DOMAIN)?;
        transfer::measure(
            (&ctx.dir, FABRIC_DOMAIN, &domain),
            Some(&fabric),
            &sizes,
            calls,
            cpus.map(|c| c.1),
            &ctx.bar,
        )?
    } else {
        Vec::new()
    };
    ctx.bar.finish_and_clear();

    let summary = Summary::of(&rows);
    render::print_tables(&rows, &ctx);
    if !transfer.is_empty() {
        transfer::print(&transfer, "");
    }
    if !transfer_fabric.is_empty() {
        transfer::print(&transfer_fabric, " through a memory fabric (its pool)");
    }
    render::print_summary(&summary);
    if let Some(path) = &args.common.json {
        let doc = Doc {
            experiment: "dmrpc",
            machine: Machine::current(),
            config: Config {
                in_flight: ctx.in_flight,
                window_ms: window.as_millis() as u64,
                rounds,
                spin_us: ctx.spin_us,
                placement: if cpus.is_some() {
                    args.pin
                } else {
                    Placement::None
                },
                forward: args.forward,
                quick,
            },
            rows: &rows,
            summary: &summary,
            transfer: &transfer,
            crossover_bytes: transfer::crossover(&transfer),
            transfer_fabric: &transfer_fabric,
        };
        json::write(path, &doc)?;
    }
    if let Some(path) = &args.common.plot {
        render::plot(&rows, path)?;
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
            "A few seconds instead of about a minute: short windows, one round (for tests)",
        );
    }
}
