//! The client side: a [`Channel`] that tonic-generated clients accept in place of
//! `tonic::transport::Channel`, reaching a local service over netless or a remote one over
//! HTTP/2, by target.
//!
//! This module decides where a channel goes (`target.rs` parses targets, `resolver.rs` maps
//! names to them) and hands each call to the path that carries it: `local.rs` over netless,
//! `remote.rs` through tonic's transport.

mod local;
mod options;
mod remote;
mod resolver;
mod target;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use netless::{Client, ClientConfig, Status};
use tracing::Instrument as _;

pub(crate) use local::{call, status_response};
pub use options::{ChannelOptions, TLS_CA_ENV};
pub use resolver::{Resolver, TARGETS_ENV};
pub use target::Location;
use target::Target;

use crate::trace::{self, Side};

/// A tonic transport to a service wherever it runs:
/// `GreeterClient::new(Channel::target("helloworld.Greeter")?)`.
///
/// A channel to a local service sends each call over netless shared memory; a channel to a
/// remote one sends it over HTTP/2 with tonic's own transport. Either way the same
/// generated client code, status codes, `grpc-timeout` deadlines (a call that sets none
/// gets the `ClientConfig`'s `default_timeout`, if any), metadata, trailers and the
/// cancellation of streams (dropping a stream cancels it on the server) behave as over
/// HTTP/2. A local unary call that is dropped is only abandoned: netless carries no cancel
/// of one, so the server runs it to its end (its deadline bounds it). A call that cannot
/// reach the service (unknown service, dead server, refused connection, full queue)
/// completes with the corresponding gRPC status, `UNAVAILABLE` for a service that is not
/// there, as tonic reports transport failures.
///
/// Cheap to clone; clones share one netless connection, or one set of HTTP/2 connections.
///
/// ```no_run
/// # mod pb { pub mod greeter_client { pub struct GreeterClient<T>(T); impl<T> GreeterClient<T> { pub fn new(t: T) -> Self { GreeterClient(t) } } } }
/// # async fn run() -> Result<(), netless::Status> {
/// use netless_grpc::Channel;
/// // Local over netless, unless NETLESS_TARGETS maps the name elsewhere.
/// let local = pb::greeter_client::GreeterClient::new(Channel::target("helloworld.Greeter")?);
/// // Remote over HTTP/2, connecting at the first call.
/// let remote = pb::greeter_client::GreeterClient::new(Channel::target("http://10.77.0.2:50051")?);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Channel {
    route: Route,
    location: Arc<Location>,
}

#[derive(Clone, Debug)]
enum Route {
    Local(Client),
    /// The HTTP/2 channel, and the deadline of calls that set none.
    Remote(tonic::transport::Channel, Option<std::time::Duration>),
}

impl Channel {
    /// A channel to `target`, with the default [`ChannelOptions`].
    ///
    /// `target` is one of:
    ///
    /// - `pkg.Service`, a bare service name: where the `NETLESS_TARGETS` table maps it (see
    ///   [`Resolver`]), else the local netless service of that name;
    /// - `netless:pkg.Service`: the local netless service, whatever the table says;
    /// - `http://host:port`, `https://host:port` (TLS; see [`ChannelOptions::tls_ca_pem`]),
    ///   `host:port` (plain HTTP/2) or `dns:///host:port` (plain HTTP/2; the name
    ///   resolves, through the system's resolver, when connecting): a gRPC server over
    ///   HTTP/2;
    /// - several of those remote forms separated by commas: calls balance across them.
    ///
    /// So an explicit target beats the table, which beats the local default. A local target
    /// connects now (as [`Channel::connect`]); a remote one connects at its first call, so
    /// this never waits for the network, but it must be called inside a tokio runtime,
    /// which then runs the channel's connections. A remote connection with calls open that
    /// has heard nothing from its server for 5 minutes sends an HTTP/2 PING, and closes
    /// (failing those calls) if no answer comes within 20 s.
    ///
    /// ```
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// use netless_grpc::{Channel, Location};
    /// let channel = Channel::target("http://127.0.0.1:50051")?;
    /// assert_eq!(
    ///     channel.location(),
    ///     &Location::Remote { uris: vec!["http://127.0.0.1:50051".into()] }
    /// );
    /// # Ok::<(), netless::Status>(()) }).unwrap();
    /// ```
    pub fn target(target: &str) -> Result<Channel, Status> {
        Channel::target_with(target, &ChannelOptions::default())
    }

