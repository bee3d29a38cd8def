//! `netless gateway`: the split architecture's infrastructure process, and the trust
//! boundary between the network and the owner's netless services. Terminates gRPC over
//! HTTP/2 (optionally TLS, optionally requiring client certificates or a bearer token) and
//! forwards each call to the netless service its path names, as raw bytes, if `--allow`
//! names it; within limits on what callers can hold (`netless_grpc::GatewayLimits`).
//!
//! With `--egress`, the other way too: each remote service named is served as a local
//! netless service of that name whose calls the gateway forwards over HTTP/2 to the
//! remote's endpoints (`netless_grpc::Egress`). A gateway with `--egress` and no `--allow`
//! forwards nothing in and listens on no port.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use netless_grpc::{Gateway, GatewayLimits};

/// Forward gRPC calls from the network to the netless services named by --allow, by path
/// (`/pkg.Service/Method` → service `pkg.Service`), and from local processes to the remote
/// services named by --egress. Anyone who can reach the listening address can call the
/// allowed services as the gateway's user: listen on loopback, or require --tls-client-ca
/// or --token-file.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Address to listen on (loopback unless told otherwise; port 0 picks a free one).
    /// Needs --allow: a gateway that forwards nothing in listens on no port.
    #[arg(long, default_value = "127.0.0.1:50051", requires = "allow")]
    pub listen: SocketAddr,
    /// Services to forward (repeatable): `pkg.Service`, `pkg.*` (every service whose name
    /// starts with `pkg.`) or `*` (every service). Netless's internal services
    /// (`netless.*`, `netless-*`) are never forwarded; every other path gets the same
    /// UNIMPLEMENTED as a service that does not exist. Required unless --egress is given.
    #[arg(
        long = "allow",
        value_name = "PATTERN",
        required_unless_present = "egress"
    )]
    pub allow: Vec<String>,
    /// The remote services served locally, and how they are reached (boxed: the other
    /// commands' arguments are much smaller).
    #[command(flatten)]
    pub egress: Box<EgressArgs>,
    /// PEM certificate chain: serve TLS (with --tls-key).
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for --tls-cert.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// PEM file of the CA(s) that issue client certificates: require mutual TLS (a client
    /// without such a certificate fails the handshake). Needs --tls-cert.
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
    /// File holding a bearer token every call must present as `authorization: Bearer
    /// <token>` (else UNAUTHENTICATED; after 3 such calls in a row the connection is
    /// closed, and calls without it do not keep a connection from the idle timeout). The
    /// file must not be open to group or others.
    #[arg(long, value_name = "PATH")]
    pub token_file: Option<PathBuf>,
    /// Connections served at once; more are closed as soon as they are accepted.
    #[arg(long, default_value_t = GatewayLimits::default().max_connections)]
    pub max_connections: usize,
    /// Connections served at once from one peer (an IPv4 address, an IPv6 /64 network);
    /// its further ones are closed as soon as they are accepted.
    #[arg(long, default_value_t = GatewayLimits::default().max_connections_per_peer)]
    pub max_connections_per_peer: usize,
    /// Streams (calls) one HTTP/2 connection may have open at once.
    #[arg(long, default_value_t = GatewayLimits::default().max_streams)]
    pub max_streams: u32,
    /// Calls one connection has at the backends at once; its others wait their turn (until
    /// their deadline). Every connection may always have 2 calls at each service.
    #[arg(long, default_value_t = GatewayLimits::default().max_calls_per_connection)]
    pub max_calls_per_connection: usize,
    /// Deadline of calls that carry no grpc-timeout (`500ms`, `30s`, `5m`; `0` for none),
    /// at most --max-timeout.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub default_timeout: Duration,
    /// The longest deadline a call gets: a longer grpc-timeout (or none, with
    /// --default-timeout 0) is cut to it before the call goes to the backend (`0` for no
    /// bound: then a client may ask for a backend's resources for as long as it likes).
    #[arg(long, default_value = "300s", value_parser = parse_duration)]
    pub max_timeout: Duration,
    /// Time a client has to complete the TLS handshake.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub tls_handshake_timeout: Duration,
    /// A connection with no authenticated call under way for this long is closed (GOAWAY).
    #[arg(long, default_value = "120s", value_parser = parse_duration)]
    pub idle_timeout: Duration,
    /// Netless connections to each backend service at most, opened as calls need them.
    #[arg(long, default_value_t = GatewayLimits::default().backend_connections)]
    pub backend_connections: usize,
    /// Time a backend has to accept a connection and complete the handshake; calls to one
    /// that does not are UNAVAILABLE, and calls to other services go on.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub backend_connect_timeout: Duration,
    /// Serve the gateway's metrics in the Prometheus text format at `http://ADDR/metrics`,
    /// on a plain-HTTP listener of its own (port 0 picks a free one): its calls in and its
    /// egress tries (gRFC A66 names: `grpc_server_call_*`, `grpc_client_attempt_*`), its
    /// connections and refusals, and the counters of the netless servers it forwards to.
    /// Printed as `METRICS ADDR` once listening. Anyone who reaches it sees the services
    /// called: keep it on loopback or a private network.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<SocketAddr>,
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

