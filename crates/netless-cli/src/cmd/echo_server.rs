//! `netless echo-server`: serves an echo service until SIGINT/SIGTERM.
//!
//! Method `/bench.Echo/Echo` decodes an `EchoRequest` protobuf and answers an
//! `EchoReply` (the `netless-proto` benchmark row); every other method echoes the raw bytes.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use netless::{Request, ResponseBuilder, Server, ServerConfig, Status, WaitMode, WaitPolicy};
use prost::Message as _;

/// The protobuf echo method's path.
pub const PROTO_METHOD: &str = "/bench.Echo/Echo";

/// `bench.EchoRequest`, the protobuf echo method's request: `bytes payload = 1`
/// (the benchmarks' `proto/echo.proto`, whose clients send it).
#[derive(Clone, PartialEq, prost::Message)]
pub struct EchoRequest {
    /// The bytes to echo.
    #[prost(bytes = "vec", tag = "1")]
    pub payload: Vec<u8>,
}

/// `bench.EchoReply`: `bytes payload = 1`, the request's payload.
#[derive(Clone, PartialEq, prost::Message)]
pub struct EchoReply {
    /// The request's bytes.
    #[prost(bytes = "vec", tag = "1")]
    pub payload: Vec<u8>,
}

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Service name to serve.
    #[arg(long)]
    pub service: String,
    /// Worker threads.
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    /// Pin workers to these CPUs (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub pin_cpu: Vec<usize>,
    /// How idle workers wait: spin, futex, adaptive or yield.
    #[arg(long, default_value = "adaptive")]
    pub wait_mode: WaitMode,
    /// Spin budget before sleeping, in microseconds (adaptive mode).
    #[arg(long, default_value_t = 50)]
    pub spin_us: u64,
    /// Serve in a memory fabric instead of the socket directory.
    #[command(flatten)]
    pub fabric: super::fabric::FabricArgs,
}

fn echo<'a>(request: &Request<'a>, response: &mut ResponseBuilder<'a>) -> Result<(), Status> {
    if request.method == PROTO_METHOD {
        let decoded = EchoRequest::decode(request.payload)
            .map_err(|e| Status::invalid_argument(format!("bad EchoRequest: {e}")))?;
        let reply = EchoReply {
            payload: decoded.payload,
        };
        reply
            .encode(&mut response.payload)
            .map_err(|e| Status::internal(e.to_string()))?;
    } else {
        // Raw echo: the reply borrows the request, copied once, straight into the ring.
        response.reply_with(request.payload);
    }
    for (key, value) in request.metadata.iter() {
        if key.starts_with("echo-") {
            response.metadata.insert(key, value);
        }
    }
    Ok(())
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, stop.clone()).context("installing signal handler")?;
    }
    let fabric = args.fabric.open()?;
    let config = ServerConfig {
        fabric: fabric.clone(),
        workers: args.workers,
        pin_cpus: args.pin_cpu.clone(),
        wait: WaitPolicy {
            mode: args.wait_mode,
            spin: Duration::from_micros(args.spin_us),
        },
        ..ServerConfig::default()
    };
    let server = Server::bind(&args.service, config, echo)?;
    let at = match &fabric {
        Some(f) => format!(
            "in fabric {} (member {})",
            f.path().display(),
            f.member().index
        ),
        None => format!("at {}", server.socket_path().display()),
    };
    println!(
        "netless echo-server: serving `{}` {at} with {} worker(s)",
        args.service, args.workers
    );
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let stats = server.stats();
    server.shutdown();
    // Leaves the fabric (after the server has withdrawn its entry).
    drop(fabric);
    eprintln!(
        "netless echo-server: stopped after {} requests ({} errors)",
        stats.requests, stats.errors
    );
    Ok(ExitCode::SUCCESS)
}
