//! `cross_host`: DmRPC-net's nested chain (§VI-B, Figure 5) across two hosts, with the
//! gateways as the only network ends and the memory node holding what travels by reference.
//!
//! The two hosts are two network namespaces on one veth link (`netless_testing::TwoHosts`):
//! A (10.77.0.1) and B (10.77.0.2), each with its own socket directory. Tier K of the chain is
//! its own process serving `chain.TierK` over netless on host B when K is odd and on host A
//! when K is even, so every hop of a chain crosses between the hosts and most tiers (4 of 7)
//! are on the remote host B. Each host runs `netless gateway`: it serves its own tiers to the
//! other host (ingress) and the other host's tiers to its own (egress), so a tier calls the
//! next one by name through a netless `Channel` and never opens a socket. `netless memnode`
//! runs on host A. The client (a process on A) calls `chain.Tier1` with N hops:
//!
//! - **by value**, the array is the request, and every hop carries it: over shared memory to
//!   the gateway, over HTTP/2 to the other host's gateway, over shared memory to the tier;
//! - **by reference**, the client puts the array on the memory node (fresh for every call),
//!   the hops carry its 48-byte reference, and the last tier reads the pages from the node.
//!
//! Each point (hops × size) runs by value and by reference in interleaved rounds (the order
//! alternating), `--in-flight` calls at a time for `--window-ms`; the table gives the median
//! over rounds of throughput, p50 and p99, and the median of the rounds' ratios. A second
//! table compares a 64-byte call to a tier on this host (netless) with one to the other host,
//! through the same `Channel` type: through this host's gateway (egress) and straight to the
//! other host's gateway over HTTP/2.
//!
//! Making the namespaces needs root and `ip` (iproute2); without them the benchmark says so
//! and exits with status 2.

pub mod client;
pub mod remote;
pub mod report;
pub mod tier;

use std::process::Command;

use anyhow::Context as _;
use netless_testing::{Host, TwoHosts};

use crate::harness::{peer, CommonArgs, Peer, Stop};
use client::{Measured, Via};
use report::{ChainPoint, LatencyPoint};

/// Longest chain (tiers spawned).
pub const MAX_HOPS: u32 = 7;
/// Where each host's gateway and the memory node listen, inside their namespaces.
const GATEWAY_PORT: u16 = 50051;
const MEMNODE_PORT: u16 = 50600;

