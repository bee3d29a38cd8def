//! The server side: serves tonic-generated services (`GreeterServer::new(svc)`) over netless,
//! each `pkg.Service` as the netless service of that name, and optionally the same services
//! over HTTP/2 on a TCP listener (`server/tcp.rs`).
//!
//! The service runs on the netless worker that took the call (`Handle::block_on`), so a unary
//! call crosses no thread; whatever it spawns runs on the server's tokio runtime. A call
//! whose request or response goes on longer becomes a stream (see [`crate::protocol`]),
//! driven by a task on that runtime.

mod tcp;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, TE};
use http::{HeaderMap, HeaderValue, Method};
use netless::{DeferredReply, Metadata, Request, ResponseBuilder, Server, ServerConfig, Status};
use tonic::server::NamedService;
use tower::ServiceExt as _;
use tower_service::Service;

use crate::mapping::{
    append_headers, format_grpc_timeout, frame_now, method_of, trailers_to_metadata,
    unknown_method, GRPC_TIMEOUT,
};
use crate::protocol::{
    split_stream_payload, CANCEL, CLOSE_SEND, MORE, RECV, SEND, SESSION, STREAM_PREFIX, WINDOW,
};
use crate::session::{response_head, Sessions, MAX_DELIVERY, MAX_SESSIONS};
use crate::trace::{self, Side};
use tcp::{Listen, TcpServing};

/// Builds and serves a set of tonic services over netless and, with [`GrpcServer::tcp`],
/// over HTTP/2 on TCP as well: one service implementation, both transports.
///
/// ```no_run
/// let serving = netless_grpc::GrpcServer::new()
///     // .add_service(GreeterServer::new(MyGreeter::default()))
///     .tcp("127.0.0.1:50051".parse().unwrap())
///     .serve()?;
/// println!("HTTP/2 on {:?}", serving.tcp_addr());
/// serving.wait();
/// # Ok::<(), netless::Status>(())
/// ```
#[derive(Default)]
pub struct GrpcServer {
    services: Vec<(&'static str, GrpcService)>,
    max_streams: Option<usize>,
    config: ServerConfig,
    runtime_threads: Option<usize>,
    /// The same services, routed by path for tonic's HTTP/2 server.
    routes: tonic::service::RoutesBuilder,
    tcp: Option<Listen>,
    tls: Option<tonic::transport::ServerTlsConfig>,
    tcp_only: bool,
    /// Whether a unary call that waits stops when its caller's connection closes.
    watch_callers: bool,
}

impl GrpcServer {
    /// No services yet, default netless configuration.
    ///
    /// ```
    /// let server = netless_grpc::GrpcServer::new();
    /// ```
    pub fn new() -> GrpcServer {
        GrpcServer::default()
    }

    /// The netless configuration each service's server uses.
    ///
    /// ```
    /// let config = netless::ServerConfig {
    ///     workers: 2,
    ///     ..Default::default()
    /// };
    /// let server = netless_grpc::GrpcServer::new().config(config);
    /// ```
    pub fn config(mut self, config: ServerConfig) -> GrpcServer {
        self.config = config;
        self
    }

    /// Most streams open at once across this server's services (default 16 384); a call that
    /// would open one more fails with `RESOURCE_EXHAUSTED`.
    ///
    /// ```
    /// let server = netless_grpc::GrpcServer::new().max_streams(1024);
    /// ```
    pub fn max_streams(mut self, max: usize) -> GrpcServer {
        self.max_streams = Some(max);
        self
    }

    /// Threads of the tokio runtime that runs streams, the TCP side and what services spawn
    /// (default 2).
    ///
    /// ```
    /// let server = netless_grpc::GrpcServer::new().runtime_threads(4);
    /// ```
    pub fn runtime_threads(mut self, threads: usize) -> GrpcServer {
        self.runtime_threads = Some(threads.max(1));
        self
    }

    /// Also serves every service over HTTP/2 on TCP `addr` (port 0 picks a free one; see
    /// [`GrpcServing::tcp_addr`]), with tonic's own server, on this server's runtime.
    ///
    /// ```no_run
    /// let serving = netless_grpc::GrpcServer::new()
    ///     // .add_service(..)
    ///     .tcp("127.0.0.1:0".parse().unwrap())
    ///     .serve()?;
    /// let addr = serving.tcp_addr().unwrap();
    /// # Ok::<(), netless::Status>(())
    /// ```
    pub fn tcp(mut self, addr: SocketAddr) -> GrpcServer {
        self.tcp = Some(Listen::Addr(addr));
        self
    }

