//! `netless`: serve, call and inspect netless services from the command line.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use netless_cli::cmd;

/// RPC over shared memory: serve, call and inspect netless services.
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
    /// Forward gRPC/HTTP2 (and TLS) from the network to the netless services --allow names.
    Gateway(Box<cmd::gateway::Args>),
    /// Size a receive buffer from the queueing model: Erlang-C E\[Nq\] and 10 × E\[Nq\] × B.
    Size(cmd::size::Args),
    /// Simulate a k-worker server (single queue vs partitioned) and check it against Erlang-C.
    Sim(cmd::sim::Args),
    /// Show replicas' live counters, refreshing like top (or one JSON snapshot with --json).
    Stat(cmd::stat::Args),
    /// Read or set a replica's soft registers while it runs.
    Ctl(cmd::ctl::Args),
    /// Name the benchmark binary for NAME (or run it, when it was built beside `netless`).
    Bench(cmd::bench::Args),
    /// Inspect a memory-fabric region: `netless fabric ls PATH`.
    Fabric(cmd::fabric::Args),
    /// Serve a memory node holding the pages of references that leave their host
    /// (`netless memnode stat --addr ADDR`: what a node holds).
    Memnode(cmd::memnode::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::EchoServer(args) => cmd::echo_server::run(args),
        Command::Ping(args) => cmd::ping::run(args),
        Command::Gateway(args) => cmd::gateway::run(*args),
        Command::Size(args) => cmd::size::run(args),
        Command::Stat(args) => cmd::stat::run(args),
        Command::Ctl(args) => cmd::ctl::run(args),
        Command::Sim(args) => cmd::sim::run(args),
        Command::Bench(args) => cmd::bench::run(args),
        Command::Fabric(args) => cmd::fabric::run(args),
        Command::Memnode(args) => cmd::memnode::run(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("netless: {e:#}");
            ExitCode::from(2)
        }
    }
}