/// The egress flags of `netless gateway`.
#[derive(clap::Args, Debug)]
pub struct EgressArgs {
    /// A remote service to serve locally (repeatable):
    /// `pkg.Service=http://10.0.0.2:50051,http://10.0.0.3:50051`. Local processes call it
    /// over netless as `pkg.Service`; the gateway forwards each call to one of its methods
    /// (`/pkg.Service/Method`; any other path is UNIMPLEMENTED), with the caller's
    /// metadata, over HTTP/2 to the least loaded endpoint that is up, and to another one if
    /// the connection failed before the call left. A live netless server of that name
    /// already there, or the name also matching --allow, is an error at startup. Printed as
    /// `EGRESS pkg.Service` once served.
    #[arg(
        id = "egress",
        long = "egress",
        value_name = "SERVICE=ENDPOINTS",
        value_parser = parse_egress
    )]
    pub services: Vec<EgressArg>,
    /// PEM file of the CA(s) that https:// egress endpoints' certificates must chain to
    /// (there are no built-in roots: https endpoints need it).
    #[arg(long, value_name = "PEM")]
    pub egress_ca: Option<PathBuf>,
    /// Time to connect to one egress endpoint (TCP, then TLS) before the call moves to
    /// another one.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub egress_connect_timeout: Duration,
    /// Times an egress call may move to another endpoint after a connection failed before
    /// the call left (never once it may have reached the remote).
    #[arg(long, default_value_t = 2)]
    pub egress_retries: u32,
    /// Calls to each egress service waiting for the remote's response headers at once
    /// (each holds one of its netless worker threads meanwhile).
    #[arg(long, default_value_t = GatewayLimits::default().egress_concurrency)]
    pub egress_concurrency: usize,
    /// Receive buffer of each egress service, in MiB: requests beyond it are refused with
    /// RESOURCE_EXHAUSTED until earlier ones have gone out.
    #[arg(long, value_name = "MiB", default_value_t = GatewayLimits::default().egress_buffer_bytes >> 20)]
    pub egress_buffer: usize,
}

/// One `--egress`: a service and its endpoints.
#[derive(Clone, Debug)]
pub struct EgressArg {
    pub service: String,
    pub endpoints: Vec<String>,
}

/// `pkg.Service=URL[,URL...]`; the gateway checks the name and the URLs.
fn parse_egress(text: &str) -> Result<EgressArg, String> {
    let usage = || format!("`{text}`: give SERVICE=ENDPOINT[,ENDPOINT...]");
    let (service, endpoints) = text.split_once('=').ok_or_else(usage)?;
    let endpoints: Vec<String> = endpoints
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(String::from)
        .collect();
    if service.is_empty() || endpoints.is_empty() {
        return Err(usage());
    }
    Ok(EgressArg {
        service: service.to_string(),
        endpoints,
    })
}

/// `250ms`, `30s`, `5m`, `1h`, or a number of seconds.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a duration (try `500ms`, `30s`, `5m`)"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "" | "s" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(n.saturating_mul(60))),
        "h" => Ok(Duration::from_secs(n.saturating_mul(3600))),
        _ => Err(format!(
            "`{text}`: unknown unit `{unit}` (use ms, s, m or h)"
        )),
    }
}