    /// As [`GrpcServer::tcp`], on a listener already bound.
    ///
    /// ```no_run
    /// let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    /// let serving = netless_grpc::GrpcServer::new().tcp_listener(listener).serve()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn tcp_listener(mut self, listener: std::net::TcpListener) -> GrpcServer {
        self.tcp = Some(Listen::Listener(listener));
        self
    }

    /// TLS (rustls) on the TCP listener.
    ///
    /// ```no_run
    /// use tonic::transport::{Identity, ServerTlsConfig};
    /// let identity = Identity::from_pem(std::fs::read("cert.pem")?, std::fs::read("key.pem")?);
    /// let server = netless_grpc::GrpcServer::new()
    ///     .tcp("0.0.0.0:50051".parse()?)
    ///     .tls(ServerTlsConfig::new().identity(identity));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn tls(mut self, config: tonic::transport::ServerTlsConfig) -> GrpcServer {
        self.tls = Some(config);
        self
    }

    /// Whether to serve on netless too (default `true`); `false`, with a TCP listener,
    /// serves on TCP alone.
    ///
    /// ```no_run
    /// let serving = netless_grpc::GrpcServer::new()
    ///     // .add_service(..)
    ///     .tcp("127.0.0.1:50051".parse().unwrap())
    ///     .netless(false)
    ///     .serve()?;
    /// assert!(serving.servers().is_empty());
    /// # Ok::<(), netless::Status>(())
    /// ```
    pub fn netless(mut self, enabled: bool) -> GrpcServer {
        self.tcp_only = !enabled;
        self
    }

    /// Adds a tonic-generated service; it is served as netless service `S::NAME` (and on
    /// TCP at `/S::NAME/`).
    ///
    /// ```no_run
    /// # #[derive(Clone)] struct GreeterServer;
    /// # impl tonic::server::NamedService for GreeterServer { const NAME: &'static str = "helloworld.Greeter"; }
    /// # impl tower_service::Service<http::Request<tonic::body::Body>> for GreeterServer {
    /// #     type Response = http::Response<tonic::body::Body>;
    /// #     type Error = std::convert::Infallible;
    /// #     type Future = std::future::Ready<Result<Self::Response, Self::Error>>;
    /// #     fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> { std::task::Poll::Ready(Ok(())) }
    /// #     fn call(&mut self, _: http::Request<tonic::body::Body>) -> Self::Future { unimplemented!() }
    /// # }
    /// // `GreeterServer::new(MyGreeter)` in an application, generated by tonic.
    /// let serving = netless_grpc::GrpcServer::new()
    ///     .add_service(GreeterServer)
    ///     .serve()?;
    /// # Ok::<(), netless::Status>(())
    /// ```
    pub fn add_service<S>(mut self, service: S) -> GrpcServer
    where
        S: Service<
                http::Request<tonic::body::Body>,
                Response = http::Response<tonic::body::Body>,
                Error = Infallible,
            > + NamedService
            + Clone
            + Send
            + Sync
            + 'static,
        S::Future: Send + 'static,
    {
        // Each netless server serves one service, so calls go straight to it: no router.
        self.routes.add_service(service.clone());
        self.services.push((S::NAME, GrpcService::new(service)));
        self
    }

    /// Binds one netless server per service and the TCP listener, if any; they serve until
    /// the returned handle is dropped or stopped.
    ///
    /// ```no_run
    /// let serving = netless_grpc::GrpcServer::new().serve()?;
    /// # Ok::<(), netless::Status>(())
    /// ```
    pub fn serve(self) -> Result<GrpcServing, Status> {
        if self.tcp_only && self.tcp.is_none() {
            return Err(Status::invalid_argument(
                "a server without netless needs a TCP listener (GrpcServer::tcp)",
            ));
        }
        // Bound first, so a taken port fails before any netless name is claimed.
        let listener = self.tcp.map(Listen::bind).transpose()?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(self.runtime_threads.unwrap_or(2))
            .thread_name("netless-grpc")
            .enable_all()
            .build()
            .map_err(|e| Status::resource_exhausted(format!("tokio runtime: {e}")))?;
        let sessions = Arc::new(Sessions::new(self.max_streams.unwrap_or(MAX_SESSIONS)));
        runtime.spawn(Sessions::sweep(Arc::downgrade(&sessions)));
        let mut shareds = Vec::new();
        let netless_services = if self.tcp_only {
            Vec::new()
        } else {
            self.services
        };
        let servers = netless_services
            .into_iter()
            .map(|(name, service)| {
                let shared = Arc::new(Shared {
                    name,
                    service,
                    sessions: sessions.clone(),
                    runtime: runtime.handle().clone(),
                    watch_callers: self.watch_callers,
                });
                shareds.push(shared.clone());
                Server::bind(
                    name,
                    self.config.clone(),
                    move |req: &Request<'_>, resp: &mut ResponseBuilder<'_>| {
                        shared.handle(req, resp)
                    },
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        let tcp = listener
            .map(|listener| TcpServing::start(&runtime, listener, self.routes.routes(), self.tls))
            .transpose()?;
        Ok(GrpcServing {
            servers,
            tcp,
            sessions,
            runtime: Some(runtime),
        })
    }

    /// Adds `service` as netless service `name`, a name known only at run time (the
    /// gateway's egress services).
    pub(crate) fn add_named<S>(mut self, name: String, service: S) -> GrpcServer
    where
        S: Service<
                http::Request<tonic::body::Body>,
                Response = http::Response<tonic::body::Body>,
                Error = Infallible,
            > + Clone
            + Send
            + Sync
            + 'static,
        S::Future: Send + 'static,
    {
        // Leaked: the names are `&'static`, and a process names few services at run time.
        self.services
            .push((Box::leak(name.into_boxed_str()), GrpcService::new(service)));
        self
    }

    /// Makes a unary call that has to wait watch its caller: when the caller's connection
    /// closes, the service's future is dropped (so what it waits on, such as an HTTP/2
    /// request to a remote, is cancelled) and its worker moves on. The reply of such a call
    /// is deferred, which costs a single-worker server its lock-free replies, so only the
    /// gateway's egress services, whose calls wait on the network, ask for it.
    pub(crate) fn watch_callers(mut self) -> GrpcServer {
        self.watch_callers = true;
        self
    }
}

/// How often a unary call that waits looks whether its caller's connection closed (as
/// often as the sessions' sweep does for streams).
const CALLER_CHECK: Duration = Duration::from_millis(200);

/// How long [`GrpcServing::stop`] lets the TCP side's calls under way finish.
const TCP_GRACE: Duration = Duration::from_secs(2);

/// Serving tonic services over netless (and TCP); stops when dropped.
pub struct GrpcServing {
    servers: Vec<Server>,
    tcp: Option<TcpServing>,
    sessions: Arc<Sessions>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl GrpcServing {
    /// The netless servers, one per service.
    ///
    /// ```no_run
    /// let serving = netless_grpc::GrpcServer::new().serve()?;
    /// for server in serving.servers() {
    ///     println!("LISTENING netless={}", server.service());
    /// }
    /// # Ok::<(), netless::Status>(())
    /// ```
    pub fn servers(&self) -> &[Server] {
        &self.servers
    }

    /// The TCP address it serves HTTP/2 on (the port chosen, if it asked for 0), if any.
    ///
    /// ```no_run
    /// let serving = netless_grpc::GrpcServer::new()
    ///     .tcp("127.0.0.1:0".parse().unwrap())
    ///     .serve()?;
    /// println!("LISTENING tcp={}", serving.tcp_addr().unwrap());
    /// # Ok::<(), netless::Status>(())
    /// ```
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        self.tcp.as_ref().map(TcpServing::local_addr)
    }

    /// Stops both transports: the TCP listener closes its connections gracefully (GOAWAY;
    /// calls under way get up to 2 s), then the netless servers close theirs. Dropping the
    /// handle stops them too, without waiting.
    ///
    /// ```no_run
    /// let serving = netless_grpc::GrpcServer::new().serve()?;
    /// serving.stop();
    /// # Ok::<(), netless::Status>(())
    /// ```
    pub fn stop(mut self) {
        if let Some(tcp) = &mut self.tcp {
            tcp.shutdown(TCP_GRACE);
        }
    }

    /// Streams open right now.
    ///
    /// ```no_run
    /// let serving = netless_grpc::GrpcServer::new().serve()?;
    /// assert_eq!(serving.open_streams(), 0);
    /// # Ok::<(), netless::Status>(())
    /// ```
    pub fn open_streams(&self) -> usize {
        self.sessions.len()
    }

    /// Blocks until the servers stop (for `main` of a server process).
    ///
    /// ```no_run
    /// let serving = netless_grpc::GrpcServer::new().serve()?;
    /// serving.wait();
    /// # Ok::<(), netless::Status>(())
    /// ```
    pub fn wait(&self) {
        for server in &self.servers {
            server.wait();
        }
        if let Some(tcp) = &self.tcp {
            tcp.wait();
        }
    }
}

impl Drop for GrpcServing {
    fn drop(&mut self) {
        if let Some(tcp) = &mut self.tcp {
            tcp.shutdown(Duration::ZERO);
        }
        self.servers.clear();
        if let Some(runtime) = self.runtime.take() {
            // Not `drop`: that blocks, and panics if the handle is dropped inside a runtime.
            runtime.shutdown_background();
        }
    }
}

impl std::fmt::Debug for GrpcServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The services themselves are boxed tower services with no Debug: show their names.
        let names: Vec<&str> = self.services.iter().map(|(name, _)| *name).collect();
        f.debug_struct("GrpcServer")
            .field("services", &names)
            .field("max_streams", &self.max_streams)
            .field("config", &self.config)
            .field("runtime_threads", &self.runtime_threads)
            .field("tcp", &self.tcp)
            .field("tls", &self.tls.is_some())
            .field("netless", &!self.tcp_only)
            .field("watch_callers", &self.watch_callers)
            .finish()
    }
}

