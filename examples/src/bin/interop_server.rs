//! gRPC's interop test server, `grpc.testing.TestService`, served on TCP, netless, or both:
//! `cargo run -p netless-examples --bin interop_server -- --transport both`. Any gRPC
//! implementation's interop client calls it over TCP, or through `netless gateway` in front
//! of its netless side; `interop_client` calls it over netless.

use clap::Parser;
use netless_examples::interop::server::service;
use netless_examples::serve::{serve, ServeArgs};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    serve: ServeArgs,
}

fn main() -> anyhow::Result<()> {
    serve(&Cli::parse().serve, service())
}
