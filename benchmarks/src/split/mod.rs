//! `split_offload`: Split gRPC's Figure 2 on one host. The same echo service, whose business
//! logic is a busy loop of W µs (request metadata `x-work-ns`), is served
//!
//! - **baseline**: by one plain tonic server process doing everything (HTTP/2 and logic) on
//!   one core, the paper's host core;
//! - **split**: by `netless gateway` pinned to the other core (HTTP/2, TLS-less here,
//!   `--wait adaptive` since the core is its own) forwarding over netless to a
//!   business-logic process (`GrpcServer`) on the host core.
//!
//! A closed-loop gRPC client over TCP keeps `--in-flight` calls outstanding against each in
//! turn (interleaved per point), for a ~1 KiB and a ~48 KiB message. In the paper the client
//! is another machine; on a 2-core machine it must share a core: it is pinned to the
//! gateway's core in both setups, which handicaps the split. So that it takes as little of
//! that core as it can, it is the lean `h2load` generator (h2 directly, one thread, the
//! request encoded once), not a tonic client. Each point reports throughput, p50/p90/p99
//! latency, and the CPU each process used (from /proc). The knee is the first W whose
//! throughput falls below 80% of the best throughput at smaller W.

mod h2load;
mod render;
mod server;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::bail;
use http::HeaderValue;
use prost::Message as _;

use crate::gateway;
use crate::harness::histogram::{new_histogram, quantile_us};
use crate::harness::noise::cpu_time;
use crate::harness::{cpu, json, Peer, Stop};
use crate::proto::EchoRequest;
use h2load::{H2Client, UnaryCall};

const WORK_US: [u64; 7] = [0, 1, 2, 5, 10, 20, 50];
const SIZES: [usize; 2] = [1024, 48 * 1024];
const SERVICE: &str = "bench.Echo";
const ECHO_PATH: &str = "/bench.Echo/Echo";

/// `split_offload`'s options.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Calls kept in flight by the closed-loop client.
    #[arg(long, default_value_t = 32)]
    pub in_flight: usize,
    /// Measured time per point, in milliseconds (after a warm-up of a fifth of it).
    #[arg(long, default_value_t = 1500)]
    pub duration_ms: u64,
    /// Write the figures as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Draw throughput against business-logic time to this SVG file.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Business-logic times to measure, in µs (default: the paper's 0,1,2,5,10,20,50).
    #[arg(long, value_delimiter = ',', default_values_t = WORK_US)]
    pub work_us: Vec<u64>,
    /// Message sizes to measure, in bytes (default: ~1 KiB and ~48 KiB).
    #[arg(long, value_delimiter = ',', default_values_t = SIZES)]
    pub sizes: Vec<usize>,
}

/// The peer processes `split_offload` spawns.
#[derive(clap::Subcommand, Debug)]
pub enum Role {
    /// The whole service in one tonic process.
    SplitBaseline {
        /// Pin the server to this CPU.
        #[arg(long)]
        pin_cpu: Option<usize>,
    },
    /// The business logic, on netless.
    SplitLogic {
        /// Pin the server to this CPU.
        #[arg(long)]
        pin_cpu: Option<usize>,
    },
    /// The user's `netless gateway`.
    Gateway(Box<netless_cli::cmd::gateway::Args>),
}

/// Runs a peer process.
pub fn peer(role: Role) -> anyhow::Result<()> {
    match role {
        Role::SplitBaseline { pin_cpu } => server::serve_baseline(pin_cpu),
        Role::SplitLogic { pin_cpu } => server::serve_logic(pin_cpu),
        Role::Gateway(args) => gateway::serve(*args),
    }
}

/// A setup under test: its name, the client that reaches it, and its processes (by name).
type Setup<'a> = (&'static str, &'a H2Client, Vec<(String, u32)>);

/// One measured point.
#[derive(Clone, Debug, serde::Serialize)]
struct Point {
    setup: &'static str,
    payload_bytes: usize,
    work_us: u64,
    calls: u64,
    throughput_calls_per_s: f64,
    p50_us: f64,
    p90_us: f64,
    p99_us: f64,
    /// CPU used by each process, in percent of one core: (name, percent).
    cpu_percent: Vec<(String, f64)>,
}

/// Runs the closed loop for `duration` against `client`, after a warm-up.
async fn closed_loop(
    client: &H2Client,
    call: &UnaryCall,
    in_flight: usize,
    duration: Duration,
    pids: &[(String, u32)],
) -> anyhow::Result<(u64, f64, hdrhistogram::Histogram<u64>, Vec<(String, f64)>)> {
    let run = |window: Duration| {
        let tasks: Vec<_> = (0..in_flight)
            .map(|_| {
                let client = client.clone();
                let call = call.clone();
                tokio::spawn(async move {
                    let mut hist = new_histogram();
                    let mut calls = 0u64;
                    let end = Instant::now() + window;
                    while Instant::now() < end {
                        let started = Instant::now();
                        client.unary(&call).await?;
                        hist.saturating_record(started.elapsed().as_nanos() as u64);
                        calls += 1;
                    }
                    Ok::<_, anyhow::Error>((calls, hist))
                })
            })
            .collect();
        async move {
            let mut total = 0u64;
            let mut hist = new_histogram();
            for task in tasks {
                let (calls, h) = task.await??;
                total += calls;
                hist.add(&h).ok();
            }
            Ok::<_, anyhow::Error>((total, hist))
        }
    };
    run(duration / 5).await?;
    let cpu_before: Vec<Duration> = pids.iter().map(|(_, pid)| cpu_time(*pid)).collect();
    let started = Instant::now();
    let (calls, hist) = run(duration).await?;
    let elapsed = started.elapsed();
    let cpu = pids
        .iter()
        .zip(cpu_before)
        .map(|((name, pid), before)| {
            let used = cpu_time(*pid).saturating_sub(before);
            (
                name.clone(),
                100.0 * used.as_secs_f64() / elapsed.as_secs_f64(),
            )
        })
        .collect();
    Ok((calls, calls as f64 / elapsed.as_secs_f64(), hist, cpu))
}

