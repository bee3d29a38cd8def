//! Serving one tonic service on TCP, on netless, or both, chosen by a flag, from one
//! `GrpcServer`; and the flags of the clients that call it.

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
    /// `tcp` or `netless` (without `--target`).
    #[arg(long, value_enum, default_value = "netless")]
    pub transport: Transport,
    /// The server's TCP address (with `--transport tcp`).
    #[arg(long, default_value = "http://127.0.0.1:50051")]
    pub addr: String,
    /// Where to call, by target (`pkg.Service`, `netless:pkg.Service`, `http://host:port`,
    /// ...): a bare service name goes where the `NETLESS_TARGETS` table maps it, else to the
    /// local netless service. Overrides `--transport`.
    #[arg(long)]
    pub target: Option<String>,
}

/// Serves `service` as `args` say until SIGINT or SIGTERM, netless and TCP from one
/// [`netless_grpc::GrpcServer`]. Prints `LISTENING netless=SERVICE` and `LISTENING tcp=ADDR`
/// once it is reachable.
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
    let mut server = netless_grpc::GrpcServer::new().add_service(service);
    if args.transport != Transport::Tcp {
        let mut config = netless::ServerConfig::default();
        if let Some(name) = &args.domain {
            let domain = netless::netless_pool::Domain::join(
                &netless::netless_pool::DomainConfig::new(name),
            )?;
            config.domain = Some(domain);
        }
        server = server.config(config);
    }
    if args.transport != Transport::Netless {
        server = server.tcp(args.listen);
    }
    let serving = server.netless(args.transport != Transport::Tcp).serve()?;
    if args.transport != Transport::Tcp {
        announce(&format!("netless={}", S::NAME));
    }
    if let Some(addr) = serving.tcp_addr() {
        announce(&format!("tcp={addr}"));
    }
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(shutdown_signal());
    serving.stop();
    Ok(())
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
