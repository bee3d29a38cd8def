//! One egress call, as the tower service the netless server of an egress service runs.
//!
//! What goes to the remote is the egress service's own method and the caller's metadata:
//! the request's path must be `/{service}/{method}`, `method` a plain gRPC method name
//! (`mapping::is_method_name`), else the call is an unknown method (`UNIMPLEMENTED`, naming
//! nothing of the remote), so a caller of `shop.Orders` reaches no other service of the
//! remote, nor a query or another origin. The URI is made anew for each try: the
//! endpoint's scheme and authority, that path. The caller's metadata goes on as it is
//! (`authorization` too: a caller may authenticate to the remote), less the headers that
//! are the transport's, never the call's: `host` (the remote's authority is the
//! endpoint's), `content-length`, and the connection-specific ones HTTP/2 forbids.
//!
//! Its deadline is the caller's, within the gateway's limits (`default_timeout`,
//! `max_timeout`), and goes to the remote as `grpc-timeout`, rewritten for each try to
//! what is left. A try goes to an endpoint the call has not tried ([`Endpoints::pick`]);
//! if it fails with its request body untouched (see `body`), nothing reached the remote
//! and the call moves on, at most `retries` times. Once a try may have reached the remote,
//! its outcome is the call's: the remote's headers, messages and trailers pass through as
//! they are. What the caller hears when no try got an answer names the service and why in
//! a few fixed words; the endpoints and the detail go to the gateway's log.

use std::convert::Infallible;
use std::error::Error;
use std::future::Future;
use std::io::ErrorKind;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use netless::{Code, Status};
use tokio_rustls::rustls;
use tower::ServiceExt as _;
use tower_service::Service;

use super::body::{Attempt, RemoteBody, TryBody};
use super::endpoints::Endpoints;
use super::{error_chain, Plan};
use crate::channel::status_response;
use crate::gateway::metrics::{observe, Metrics};
use crate::gateway::GatewayLimits;
use crate::mapping::{format_grpc_timeout, method_of, unknown_method, GRPC_TIMEOUT};

type Request = http::Request<tonic::body::Body>;
type Response = http::Response<tonic::body::Body>;

/// Request headers that never go to the remote: `host` (the remote's `:authority` is the
/// endpoint's), `content-length` (HTTP/2 frames the body, and h2 fails a call whose body
/// does not match the figure), and the connection-specific headers HTTP/2 forbids (RFC
/// 9113, 8.2.2; hyper would drop them too). Metadata keys starting with `:` never become
/// headers at all.
const NOT_FORWARDED: [http::HeaderName; 7] = [
    http::header::HOST,
    http::header::CONTENT_LENGTH,
    http::header::CONNECTION,
    http::header::TRANSFER_ENCODING,
    http::header::UPGRADE,
    http::HeaderName::from_static("keep-alive"),
    http::HeaderName::from_static("proxy-connection"),
];

/// Forwards the calls of one egress service to its remote. Cheap to clone.
#[derive(Clone, Debug)]
pub(super) struct Forward {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    service: Arc<str>,
    endpoints: Endpoints,
    retries: u32,
    limits: GatewayLimits,
    /// Where each try is counted (`grpc_client_attempt_*`).
    metrics: Arc<Metrics>,
}

impl Forward {
    pub(super) fn new(
        plan: &Plan,
        endpoints: Endpoints,
        limits: GatewayLimits,
        metrics: Arc<Metrics>,
    ) -> Forward {
        Forward {
            shared: Arc::new(Shared {
                service: plan.service.clone(),
                endpoints,
                retries: plan.retries,
                limits,
                metrics,
            }),
        }
    }
}

impl Service<Request> for Forward {
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let shared = self.shared.clone();
        Box::pin(async move { Ok(shared.forward(request).await) })
    }
}

impl Shared {
    async fn forward(&self, request: Request) -> Response {
        let (mut parts, body) = request.into_parts();
        let Some(path) = path_of(&parts.uri, &self.service) else {
            return status_response(&unknown_method(&parts.uri.to_string(), &self.service));
        };
        for name in &NOT_FORWARDED {
            parts.headers.remove(name);
        }
        let deadline = self.limits.deadline(&mut parts.headers);
        let mut body = Some(body);
        let mut tried = Vec::new();
        let mut failure = None;
        while tried.len() <= self.retries as usize {
            let (Some(i), Some(next)) = (self.endpoints.pick(&tried), body.take()) else {
                break;
            };
            tried.push(i);
            if let Some(deadline) = deadline {
                if Instant::now() >= deadline {
                    return status_response(&self.deadline_passed());
                }
                parts
                    .headers
                    .insert(GRPC_TIMEOUT, format_grpc_timeout(deadline));
            }
            let method = &path.path()[self.service.len() + 2..];
            let shown = self.endpoints.shown(i);
            let counted = self.metrics.client_attempt(&self.service, method, shown);
            let (attempt, try_body) = Attempt::new(next);
            let request = request_of(&parts, self.endpoints.uri(i, &path), try_body);
            attempt.arm();
            let (channel, load) = self.endpoints.begin(i);
            let sent = channel.oneshot(request);
            let outcome = match deadline {
                Some(deadline) => match tokio::time::timeout_at(deadline.into(), sent).await {
                    Ok(outcome) => outcome,
                    Err(_) => {
                        counted.finish(Code::DeadlineExceeded);
                        return status_response(&self.deadline_passed());
                    }
                },
                None => sent.await,
            };
            let error = match outcome {
                Ok(response) => {
                    self.endpoints.answered(i);
                    let response = response.map(|remote| {
                        let service = self.service.clone();
                        tonic::body::Body::new(RemoteBody::new(remote, deadline, service, load))
                    });
                    return observe(response, counted);
                }
                Err(error) => error,
            };
            drop(load);
            let why = Failure::of(&error);
            counted.finish(if why.deadline {
                Code::DeadlineExceeded
            } else {
                Code::Unavailable
            });
            if why.deadline {
                return status_response(&self.deadline_passed());
            }
            match attempt.take_back() {
                Some(untouched) => {
                    self.endpoints.failed(i, &why.detail);
                    body = Some(untouched);
                    failure = Some(why);
                }
                None => {
                    tracing::debug!("egress `{}`: {}", self.service, why.detail);
                    return status_response(&Status::unavailable(format!(
                        "the connection to the remote service `{}` failed before it answered \
                         ({}); the call may have reached it, so it was not tried again",
                        self.service, why.reason
                    )));
                }
            }
        }
        let reason = failure.map_or("no endpoint", |f| f.reason);
        status_response(&Status::unavailable(format!(
            "the remote service `{}` is unreachable from this gateway: {reason} ({} of {} \
             endpoints tried)",
            self.service,
            tried.len(),
            self.endpoints.len()
        )))
    }