/// Runs the benchmark.
pub fn run(args: Args) -> anyhow::Result<()> {
    if args.in_flight == 0 || args.duration_ms == 0 {
        bail!("--in-flight and --duration-ms must be positive");
    }
    if args.work_us.is_empty() || args.sizes.is_empty() {
        bail!("--work-us and --sizes need at least one value each");
    }
    let (gateway_cpu, logic_cpu) =
        cpu::two_cpus().map_or((None, None), |(a, b)| (Some(a), Some(b)));
    let logic_cpu_arg = logic_cpu.map(|c| c.to_string());
    let mut baseline_args = vec!["split-baseline"];
    let mut logic_args = vec!["split-logic"];
    if let Some(cpu) = &logic_cpu_arg {
        baseline_args.extend(["--pin-cpu", cpu]);
        logic_args.extend(["--pin-cpu", cpu]);
    }
    let (baseline, baseline_addr) = Peer::spawn(&baseline_args, "LISTENING", Stop::CloseStdin)?;
    let (logic, _) = Peer::spawn(&logic_args, "LISTENING", Stop::CloseStdin)?;
    // The gateway has a core of its own, as the paper's infrastructure process does, so it
    // waits for the logic's replies in adaptive mode (spinning briefly before it sleeps): on
    // hosts where a system call is dear, a futex wake-up per reply costs the gateway's core
    // more than the spin (about +15% split throughput at 20 µs on an AMD EPYC VM).
    let (gateway, gateway_addr) = gateway::spawn(gateway_cpu, SERVICE, "adaptive")?;
    let me = std::process::id();
    // As in the paper, the server side gets one host core in the baseline, and the split
    // adds a core for the gateway. The load generator (another machine in the paper) must
    // live somewhere: on the gateway's core, in both setups (pinned after the peers were
    // spawned, so they do not inherit it). This handicaps the split, whose gateway shares
    // its core with the client, and not the baseline.
    if let Some(cpu) = gateway_cpu {
        netless_shm::pin_current_thread(cpu)?;
    }
    // One thread: the generator's streams and its connection tasks wake each other without
    // crossing threads.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let baseline_client = runtime.block_on(H2Client::connect(&baseline_addr))?;
    let split_client = runtime.block_on(H2Client::connect(&gateway_addr))?;
    let duration = Duration::from_millis(args.duration_ms);
    let setups: [Setup<'_>; 2] = [
        (
            "baseline",
            &baseline_client,
            vec![("server".into(), baseline.id()), ("client".into(), me)],
        ),
        (
            "split",
            &split_client,
            vec![
                ("gateway".into(), gateway.id()),
                ("logic".into(), logic.id()),
                ("client".into(), me),
            ],
        ),
    ];
    let total = (args.sizes.len() * args.work_us.len() * setups.len()) as u64;
    let bar = indicatif::ProgressBar::new(total).with_message("split_offload");
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} points, {eta} left")
            .expect("valid template"),
    );
    let mut points = Vec::new();
    for &size in &args.sizes {
        let message = EchoRequest {
            payload: vec![0x5a; size],
        }
        .encode_to_vec();
        for &work in &args.work_us {
            // The reply carries the same bytes in the same field: the same length.
            let call = UnaryCall::new(ECHO_PATH, &message, message.len())
                .header("x-work-ns", HeaderValue::from(work * 1000));
            for (setup, client, pids) in &setups {
                let (calls, rate, hist, cpu) =
                    runtime.block_on(closed_loop(client, &call, args.in_flight, duration, pids))?;
                let q = |p: f64| quantile_us(&hist, p);
                points.push(Point {
                    setup,
                    payload_bytes: size,
                    work_us: work,
                    calls,
                    throughput_calls_per_s: rate,
                    p50_us: q(0.5),
                    p90_us: q(0.9),
                    p99_us: q(0.99),
                    cpu_percent: cpu,
                });
                bar.inc(1);
            }
        }
    }
    bar.finish_and_clear();
    render::print_table(&points, args.in_flight, &args.sizes);
    if let Some(path) = &args.json {
        let doc = serde_json::json!({
            "experiment": "split",
            "in_flight": args.in_flight,
            "duration_ms": args.duration_ms,
            "rows": points,
        });
        json::write(path, &doc)?;
    }
    if let Some(path) = &args.plot {
        render::plot(&points, path, &args.sizes)?;
        eprintln!("wrote {}", path.display());
    }
    drop((baseline, logic, gateway));
    Ok(())
}
