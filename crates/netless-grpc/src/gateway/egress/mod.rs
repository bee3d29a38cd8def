//! Egress, the gateway's other direction: a business-logic process calls a *remote* gRPC
//! service by its name, `pkg.Service`, over netless, exactly as it calls a local one, and
//! never opens a socket. For each [`Egress`] the gateway serves a netless service of that
//! name whose every call to one of its methods (`/pkg.Service/Method`: any other path is
//! an unknown method), unary or streaming, goes on as raw bytes over HTTP/2 to one of the
//! remote's endpoints, with the caller's metadata (see `forward`), deadline and trailers.
//! The gateway owns those connections and their TLS, picks the endpoint, retries what
//! never reached the remote, and bounds deadlines as it does for ingress.
//!
//! The remote's stream is reset, so the remote sees the call cancelled, when the deadline
//! passes, when the caller drops a stream (netless carries that as the stream's `cancel`),
//! and when the caller's netless connection closes (its process exited, or it dropped its
//! last client): a unary call waiting for the remote looks every 200 ms. Netless carries
//! no cancel of a single unary call, so one that a caller still connected gives up on goes
//! on until the remote answers or the deadline passes, holding one of the service's
//! workers meanwhile.
//!
//! Module map: this file (what an egress is, checked when the gateway is built, and
//! serving it), `forward` (one call: its deadline, its tries, what the caller hears),
//! `endpoints` (the remote endpoints: their connections, load and health), `body` (a
//! request body that can go again while untouched, and the response body under the
//! call's deadline).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use netless::{ServerConfig, Status};
use tonic::transport::{Certificate, ClientTlsConfig};

use super::allow::{self, AllowList};
use super::Gateway;
use crate::server::{GrpcServer, GrpcServing};
use endpoints::Endpoints;
use forward::Forward;

mod body;
mod endpoints;
mod forward;

/// HTTP/2 PINGs on a connection to a remote quiet for this long, so a remote that vanished
/// is noticed even while streams are open to it. Not sooner: grpc-go, grpc-java and C-core
/// servers answer pings more frequent than every 5 minutes on a quiet connection with
/// `GOAWAY too_many_pings` by default.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(300);
/// A PING unanswered this long closes the connection.
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// A remote gRPC service the gateway makes reachable over netless by its name: its
/// endpoints, how to reach them, and how often a call may move to another endpoint.
///
/// Each endpoint is `http://host:port` or `https://host:port`; an `https` one is verified
/// against the CA of [`Egress::tls_ca`] (there are no built-in roots).
///
/// ```
/// use std::time::Duration;
/// let orders = netless_grpc::Egress::new(
///     "shop.Orders",
///     ["https://10.0.0.2:50051", "https://10.0.0.3:50051"],
/// )
/// .tls_ca("/etc/netless/remote-ca.pem")
/// .connect_timeout(Duration::from_millis(500))
/// .retries(1);
/// let gateway = netless_grpc::Gateway::builder(netless::ClientConfig::default())
///     .add_egress(orders)
///     .egress("helloworld.Greeter", ["http://10.0.0.4:50051"]);
/// ```
#[derive(Clone, Debug)]
pub struct Egress {
    service: String,
    endpoints: Vec<String>,
    ca: Option<PathBuf>,
    tls_domain: Option<String>,
    connect_timeout: Duration,
    retries: u32,
}

impl Egress {
    /// Remote service `service` (`pkg.Service`, served locally under that name) at
    /// `endpoints`; 2 s to connect, 2 retries.
    pub fn new(
        service: impl Into<String>,
        endpoints: impl IntoIterator<Item = impl Into<String>>,
    ) -> Egress {
        Egress {
            service: service.into(),
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            ca: None,
            tls_domain: None,
            connect_timeout: Duration::from_secs(2),
            retries: 2,
        }
    }

    /// The PEM file of the CA(s) that `https` endpoints' certificates must chain to; read
    /// when the gateway is built.
    pub fn tls_ca(mut self, pem: impl Into<PathBuf>) -> Egress {
        self.ca = Some(pem.into());
        self
    }

    /// The name `https` endpoints' certificates must carry (default: each endpoint's host).
    pub fn tls_domain(mut self, name: impl Into<String>) -> Egress {
        self.tls_domain = Some(name.into());
        self
    }

