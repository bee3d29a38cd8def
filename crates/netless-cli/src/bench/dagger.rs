//! Placeholder: being written.

use std::process::ExitCode;

/// Arguments.
#[derive(clap::Args, Debug)]
pub struct Args {}

/// Arguments of the peer processes.
#[derive(clap::Args, Debug)]
pub struct PeerArgs {}

/// Runs the benchmark.
pub fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("not built yet")
}

/// Runs a peer process.
pub fn peer(_args: PeerArgs) -> anyhow::Result<()> {
    anyhow::bail!("not built yet")
}
