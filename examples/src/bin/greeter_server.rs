//! `helloworld.Greeter`, served on TCP, netless, or both:
//! `cargo run -p netless-examples --bin greeter_server -- --transport both`.

use clap::Parser;
use netless_examples::greeter::MyGreeter;
use netless_examples::helloworld::greeter_server::GreeterServer;
use netless_examples::serve::{serve, ServeArgs};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    serve: ServeArgs,
}

fn main() -> anyhow::Result<()> {
    serve(&Cli::parse().serve, GreeterServer::new(MyGreeter))
}
