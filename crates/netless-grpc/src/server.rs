//! The server side: serves tonic-generated services (`GreeterServer::new(svc)`) over netless,
//! each `pkg.Service` as the netless service of that name.
//!
//! Each netless worker runs the tonic service on its own single-threaded tokio runtime, so
//! the service code runs unchanged; the request's bytes, metadata and deadline are turned
//! back into an HTTP request and the response's body, headers and trailers into the netless
//! reply.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderValue, Method};
use http_body_util::BodyExt;
use netless::{Request, ResponseBuilder, Server, ServerConfig, Status};
use tonic::server::NamedService;
use tonic::service::Routes;
use tower_service::Service;

use crate::mapping::{
    format_grpc_timeout, headers_to_metadata, metadata_to_headers, trailers_to_metadata,
};

/// Builds and serves a set of tonic services over netless.
///
/// ```no_run
/// # fn svc() -> tonic::service::Routes { tonic::service::Routes::default() }
/// let servers = netless_grpc::GrpcServer::new()
///     // .add_service(GreeterServer::new(MyGreeter::default()))
///     .serve()?;
/// # Ok::<(), netless::Status>(())
/// ```
#[derive(Default)]
pub struct GrpcServer {
    routes: Routes,
    names: Vec<&'static str>,
    config: ServerConfig,
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
        self.names.push(S::NAME);
        self.routes = self.routes.add_service(service);
        self
    }

    /// Binds one netless server per service; they serve until dropped.
    pub fn serve(self) -> Result<Vec<Server>, Status> {
        let routes = Arc::new(self.routes);
        self.names
            .iter()
            .map(|name| {
                let routes = routes.clone();
                Server::bind(
                    name,
                    self.config.clone(),
                    move |req: &Request<'_>, resp: &mut ResponseBuilder<'_>| {
                        handle(&routes, req, resp)
                    },
                )
            })
            .collect()
    }
}

thread_local! {
    /// Each netless worker thread drives tonic services on its own runtime.
    static RUNTIME: Option<tokio::runtime::Runtime> = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .ok();
}

fn handle(
    routes: &Routes,
    req: &Request<'_>,
    resp: &mut ResponseBuilder<'_>,
) -> Result<(), Status> {
    let (mut headers, _) = metadata_to_headers(&req.metadata);
    headers.insert("content-type", HeaderValue::from_static("application/grpc"));
    headers.insert("te", HeaderValue::from_static("trailers"));
    if let Some(deadline) = req.deadline {
        headers.insert("grpc-timeout", format_grpc_timeout(deadline));
    }
    let uri: http::Uri = req
        .method
        .parse()
        .map_err(|_| Status::invalid_argument(format!("`{}` is not a gRPC path", req.method)))?;
    let mut request = http::Request::new(tonic::body::Body::new(http_body_util::Full::new(
        Bytes::copy_from_slice(req.payload),
    )));
    *request.method_mut() = Method::POST;
    *request.uri_mut() = uri;
    *request.headers_mut() = headers;
    let mut routes = routes.clone();
    let collected = RUNTIME.with(|runtime| {
        let runtime = runtime
            .as_ref()
            .ok_or_else(|| Status::internal("no tokio runtime on this worker"))?;
        runtime.block_on(async move {
            let Ok(response) = routes.call(request).await;
            let (parts, body) = response.into_parts();
            let collected = body.collect().await.map_err(|e| {
                Status::internal(format!("the service's response body failed: {e}"))
            })?;
            Ok::<_, Status>((parts, collected))
        })
    })?;
    let (parts, collected) = collected;
    headers_to_metadata(&parts.headers, &mut resp.metadata);
    // A trailers-only response carries grpc-status in its headers; pass them as trailers.
    if let Some(status) = parts.headers.get("grpc-status") {
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", status.clone());
        if let Some(message) = parts.headers.get("grpc-message") {
            trailers.insert("grpc-message", message.clone());
        }
        trailers_to_metadata(&trailers, &mut resp.metadata);
    }
    if let Some(trailers) = collected.trailers() {
        trailers_to_metadata(trailers, &mut resp.metadata);
    }
    resp.payload.extend_from_slice(&collected.to_bytes());
    Ok(())
}
