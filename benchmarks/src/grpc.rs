//! `grpc_paths`: the same tonic client code over (a) tonic's own HTTP/2 channel on TCP
//! loopback to a tonic server, (b) the netless `Channel` to the service served by
//! `netless_grpc::GrpcServer`, and (c) tonic's HTTP/2 channel to `netless gateway`, which
//! forwards to that same netless server. Every server is its own process. Sequential
//! latency (interleaved rounds), then throughput with many calls in flight.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::bail;
use hdrhistogram::Histogram;

use crate::gateway;
use crate::grpc_http2::{self, GrpcHttp2};
use crate::harness::clock::Stopwatch;
use crate::harness::histogram::new_histogram;
use crate::harness::latency_table::{self, Row};
use crate::harness::{cpu, json, peer, Peer, Stop};
use crate::proto::{EchoClient, EchoRequest};

/// The netless service name the echo service is served under (its gRPC `pkg.Service`).
const SERVICE: &str = "bench.Echo";

/// `grpc_paths`' options.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Measured sequential calls per row.
    #[arg(long, default_value_t = 20_000)]
    pub calls: u64,
    /// Calls in flight for the throughput runs.
    #[arg(long, default_value_t = 32)]
    pub in_flight: u64,
    /// Calls per throughput run.
    #[arg(long, default_value_t = 50_000)]
    pub throughput_calls: u64,
    /// Write the figures as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// The peer processes `grpc_paths` spawns.
#[derive(clap::Subcommand, Debug)]
pub enum Role {
    /// A tonic echo server on TCP loopback.
    GrpcServer(grpc_http2::ServerArgs),
    /// The echo service served by `netless_grpc::GrpcServer`.
    GrpcNetless {
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
        Role::GrpcServer(args) => grpc_http2::serve(args),
        Role::GrpcNetless { pin_cpu } => serve_netless(pin_cpu),
        Role::Gateway(args) => gateway::serve(*args),
    }
}

/// A `GrpcServer` serving the echo service over netless, in its own process.
fn serve_netless(pin_cpu: Option<usize>) -> anyhow::Result<()> {
    if let Some(cpu) = pin_cpu {
        netless_shm::pin_current_thread(cpu)?;
    }
    let config = netless::ServerConfig {
        pin_cpus: pin_cpu.into_iter().collect(),
        ..Default::default()
    };
    let _servers = netless_grpc::GrpcServer::new()
        .config(config)
        .add_service(grpc_http2::echo_service())
        .serve()?;
    peer::listening(SERVICE)?;
    peer::until_stdin_closes();
    Ok(())
}

async fn sequential<T>(
    client: &mut EchoClient<T>,
    payload: &[u8],
    calls: u64,
    hist: &mut Histogram<u64>,
    watch: &Stopwatch,
) -> anyhow::Result<()>
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<tonic::codegen::StdError>,
    T::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <T::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    for _ in 0..calls {
        let start = watch.mark();
        let reply = client
            .echo(EchoRequest {
                payload: payload.to_vec(),
            })
            .await?;
        let ns = watch.elapsed_ns(start);
        if reply.get_ref().payload.len() != payload.len() {
            bail!(
                "echo returned {} bytes for {}",
                reply.get_ref().payload.len(),
                payload.len()
            );
        }
        hist.saturating_record(ns.max(1));
    }
    Ok(())
}

async fn throughput<T>(
    client: EchoClient<T>,
    payload: &[u8],
    calls: u64,
    in_flight: u64,
) -> anyhow::Result<f64>
where
    T: tonic::client::GrpcService<tonic::body::Body> + Clone + Send + 'static,
    T::Future: Send,
    T::Error: Into<tonic::codegen::StdError>,
    T::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <T::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    let per_task = calls.div_ceil(in_flight);
    let started = Instant::now();
    let tasks: Vec<_> = (0..in_flight)
        .map(|_| {
            let mut client = client.clone();
            let payload = payload.to_vec();
            tokio::spawn(async move {
                for _ in 0..per_task {
                    client
                        .echo(EchoRequest {
                            payload: payload.clone(),
                        })
                        .await?;
                }
                Ok::<_, tonic::Status>(())
            })
        })
        .collect();
    for task in tasks {
        task.await??;
    }
    Ok((per_task * in_flight) as f64 / started.elapsed().as_secs_f64())
}

