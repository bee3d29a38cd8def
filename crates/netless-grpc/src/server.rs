//! The server side: serves tonic-generated services (`GreeterServer::new(svc)`) over netless,
//! each `pkg.Service` as the netless service of that name.
//!
//! The service runs on the netless worker that took the call (`Handle::block_on`), so a unary
//! call crosses no thread; whatever it spawns runs on the server's tokio runtime. A call
//! whose request or response goes on longer becomes a stream (see [`crate::protocol`]),
//! driven by a task on that runtime.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, TE};
use http::{HeaderMap, HeaderValue, Method};
use netless::{Metadata, Request, ResponseBuilder, Server, ServerConfig, Status};
use tonic::server::NamedService;
use tower::ServiceExt as _;
use tower_service::Service;

use crate::mapping::{
    append_headers, format_grpc_timeout, frame_now, trailers_to_metadata, GRPC_TIMEOUT,
};
use crate::protocol::{
    split_stream_payload, CANCEL, CLOSE_SEND, MORE, RECV, SEND, SESSION, STREAM_PREFIX, WINDOW,
};
use crate::session::{response_head, Sessions, MAX_DELIVERY, MAX_SESSIONS};

/// Builds and serves a set of tonic services over netless.
///
/// ```no_run
/// let serving = netless_grpc::GrpcServer::new()
///     // .add_service(GreeterServer::new(MyGreeter::default()))
///     .serve()?;
/// serving.wait();
/// # Ok::<(), netless::Status>(())
/// ```
#[derive(Default)]
pub struct GrpcServer {
    services: Vec<(&'static str, GrpcService)>,
    max_streams: Option<usize>,
    config: ServerConfig,
    runtime_threads: Option<usize>,
}

impl GrpcServer {
    /// No services yet, default netless configuration.
    pub fn new() -> GrpcServer {
        GrpcServer::default()
    }

    /// The netless configuration each service's server uses.
    pub fn config(mut self, config: ServerConfig) -> GrpcServer {
        self.config = config;
        self
    }

    /// Most streams open at once across this server's services (default 16 384); a call that
    /// would open one more fails with `RESOURCE_EXHAUSTED`.
    pub fn max_streams(mut self, max: usize) -> GrpcServer {
        self.max_streams = Some(max);
        self
    }

    /// Threads of the tokio runtime that runs streams and what services spawn (default 2).
    pub fn runtime_threads(mut self, threads: usize) -> GrpcServer {
        self.runtime_threads = Some(threads.max(1));
        self
    }

    /// Adds a tonic-generated service; it is served as netless service `S::NAME`.
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
        self.services.push((S::NAME, GrpcService::new(service)));
        self
    }

    /// Binds one netless server per service; they serve until the returned handle is dropped.
    pub fn serve(self) -> Result<GrpcServing, Status> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(self.runtime_threads.unwrap_or(2))
            .thread_name("netless-grpc")
            .enable_all()
            .build()
            .map_err(|e| Status::resource_exhausted(format!("tokio runtime: {e}")))?;
        let sessions = Arc::new(Sessions::new(self.max_streams.unwrap_or(MAX_SESSIONS)));
        runtime.spawn(Sessions::sweep(Arc::downgrade(&sessions)));
        let mut shareds = Vec::new();
        let servers = self
            .services
            .into_iter()
            .map(|(name, service)| {
                let shared = Arc::new(Shared {
                    service,
                    sessions: sessions.clone(),
                    runtime: runtime.handle().clone(),
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
        Ok(GrpcServing {
            servers,
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
}

/// Serving tonic services over netless; stops when dropped.
pub struct GrpcServing {
    servers: Vec<Server>,
    sessions: Arc<Sessions>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl GrpcServing {
    /// The netless servers, one per service.
    pub fn servers(&self) -> &[Server] {
        &self.servers
    }

    /// Streams open right now.
    pub fn open_streams(&self) -> usize {
        self.sessions.len()
    }

    /// Blocks until the servers stop (for `main` of a server process).
    pub fn wait(&self) {
        for server in &self.servers {
            server.wait();
        }
    }
}

impl Drop for GrpcServing {
    fn drop(&mut self) {
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
            .finish()
    }
}

impl std::fmt::Debug for GrpcServing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrpcServing")
            .field("servers", &self.servers)
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
    service: GrpcService,
    sessions: Arc<Sessions>,
    runtime: tokio::runtime::Handle,
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
        if req.metadata.get(MORE).is_some() {
            return self.open_client_stream(req, resp);
        }
        let body = http_body_util::Full::new(Bytes::copy_from_slice(req.payload));
        let request = self.http_request(req, tonic::body::Body::new(body))?;
        let service = self.service.clone();
        let ready = self.run(async move {
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
        })?;
        let (head, trailers_only) = response_head(&ready.head);
        resp.metadata = head;
        if let Some(trailers) = trailers_only {
            for (k, v) in trailers.iter() {
                resp.metadata.insert(k, v);
            }
            return Ok(());
        }
        match ready.rest {
            None => {
                if let Some(trailers) = &ready.trailers {
                    trailers_to_metadata(trailers, &mut resp.metadata);
                }
                resp.payload.extend_from_slice(&ready.data);
                Ok(())
            }
            Some(body) => {
                // The response goes on: the rest streams through a session.
                let metadata = std::mem::take(&mut resp.metadata);
                let reply = resp.defer()?;
                let session = match self.sessions.open(reply.watch()) {
                    Ok(session) => session,
                    Err(status) => return reply.fail(&status).or(Ok(())),
                };
                let mut metadata = metadata;
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
        }
    }

    /// Runs `future` to completion on this (netless worker) thread, in the server's runtime
    /// context. A unary call's future is usually ready when first polled, so it is polled
    /// once in place, which costs less than `Handle::block_on` (which sets up a blocking
    /// region and a parker every time); only a future that has to wait goes on to
    /// `block_on`, whose first poll registers the waker that will wake it.
    fn run<F: std::future::Future>(&self, future: F) -> F::Output {
        let mut future = std::pin::pin!(future);
        {
            let _context = self.runtime.enter();
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            if let std::task::Poll::Ready(output) = future.as_mut().poll(&mut cx) {
                return output;
            }
        }
        self.runtime.block_on(future)
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
            self.runtime.spawn(async move {
                let Ok(response) = service.oneshot(request).await;
                let (parts, body) = response.into_parts();
                let trailers_only = parts.headers.contains_key("grpc-status");
                session.set_head(&parts.headers);
                if !trailers_only {
                    session.pump(body).await;
                }
            })
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
        let uri: http::Uri = req.method.parse().map_err(|_| {
            Status::invalid_argument(format!("`{}` is not a gRPC path", req.method))
        })?;
        let mut request = http::Request::new(body);
        *request.method_mut() = Method::POST;
        *request.uri_mut() = uri;
        *request.headers_mut() = headers;
        Ok(request)
    }
}
