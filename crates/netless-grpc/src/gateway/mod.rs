//! The gateway: the infrastructure process of the split architecture, and the trust
//! boundary between the network and a user's netless services. It terminates gRPC over
//! HTTP/2 (and TLS) and forwards each call by its path, `/pkg.Service/Method` → netless
//! service `pkg.Service`, as raw bytes: no `.proto`, no decoding. Streams, metadata,
//! trailers and deadlines pass through as they are, because the forwarding is the netless
//! [`Channel`](crate::Channel)'s own call.
//!
//! It forwards only the services its allow-list names, never netless's internal ones
//! (`netless.*`, `netless-*`), and answers every other path exactly as it answers a service
//! that does not exist. Callers may have to authenticate (a client certificate, a bearer
//! token), and every resource a caller can hold is bounded ([`GatewayLimits`]).
//!
//! It also works the other way, egress ([`Egress`]): local processes call a remote gRPC
//! service by its name over netless, and the gateway forwards the calls over HTTP/2 to the
//! remote's endpoints, so a business-logic process never opens a socket.
//!
//! Module map: `allow` (which services), `auth` (bearer tokens), `tls`, `serve`
//! (connections), `admission` (calls per connection and per service), `backends` (the
//! netless connections), `public` (what remote callers are told), `coalesce` (writes),
//! `egress` (the remote services served locally), `own` (the services it answers itself:
//! `health`, `reflection`), `metrics` (its counters) and `scrape` (its `/metrics`).
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:50051").await?;
//! let gateway = netless_grpc::Gateway::builder(netless::ClientConfig::default())
//!     .allow("helloworld.*") // every service of package `helloworld`
//!     .allow("routeguide.RouteGuide") // and this one
//!     .build()?;
//! gateway.serve(listener, None, std::future::pending()).await?;
//! # Ok(())
//! # }
//! ```

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::header::AUTHORIZATION;
use http::HeaderMap;
use hyper::body::Incoming;
use netless::{ClientConfig, Code, Status};

use crate::channel::{self, status_response};
use crate::mapping::{format_grpc_timeout, parse_grpc_timeout, GRPC_TIMEOUT};
use admission::{CallBody, Held, RemoteConnection, RESERVED_PER_SERVICE};
use allow::AllowList;
use auth::BearerToken;
use backends::{Backends, LinkSpec};
use egress::Plan;
use metrics::{Metrics, ServerCall};
use public::Scrubber;

mod admission;
pub(crate) mod allow;
pub(crate) mod auth;
mod backends;
mod coalesce;
mod egress;
mod health;
mod metrics;
mod own;
pub(crate) mod public;
mod reflection;
mod scrape;
mod serve;
mod tls;

pub use auth::read_token_file;
pub use egress::Egress;
pub use tls::{tls_acceptor, tls_acceptor_verifying_clients};

