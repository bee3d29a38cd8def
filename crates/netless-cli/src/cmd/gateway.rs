//! `netless gateway`: the split architecture's infrastructure process. Terminates gRPC over
//! HTTP/2 (optionally TLS) and forwards every call by path to the netless service of that
//! name, as raw bytes.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use netless_grpc::Gateway;

/// Forward gRPC calls from the network to netless services by path
/// (`/pkg.Service/Method` → service `pkg.Service`).
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Address to listen on (loopback unless told otherwise; port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:50051")]
    pub listen: SocketAddr,
    /// PEM certificate chain: serve TLS (with --tls-key).
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for --tls-cert.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Pin the gateway (all its threads) to this CPU.
    #[arg(long)]
    pub pin_cpu: Option<usize>,
    /// Threads serving connections (default: 1 when pinned, else the CPU count).
    #[arg(long)]
    pub threads: Option<usize>,
    /// How forwarded calls wait for the backend's reply: `futex` (the default: a loaded
    /// gateway has other calls to serve meanwhile), `adaptive` or `spin` (lower latency for
    /// a lightly loaded gateway, at the cost of CPU).
    #[arg(long, default_value = "futex")]
    pub wait: netless::WaitMode,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if let Some(cpu) = args.pin_cpu {
        // Before any thread exists, so every thread (runtime, netless helpers) inherits it.
        netless_shm::pin_current_thread(cpu).with_context(|| format!("pinning to cpu {cpu}"))?;
    }
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => {
            Some(netless_grpc::tls_acceptor(cert, key).map_err(anyhow::Error::msg)?)
        }
        _ => None,
    };
    let threads = args.threads.unwrap_or(if args.pin_cpu.is_some() {
        1
    } else {
        std::thread::available_parallelism().map_or(2, |n| n.get())
    });
    let runtime = if threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()?
    };
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("listening on {}", args.listen))?;
        let address = listener.local_addr()?;
        println!(
            "LISTENING {address}{}",
            if tls.is_some() { " (TLS)" } else { "" }
        );
        std::io::stdout().flush()?;
        let gateway = Gateway::new(netless::ClientConfig {
            wait: netless::WaitPolicy {
                mode: args.wait,
                ..Default::default()
            },
            ..Default::default()
        });
        gateway
            .clone()
            .serve(listener, tls, shutdown_signal())
            .await?;
        let (calls, refused) = gateway.counts();
        eprintln!("gateway: {calls} calls forwarded, {refused} refused; bye");
        Ok(ExitCode::SUCCESS)
    })
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