/// The benchmark's flags.
#[derive(clap::Args, Debug)]
#[command(
    mut_arg("json", |a| a.help("Write every point's rounds and medians as JSON to this file")),
    mut_arg("plot", |a| a.help("Unused by this benchmark")),
    mut_arg("quick", |a| a.help("One round of short windows at 1 and 7 hops (for tests)"))
)]
pub struct Args {
    /// Chain lengths.
    #[arg(long, value_delimiter = ',', default_value = "1,3,7")]
    pub hops: Vec<u32>,
    /// Array sizes in bytes.
    #[arg(long, value_delimiter = ',', default_value = "65536,1048576")]
    pub sizes: Vec<usize>,
    /// Interleaved rounds per point.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Length of each measured window, in ms.
    #[arg(long, default_value_t = 2000)]
    pub window_ms: u64,
    /// Calls in flight.
    #[arg(long, default_value_t = 4)]
    pub in_flight: usize,
    /// Sequential calls per round of the local-vs-remote latency table.
    #[arg(long, default_value_t = 1000)]
    pub latency_calls: usize,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// The peer roles.
#[derive(clap::Subcommand, Debug)]
pub enum Role {
    /// A tier of the chain.
    Tier(tier::TierArgs),
    /// The load.
    Client(client::ClientArgs),
    /// A host's `netless gateway`.
    Gateway(Box<netless_cli::cmd::gateway::Args>),
    /// The `netless memnode`.
    Memnode(netless_cli::cmd::memnode::Args),
}

/// Runs a peer role.
pub fn peer(role: Role) -> anyhow::Result<()> {
    match role {
        Role::Tier(args) => tier::serve(args),
        Role::Client(args) => client::serve(args),
        Role::Gateway(args) => crate::gateway::serve(*args),
        Role::Memnode(args) => netless_cli::cmd::memnode::run(args).map(drop),
    }
}

/// The processes of a run, stopped in reverse order of start when dropped.
struct Processes {
    peers: Vec<Peer>,
}

impl Drop for Processes {
    fn drop(&mut self) {
        while let Some(peer) = self.peers.pop() {
            drop(peer);
        }
    }
}

/// Starts `peer ARGS…` of this executable on `host`, waiting for its `LISTENING` line (a
/// gateway prints an `EGRESS` line per egress service first).
fn start(host: &Host, args: &[String], stop: Stop) -> anyhow::Result<Peer> {
    let mut command: Command = peer::command(args)?;
    host.enter(&mut command);
    let what = format!("[{}] {}", host.name, args.join(" "));
    let egress = args.iter().any(|a| a == "--egress");
    let ready = if egress { "EGRESS" } else { "LISTENING" };
    let (mut peer, _) = Peer::spawn_command(command, what, ready, stop)?;
    if egress {
        while !peer.line()?.starts_with("LISTENING") {}
    }
    Ok(peer)
}

fn words(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// Runs the benchmark.
pub fn run(mut args: Args) -> anyhow::Result<()> {
    if args.common.quick {
        args.hops = vec![1, MAX_HOPS];
        args.sizes = vec![64 << 10, 1 << 20];
        args.rounds = 1;
        args.window_ms = 400;
        args.latency_calls = 100;
    }
    anyhow::ensure!(
        args.hops.iter().all(|h| (1..=MAX_HOPS).contains(h)),
        "--hops must be 1 to {MAX_HOPS}"
    );
    anyhow::ensure!(
        args.in_flight > 0 && args.rounds > 0,
        "--in-flight and --rounds must be > 0"
    );
    let hosts = TwoHosts::new("cross-host")
        .map_err(|why| anyhow::anyhow!("cross_host runs on two network namespaces: {why}"))?;
    let memnode = format!("http://{}:{MEMNODE_PORT}", hosts.a.addr);
    let mut processes = Processes { peers: Vec::new() };
    processes.peers.push(start(
        &hosts.a,
        &words(&[
            "memnode",
            "--listen",
            &format!("{}:{MEMNODE_PORT}", hosts.a.addr),
        ]),
        Stop::Sigterm,
    )?);
    for k in 1..=MAX_HOPS {
        let host = if k % 2 == 1 { &hosts.b } else { &hosts.a };
        let args = words(&["tier", "--index", &k.to_string(), "--memnode", &memnode]);
        processes.peers.push(start(host, &args, Stop::CloseStdin)?);
    }
    for (host, other, parity) in [(&hosts.a, &hosts.b, 1), (&hosts.b, &hosts.a, 0)] {
        let listen = format!("{}:{GATEWAY_PORT}", host.addr);
        let mut gateway = words(&["gateway", "--listen", &listen]);
        // Its own tiers in (the others' calls), the other host's out.
        for k in 1..=MAX_HOPS {
            if k % 2 == parity {
                gateway.push("--egress".into());
                gateway.push(format!(
                    "chain.Tier{k}=http://{}:{GATEWAY_PORT}",
                    other.addr
                ));
            } else {
                gateway.push("--allow".into());
                gateway.push(format!("chain.Tier{k}"));
            }
        }
        processes.peers.push(start(host, &gateway, Stop::Sigterm)?);
    }
    let remote_gateway = format!("http://{}:{GATEWAY_PORT}", hosts.b.addr);
    let client_args = words(&[
        "client",
        "--memnode",
        &memnode,
        "--remote-gateway",
        &remote_gateway,
    ]);
    let mut client = start(&hosts.a, &client_args, Stop::CloseStdin)?;

    let latency = measure_latency(&mut client, &args)?;
    let mut points = Vec::new();
    for &size in &args.sizes {
        for &hops in &args.hops {
            points.push(measure_chain(&mut client, &args, hops, size)?);
        }
    }
    drop(client);
    drop(processes);
    report::print(&points, &latency, &args);
    if let Some(path) = &args.common.json {
        report::write_json(path, &points, &latency, &args)?;
    }
    Ok(())
}

fn ask(client: &mut Peer, command: serde_json::Value) -> anyhow::Result<Measured> {
    client
        .ask(&command.to_string())
        .with_context(|| format!("the client's answer to {command}"))
}

fn measure_latency(client: &mut Peer, args: &Args) -> anyhow::Result<Vec<LatencyPoint>> {
    let vias = [Via::Local, Via::Egress, Via::Direct];
    let mut rounds: Vec<Vec<Measured>> = vec![Vec::new(); vias.len()];
    for round in 0..args.rounds {
        for i in 0..vias.len() {
            // Rotated each round, so a drift of the host hits every path alike.
            let i = (i + round) % vias.len();
            let command = serde_json::json!({
                "op": "latency", "via": vias[i], "calls": args.latency_calls,
            });
            rounds[i].push(ask(client, command)?);
        }
    }
    Ok(vias
        .iter()
        .zip(rounds)
        .map(|(&via, rounds)| LatencyPoint { via, rounds })
        .collect())
}

fn measure_chain(
    client: &mut Peer,
    args: &Args,
    hops: u32,
    size: usize,
) -> anyhow::Result<ChainPoint> {
    let mut point = ChainPoint {
        hops,
        size,
        by_value: Vec::new(),
        by_ref: Vec::new(),
    };
    for round in 0..args.rounds {
        let order = if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for by_ref in order {
            let command = serde_json::json!({
                "op": "chain", "hops": hops, "size": size, "by_ref": by_ref,
                "in_flight": args.in_flight, "window_ms": args.window_ms,
            });
            let measured = ask(client, command)?;
            if by_ref {
                point.by_ref.push(measured);
            } else {
                point.by_value.push(measured);
            }
        }
    }
    Ok(point)
}