/// What one gateway lets its callers hold; every field has a default
/// (`GatewayLimits::default()`), the `netless gateway` flag of the same name.
///
/// ```
/// use std::time::Duration;
/// let limits = netless_grpc::GatewayLimits {
///     max_connections: 64,
///     default_timeout: Some(Duration::from_secs(5)),
///     ..Default::default()
/// };
/// assert_eq!(limits.max_streams, 100);
/// ```
#[derive(Clone, Debug)]
pub struct GatewayLimits {
    /// Connections served at once (default 256); the next ones are closed as soon as they
    /// are accepted.
    pub max_connections: usize,
    /// Connections served at once from one peer (default 64): an IPv4 address, or an IPv6
    /// /64 network (what one host is commonly given); its next ones are closed as soon as
    /// they are accepted, so one address cannot take every connection.
    pub max_connections_per_peer: usize,
    /// Streams (calls) one HTTP/2 connection may have open at once: its
    /// `SETTINGS_MAX_CONCURRENT_STREAMS` (default 100).
    pub max_streams: u32,
    /// Calls one connection has at the backends at once (default 64); its further calls
    /// wait their turn, until their deadline. Besides, each connection may always have 2
    /// calls at each service, whatever other connections hold there.
    pub max_calls_per_connection: usize,
    /// Deadline of calls that set none (no `grpc-timeout`), passed on to the backend
    /// (default 60 s); `None`: such calls may last as long as their backend and
    /// `max_timeout` let them.
    pub default_timeout: Option<Duration>,
    /// The longest deadline a call gets (default 300 s): a longer `grpc-timeout`, or none,
    /// is cut to it before it is passed on to the backend; `None`: no bound.
    pub max_timeout: Option<Duration>,
    /// Time a client has to complete the TLS handshake (default 10 s).
    pub tls_handshake_timeout: Duration,
    /// A connection with no call under way for this long is closed with GOAWAY (default
    /// 120 s); so is one that opens no stream at all. A call refused for its bearer token
    /// does not count.
    pub idle_timeout: Duration,
    /// Netless connections to each backend service at most (default 8), opened as the
    /// calls to it need them; calls go to the least loaded. Each carries up to
    /// `max_in_flight / 2 - 8` calls of the gateway's `ClientConfig` (120 by default).
    pub backend_connections: usize,
    /// Time a backend has to accept a connection and complete the handshake (default 2 s);
    /// calls to a backend that does not are `UNAVAILABLE`, and calls to other services go on.
    pub backend_connect_timeout: Duration,
    /// Calls to each egress service waiting for the remote's response headers at once
    /// (default 16, at most 1024): each holds one of the service's netless worker threads
    /// meanwhile, and the next wait in its queue. Streams, once their headers arrived,
    /// hold none.
    pub egress_concurrency: usize,
    /// Receive buffer of each egress service, in bytes (default 16 MiB: its 16 calls of 1
    /// MiB each at once): requests that do not fit are refused with `RESOURCE_EXHAUSTED`
    /// until earlier ones have gone out.
    pub egress_buffer_bytes: usize,
}

impl Default for GatewayLimits {
    fn default() -> GatewayLimits {
        GatewayLimits {
            max_connections: 256,
            max_connections_per_peer: 64,
            max_streams: 100,
            max_calls_per_connection: 64,
            default_timeout: Some(Duration::from_secs(60)),
            max_timeout: Some(Duration::from_secs(300)),
            tls_handshake_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(120),
            backend_connections: 8,
            backend_connect_timeout: Duration::from_secs(2),
            egress_concurrency: 16,
            egress_buffer_bytes: 16 << 20,
        }
    }
}

impl GatewayLimits {
    /// The call's deadline: its `grpc-timeout`, else the default timeout's, at most the
    /// max timeout's. Written into `headers` for the backend (or the remote) unless it is
    /// the call's own.
    pub(crate) fn deadline(&self, headers: &mut HeaderMap) -> Option<Instant> {
        let now = Instant::now();
        let after = |timeout: Option<Duration>| timeout.and_then(|t| now.checked_add(t));
        let asked = headers
            .get(GRPC_TIMEOUT)
            .and_then(|v| parse_grpc_timeout(v.as_bytes()));
        let cap = after(self.max_timeout);
        let deadline = match (asked, cap) {
            (Some(asked), Some(cap)) if asked <= cap => return Some(asked),
            (Some(asked), None) => return Some(asked),
            (Some(_), Some(cap)) => cap,
            (None, cap) => match (after(self.default_timeout), cap) {
                (Some(default), Some(cap)) => default.min(cap),
                (default, cap) => default.or(cap)?,
            },
        };
        headers.insert(GRPC_TIMEOUT, format_grpc_timeout(deadline));
        Some(deadline)
    }

