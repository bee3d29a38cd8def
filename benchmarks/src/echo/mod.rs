//! `echo_latency`: NotNets Table 1 on this machine.
//!
//! One client process (this one, pinned to one CPU) measures sequential calls against peer
//! processes pinned to another CPU: a tonic server over TCP loopback (`grpc-http2`), the
//! user's netless echo server (`netless-proto` with prost messages, `netless-raw` with raw
//! bytes), and a plain spinning shared-memory ping-pong (`floor`). The rows are measured in
//! rounds, interleaved, so drifts in the machine's load hit every row alike.

mod floor;

use std::path::PathBuf;

use anyhow::{bail, Context as _};
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use netless::{CallOptions, Client};
use netless_cli::cmd::echo_server::{self, PROTO_METHOD};
use prost::Message as _;

use crate::grpc_http2::{self, GrpcHttp2};
use crate::harness::clock::Stopwatch;
use crate::harness::histogram::new_histogram;
use crate::harness::latency_table::{self, Row};
use crate::harness::{cpu, Peer, Stop};
use crate::proto::pb::{EchoReply, EchoRequest};
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

const TRANSPORTS: [&str; 4] = ["grpc-http2", "netless-proto", "netless-raw", "floor"];
const WARMUP_CALLS: u64 = 2_000;

/// The user's echo server in a peer process, one worker pinned to `pin`, and a client of
/// it; the server is stopped (SIGTERM) when the [`Peer`] drops.
fn start_echo_server(service: &str, pin: Option<usize>) -> anyhow::Result<(Peer, Client)> {
    let pin = pin.map(|cpu| cpu.to_string());
    let mut args = vec!["echo-server", "--service", service, "--workers", "1"];
    if let Some(cpu) = &pin {
        args.extend(["--pin-cpu", cpu]);
    }
    // It says so once its socket is bound.
    let (server, _) = Peer::spawn(&args, "netless echo-server: serving", Stop::Sigterm)?;
    let client = Client::connect(service).context("connecting to the netless echo server")?;
    Ok((server, client))
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
    let (_server, client) = start_echo_server(&service, peer_cpu)?;
    let mut floor = Floor::start(peer_cpu)?;
    // Pin only now: children inherit the affinity of the thread that spawns them.
    if let Some(cpu) = client_cpu {
        netless_shm::pin_current_thread(cpu).context("pinning the measuring thread")?;
    }
    let watch = Stopwatch::calibrate();
    let timer_overhead = watch.overhead_ns();

    let mut hists: Vec<Vec<Histogram<u64>>> = args
        .payloads
        .iter()
        .map(|_| TRANSPORTS.iter().map(|_| new_histogram()).collect())
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
    }
    floor.measure(WARMUP_CALLS, &mut new_histogram(), &watch)?;

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
    if let Some(path) = &args.json {
        latency_table::write_json(path, "echo", &rows)?;
    }
    Ok(())
}