impl std::fmt::Debug for GrpcServing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrpcServing")
            .field("servers", &self.servers)
            .field("tcp", &self.tcp_addr())
            .finish()
    }
}

/// A tonic-generated service, type-erased.
type GrpcService = tower::util::BoxCloneSyncService<
    http::Request<tonic::body::Body>,
    http::Response<tonic::body::Body>,
    Infallible,
>;

struct Shared {
    /// The service's name: every call's path is `/{name}/{method}`.
    name: &'static str,
    service: GrpcService,
    sessions: Arc<Sessions>,
    runtime: tokio::runtime::Handle,
    watch_callers: bool,
}

/// What a call produced before it would have had to wait.
struct Ready {
    head: HeaderMap,
    data: Vec<u8>,
    trailers: Option<HeaderMap>,
    /// The rest of the body, if it has not ended.
    rest: Option<tonic::body::Body>,
}

impl Shared {
    fn handle(&self, req: &Request<'_>, resp: &mut ResponseBuilder<'_>) -> Result<(), Status> {
        if req.method.starts_with(STREAM_PREFIX) {
            return self.stream_op(req, resp);
        }
        let span = trace::call_span(Side::Server, req.method, || {
            req.metadata.get(trace::TRACEPARENT)
        });
        let _entered = span.enter();
        if req.metadata.get(MORE).is_some() {
            return self.open_client_stream(req, resp);
        }
        let body = http_body_util::Full::new(Bytes::copy_from_slice(req.payload));
        let request = self.http_request(req, tonic::body::Body::new(body))?;
        let service = self.service.clone();
        let call = async move {
            let Ok(response) = service.oneshot(request).await;
            let (parts, mut body) = response.into_parts();
            let mut data = Vec::new();
            loop {
                match frame_now(&mut body).await {
                    Some(Some(Ok(frame))) => match frame.into_data() {
                        Ok(bytes) => {
                            data.extend_from_slice(&bytes);
                            if data.len() >= WINDOW {
                                break;
                            }
                        }
                        Err(frame) => {
                            return Ok(Ready {
                                head: parts.headers,
                                data,
                                trailers: frame.into_trailers().ok(),
                                rest: None,
                            });
                        }
                    },
                    Some(None) => {
                        return Ok(Ready {
                            head: parts.headers,
                            data,
                            trailers: Some(HeaderMap::new()),
                            rest: None,
                        })
                    }
                    Some(Some(Err(e))) => {
                        return Err(Status::internal(format!(
                            "the service's response body failed: {e}"
                        )))
                    }
                    None => break,
                }
            }
            Ok::<_, Status>(Ready {
                head: parts.headers,
                data,
                trailers: None,
                rest: Some(body),
            })
        };
        let mut later = None;
        let Some(outcome) = self.run(call, resp, &mut later)? else {
            // The caller's connection closed while the service waited: its future is gone.
            return Ok(());
        };
        match (outcome, later) {
            (Ok(ready), later) => self.reply_unary(ready, later, resp),
            (Err(status), None) => Err(status),
            (Err(status), Some(reply)) => reply.fail(&status).or(Ok(())),
        }
    }

