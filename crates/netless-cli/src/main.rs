//! `netless`: serve, call and benchmark netless services from the command line.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use netless_cli::cmd;

mod bench;

/// RPC over shared memory: serve, call and benchmark netless services.
#[derive(Parser, Debug)]
#[command(name = "netless", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve an echo service until SIGINT or SIGTERM.
    EchoServer(cmd::echo_server::Args),
    /// Call a service repeatedly, like ping(8), and summarise the round-trip times.
    Ping(cmd::ping::Args),
    /// Forward gRPC/HTTP2 (and TLS) from the network to netless services by path.
    Gateway(cmd::gateway::Args),
    /// Size a receive buffer from the queueing model: Erlang-C E\[Nq\] and 10 × E\[Nq\] × B.
    Size(cmd::size::Args),
    /// Simulate a k-worker server (single queue vs partitioned) and check it against Erlang-C.
    Sim(cmd::sim::Args),
    /// Show replicas' live counters, refreshing like top (or one JSON snapshot with --json).
    Stat(cmd::stat::Args),
    /// Read or set a replica's soft registers while it runs.
    Ctl(cmd::ctl::Args),
    /// Run a benchmark and print its table (and JSON with --json).
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Internal: the peer processes the benchmarks spawn.
    #[command(subcommand, hide = true)]
    BenchPeer(PeerCommand),
}

#[derive(Subcommand, Debug)]
enum BenchCommand {
    /// NotNets Table 1: gRPC over HTTP/2 vs netless (protobuf and raw) vs the shared-memory floor.
    Echo(bench::echo::Args),
    /// The same tonic client over TCP/HTTP2, over the netless Channel, and through the gateway.
    Grpc(bench::grpc::Args),
    /// Split gRPC Figure 2: one tonic process vs gateway + business-logic process.
    Split(bench::split::Args),
    /// DmRPC Figs. 5-7: pass by value vs by reference (domain page pool), copy-on-write.
    Dmrpc(bench::dmrpc::Args),
    /// NEBULA: a key-value service under open-loop load; receive-buffer provisioning and dispatch.
    Kvs(bench::kvs::Args),
    /// Dagger Figs. 5-6: pipelined 64 B echo throughput and latency by request batching.
    Dagger(bench::dagger::Args),
}

#[derive(Subcommand, Debug)]
enum PeerCommand {
    /// A tonic echo server on TCP loopback.
    GrpcServer {
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: String,
        #[arg(long)]
        pin_cpu: Option<usize>,
    },
    /// The echo service served by netless_grpc::GrpcServer.
    GrpcNetless {
        #[arg(long)]
        pin_cpu: Option<usize>,
    },
    /// The whole split-bench service in one tonic process.
    SplitBaseline {
        #[arg(long)]
        pin_cpu: Option<usize>,
    },
    /// The split bench's business logic, on netless.
    SplitLogic {
        #[arg(long)]
        pin_cpu: Option<usize>,
    },
    /// A tier of the DmRPC bench: serves a service, forwards to --next or does the work.
    DmrpcTier(bench::dmrpc::TierArgs),
    /// The server of the DmRPC bench's by-value / by-reference crossover.
    TransferServer {
        #[arg(long)]
        dir: std::path::PathBuf,
        #[arg(long)]
        domain: String,
        #[arg(long)]
        service: String,
        #[arg(long)]
        pin_cpu: Option<usize>,
    },
    /// A process of the key-value bench: the server or one load generator.
    Kvs(bench::kvs::PeerArgs),
    /// A process of the Dagger bench.
    Dagger(bench::dagger::PeerArgs),
    /// The other end of the shared-memory floor ping-pong.
    Floor {
        #[arg(long)]
        fd: i32,
        #[arg(long)]
        pin_cpu: Option<usize>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::EchoServer(args) => cmd::echo_server::run(args),
        Command::Ping(args) => cmd::ping::run(args),
        Command::Gateway(args) => cmd::gateway::run(args),
        Command::Size(args) => cmd::size::run(args),
        Command::Stat(args) => cmd::stat::run(args),
        Command::Ctl(args) => cmd::ctl::run(args),
        Command::Sim(args) => cmd::sim::run(args),
        Command::Bench(BenchCommand::Kvs(args)) => bench::kvs::run(args),
        Command::Bench(BenchCommand::Dagger(args)) => bench::dagger::run(args),
        Command::BenchPeer(PeerCommand::Dagger(args)) => {
            bench::dagger::peer(args).map(|()| ExitCode::SUCCESS)
        }
        Command::BenchPeer(PeerCommand::Kvs(args)) => {
            bench::kvs::peer(args).map(|()| ExitCode::SUCCESS)
        }
        Command::Bench(BenchCommand::Echo(args)) => bench::echo::run(args),
        Command::Bench(BenchCommand::Grpc(args)) => bench::grpc::run(args),
        Command::Bench(BenchCommand::Split(args)) => bench::split::run(args),
        Command::Bench(BenchCommand::Dmrpc(args)) => bench::dmrpc::run(args),
        Command::BenchPeer(PeerCommand::DmrpcTier(args)) => {
            bench::dmrpc::serve_tier(args).map(|()| ExitCode::SUCCESS)
        }
        Command::BenchPeer(PeerCommand::TransferServer {
            dir,
            domain,
            service,
            pin_cpu,
        }) => bench::transfer::serve(&dir, &domain, &service, pin_cpu).map(|()| ExitCode::SUCCESS),
        Command::BenchPeer(PeerCommand::SplitBaseline { pin_cpu }) => {
            bench::split::serve_baseline(pin_cpu).map(|()| ExitCode::SUCCESS)
        }
        Command::BenchPeer(PeerCommand::SplitLogic { pin_cpu }) => {
            bench::split::serve_logic(pin_cpu).map(|()| ExitCode::SUCCESS)
        }
        Command::BenchPeer(PeerCommand::GrpcNetless { pin_cpu }) => {
            bench::grpc::serve_netless(pin_cpu).map(|()| ExitCode::SUCCESS)
        }
        Command::BenchPeer(PeerCommand::GrpcServer { listen, pin_cpu }) => {
            bench::grpc_http2::serve(&listen, pin_cpu).map(|()| ExitCode::SUCCESS)
        }
        Command::BenchPeer(PeerCommand::Floor { fd, pin_cpu }) => {
            bench::floor::peer(fd, pin_cpu).map(|()| ExitCode::SUCCESS)
        }
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("netless: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// The path of this executable, for spawning peer processes.
pub(crate) fn self_exe() -> anyhow::Result<PathBuf> {
    Ok(std::env::current_exe()?)
}