/// Runs the benchmark.
pub fn run(args: Args) -> anyhow::Result<()> {
    if args.calls == 0 || args.in_flight == 0 || args.throughput_calls == 0 {
        bail!("--calls, --in-flight and --throughput-calls must be positive");
    }
    let (client_cpu, peer_cpu) = cpu::two_cpus().map_or((None, None), |(a, b)| (Some(a), Some(b)));
    let tcp = GrpcHttp2::start(peer_cpu)?;
    let peer_cpu_arg = peer_cpu.map(|c| c.to_string());
    let mut peer_args = vec!["grpc-netless"];
    if let Some(cpu) = &peer_cpu_arg {
        peer_args.extend(["--pin-cpu", cpu]);
    }
    let (_peer, _) = Peer::spawn(&peer_args, "LISTENING", Stop::CloseStdin)?;
    // The gateway shares its core with the servers here: it sleeps while it waits.
    let gateway = gateway::spawn(peer_cpu, SERVICE, "futex")?;
    let channel = netless_grpc::Channel::connect(SERVICE)?;
    let mut netless_client = EchoClient::new(channel);
    if let Some(cpu) = client_cpu {
        netless_shm::pin_current_thread(cpu)?;
    }
    let watch = Stopwatch::calibrate();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    // Created on this runtime: a tonic channel's connection task runs where it was made.
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{}", tcp.address()))?
        .tcp_nodelay(true);
    let mut tcp_client = EchoClient::new(rt.block_on(endpoint.connect())?);
    let endpoint =
        tonic::transport::Endpoint::from_shared(format!("http://{}", gateway.1))?.tcp_nodelay(true);
    let mut gateway_client = EchoClient::new(rt.block_on(endpoint.connect())?);
    let transports = ["tonic-tcp", "tonic-netless", "tcp-gateway-netless"];
    let payloads = [64usize, 4096];
    let mut rows = Vec::new();
    let mut json_rows = Vec::new();
    let (calls, in_flight) = (args.throughput_calls, args.in_flight);
    rt.block_on(async {
        for &size in &payloads {
            let payload = vec![0x5au8; size];
            let mut hists = [new_histogram(), new_histogram(), new_histogram()];
            let watch = &watch;
            // Warm up all three, then interleave ten rounds.
            let warm = &mut new_histogram();
            sequential(&mut tcp_client, &payload, 500, warm, watch).await?;
            sequential(&mut netless_client, &payload, 2000, warm, watch).await?;
            sequential(&mut gateway_client, &payload, 500, warm, watch).await?;
            let per_round = args.calls.div_ceil(10);
            for _ in 0..10 {
                let [tcp, shm, gw] = &mut hists;
                sequential(&mut tcp_client, &payload, per_round, tcp, watch).await?;
                sequential(&mut netless_client, &payload, per_round, shm, watch).await?;
                sequential(&mut gateway_client, &payload, per_round, gw, watch).await?;
            }
            let tcp_rate = throughput(tcp_client.clone(), &payload, calls, in_flight).await?;
            let shm_rate = throughput(netless_client.clone(), &payload, calls, in_flight).await?;
            let gw_rate = throughput(gateway_client.clone(), &payload, calls, in_flight).await?;
            for (t, (hist, rate)) in hists.iter().zip([tcp_rate, shm_rate, gw_rate]).enumerate() {
                let row = Row::from_histogram(transports[t], size, hist);
                json_rows.push(serde_json::json!({
                    "transport": row.transport,
                    "payload_bytes": row.payload_bytes,
                    "calls": row.calls,
                    "avg_us": row.avg_us,
                    "p50_us": row.p50_us,
                    "p99_us": row.p99_us,
                    "p999_us": row.p999_us,
                    "throughput_calls_per_s": rate,
                    "in_flight": in_flight,
                }));
                rows.push((row, rate));
            }
        }
        Ok::<_, anyhow::Error>(())
    })?;
    let plain: Vec<Row> = rows.iter().map(|(r, _)| r.clone()).collect();
    latency_table::print_table(
        "grpc_paths: the same tonic client, sequential calls, server in another process",
        &plain,
        "tonic-tcp",
    );
    println!();
    println!("throughput with {} calls in flight:", args.in_flight);
    for triple in rows.chunks(3) {
        let (tcp_row, tcp_rate) = &triple[0];
        let (_, shm_rate) = &triple[1];
        let (_, gw_rate) = &triple[2];
        println!(
            "  {:>5} B  tonic-tcp {:>9.0}/s   tonic-netless {:>9.0}/s ({:.1}×)   tcp-gateway-netless {:>9.0}/s ({:.1}×)",
            tcp_row.payload_bytes,
            tcp_rate,
            shm_rate,
            shm_rate / tcp_rate,
            gw_rate,
            gw_rate / tcp_rate
        );
    }
    if let Some(path) = &args.json {
        json::write(
            path,
            &serde_json::json!({ "experiment": "grpc", "rows": json_rows }),
        )?;
    }
    Ok(())
}
