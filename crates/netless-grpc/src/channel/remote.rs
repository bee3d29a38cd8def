//! The remote path: calls to gRPC servers elsewhere go over HTTP/2 through tonic's own
//! transport (`tonic::transport::Channel`), so any gRPC server in any language answers.
//!
//! This module owns building that channel from a [`Location::Remote`], giving calls that
//! set no deadline the `ClientConfig`'s `default_timeout` (as `grpc-timeout`, as the local
//! path does), holding every call to its deadline itself, so that a server that accepts a
//! call and never answers cannot hang it, and turning transport failures into gRPC
//! statuses; the calls themselves pass through unchanged.
//!
//! [`Location::Remote`]: super::Location::Remote

use std::error::Error as StdError;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use netless::{Code, Status};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};
use tower::ServiceExt as _;

use super::local::status_response;
use super::options::ChannelOptions;
use crate::mapping::{format_grpc_timeout, parse_grpc_timeout, GRPC_TIMEOUT};

/// HTTP/2 PINGs on a connection with calls open and nothing heard for this long, so a
/// server that vanished (no reset, no FIN) is noticed even by a call without a deadline.
/// Five minutes: gRPC servers answer pings more frequent than that on a quiet connection
/// with `GOAWAY` (`too_many_pings`) by default (grpc-go's and grpc-java's minimum ping
/// interval, C-core's without data).
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(300);
/// A PING unanswered this long closes the connection, failing its calls.
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// A lazily connecting tonic channel to `uris`, balanced across them when there are
/// several. Connections are made by the first call, in the current tokio runtime.
pub(super) fn connect(
    uris: &[String],
    options: &ChannelOptions,
) -> Result<tonic::transport::Channel, Status> {
    if tokio::runtime::Handle::try_current().is_err() {
        // tonic runs the channel's connections as tasks of the runtime it is made in.
        return Err(Status::new(
            Code::FailedPrecondition,
            "a channel to a remote target is made inside a tokio runtime, which runs its \
             connections",
        ));
    }
    let endpoints = uris
        .iter()
        .map(|uri| endpoint(uri, options))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(match &endpoints[..] {
        [one] => one.connect_lazy(),
        _ => tonic::transport::Channel::balance_list(endpoints.into_iter()),
    })
}

fn endpoint(uri: &str, options: &ChannelOptions) -> Result<Endpoint, Status> {
    let invalid = |e: &dyn std::fmt::Display| {
        Status::invalid_argument(format!("`{uri}` is not a usable server address: {e}"))
    };
    let mut endpoint = Endpoint::from_shared(uri.to_string())
        .map_err(|e| invalid(&e))?
        .connect_timeout(options.client.connect_timeout)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT);
    if uri.starts_with("https://") {
        let mut tls =
            ClientTlsConfig::new().ca_certificate(Certificate::from_pem(options.ca_pem(uri)?));
        if let Some(domain) = &options.tls_domain {
            tls = tls.domain_name(domain.clone());
        }
        endpoint = endpoint.tls_config(tls).map_err(|e| invalid(&e))?;
    }
    Ok(endpoint)
}

/// One call through `channel`; a transport failure becomes a trailers-only response, as a
/// netless failure does on the local path.
///
/// Its deadline is its `grpc-timeout`, else `default_timeout` from now, which then goes to
/// the server as its `grpc-timeout`. When the deadline passes before the response headers,
/// or while the response body is still to come, the call ends with `DEADLINE_EXCEEDED`
/// and its HTTP/2 stream is reset.
pub(super) async fn call(
    channel: tonic::transport::Channel,
    target: &str,
    default_timeout: Option<Duration>,
    mut request: http::Request<tonic::body::Body>,
) -> http::Response<tonic::body::Body> {
    let asked = request
        .headers()
        .get(GRPC_TIMEOUT)
        .and_then(|v| parse_grpc_timeout(v.as_bytes()));
    let deadline = asked.or_else(|| {
        let deadline = Instant::now().checked_add(default_timeout?)?;
        request
            .headers_mut()
            .insert(GRPC_TIMEOUT, format_grpc_timeout(deadline));
        Some(deadline)
    });
    let sent = channel.oneshot(request);
    let outcome = match deadline {
        Some(deadline) => match tokio::time::timeout_at(deadline.into(), sent).await {
            Ok(outcome) => outcome,
            Err(_) => return status_response(&deadline_passed(target)),
        },
        None => sent.await,
    };
    match (outcome, deadline) {
        (Ok(response), Some(deadline)) => response.map(|body| {
            tonic::body::Body::new(DeadlineBody {
                inner: Some(body),
                deadline: Box::pin(tokio::time::sleep_until(deadline.into())),
                target: target.to_string(),
            })
        }),
        (Ok(response), None) => response,
        (Err(error), _) => status_response(&transport_status(&error, target)),
    }
}