    /// Replies to a unary call with what its service produced (`ready`), through the
    /// deferred reply if the call has one, else `resp`; a response that goes on becomes a
    /// stream.
    fn reply_unary(
        &self,
        ready: Ready,
        later: Option<DeferredReply>,
        resp: &mut ResponseBuilder<'_>,
    ) -> Result<(), Status> {
        let (mut metadata, trailers_only) = response_head(&ready.head);
        if let Some(trailers) = trailers_only {
            for (k, v) in trailers.iter() {
                metadata.insert(k, v);
            }
            return reply_now_or_later(later, resp, metadata, b"");
        }
        let Some(body) = ready.rest else {
            if let Some(trailers) = &ready.trailers {
                trailers_to_metadata(trailers, &mut metadata);
            }
            return reply_now_or_later(later, resp, metadata, &ready.data);
        };
        // The response goes on: the rest streams through a session.
        let reply = match later {
            Some(reply) => reply,
            None => resp.defer()?,
        };
        let session = match self.sessions.open(reply.watch()) {
            Ok(session) => session,
            Err(status) => return reply.fail(&status).or(Ok(())),
        };
        metadata.insert(SESSION, session.id.to_string());
        let first = ready.data.len().min(MAX_DELIVERY);
        session.preload(&ready.data[first..]);
        let task = self.runtime.spawn(session.clone().pump(body));
        session.set_task(task.abort_handle());
        if reply.send(&metadata, &ready.data[..first]).is_err() {
            session.cancel("the client's connection closed");
        }
        Ok(())
    }

