//! `netless bench echo`: NotNets Table 1 on this machine.
//!
//! One client process (this one, pinned to one CPU) measures sequential calls against peer
//! processes pinned to another CPU: a tonic server over TCP loopback (`grpc-http2`), a netless
//! echo server (`netless-proto` with prost messages, `netless-raw` with raw bytes), and a
//! plain spinning shared-memory ping-pong (`floor`). The rows are measured in rounds,
//! interleaved, so drifts in the machine's load hit every row alike.

use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use netless::{CallOptions, Client};
use prost::Message as _;

use super::clock::Stopwatch;
use super::floor::Floor;
use super::grpc_http2::GrpcHttp2;
use super::proto::pb::{EchoReply, EchoRequest};
use super::report::{self, Row};
use crate::cmd::echo_server::PROTO_METHOD;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Measured calls per row (transport × payload).
    #[arg(long, default_value_t = 50_000)]
    pub calls: u64,
    /// Interleaving rounds: each row measures calls/rounds calls per round.
    #[arg(long, default_value_t = 10)]
    pub rounds: u64,
    /// Payload sizes in bytes.
    #[arg(long, value_delimiter = ',', default_value = "64,4096")]
    pub payloads: Vec<usize>,
    /// Write the figures as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
}

const TRANSPORTS: [&str; 4] = ["grpc-http2", "netless-proto", "netless-raw", "floor"];
const WARMUP_CALLS: u64 = 2_000;

/// CPUs for the measuring client and for the peers: different cores when there are two.
fn cpus() -> (Option<usize>, Option<usize>) {
    let allowed = netless_shm::allowed_cpus();
    match allowed.as_slice() {
        [a, b, ..] => (Some(*a), Some(*b)),
        _ => (None, None),
    }
}

/// A netless echo server in its own process; killed on drop.
struct EchoServerProcess {
    child: Child,
}