    fn validate(&self) -> Result<(), String> {
        let positive = [
            ("max_connections", self.max_connections),
            ("max_connections_per_peer", self.max_connections_per_peer),
            ("max_streams", self.max_streams as usize),
            ("max_calls_per_connection", self.max_calls_per_connection),
            ("backend_connections", self.backend_connections),
            ("egress_concurrency", self.egress_concurrency),
        ];
        for (name, value) in positive {
            if value == 0 {
                return Err(format!("{name} must be at least 1"));
            }
        }
        if self.egress_concurrency > 1024 {
            return Err("egress_concurrency must be at most 1024".into());
        }
        if !(64 << 10..=1 << 30).contains(&self.egress_buffer_bytes) {
            return Err("egress_buffer_bytes must be 64 KiB to 1 GiB".into());
        }
        let durations = [
            (
                "default_timeout",
                self.default_timeout.unwrap_or(Duration::MAX),
            ),
            ("max_timeout", self.max_timeout.unwrap_or(Duration::MAX)),
            ("tls_handshake_timeout", self.tls_handshake_timeout),
            ("idle_timeout", self.idle_timeout),
            ("backend_connect_timeout", self.backend_connect_timeout),
        ];
        for (name, value) in durations {
            if value.is_zero() {
                return Err(format!("{name} must be more than zero"));
            }
        }
        Ok(())
    }
}

/// Builds a [`Gateway`]: which services it forwards, how callers authenticate, its limits.
///
/// ```
/// let gateway = netless_grpc::Gateway::builder(netless::ClientConfig::default())
///     .allow("helloworld.Greeter")
///     .allow("shop.*")
///     .bearer_token("a-long-random-secret")
///     .build()?;
/// # Ok::<(), netless::Status>(())
/// ```
pub struct GatewayBuilder {
    config: ClientConfig,
    allow: Vec<String>,
    token: Option<Vec<u8>>,
    limits: GatewayLimits,
    egress: Vec<Egress>,
}

impl std::fmt::Debug for GatewayBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token itself.
        f.debug_struct("GatewayBuilder")
            .field("config", &self.config)
            .field("allow", &self.allow)
            .field("token", &self.token.is_some())
            .field("limits", &self.limits)
            .field("egress", &self.egress)
            .finish()
    }
}

impl GatewayBuilder {
    /// Forwards the services `pattern` names: `pkg.Service` (that service), `pkg.*` (every
    /// service whose name starts with `pkg.`) or `*` (every service). Netless's internal
    /// services (`netless.*`, `netless-*`) are never forwarded, whatever the pattern.
    pub fn allow(mut self, pattern: impl Into<String>) -> GatewayBuilder {
        self.allow.push(pattern.into());
        self
    }

    /// Requires every call to carry the metadata `authorization: Bearer <token>`; others
    /// fail with `UNAUTHENTICATED`. The header is not passed on to backends.
    pub fn bearer_token(mut self, token: impl Into<Vec<u8>>) -> GatewayBuilder {
        self.token = Some(token.into());
        self
    }

    /// The gateway's limits (default: [`GatewayLimits::default`]).
    pub fn limits(mut self, limits: GatewayLimits) -> GatewayBuilder {
        self.limits = limits;
        self
    }

    /// Makes remote service `service` (`pkg.Service`) reachable over netless by that name,
    /// at `endpoints` (`http://host:port`), with the defaults of [`Egress::new`]; served by
    /// [`Gateway::serve_egress`].
    ///
    /// ```
    /// let gateway = netless_grpc::Gateway::builder(netless::ClientConfig::default())
    ///     .egress("helloworld.Greeter", ["http://10.0.0.2:50051", "http://10.0.0.3:50051"])
    ///     .build()?;
    /// assert_eq!(gateway.egress_services().collect::<Vec<_>>(), ["helloworld.Greeter"]);
    /// # Ok::<(), netless::Status>(())
    /// ```
    pub fn egress(
        self,
        service: impl Into<String>,
        endpoints: impl IntoIterator<Item = impl Into<String>>,
    ) -> GatewayBuilder {
        self.add_egress(Egress::new(service, endpoints))
    }

