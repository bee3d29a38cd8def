//! Serving one tonic service on TCP, on netless, or both, chosen by a flag.

use std::convert::Infallible;
use std::io::Write;
use std::net::SocketAddr;

use clap::{Args, ValueEnum};
use tonic::body::Body;
use tonic::codegen::http::{Request, Response};
use tonic::codegen::Service;
use tonic::server::NamedService;

/// Where a service is served.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Transport {
    /// Plain tonic over TCP and HTTP/2.
    Tcp,
    /// netless shared memory (the service is named after its `pkg.Service`).
    Netless,
    /// Both at once.
    Both,
}

/// The flags every example server takes.
#[derive(Args, Clone, Debug)]
pub struct ServeArgs {
    /// Where to serve.
    #[arg(long, value_enum, default_value = "both")]
    pub transport: Transport,
    /// TCP address (with `--transport tcp` or `both`); port 0 picks a free one.
    #[arg(long, default_value = "127.0.0.1:50051")]
    pub listen: SocketAddr,
    /// Join this page-pool domain: clients of the same domain send large messages by
    /// reference (no copy through the receive buffer).
    #[arg(long)]
    pub domain: Option<String>,
}

/// The flags every example client takes.
#[derive(Args, Clone, Debug)]
pub struct ClientArgs {
    /// `tcp` or `netless`.
    #[arg(long, value_enum, default_value = "netless")]
    pub transport: Transport,
    /// The server's TCP address (with `--transport tcp`).
    #[arg(long, default_value = "http://127.0.0.1:50051")]
    pub addr: String,
}

/// Serves `service` as `args` say until SIGINT or SIGTERM. Prints `LISTENING tcp=ADDR` and
/// `LISTENING netless=SERVICE` once it is reachable.
pub fn serve<S>(args: &ServeArgs, service: S) -> anyhow::Result<()>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible>
        + NamedService
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    let _netless = match args.transport {
        Transport::Netless | Transport::Both => {
            let mut config = netless::ServerConfig::default();
            if let Some(name) = &args.domain {
                let domain = netless::netless_pool::Domain::join(
                    &netless::netless_pool::DomainConfig::new(name),
                )?;
                config.domain = Some(domain);
            }
            let serving = netless_grpc::GrpcServer::new()
                .config(config)
                .add_service(service.clone())
                .serve()?;
            announce(&format!("netless={}", S::NAME));
            Some(serving)
        }
        Transport::Tcp => None,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        if args.transport == Transport::Netless {
            shutdown_signal().await;
            return Ok(());
        }
        let listener = tokio::net::TcpListener::bind(args.listen).await?;
        announce(&format!("tcp={}", listener.local_addr()?));
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming_shutdown(
                tonic::transport::server::TcpIncoming::from(listener),
                shutdown_signal(),
            )
            .await?;
        Ok(())
    })
}

fn announce(what: &str) {
    println!("LISTENING {what}");
    let _ = std::io::stdout().flush();
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