    /// Runs `future` to completion on this (netless worker) thread, in the server's runtime
    /// context. A unary call's future is usually ready when first polled, so it is polled
    /// once in place, which costs less than `Handle::block_on` (which sets up a blocking
    /// region and a parker every time); only a future that has to wait goes on to
    /// `block_on`, whose first poll registers the waker that will wake it.
    ///
    /// On a server that watches its callers, a future that has to wait defers the call
    /// (the reply, in `later`, is then the only way to answer it) and is dropped when the
    /// caller's connection closes first: `None`.
    fn run<F: std::future::Future>(
        &self,
        future: F,
        resp: &mut ResponseBuilder<'_>,
        later: &mut Option<DeferredReply>,
    ) -> Result<Option<F::Output>, Status> {
        let mut future = std::pin::pin!(future);
        {
            let _context = self.runtime.enter();
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            if let std::task::Poll::Ready(output) = future.as_mut().poll(&mut cx) {
                return Ok(Some(output));
            }
        }
        if !self.watch_callers {
            return Ok(Some(self.runtime.block_on(future)));
        }
        let watch = later.insert(resp.defer()?).watch();
        let name = self.name;
        Ok(self.runtime.block_on(async move {
            let mut check = tokio::time::interval(CALLER_CHECK);
            std::future::poll_fn(|cx| {
                if let std::task::Poll::Ready(output) = future.as_mut().poll(cx) {
                    return std::task::Poll::Ready(Some(output));
                }
                while check.poll_tick(cx).is_ready() {
                    if watch.is_closed() {
                        tracing::debug!("`{name}`: a caller left; its call stopped");
                        return std::task::Poll::Ready(None);
                    }
                }
                std::task::Poll::Pending
            })
            .await
        }))
    }