    /// Makes the remote service `egress` describes reachable over netless by its name.
    pub fn add_egress(mut self, egress: Egress) -> GatewayBuilder {
        self.egress.push(egress);
        self
    }

    /// The gateway; `INVALID_ARGUMENT` for a malformed or internal pattern, a malformed
    /// token, limits that do not fit together (each connection's reserved calls must fit
    /// in a service's backend connections), or an egress service that is malformed,
    /// named twice, or also allowed in from the network.
    pub fn build(self) -> Result<Gateway, Status> {
        let invalid = Status::invalid_argument;
        let mut allow = AllowList::default();
        for pattern in &self.allow {
            allow.add(pattern).map_err(invalid)?;
        }
        let mut egress: Vec<Arc<Plan>> = Vec::new();
        for e in &self.egress {
            let plan = Plan::new(e, &allow).map_err(invalid)?;
            if egress.iter().any(|p| p.service() == plan.service()) {
                return Err(invalid(format!(
                    "egress service `{}` is named twice",
                    plan.service()
                )));
            }
            egress.push(Arc::new(plan));
        }
        let token = match &self.token {
            Some(token) => Some(BearerToken::new(token).map_err(invalid)?),
            None => None,
        };
        self.limits.validate().map_err(invalid)?;
        let per_link = LinkSpec::calls_per_link(&self.config);
        let capacity = per_link * self.limits.backend_connections;
        let reserved = self.limits.max_connections * RESERVED_PER_SERVICE;
        if reserved >= capacity {
            return Err(invalid(format!(
                "{} backend connections of {per_link} calls carry {capacity} calls per \
                 service, not more than the {reserved} reserved for {} connections \
                 ({RESERVED_PER_SERVICE} each): raise backend_connections or lower \
                 max_connections",
                self.limits.backend_connections, self.limits.max_connections
            )));
        }
        Ok(Gateway::assemble(
            self,
            allow,
            token,
            capacity - reserved,
            egress,
        ))
    }
}

/// Forwards gRPC calls from HTTP/2 to the netless services it is allowed to. Cheap to clone.
#[derive(Clone)]
pub struct Gateway {
    inner: Arc<Inner>,
}

struct Inner {
    allow: AllowList,
    token: Option<BearerToken>,
    limits: GatewayLimits,
    backends: Backends,
    /// Calls a service takes beyond the connections' reserves.
    shared_cap: usize,
    /// The remote services served locally.
    egress: Vec<Arc<Plan>>,
    scrubber: Arc<Scrubber>,
    metrics: Arc<Metrics>,
    calls: AtomicU64,
    refused: AtomicU64,
    refused_connections: AtomicU64,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("allow", &self.inner.allow)
            .field("token", &self.inner.token.is_some())
            .field("limits", &self.inner.limits)
            .field("egress", &self.inner.egress)
            .field("calls", &self.inner.calls.load(Ordering::Relaxed))
            .finish()
    }
}

impl Gateway {
    /// A gateway that reaches backends with `config` and forwards **nothing**: every call is
    /// `UNIMPLEMENTED` until services are allowed, with [`Gateway::builder`].
    pub fn new(config: ClientConfig) -> Gateway {
        let builder = Gateway::builder(config);
        Gateway::assemble(builder, AllowList::default(), None, 0, Vec::new())
    }

    /// A builder for a gateway that reaches backends with `config` (socket directory, wait
    /// policy; its `connect_timeout` is replaced by the limits' `backend_connect_timeout`).
    pub fn builder(config: ClientConfig) -> GatewayBuilder {
        GatewayBuilder {
            config,
            allow: Vec::new(),
            token: None,
            limits: GatewayLimits::default(),
            egress: Vec::new(),
        }
    }