    /// A channel to `target` (as [`Channel::target`]) with `options`: the netless client
    /// configuration, the resolver in place of `NETLESS_TARGETS`, TLS, the connect timeout.
    ///
    /// ```
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// use netless_grpc::{Channel, ChannelOptions, Resolver};
    /// let options = ChannelOptions::new()
    ///     .resolver("routeguide.* 127.0.0.1:50051, 127.0.0.1:50052".parse::<Resolver>()?);
    /// let channel = Channel::target_with("routeguide.RouteGuide", &options)?;
    /// assert_eq!(channel.location().to_string(), "http://127.0.0.1:50051,http://127.0.0.1:50052");
    /// # Ok::<(), netless::Status>(()) }).unwrap();
    /// ```
    pub fn target_with(target: &str, options: &ChannelOptions) -> Result<Channel, Status> {
        let location = match Target::parse(target)? {
            Target::At(location) => location,
            Target::Name(name) => {
                let resolved = match &options.resolver {
                    Some(resolver) => resolver.resolve(&name).cloned(),
                    None => Resolver::from_env()?.resolve(&name).cloned(),
                };
                resolved.unwrap_or(Location::Local { service: name })
            }
        };
        let route = match &location {
            Location::Local { service } => {
                Route::Local(Client::connect_with(service, options.client.clone())?)
            }
            Location::Remote { uris } => Route::Remote(
                remote::connect(uris, options)?,
                options.client.default_timeout,
            ),
        };
        Ok(Channel {
            route,
            location: Arc::new(location),
        })
    }

    /// Connects to the local netless service `service` (by convention the gRPC
    /// `pkg.Service`), without consulting any table.
    ///
    /// ```no_run
    /// let channel = netless_grpc::Channel::connect("helloworld.Greeter")?;
    /// # Ok::<(), netless::Status>(())
    /// ```
    pub fn connect(service: &str) -> Result<Channel, Status> {
        Ok(Channel::from_client(Client::connect(service)?))
    }

    /// Connects to the local netless service `service` with `config`.
    ///
    /// ```no_run
    /// let config = netless::ClientConfig::default();
    /// let channel = netless_grpc::Channel::connect_with("helloworld.Greeter", config)?;
    /// # Ok::<(), netless::Status>(())
    /// ```
    pub fn connect_with(service: &str, config: ClientConfig) -> Result<Channel, Status> {
        Ok(Channel::from_client(Client::connect_with(service, config)?))
    }

    /// Wraps an existing netless client.
    ///
    /// ```no_run
    /// let client = netless::Client::connect("helloworld.Greeter")?;
    /// let channel = netless_grpc::Channel::from_client(client);
    /// # Ok::<(), netless::Status>(())
    /// ```
    pub fn from_client(client: Client) -> Channel {
        let location = Location::Local {
            service: client.service().to_string(),
        };
        Channel {
            route: Route::Local(client),
            location: Arc::new(location),
        }
    }

    /// Where this channel's calls go: a local netless service or remote servers.
    ///
    /// ```no_run
    /// let channel = netless_grpc::Channel::target("routeguide.RouteGuide")?;
    /// eprintln!("routeguide.RouteGuide: {}", channel.location());
    /// # Ok::<(), netless::Status>(())
    /// ```
    pub fn location(&self) -> &Location {
        &self.location
    }
}

type ResponseFuture =
    Pin<Box<dyn Future<Output = Result<http::Response<tonic::body::Body>, Infallible>> + Send>>;

impl tower_service::Service<http::Request<tonic::body::Body>> for Channel {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // The remote path waits for its own readiness inside the call, so that a transport
        // failure becomes the call's status rather than an error tonic has to map.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> ResponseFuture {
        let span = trace::call_span(Side::Client, request.uri().path(), || {
            let traceparent = request.headers().get(trace::TRACEPARENT);
            traceparent.map(|v| v.as_bytes())
        });
        match &self.route {
            Route::Local(client) => {
                let client = client.clone();
                Box::pin(
                    async move {
                        Ok(call(client, request)
                            .await
                            .unwrap_or_else(|status| status_response(&status)))
                    }
                    .instrument(span),
                )
            }
            Route::Remote(channel, default_timeout) => {
                let (channel, location) = (channel.clone(), self.location.clone());
                let default_timeout = *default_timeout;
                Box::pin(
                    async move {
                        let target = location.to_string();
                        Ok(remote::call(channel, &target, default_timeout, request).await)
                    }
                    .instrument(span),
                )
            }
        }
    }
}