impl Args {
    fn limits(&self) -> GatewayLimits {
        GatewayLimits {
            max_connections: self.max_connections,
            max_connections_per_peer: self.max_connections_per_peer,
            max_streams: self.max_streams,
            max_calls_per_connection: self.max_calls_per_connection,
            default_timeout: (!self.default_timeout.is_zero()).then_some(self.default_timeout),
            max_timeout: (!self.max_timeout.is_zero()).then_some(self.max_timeout),
            tls_handshake_timeout: self.tls_handshake_timeout,
            idle_timeout: self.idle_timeout,
            backend_connections: self.backend_connections,
            backend_connect_timeout: self.backend_connect_timeout,
            egress_concurrency: self.egress.egress_concurrency,
            egress_buffer_bytes: self.egress.egress_buffer.saturating_mul(1 << 20),
        }
    }

    fn gateway(&self) -> anyhow::Result<Gateway> {
        let config = netless::ClientConfig {
            wait: netless::WaitPolicy {
                mode: self.wait,
                ..Default::default()
            },
            ..Default::default()
        };
        let mut builder = Gateway::builder(config).limits(self.limits());
        for pattern in &self.allow {
            builder = builder.allow(pattern);
        }
        if let Some(path) = &self.token_file {
            let token = netless_grpc::read_token_file(path).map_err(anyhow::Error::msg)?;
            builder = builder.bearer_token(token);
        }
        let egress = &self.egress;
        for service in &egress.services {
            let mut remote = netless_grpc::Egress::new(&service.service, &service.endpoints)
                .connect_timeout(egress.egress_connect_timeout)
                .retries(egress.egress_retries);
            if let Some(ca) = &egress.egress_ca {
                remote = remote.tls_ca(ca);
            }
            builder = builder.add_egress(remote);
        }
        builder
            .build()
            .map_err(|status| anyhow::anyhow!("{}", status.message()))
    }

    fn tls(&self) -> anyhow::Result<Option<netless_grpc::TlsAcceptor>> {
        let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) else {
            return Ok(None);
        };
        let acceptor = match &self.tls_client_ca {
            Some(ca) => netless_grpc::tls_acceptor_verifying_clients(cert, key, ca),
            None => netless_grpc::tls_acceptor(cert, key),
        };
        acceptor.map(Some).map_err(anyhow::Error::msg)
    }
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if let Some(cpu) = args.pin_cpu {
        // Before any thread exists, so every thread (runtime, netless helpers) inherits it.
        netless_shm::pin_current_thread(cpu).with_context(|| format!("pinning to cpu {cpu}"))?;
    }
    let tls = args.tls()?;
    let gateway = args.gateway()?;
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
    // Served before the listener opens: once `LISTENING` is printed, so is every `EGRESS`.
    let _egress = if args.egress.services.is_empty() {
        None
    } else {
        let serving = gateway
            .serve_egress()
            .map_err(|status| anyhow::anyhow!("{}", status.message()))?;
        for service in gateway.egress_services() {
            println!("EGRESS {service}");
        }
        std::io::stdout().flush()?;
        Some(serving)
    };
    runtime.block_on(async {
        if let Some(addr) = args.metrics {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("listening on {addr} for metrics"))?;
            println!("METRICS {}", listener.local_addr()?);
            std::io::stdout().flush()?;
            // Ends with the runtime, when the gateway stops.
            tokio::spawn(
                gateway
                    .clone()
                    .serve_metrics(listener, std::future::pending()),
            );
        }
        if args.allow.is_empty() {
            shutdown_signal().await;
            eprintln!("gateway: bye");
            return Ok(ExitCode::SUCCESS);
        }
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("listening on {}", args.listen))?;
        let address = listener.local_addr()?;
        let security = match (&tls, &args.tls_client_ca, &args.token_file) {
            (None, _, None) => "",
            (None, _, Some(_)) => " (token)",
            (Some(_), None, None) => " (TLS)",
            (Some(_), Some(_), None) => " (TLS, client certificates)",
            (Some(_), None, Some(_)) => " (TLS, token)",
            (Some(_), Some(_), Some(_)) => " (TLS, client certificates, token)",
        };
        println!("LISTENING {address}{security}");
        std::io::stdout().flush()?;
        gateway
            .clone()
            .serve(listener, tls, shutdown_signal())
            .await?;
        let (calls, refused) = gateway.counts();
        eprintln!(
            "gateway: {calls} calls, {refused} refused; {} connections refused; bye",
            gateway.refused_connections()
        );
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

#[cfg(test)]
mod tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert!(parse_duration("5d").is_err());
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("").is_err());
    }
}