    fn assemble(
        builder: GatewayBuilder,
        allow: AllowList,
        token: Option<BearerToken>,
        shared_cap: usize,
        egress: Vec<Arc<Plan>>,
    ) -> Gateway {
        let GatewayBuilder {
            mut config, limits, ..
        } = builder;
        config.connect_timeout = limits.backend_connect_timeout;
        if config.dir.is_none() && !allow.is_empty() {
            // Resolved once: every link uses it, and error messages are scrubbed of it.
            config.dir = config
                .socket_path("gateway.Probe")
                .ok()
                .and_then(|p| p.parent().map(Path::to_path_buf));
        }
        let scrubber = Arc::new(Scrubber::new(config.dir.as_deref()));
        let spec = LinkSpec {
            per_link: LinkSpec::calls_per_link(&config),
            max_links: limits.backend_connections,
            config,
        };
        Gateway {
            inner: Arc::new(Inner {
                allow,
                token,
                limits,
                backends: Backends::new(spec),
                shared_cap,
                egress,
                scrubber,
                metrics: Arc::default(),
                calls: AtomicU64::new(0),
                refused: AtomicU64::new(0),
                refused_connections: AtomicU64::new(0),
            }),
        }
    }

    /// Calls received so far, and how many of them the gateway refused or failed itself
    /// (unauthenticated, unknown or not allowed service, no backend, over a limit).
    pub fn counts(&self) -> (u64, u64) {
        (
            self.inner.calls.load(Ordering::Relaxed),
            self.inner.refused.load(Ordering::Relaxed),
        )
    }

    /// Connections closed on accept because `max_connections` were being served, or
    /// `max_connections_per_peer` from their peer.
    pub fn refused_connections(&self) -> u64 {
        self.inner.refused_connections.load(Ordering::Relaxed)
    }

    /// Forwards one call from `remote` to the netless service its path names, if allowed,
    /// in its span, counting it in the metrics.
    async fn forward(
        &self,
        request: http::Request<Incoming>,
        remote: &Arc<RemoteConnection>,
    ) -> http::Response<tonic::body::Body> {
        use tracing::Instrument as _;
        let inner = &*self.inner;
        inner.calls.fetch_add(1, Ordering::Relaxed);
        let mut call = inner.metrics.server_call();
        let span =
            crate::trace::call_span(crate::trace::Side::Gateway, request.uri().path(), || {
                let traceparent = request.headers().get(crate::trace::TRACEPARENT);
                traceparent.map(|v| v.as_bytes())
            });
        let response = self
            .route(request, remote, &mut call)
            .instrument(span)
            .await;
        call.respond(response)
    }

    /// [`Gateway::forward`]'s call: the gateway's own services are answered, the others
    /// checked and forwarded.
    async fn route(
        &self,
        request: http::Request<Incoming>,
        remote: &Arc<RemoteConnection>,
        call: &mut ServerCall,
    ) -> http::Response<tonic::body::Body> {
        let inner = &*self.inner;
        let request = match self.authenticate(request, remote) {
            Ok(request) => request,
            Err(status) => {
                inner.refused.fetch_add(1, Ordering::Relaxed);
                call.refused();
                return status_response(&status);
            }
        };
        // Only now is the call activity: a caller without the token must not keep its
        // connection from the idle timeout by calling.
        let mut held = Held {
            _activity: Some(remote.begin()),
            ..Held::default()
        };
        if let Some((service, method)) = own_method_of(request.uri().path()) {
            call.label(service, method);
            let (service, mut request) = (service.to_string(), request);
            let deadline = self.deadline(request.headers_mut());
            let response = own::answer(self, &service, request, deadline).await;
            let (parts, body) = response.into_parts();
            let body = CallBody::new(body, held, inner.scrubber.clone());
            return http::Response::from_parts(parts, tonic::body::Body::new(body));
        }
        let request = match self.admit(request, remote, &mut held, call).await {
            Ok(request) => request,
            Err(status) => {
                inner.refused.fetch_add(1, Ordering::Relaxed);
                call.refused();
                return status_response(&status);
            }
        };
        let Some(client) = held.link.as_ref().map(|link| link.client().clone()) else {
            return status_response(&Status::internal("no backend connection"));
        };
        let (parts, body) = request.into_parts();
        let request = http::Request::from_parts(parts, tonic::body::Body::new(body));
        match channel::call(client.clone(), request).await {
            Ok(response) => {
                let (mut parts, body) = response.into_parts();
                inner.scrubber.trailers(&mut parts.headers);
                let body = CallBody::new(body, held, inner.scrubber.clone());
                http::Response::from_parts(parts, tonic::body::Body::new(body))
            }
            Err(status) => {
                if status.code() == Code::Unavailable {
                    // The backend may be gone: the next call then connects afresh.
                    client.check_closed();
                }
                status_response(&inner.scrubber.status(&status))
            }
        }
    }

