//! `echo_latency`: NotNets Table 1 on this machine.
//!
//! One client process (this one, pinned to one CPU) measures sequential calls against peer
//! processes pinned to another CPU: a tonic server over TCP loopback (`grpc-http2`), the
//! user's netless echo server (`netless-proto` with prost messages, `netless-raw` with raw
//! bytes), the same raw calls to another echo server met in a memory fabric instead of the
//! socket directory (`netless-fabric-hw`, see the `fabric` module), and a plain spinning
//! shared-memory ping-pong (`floor`). The rows are measured in rounds, interleaved, so drifts
//! in the machine's load hit every row alike.

mod fabric;
mod floor;

use std::path::PathBuf;

use anyhow::{bail, Context as _};
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use netless::{CallOptions, Client, ClientConfig};
use netless_cli::cmd::echo_server::{self, PROTO_METHOD};
use prost::Message as _;
use serde::Serialize;

use crate::grpc_http2::{self, GrpcHttp2};
use crate::harness::clock::Stopwatch;
use crate::harness::histogram::new_histogram;
use crate::harness::json::{self, Machine};
use crate::harness::latency_table::{self, Row};
use crate::harness::{cpu, Peer, Stop};
use crate::proto::pb::{EchoReply, EchoRequest};
use fabric::FABRIC_ROWS;
use floor::Floor;

/// `echo_latency`'s options.
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

/// The peer processes `echo_latency` spawns.
#[derive(clap::Subcommand, Debug)]
pub enum Role {
    /// The user's netless echo server (`netless echo-server`).
    EchoServer(echo_server::Args),
    /// A tonic echo server on TCP loopback.
    GrpcServer(grpc_http2::ServerArgs),
    /// The other end of the shared-memory floor ping-pong.
    Floor(floor::PeerArgs),
}

/// Runs a peer process.
pub fn peer(role: Role) -> anyhow::Result<()> {
    match role {
        Role::EchoServer(args) => echo_server::run(args).map(drop),
        Role::GrpcServer(args) => grpc_http2::serve(args),
        Role::Floor(args) => floor::peer(args),
    }
}

/// The rows, in the table's order: the fabric rows follow `netless-raw`.
fn transports() -> Vec<&'static str> {
    let mut all = vec!["grpc-http2", "netless-proto", "netless-raw"];
    all.extend(FABRIC_ROWS.iter().map(|row| row.transport));
    all.push("floor");
    all
}
const WARMUP_CALLS: u64 = 2_000;

/// How a netless row's server and client are configured: the flags of the user's echo
/// server (its `ServerConfig`, in the peer process) and the client's `ClientConfig`.
#[derive(Debug, Default)]
struct Setup {
    /// `netless echo-server` flags beyond the service, worker and CPU.
    server_flags: Vec<String>,
    /// How the measuring client connects.
    client: ClientConfig,
}

/// The user's echo server in a peer process, one worker pinned to `pin`, configured as
/// `setup` says, and a client of it; the server is stopped (SIGTERM) when the [`Peer`] drops.
fn start_echo_server_with(
    service: &str,
    pin: Option<usize>,
    setup: Setup,
) -> anyhow::Result<(Peer, Client)> {
    let pin = pin.map(|cpu| cpu.to_string());
    let mut args = vec!["echo-server", "--service", service, "--workers", "1"];
    if let Some(cpu) = &pin {
        args.extend(["--pin-cpu", cpu]);
    }
    args.extend(setup.server_flags.iter().map(String::as_str));
    // It says so once its socket is bound (or its entry published).
    let (server, _) = Peer::spawn(&args, "netless echo-server: serving", Stop::Sigterm)?;
    let client = Client::connect_with(service, setup.client)
        .context("connecting to the netless echo server")?;
    Ok((server, client))
}

/// A fabric row's p50 over `netless-raw`'s at the same payload (JSON `fabric_vs_raw`).
#[derive(Serialize, Debug)]
struct VsRaw {
    transport: &'static str,
    label: &'static str,
    payload_bytes: usize,
    p50_over_raw: f64,
    p99_over_raw: f64,
}

/// `echo_latency`'s JSON: `latency_table`'s document (`experiment`, `machine`, `rows`) and
/// the fabric rows' ratios to `netless-raw`.
#[derive(Serialize)]
struct Report<'a> {
    experiment: &'a str,
    machine: Machine,
    rows: &'a [Row],
    fabric_vs_raw: &'a [VsRaw],
}

