//! `routeguide.RouteGuide`, served on TCP, netless, or both:
//! `cargo run -p netless-examples --bin routeguide_server -- --transport both`.

use std::io::Write;
use std::sync::Arc;

use clap::Parser;
use netless_examples::routeguide::RouteGuideService;
use netless_examples::routeguide_pb::route_guide_server::RouteGuideServer;
use netless_examples::serve::{serve, ServeArgs};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    serve: ServeArgs,
    /// How many features the guide knows (on a grid of rows of 100).
    #[arg(long, default_value_t = 1000)]
    features: usize,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let observer = Arc::new(|event: String| {
        println!("EVENT {event}");
        let _ = std::io::stdout().flush();
    });
    let service = RouteGuideService::new(cli.features, observer);
    serve(&cli.serve, RouteGuideServer::new(service))
}