    /// Time one try has to open a connection to an endpoint, TCP and TLS handshake each
    /// (default 2 s). A try that does not fails before anything reached the remote, so the
    /// call moves to another endpoint.
    pub fn connect_timeout(mut self, timeout: Duration) -> Egress {
        self.connect_timeout = timeout;
        self
    }

    /// Times a call may move to another endpoint after a try that failed before any of
    /// its bytes left the gateway (default 2): a refused or failed connection. A call that
    /// may have reached the remote is never tried again.
    pub fn retries(mut self, retries: u32) -> Egress {
        self.retries = retries;
        self
    }

    /// The service's name.
    pub fn service(&self) -> &str {
        &self.service
    }
}

/// An [`Egress`] as checked when the gateway is built: what serving it needs.
#[derive(Debug)]
pub(crate) struct Plan {
    service: Arc<str>,
    /// Each endpoint as given (for the gateway's log), and as tonic reaches it.
    endpoints: Vec<(String, tonic::transport::Endpoint)>,
    retries: u32,
}

impl Plan {
    /// Checks `egress`: a service name a netless server may take, that `allow` does not
    /// forward from the network (else the gateway would relay the network to the network),
    /// and endpoints tonic can reach.
    pub(crate) fn new(egress: &Egress, allow: &AllowList) -> Result<Plan, String> {
        let service = &egress.service;
        allow::check_service_name(service)?;
        if allow.allows(service) {
            return Err(format!(
                "`{service}` is both an egress service and allowed in from the network: the \
                 gateway would relay callers from the network to a remote service"
            ));
        }
        if egress.endpoints.is_empty() {
            return Err(format!("egress service `{service}` has no endpoint"));
        }
        if egress.connect_timeout.is_zero() {
            return Err(format!(
                "egress service `{service}`: connect_timeout must be more than zero"
            ));
        }
        let ca = match &egress.ca {
            Some(path) => Some(
                std::fs::read(path)
                    .map_err(|e| format!("reading the egress CA {}: {e}", path.display()))?,
            ),
            None => None,
        };
        let endpoints = egress
            .endpoints
            .iter()
            .map(|text| {
                let endpoint = endpoint(text, egress, ca.as_deref())
                    .map_err(|why| format!("egress service `{service}`: `{text}` {why}"))?;
                Ok((text.clone(), endpoint))
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(Plan {
            service: service.as_str().into(),
            endpoints,
            retries: egress.retries,
        })
    }

    pub(crate) fn service(&self) -> &str {
        &self.service
    }
}

/// How tonic reaches the endpoint `text` of `egress`; `Err` says what is wrong with it.
fn endpoint(
    text: &str,
    egress: &Egress,
    ca: Option<&[u8]>,
) -> Result<tonic::transport::Endpoint, String> {
    let uri: http::Uri = text
        .parse()
        .map_err(|_| "is not an endpoint: give http://host:port or https://host:port")?;
    let tls = match uri.scheme_str() {
        Some("http") => false,
        Some("https") => true,
        _ => return Err("must start with http:// or https://".into()),
    };
    let Some(authority) = uri.authority() else {
        return Err("names no host".into());
    };
    if authority.as_str().contains('@') {
        // Credentials in a URI end up in logs; remote credentials travel as metadata.
        return Err("must not carry credentials (user@)".into());
    }
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return Err("must have no path: the call's own path is sent".into());
    }
    let mut endpoint = tonic::transport::Endpoint::from(uri)
        .connect_timeout(egress.connect_timeout)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT);
    if tls {
        let Some(ca) = ca else {
            return Err(
                "is https, and no CA is given to verify it (Egress::tls_ca, --egress-ca)".into(),
            );
        };
        let mut config = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(ca))
            .timeout(egress.connect_timeout);
        if let Some(domain) = &egress.tls_domain {
            config = config.domain_name(domain.clone());
        }
        endpoint = endpoint
            .tls_config(config)
            .map_err(|e| format!("cannot use the CA: {}", error_chain(&e)))?;
    }
    Ok(endpoint)
}

/// `error` and its sources, for the gateway's own messages and log.
pub(super) fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        let more = e.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = e.source();
    }
    text
}