    /// Checks the call's bearer token, if the gateway requires one, and takes it out of the
    /// request. `auth::MAX_FAILED_AUTHENTICATIONS` calls in a row without it close `remote`.
    fn authenticate(
        &self,
        mut request: http::Request<Incoming>,
        remote: &RemoteConnection,
    ) -> Result<http::Request<Incoming>, Status> {
        let Some(token) = &self.inner.token else {
            return Ok(request);
        };
        if let Err(status) = token.check(request.headers()) {
            if remote.failed_authentication() {
                return Err(auth::closing(&status));
            }
            return Err(status);
        }
        remote.authenticated();
        // The gateway's secret is not the backends' business.
        request.headers_mut().remove(AUTHORIZATION);
        Ok(request)
    }

    /// Checks a call against the gateway's rules and takes what it needs to go ahead (a
    /// permit of its connection, a share of its service, a link), into `held`. Returns the
    /// request as it goes to the backend.
    async fn admit(
        &self,
        mut request: http::Request<Incoming>,
        remote: &Arc<RemoteConnection>,
        held: &mut Held,
        call: &mut ServerCall,
    ) -> Result<http::Request<Incoming>, Status> {
        let inner = &*self.inner;
        let path = request.uri().path();
        let service = service_of(path)
            .ok_or_else(|| public::not_a_method_path(path))?
            .to_string();
        if !inner.allow.allows(&service) {
            return Err(public::unknown_service(&service));
        }
        let deadline = self.deadline(request.headers_mut());
        let backend = inner.backends.get(&service);
        let max_calls = inner.limits.max_calls_per_connection;
        held.permit = Some(
            remote
                .permit(deadline)
                .await
                .ok_or_else(|| public::connection_busy(max_calls))?,
        );
        held.share = Some(
            remote
                .share(&backend, inner.shared_cap)
                .ok_or_else(|| public::service_busy(&service))?,
        );
        held.link = Some(
            backend
                .link(inner.backends.spec(), deadline)
                .await
                .map_err(|why| public::no_link(&service, why))?,
        );
        let method = &request.uri().path()[service.len() + 2..];
        call.label(&service, method);
        Ok(request)
    }

    /// The call's deadline (see [`GatewayLimits::deadline`]).
    fn deadline(&self, headers: &mut HeaderMap) -> Option<Instant> {
        self.inner.limits.deadline(headers)
    }
}

/// `pkg.Service` of `/pkg.Service/Method`.
pub(crate) fn service_of(path: &str) -> Option<&str> {
    let (service, method) = path.strip_prefix('/')?.split_once('/')?;
    (!service.is_empty() && !method.is_empty() && !method.contains('/')).then_some(service)
}