/// Each fabric row's p50 and p99 over `netless-raw`'s at the same payload.
fn fabric_vs_raw(rows: &[Row]) -> Vec<VsRaw> {
    let mut out = Vec::new();
    for fabric in FABRIC_ROWS {
        for row in rows.iter().filter(|r| r.transport == fabric.transport) {
            let Some(raw) = rows
                .iter()
                .find(|r| r.transport == "netless-raw" && r.payload_bytes == row.payload_bytes)
            else {
                continue;
            };
            if raw.p50_us > 0.0 && raw.p99_us > 0.0 {
                out.push(VsRaw {
                    transport: fabric.transport,
                    label: fabric.label,
                    payload_bytes: row.payload_bytes,
                    p50_over_raw: row.p50_us / raw.p50_us,
                    p99_over_raw: row.p99_us / raw.p99_us,
                });
            }
        }
    }
    out
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

/// Runs the benchmark.
pub fn run(args: Args) -> anyhow::Result<()> {
    if args.calls == 0 || args.rounds == 0 || args.payloads.is_empty() {
        bail!("--calls, --rounds and --payloads must be non-empty and positive");
    }
    let (client_cpu, peer_cpu) = cpu::two_cpus().map_or((None, None), |(a, b)| (Some(a), Some(b)));
    let service = format!("bench.Echo-{}", std::process::id());
    eprintln!("starting peers (client on cpu {client_cpu:?}, servers on cpu {peer_cpu:?}) ...");
    let mut grpc = GrpcHttp2::start(peer_cpu)?;
    let (_server, client) = start_echo_server_with(&service, peer_cpu, Setup::default())?;
    // Each fabric row: its region, its own echo server met there, and a client of it.
    let mut fabrics = Vec::new();
    for row in &FABRIC_ROWS {
        let (region, setup) = fabric::setup(row)?;
        let service = format!("{service}-{}", row.transport);
        let (server, client) = start_echo_server_with(&service, peer_cpu, setup)?;
        fabrics.push((region, server, client));
    }
    let mut floor = Floor::start(peer_cpu)?;
    // Pin only now: children inherit the affinity of the thread that spawns them.
    if let Some(cpu) = client_cpu {
        netless_shm::pin_current_thread(cpu).context("pinning the measuring thread")?;
    }
    let watch = Stopwatch::calibrate();
    let timer_overhead = watch.overhead_ns();

    let transports = transports();
    let mut hists: Vec<Vec<Histogram<u64>>> = args
        .payloads
        .iter()
        .map(|_| transports.iter().map(|_| new_histogram()).collect())
        .collect();
    let per_round = args.calls.div_ceil(args.rounds);
    let rows_measured = args.payloads.len() * (transports.len() - 1) + 1;
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
        let mut scratch = new_histogram();
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
        for (_, _, client) in &fabrics {
            netless_raw(&watch, client, &payload, WARMUP_CALLS, &mut out, None)?;
        }
    }
    floor.measure(WARMUP_CALLS, &mut new_histogram(), &watch)?;

    for round in 0..args.rounds {
        for (p, &size) in args.payloads.iter().enumerate() {
            let payload = vec![0xa5u8; size];
            for (t, transport) in transports.iter().enumerate() {
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
                    "floor" => floor.measure(per_round, hist, &watch)?,
                    // A fabric row: the same calls as netless-raw, through its region.
                    fabric => {
                        let i = FABRIC_ROWS
                            .iter()
                            .position(|row| row.transport == fabric)
                            .context("a row without a transport")?;
                        let client = &fabrics[i].2;
                        netless_raw(&watch, client, &payload, 200, &mut out, None)?;
                        netless_raw(&watch, client, &payload, per_round, &mut out, Some(hist))?
                    }
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
            transports
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
    latency_table::print_table(
        "echo_latency: sequential calls, client and server in separate processes",
        &rows,
        "grpc-http2",
    );
    println!(
        "timed with {} on a pinned thread; an empty timed interval costs {:.0} ns (included in every row)",
        watch.source(),
        timer_overhead
    );
    let vs_raw = fabric_vs_raw(&rows);
    for r in &vs_raw {
        println!(
            "{} ({}) over netless-raw at {} B: p50 {:.2}×, p99 {:.2}×",
            r.transport, r.label, r.payload_bytes, r.p50_over_raw, r.p99_over_raw
        );
    }
    if let Some(path) = &args.json {
        let report = Report {
            experiment: "echo",
            machine: Machine::current(),
            rows: &rows,
            fabric_vs_raw: &vs_raw,
        };
        json::write(path, &report)?;
    }
    Ok(())
}