impl EchoServerProcess {
    fn start(service: &str, pin: Option<usize>) -> anyhow::Result<(EchoServerProcess, Client)> {
        let mut cmd = Command::new(crate::self_exe()?);
        cmd.args(["echo-server", "--service", service, "--workers", "1"])
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        if let Some(cpu) = pin {
            cmd.args(["--pin-cpu", &cpu.to_string()]);
        }
        let mut process = EchoServerProcess {
            child: cmd.spawn().context("spawning the netless echo server")?,
        };
        let started = Instant::now();
        loop {
            match Client::connect(service) {
                Ok(client) => return Ok((process, client)),
                Err(status) if started.elapsed() > Duration::from_secs(20) => {
                    bail!("netless echo server did not come up: {status}")
                }
                Err(_) => {
                    if let Some(exit) = process.child.try_wait()? {
                        bail!("netless echo server exited early: {exit}");
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
    }
}

impl Drop for EchoServerProcess {
    fn drop(&mut self) {
        // SIGTERM for a clean exit, then make sure.
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_child(&self.child),
            rustix::process::Signal::TERM,
        );
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn netless_raw(
    watch: &Stopwatch,
    client: &Client,
    payload: &[u8],
    calls: u64,
    out: &mut Vec<u8>,
    hist: Option<&mut Histogram<u64>>,
) -> anyhow::Result<()> {
    let options = CallOptions::new();
    let mut hist = hist;
    for _ in 0..calls {
        let start = watch.mark();
        client.call_into("Echo", payload, &options, out)?;
        let ns = watch.elapsed_ns(start);
        if out.len() != payload.len() {
            bail!(
                "netless-raw: reply of {} bytes to a {}-byte request",
                out.len(),
                payload.len()
            );
        }
        if let Some(h) = hist.as_deref_mut() {
            h.saturating_record(ns.max(1));
        }
    }
    Ok(())
}

fn netless_proto(
    watch: &Stopwatch,
    client: &Client,
    payload: &[u8],
    calls: u64,
    buf: &mut Vec<u8>,
    out: &mut Vec<u8>,
    hist: Option<&mut Histogram<u64>>,
) -> anyhow::Result<()> {
    let options = CallOptions::new();
    let mut hist = hist;
    for _ in 0..calls {
        let start = watch.mark();
        buf.clear();
        EchoRequest {
            payload: payload.to_vec(),
        }
        .encode(buf)?;
        client.call_into(PROTO_METHOD, buf, &options, out)?;
        let reply = EchoReply::decode(out.as_slice())?;
        let ns = watch.elapsed_ns(start);
        if reply.payload.len() != payload.len() {
            bail!(
                "netless-proto: reply payload of {} bytes",
                reply.payload.len()
            );
        }
        if let Some(h) = hist.as_deref_mut() {
            h.saturating_record(ns.max(1));
        }
    }
    Ok(())
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.calls == 0 || args.rounds == 0 || args.payloads.is_empty() {
        bail!("--calls, --rounds and --payloads must be non-empty and positive");
    }
    let exe = crate::self_exe()?;
    let (client_cpu, peer_cpu) = cpus();
    let service = format!("netless.bench.Echo-{}", std::process::id());
    eprintln!("starting peers (client on cpu {client_cpu:?}, servers on cpu {peer_cpu:?}) ...");
    let mut grpc = GrpcHttp2::start(&exe, peer_cpu)?;
    let (_server, client) = EchoServerProcess::start(&service, peer_cpu)?;
    let mut floor = Floor::start(&exe, peer_cpu)?;
    // Pin only now: children inherit the affinity of the thread that spawns them.
    if let Some(cpu) = client_cpu {
        netless_shm::pin_current_thread(cpu).context("pinning the measuring thread")?;
    }
    let watch = Stopwatch::calibrate();
    let timer_overhead = watch.overhead_ns();

    let mut hists: Vec<Vec<Histogram<u64>>> = args
        .payloads
        .iter()
        .map(|_| TRANSPORTS.iter().map(|_| report::new_histogram()).collect())
        .collect();
    let per_round = args.calls.div_ceil(args.rounds);
    let rows_measured = args.payloads.len() * (TRANSPORTS.len() - 1) + 1;
    let total = per_round * args.rounds * rows_measured as u64;
    let bar = if args.quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(total).with_style(
            ProgressStyle::with_template(
                "{bar:40} {pos}/{len} calls  {elapsed} (eta {eta})  {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        )
    };
    let mut out = Vec::new();
    let mut buf = Vec::new();
    // Warm every path once: connections, caches, branch predictors, page faults.
    for &size in &args.payloads {
        let payload = vec![0xa5u8; size];
        let mut scratch = report::new_histogram();
        grpc.measure(size, WARMUP_CALLS / 10, &mut scratch, &watch)?;
        netless_proto(
            &watch,
            &client,
            &payload,
            WARMUP_CALLS,
            &mut buf,
            &mut out,
            None,
        )?;
        netless_raw(&watch, &client, &payload, WARMUP_CALLS, &mut out, None)?;
    }
    floor.measure(WARMUP_CALLS, &mut report::new_histogram(), &watch)?;

    for round in 0..args.rounds {
        for (p, &size) in args.payloads.iter().enumerate() {
            let payload = vec![0xa5u8; size];
            for (t, transport) in TRANSPORTS.iter().enumerate() {
                if *transport == "floor" && p != 0 {
                    continue;
                }
                bar.set_message(format!(
                    "round {}/{} {transport} {size} B",
                    round + 1,
                    args.rounds
                ));
                let hist = &mut hists[p][t];
                match *transport {
                    "grpc-http2" => grpc.measure(size, per_round, hist, &watch)?,
                    "netless-proto" => {
                        // A short unrecorded run refills caches after the other rows ran.
                        netless_proto(&watch, &client, &payload, 200, &mut buf, &mut out, None)?;
                        netless_proto(
                            &watch,
                            &client,
                            &payload,
                            per_round,
                            &mut buf,
                            &mut out,
                            Some(hist),
                        )?
                    }
                    "netless-raw" => {
                        netless_raw(&watch, &client, &payload, 200, &mut out, None)?;
                        netless_raw(&watch, &client, &payload, per_round, &mut out, Some(hist))?
                    }
                    // The floor moves one 64-byte cache line: one row, with the first payload.
                    _ => floor.measure(per_round, hist, &watch)?,
                }
                bar.inc(per_round);
            }
        }
    }
    bar.finish_and_clear();
    let rows: Vec<Row> = args
        .payloads
        .iter()
        .enumerate()
        .flat_map(|(p, &size)| {
            let hists = &hists;
            TRANSPORTS
                .iter()
                .enumerate()
                .filter(move |(_, transport)| **transport != "floor" || p == 0)
                .map(move |(t, transport)| {
                    Row::from_histogram(
                        transport,
                        if *transport == "floor" { 64 } else { size },
                        &hists[p][t],
                    )
                })
        })
        .collect();
    report::print_table(
        "netless bench echo: sequential calls, client and server in separate processes",
        &rows,
        "grpc-http2",
    );
    println!(
        "timed with {} on a pinned thread; an empty timed interval costs {:.0} ns (included in every row)",
        watch.source(),
        timer_overhead
    );
    if let Some(path) = &args.json {
        report::write_json(path, "echo", &rows)
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}