    fn deadline_passed(&self) -> Status {
        Status::deadline_exceeded(format!(
            "the deadline passed before the remote service `{}` answered",
            self.service
        ))
    }
}

/// The path that goes to the remote, if `uri` is a path to one of `service`'s methods:
/// `/{service}/{method}`, with no scheme, authority or query.
fn path_of(uri: &http::Uri, service: &str) -> Option<http::uri::PathAndQuery> {
    if uri.scheme().is_some() || uri.authority().is_some() || uri.query().is_some() {
        return None;
    }
    let method = method_of(uri.path(), service)?;
    format!("/{service}/{method}").parse().ok()
}

/// The request of one try: the call's, to `uri`, with `body`.
fn request_of(parts: &http::request::Parts, uri: http::Uri, body: TryBody) -> Request {
    let mut request = http::Request::new(tonic::body::Body::new(body));
    *request.method_mut() = http::Method::POST;
    *request.uri_mut() = uri;
    *request.version_mut() = http::Version::HTTP_2;
    *request.headers_mut() = parts.headers.clone();
    request
}

/// Why a try got no answer.
#[derive(Debug)]
struct Failure {
    /// In a few fixed words, for the caller.
    reason: &'static str,
    /// The call's deadline passed (tonic enforces `grpc-timeout` too).
    deadline: bool,
    /// The whole error, for the gateway's log.
    detail: String,
}

impl Failure {
    fn of(error: &(dyn Error + 'static)) -> Failure {
        let detail = error_chain(error);
        let mut reason = None;
        let mut deadline = false;
        let mut source = Some(error);
        while let Some(e) = source {
            if e.is::<tonic::TimeoutExpired>() {
                deadline = true;
            }
            if let Some(io) = e.downcast_ref::<std::io::Error>() {
                let tls = io
                    .get_ref()
                    .is_some_and(|inner| inner.is::<rustls::Error>());
                reason = reason.or(match io.kind() {
                    _ if tls => Some("the TLS handshake failed"),
                    ErrorKind::ConnectionRefused => Some("connection refused"),
                    ErrorKind::TimedOut => Some("connecting timed out"),
                    ErrorKind::ConnectionReset
                    | ErrorKind::ConnectionAborted
                    | ErrorKind::BrokenPipe
                    | ErrorKind::UnexpectedEof => Some("connection reset"),
                    _ => None,
                });
            }
            source = e.source();
        }
        let reason = reason.unwrap_or_else(|| {
            if detail.contains("TLS handshake timeout") {
                "the TLS handshake timed out"
            } else if detail.contains("HTTP/2 was not negotiated") {
                "the remote does not offer HTTP/2"
            } else {
                "the connection failed"
            }
        });
        Failure {
            reason,
            deadline,
            detail,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_services_own_methods_go_to_the_remote() {
        let path = |uri: &str| path_of(&uri.parse().unwrap(), "shop.Orders");
        assert_eq!(path("/shop.Orders/Get").unwrap(), "/shop.Orders/Get");
        for uri in [
            "/admin.Admin/DropAllTables",
            "/shop.Orders/Get?x=1",
            "http://evil.example:9/shop.Orders/Get",
            "//evil.example/shop.Orders/Get",
            "/shop.Orders/Get/x",
            "/shop.Orders/Get%3Fx",
            "*",
        ] {
            assert!(path(uri).is_none(), "{uri}");
        }
    }

    #[test]
    fn failures_are_told_in_fixed_words() {
        let io = |kind, text: &str| std::io::Error::new(kind, text.to_string());
        let refused = tonic::ConnectError(Box::new(io(ErrorKind::ConnectionRefused, "x")));
        assert_eq!(Failure::of(&refused).reason, "connection refused");
        let timeout = tonic::ConnectError(Box::new(io(ErrorKind::TimedOut, "tcp connect")));
        assert_eq!(Failure::of(&timeout).reason, "connecting timed out");
        let tls = std::io::Error::new(
            ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        );
        let failure = Failure::of(&tls);
        assert_eq!(failure.reason, "the TLS handshake failed");
        assert!(failure.detail.contains("certificate"), "{failure:?}");
        let other = io(ErrorKind::Other, "/some/path/secret-token");
        let failure = Failure::of(&other);
        assert_eq!(failure.reason, "the connection failed");
        assert!(!failure.deadline);
        assert!(Failure::of(&tonic::TimeoutExpired(())).deadline);
    }
}
