//! `netless bench split`: Split gRPC's Figure 2 on one host. The same echo service, whose
//! business logic is a busy loop of W µs (request metadata `x-work-ns`), is served
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

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use tonic::{Request, Response, Status};

use http::HeaderValue;
use prost::Message as _;

use super::h2load::{H2Client, UnaryCall};
use super::peer::{cpu_time, spawn_gateway, Peer, Stop};
use super::proto::{Echo, EchoReply, EchoRequest, EchoServer};
use super::report;

const WORK_US: [u64; 7] = [0, 1, 2, 5, 10, 20, 50];
const SIZES: [usize; 2] = [1024, 48 * 1024];
const SERVICE: &str = "netless.bench.Echo";
const ECHO_PATH: &str = "/netless.bench.Echo/Echo";

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

/// Echo whose business logic spins for `x-work-ns` nanoseconds.
#[derive(Clone, Copy, Debug, Default)]
struct WorkEcho;

#[tonic::async_trait]
impl Echo for WorkEcho {
    async fn echo(&self, request: Request<EchoRequest>) -> Result<Response<EchoReply>, Status> {
        let work_ns: u64 = request
            .metadata()
            .get("x-work-ns")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(0);
        let until = Instant::now() + Duration::from_nanos(work_ns);
        while Instant::now() < until {
            std::hint::spin_loop();
        }
        Ok(Response::new(EchoReply {
            payload: request.into_inner().payload,
        }))
    }
}

/// `bench-peer split-baseline [--pin-cpu N]`: the whole service in one tonic process, on the
/// one core the business logic gets in the split setup.
pub fn serve_baseline(pin_cpu: Option<usize>) -> anyhow::Result<()> {
    if let Some(cpu) = pin_cpu {
        netless_shm::pin_current_thread(cpu)?;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        println!("LISTENING {}", listener.local_addr()?);
        std::io::stdout().flush()?;
        let stdin_closed = tokio::task::spawn_blocking(|| {
            let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut Vec::new());
        });
        tonic::transport::Server::builder()
            .add_service(
                EchoServer::new(WorkEcho)
                    .max_decoding_message_size(usize::MAX)
                    .max_encoding_message_size(usize::MAX),
            )
            .serve_with_incoming_shutdown(
                tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
                async {
                    let _ = stdin_closed.await;
                },
            )
            .await?;
        Ok(())
    })
}

/// `bench-peer split-logic --pin-cpu N`: the business logic behind the gateway, on netless.
pub fn serve_logic(pin_cpu: Option<usize>) -> anyhow::Result<()> {
    if let Some(cpu) = pin_cpu {
        netless_shm::pin_current_thread(cpu)?;
    }
    // 32 calls of 48 KiB in flight need more than the default 1 MiB receive buffer (with
    // less, the excess is refused with RESOURCE_EXHAUSTED, by design).
    let config = netless::ServerConfig {
        buffer_bytes: Some(8 << 20),
        ..Default::default()
    };
    let _serving = netless_grpc::GrpcServer::new()
        .config(config)
        .runtime_threads(1)
        .add_service(
            EchoServer::new(WorkEcho)
                .max_decoding_message_size(usize::MAX)
                .max_encoding_message_size(usize::MAX),
        )
        .serve()?;
    println!("LISTENING {SERVICE}");
    std::io::stdout().flush()?;
    let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut Vec::new());
    Ok(())
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
                    let mut hist = report::new_histogram();
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
            let mut hist = report::new_histogram();
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

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.in_flight == 0 || args.duration_ms == 0 {
        bail!("--in-flight and --duration-ms must be positive");
    }
    if args.work_us.is_empty() || args.sizes.is_empty() {
        bail!("--work-us and --sizes need at least one value each");
    }
    let exe = crate::self_exe()?;
    let cpus = netless_shm::allowed_cpus();
    let (gateway_cpu, logic_cpu) = match cpus.as_slice() {
        [a, b, ..] => (Some(*a), Some(*b)),
        _ => (None, None),
    };
    let logic_cpu_arg = logic_cpu.map(|c| c.to_string());
    let mut baseline_args = vec!["bench-peer", "split-baseline"];
    let mut logic_args = vec!["bench-peer", "split-logic"];
    if let Some(cpu) = &logic_cpu_arg {
        baseline_args.extend(["--pin-cpu", cpu]);
        logic_args.extend(["--pin-cpu", cpu]);
    }
    let (baseline, baseline_addr) = Peer::spawn(&exe, &baseline_args, Stop::CloseStdin)?;
    let (logic, _) = Peer::spawn(&exe, &logic_args, Stop::CloseStdin)?;
    // The gateway has a core of its own, as the paper's infrastructure process does, so it
    // waits for the logic's replies in adaptive mode (spinning briefly before it sleeps): on
    // hosts where a system call is dear, a futex wake-up per reply costs the gateway's core
    // more than the spin (about +15% split throughput at 20 µs on an AMD EPYC VM).
    let (gateway, gateway_addr) = spawn_gateway(&exe, gateway_cpu, "adaptive")?;
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
    let bar = indicatif::ProgressBar::new(total).with_message("bench split");
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
                let q = |p: f64| hist.value_at_quantile(p) as f64 / 1000.0;
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
    print_table(&points, args.in_flight, &args.sizes);
    if let Some(path) = &args.json {
        let doc = serde_json::json!({
            "experiment": "split",
            "in_flight": args.in_flight,
            "duration_ms": args.duration_ms,
            "rows": points,
        });
        std::fs::write(path, serde_json::to_string_pretty(&doc)?)
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    if let Some(path) = &args.plot {
        plot(&points, path, &args.sizes)?;
        eprintln!("wrote {}", path.display());
    }
    drop((baseline, logic, gateway));
    Ok(ExitCode::SUCCESS)
}