/// `(service, method)` of a path to one of the gateway's own services.
fn own_method_of(path: &str) -> Option<(&str, &str)> {
    let service = service_of(path).filter(|s| own::is_own(s))?;
    let method = &path[service.len() + 2..];
    Some((
        service,
        if own::is_own_method(service, method) {
            method
        } else {
            ""
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_their_service() {
        assert_eq!(
            service_of("/helloworld.Greeter/SayHello"),
            Some("helloworld.Greeter")
        );
        assert_eq!(service_of("/x/"), None);
        assert_eq!(service_of("//M"), None);
        assert_eq!(service_of("/a/b/c"), None);
        assert_eq!(service_of("nope"), None);
    }

    #[test]
    fn the_builder_refuses_what_cannot_work() {
        let config = ClientConfig::default;
        let err = |b: GatewayBuilder| b.build().unwrap_err();
        assert_eq!(
            err(Gateway::builder(config()).allow("netless.ctl")).code(),
            Code::InvalidArgument
        );
        assert_eq!(
            err(Gateway::builder(config()).allow("a/b")).code(),
            Code::InvalidArgument
        );
        assert_eq!(
            err(Gateway::builder(config()).bearer_token("has space")).code(),
            Code::InvalidArgument
        );
        let crowded = GatewayLimits {
            max_connections: 10_000,
            ..GatewayLimits::default()
        };
        let status = err(Gateway::builder(config()).limits(crowded));
        assert!(status.message().contains("backend_connections"), "{status}");
        let none = GatewayLimits {
            idle_timeout: Duration::ZERO,
            ..GatewayLimits::default()
        };
        assert!(err(Gateway::builder(config()).limits(none))
            .message()
            .contains("idle_timeout"));
        let fine = Gateway::builder(config()).allow("helloworld.*").build();
        assert!(fine.is_ok(), "{fine:?}");
    }

    #[test]
    fn deadlines_are_at_most_the_max_timeout() {
        let gateway = |default_timeout: Option<u64>, max_timeout: Option<u64>| {
            let limits = GatewayLimits {
                default_timeout: default_timeout.map(Duration::from_secs),
                max_timeout: max_timeout.map(Duration::from_secs),
                ..GatewayLimits::default()
            };
            let config = ClientConfig {
                dir: Some("/nonexistent".into()),
                ..ClientConfig::default()
            };
            Gateway::builder(config).limits(limits).build().unwrap()
        };
        // Checks the timeout a call gets and the one its backend sees, in seconds (the
        // header's seconds are whole: within a second).
        let check = |gateway: &Gateway, asked: Option<&'static str>, expected: Option<u64>| {
            let mut headers = HeaderMap::new();
            if let Some(asked) = asked {
                headers.insert(GRPC_TIMEOUT, http::HeaderValue::from_static(asked));
            }
            let now = Instant::now();
            let seconds = |d: Instant| d.duration_since(now).as_secs_f64();
            let deadline = gateway.deadline(&mut headers).map(seconds);
            let passed = headers
                .get(GRPC_TIMEOUT)
                .and_then(|v| parse_grpc_timeout(v.as_bytes()))
                .map(seconds);
            for got in [deadline, passed] {
                let near = match (got, expected) {
                    (Some(got), Some(expected)) => (got - expected as f64).abs() <= 1.0,
                    (got, expected) => got.is_none() && expected.is_none(),
                };
                assert!(near, "{asked:?}: {deadline:?} {passed:?}, not {expected:?}");
            }
        };
        let capped = gateway(Some(60), Some(300));
        check(&capped, Some("10S"), Some(10));
        check(&capped, Some("2H"), Some(300));
        check(&capped, Some("99999999S"), Some(300));
        check(&capped, None, Some(60));
        check(&capped, Some("nonsense"), Some(60));
        check(&gateway(Some(60), Some(20)), None, Some(20));
        check(&gateway(None, Some(300)), None, Some(300));
        let unbounded = gateway(None, None);
        check(&unbounded, Some("2H"), Some(7200));
        check(&unbounded, None, None);
    }
}
