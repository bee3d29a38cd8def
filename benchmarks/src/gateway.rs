//! The user's `netless gateway` as a peer of the gRPC experiments: the `gateway` peer role
//! runs the `netless` command's own gateway code ([`netless_cli::cmd::gateway`]), so what is
//! measured is what the user runs. It owns how the experiments start it, never what they
//! send through it.

use crate::harness::{Peer, Stop};

/// The gateway on a free loopback port, pinned to `cpu`, forwarding to `service` only and
/// waiting for its backends' replies in `wait` mode; and its address. It is a daemon:
/// stopped with SIGTERM.
pub fn spawn(cpu: Option<usize>, service: &str, wait: &str) -> anyhow::Result<(Peer, String)> {
    let cpu = cpu.map(|c| c.to_string());
    let mut args = vec![
        "gateway",
        "--listen",
        "127.0.0.1:0",
        "--allow",
        service,
        "--wait",
        wait,
    ];
    if let Some(cpu) = &cpu {
        args.extend(["--pin-cpu", cpu]);
    }
    Peer::spawn(&args, "LISTENING", Stop::Sigterm)
}

/// Runs the `gateway` peer role until SIGTERM or SIGINT.
pub fn serve(args: netless_cli::cmd::gateway::Args) -> anyhow::Result<()> {
    netless_cli::cmd::gateway::run(args).map(drop)
}