/// The first work level whose throughput is below 80% of the best at smaller work levels.
fn knee(points: &[&Point]) -> Option<u64> {
    let mut best: f64 = 0.0;
    for p in points {
        if best > 0.0 && p.throughput_calls_per_s < 0.8 * best {
            return Some(p.work_us);
        }
        best = best.max(p.throughput_calls_per_s);
    }
    None
}

fn print_table(points: &[Point], in_flight: usize, sizes: &[usize]) {
    println!(
        "netless bench split: business logic of W µs, {in_flight} calls in flight (closed loop)"
    );
    println!("baseline: one tonic process does HTTP/2 and the logic (core B);");
    println!("split: netless gateway (core A) → netless → logic process (core B);");
    println!("the load generator (h2, one thread) runs on core A in both");
    println!();
    println!(
        "{:>8} {:>6} {:>9} {:>11} {:>9} {:>9} {:>9}  cpu % of a core",
        "message", "W µs", "setup", "calls/s", "p50 µs", "p90 µs", "p99 µs"
    );
    for p in points {
        let cpu: Vec<String> = p
            .cpu_percent
            .iter()
            .map(|(name, pct)| format!("{name} {pct:.0}"))
            .collect();
        println!(
            "{:>8} {:>6} {:>9} {:>11.0} {:>9.1} {:>9.1} {:>9.1}  {}",
            report::fmt_bytes(p.payload_bytes),
            p.work_us,
            p.setup,
            p.throughput_calls_per_s,
            p.p50_us,
            p.p90_us,
            p.p99_us,
            cpu.join(", ")
        );
    }
    println!();
    for &size in sizes {
        for setup in ["baseline", "split"] {
            let series: Vec<&Point> = points
                .iter()
                .filter(|p| p.payload_bytes == size && p.setup == setup)
                .collect();
            match knee(&series) {
                Some(w) => println!(
                    "knee ({}, {setup}): throughput drops below 80% of its plateau at {w} µs",
                    report::fmt_bytes(size)
                ),
                None => println!(
                    "knee ({}, {setup}): none up to {} µs",
                    report::fmt_bytes(size),
                    series.last().map_or(0, |p| p.work_us)
                ),
            }
        }
        let at = |setup: &str| {
            points
                .iter()
                .find(|p| p.payload_bytes == size && p.setup == setup && p.work_us == 20)
                .map(|p| p.throughput_calls_per_s)
        };
        if let (Some(b), Some(s)) = (at("baseline"), at("split")) {
            println!(
                "at 20 µs ({}): split {s:.0} calls/s vs baseline {b:.0} calls/s ({:.2}×)",
                report::fmt_bytes(size),
                s / b
            );
        }
    }
}

fn plot(points: &[Point], path: &Path, sizes: &[usize]) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (900, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((1, sizes.len()));
    for (panel, &size) in panels.iter().zip(sizes) {
        let mine: Vec<&Point> = points.iter().filter(|p| p.payload_bytes == size).collect();
        let top = mine
            .iter()
            .map(|p| p.throughput_calls_per_s)
            .fold(1.0, f64::max)
            * 1.1;
        let right = mine.iter().map(|p| p.work_us as f64).fold(1.0, f64::max) * 1.04;
        let mut chart = ChartBuilder::on(panel)
            .caption(
                format!("{} message", report::fmt_bytes(size)),
                ("sans-serif", 18),
            )
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..right, 0f64..top)?;
        chart
            .configure_mesh()
            .x_desc("business logic (µs)")
            .y_desc("calls/s")
            .draw()?;
        for (setup, color) in [("baseline", RED), ("split", BLUE)] {
            let series: Vec<(f64, f64)> = mine
                .iter()
                .filter(|p| p.setup == setup)
                .map(|p| (p.work_us as f64, p.throughput_calls_per_s))
                .collect();
            chart
                .draw_series(LineSeries::new(series.clone(), color.stroke_width(2)))?
                .label(setup)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
            chart.draw_series(
                series
                    .iter()
                    .map(|&(x, y)| Circle::new((x, y), 3, color.filled())),
            )?;
        }
        chart
            .configure_series_labels()
            .border_style(BLACK)
            .background_style(WHITE.mix(0.8))
            .draw()?;
    }
    root.present()?;
    Ok(())
}