impl Gateway {
    /// Serves the gateway's egress services: one netless server per service, in the socket
    /// directory of the gateway's `ClientConfig`, open to its owner's processes (the
    /// default ACL), with `egress_concurrency` workers that wait as the `ClientConfig`'s
    /// `wait` says. They serve until the returned handle is dropped; no tokio runtime is
    /// needed to call this (the servers run their own, which also runs the HTTP/2
    /// connections to the remotes).
    ///
    /// Fails with `ALREADY_EXISTS` if a live server already serves one of the names (the
    /// others are not served then either).
    ///
    /// ```no_run
    /// let gateway = netless_grpc::Gateway::builder(netless::ClientConfig::default())
    ///     .egress("helloworld.Greeter", ["http://10.0.0.2:50051", "http://10.0.0.3:50051"])
    ///     .build()?;
    /// let serving = gateway.serve_egress()?;
    /// // Local processes now call `helloworld.Greeter` with `netless_grpc::Channel`.
    /// serving.wait();
    /// # Ok::<(), netless::Status>(())
    /// ```
    pub fn serve_egress(&self) -> Result<GrpcServing, Status> {
        let inner = &*self.inner;
        let client = &inner.backends.spec().config;
        let config = ServerConfig {
            workers: inner.limits.egress_concurrency,
            buffer_bytes: Some(inner.limits.egress_buffer_bytes),
            wait: client.wait,
            dir: client.dir.clone(),
            ..ServerConfig::default()
        };
        let mut server = GrpcServer::new().config(config).watch_callers();
        for plan in &inner.egress {
            // Fresh endpoints per serving: their connections live in its runtime.
            let endpoints = Endpoints::new(&plan.endpoints);
            let forward =
                Forward::new(plan, endpoints, inner.limits.clone(), inner.metrics.clone());
            server = server.add_named(plan.service.to_string(), forward);
        }
        server.serve().map_err(|status| {
            Status::new(
                status.code(),
                format!("serving the egress services: {}", status.message()),
            )
        })
    }

    /// The names of the gateway's egress services, as [`Gateway::serve_egress`] serves them.
    pub fn egress_services(&self) -> impl Iterator<Item = &str> {
        self.inner.egress.iter().map(|plan| plan.service())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(egress: Egress) -> Result<Plan, String> {
        Plan::new(&egress, &AllowList::default())
    }

    #[test]
    fn endpoints_are_checked() {
        let ok = plan(Egress::new(
            "a.B",
            ["http://127.0.0.1:1", "http://host:80/"],
        ));
        assert!(ok.is_ok(), "{ok:?}");
        let refused = [
            (Egress::new("a.B", Vec::<String>::new()), "no endpoint"),
            (Egress::new("a.B", ["127.0.0.1:1"]), "http://"),
            (Egress::new("a.B", ["ftp://h:1"]), "http://"),
            (Egress::new("a.B", ["http://h:1/x"]), "no path"),
            (Egress::new("a.B", ["http://u:p@h:1"]), "credentials"),
            (Egress::new("a.B", ["https://h:1"]), "no CA"),
            (Egress::new("netless.ctl", ["http://h:1"]), "internal"),
            (Egress::new("a/B", ["http://h:1"]), "service"),
            (
                Egress::new("a.B", ["http://h:1"]).connect_timeout(Duration::ZERO),
                "connect_timeout",
            ),
            (
                Egress::new("a.B", ["https://h:1"]).tls_ca("/nonexistent/ca.pem"),
                "reading the egress CA",
            ),
        ];
        for (egress, why) in refused {
            let service = egress.service().to_string();
            let err = plan(egress).unwrap_err();
            assert!(err.contains(why), "{service}: {err}");
        }
    }

    #[test]
    fn an_egress_service_is_not_forwarded_in() {
        let mut allow = AllowList::default();
        allow.add("shop.*").unwrap();
        let err = Plan::new(&Egress::new("shop.Orders", ["http://h:1"]), &allow).unwrap_err();
        assert!(err.contains("relay"), "{err}");
        assert!(Plan::new(&Egress::new("bank.Ledger", ["http://h:1"]), &allow).is_ok());
    }

    #[test]
    fn error_chains_are_told_once() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let outer = tonic::ConnectError(Box::new(io));
        assert_eq!(error_chain(&outer), "refused");
    }
}