    /// A call whose request goes on: the service runs as a task reading `send`s.
    fn open_client_stream(
        &self,
        req: &Request<'_>,
        resp: &mut ResponseBuilder<'_>,
    ) -> Result<(), Status> {
        // Checked before the session exists, so a bad path leaves nothing behind.
        let mut request = self.http_request(req, tonic::body::Body::empty())?;
        let reply = resp.defer()?;
        let session = match self.sessions.open(reply.watch()) {
            Ok(session) => session,
            Err(status) => return reply.fail(&status).or(Ok(())),
        };
        *request.body_mut() =
            tonic::body::Body::new(session.request_body(Bytes::copy_from_slice(req.payload)));
        let service = self.service.clone();
        let task = {
            let session = session.clone();
            let span = tracing::Span::current();
            self.runtime.spawn(tracing::Instrument::instrument(
                async move {
                    let Ok(response) = service.oneshot(request).await;
                    let (parts, body) = response.into_parts();
                    let trailers_only = parts.headers.contains_key("grpc-status");
                    session.set_head(&parts.headers);
                    if !trailers_only {
                        session.pump(body).await;
                    }
                },
                span,
            ))
        };
        session.set_task(task.abort_handle());
        let mut metadata = Metadata::new();
        metadata.insert(SESSION, session.id.to_string());
        if reply.send(&metadata, b"").is_err() {
            session.cancel("the client's connection closed");
        }
        Ok(())
    }

    /// `recv`, `send`, `close-send` or `cancel` on a stream.
    fn stream_op(&self, req: &Request<'_>, resp: &mut ResponseBuilder<'_>) -> Result<(), Status> {
        let (id, data) = split_stream_payload(req.payload)
            .ok_or_else(|| Status::invalid_argument("stream call without a stream id"))?;
        let reply = resp.defer()?;
        let session = match self.sessions.get(id, &reply) {
            Ok(session) => session,
            // Cancelling a stream that already ended is not an error.
            Err(_) if req.method == CANCEL => return reply.send(&Metadata::new(), b"").or(Ok(())),
            Err(status) => return reply.fail(&status).or(Ok(())),
        };
        match req.method {
            RECV => session.recv(reply),
            SEND => session.send(data, reply),
            CLOSE_SEND => {
                session.close_send();
                let _ = reply.send(&Metadata::new(), b"");
            }
            CANCEL => {
                session.cancel("the client cancelled the call");
                let _ = reply.send(&Metadata::new(), b"");
            }
            other => {
                let _ = reply.fail(&Status::new(
                    netless::Code::Unimplemented,
                    format!("unknown stream operation `{other}`"),
                ));
            }
        }
        Ok(())
    }

    /// The HTTP request tonic expects, from a netless request, with `body`.
    fn http_request(
        &self,
        req: &Request<'_>,
        body: tonic::body::Body,
    ) -> Result<http::Request<tonic::body::Body>, Status> {
        let mut headers = HeaderMap::with_capacity(req.metadata.len() + 3);
        append_headers(&req.metadata, &mut headers);
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        headers.insert(TE, HeaderValue::from_static("trailers"));
        if let Some(deadline) = req.deadline {
            headers.insert(GRPC_TIMEOUT, format_grpc_timeout(deadline));
        }
        // The service routes by path: only a path to one of this service's methods goes in.
        let unknown = || unknown_method(req.method, self.name);
        if method_of(req.method, self.name).is_none() {
            return Err(unknown());
        }
        let uri: http::Uri = req.method.parse().map_err(|_| unknown())?;
        let mut request = http::Request::new(body);
        *request.method_mut() = Method::POST;
        *request.uri_mut() = uri;
        *request.headers_mut() = headers;
        Ok(request)
    }
}

/// Replies `metadata` and `payload` through `later`, the deferred reply, if the call has
/// one, else through `resp`.
fn reply_now_or_later(
    later: Option<DeferredReply>,
    resp: &mut ResponseBuilder<'_>,
    metadata: Metadata,
    payload: &[u8],
) -> Result<(), Status> {
    match later {
        // A caller gone meanwhile hears nothing either way.
        Some(reply) => reply.send(&metadata, payload).or(Ok(())),
        None => {
            resp.metadata = metadata;
            resp.payload.extend_from_slice(payload);
            Ok(())
        }
    }
}