fn deadline_passed(target: &str) -> Status {
    Status::deadline_exceeded(format!("the deadline expired before `{target}` answered"))
}

/// A response body held to the call's deadline: when it passes with the body still to
/// come, the body ends with `DEADLINE_EXCEEDED` in its trailers, and the server's stream is
/// reset (the inner body is dropped).
struct DeadlineBody {
    /// `None` once ended.
    inner: Option<tonic::body::Body>,
    deadline: Pin<Box<tokio::time::Sleep>>,
    target: String,
}

impl Body for DeadlineBody {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        let this = &mut *self;
        let Some(inner) = &mut this.inner else {
            return Poll::Ready(None);
        };
        match Pin::new(inner).poll_frame(cx) {
            Poll::Ready(None) => {
                this.inner = None;
                Poll::Ready(None)
            }
            Poll::Ready(frame) => Poll::Ready(frame),
            Poll::Pending => {
                if this.deadline.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                this.inner = None;
                let status = tonic::Status::deadline_exceeded(format!(
                    "the deadline expired while `{}` was answering",
                    this.target
                ));
                let mut trailers = HeaderMap::new();
                let _ = status.add_header(&mut trailers);
                Poll::Ready(Some(Ok(Frame::trailers(trailers))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or(SizeHint::with_exact(0), Body::size_hint)
    }
}

/// The status for a failure of tonic's transport: the deadline's expiry is
/// `DEADLINE_EXCEEDED`, everything else (refused, reset, no route, TLS) `UNAVAILABLE`,
/// each with the causes' own words (which name the target, never a local path).
pub(super) fn transport_status(error: &(dyn StdError + 'static), target: &str) -> Status {
    let mut causes: Vec<String> = Vec::new();
    let mut source = Some(error);
    while let Some(error) = source {
        if error.downcast_ref::<tonic::TimeoutExpired>().is_some() {
            return deadline_passed(target);
        }
        let text = error.to_string();
        // Layers often repeat their source's words in their own.
        if !causes.iter().any(|c| c.contains(&text)) {
            causes.push(text);
        }
        source = error.source();
    }
    Status::unavailable(format!("`{target}` is unavailable: {}", causes.join(": ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<dyn StdError + Send + Sync>>);

    impl std::fmt::Display for Layer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl StdError for Layer {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            self.1.as_deref().map(|e| e as &(dyn StdError + 'static))
        }
    }

    #[test]
    fn a_refused_connection_is_unavailable_with_every_cause() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let error = Layer(
            "transport error",
            Some(Box::new(Layer(
                "tcp connect error",
                Some(Box::new(refused)),
            ))),
        );
        let status = transport_status(&error, "http://127.0.0.1:1");
        assert_eq!(status.code(), Code::Unavailable);
        assert_eq!(
            status.message(),
            "`http://127.0.0.1:1` is unavailable: transport error: tcp connect error: \
             connection refused"
        );
    }

    #[test]
    fn an_expired_deadline_is_deadline_exceeded() {
        let error = Layer("transport error", Some(Box::new(tonic::TimeoutExpired(()))));
        let status = transport_status(&error, "http://a:1");
        assert_eq!(status.code(), Code::DeadlineExceeded);
    }

    #[test]
    fn https_without_a_ca_says_how_to_give_one() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _context = runtime.enter();
        let mut options = ChannelOptions::new();
        if std::env::var_os(super::super::options::TLS_CA_ENV).is_some() {
            // A CA from the environment would be used; give a bad one explicitly instead.
            options = options.tls_ca_pem(b"not a certificate".to_vec());
            let _ = connect(&["https://localhost:1".into()], &options);
            return;
        }
        let err = connect(&["https://localhost:1".into()], &options).unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition);
        assert!(
            err.message().contains("NETLESS_TLS_CA"),
            "{}",
            err.message()
        );
    }

    #[test]
    fn outside_a_runtime_a_remote_channel_is_refused_not_a_panic() {
        let err = connect(&["http://127.0.0.1:1".into()], &ChannelOptions::new()).unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition);
        assert!(err.message().contains("tokio runtime"));
    }
}
