//! A `Channel` to a remote target keeps the `ClientConfig`'s `default_timeout`, as a local
//! one does: a call that sets no deadline gets it as `grpc-timeout`, and a server that
//! accepts the call and never answers (before its response headers, or after them) fails
//! it with `DEADLINE_EXCEEDED` instead of hanging it. The servers are bare hyper HTTP/2
//! servers that tell the test the `grpc-timeout` they got.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::mpsc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::HeaderValue;
use http_body::Frame;
use http_body_util::BodyExt;
use netless::ClientConfig;
use netless_grpc::{Channel, ChannelOptions};
use tower::ServiceExt as _;

/// How the server treats a call.
#[derive(Clone, Copy, Debug)]
enum Silent {
    /// Never answers.
    Before,
    /// Sends the response headers, then nothing.
    After,
}

/// A response body that never has anything, nor ends.
struct Never;

impl http_body::Body for Never {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Pending
    }
}

/// A server that accepts calls and falls silent as `silent` says; the `grpc-timeout` of
/// each call it gets goes to the returned channel.
async fn server(silent: Silent) -> (std::net::SocketAddr, mpsc::Receiver<Option<String>>) {
    let (tx, timeouts) = mpsc::channel();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (socket, _) = listener.accept().await.unwrap();
            let tx = tx.clone();
            let service =
                hyper::service::service_fn(move |request: http::Request<hyper::body::Incoming>| {
                    let timeout = request
                        .headers()
                        .get("grpc-timeout")
                        .map(|v| v.to_str().unwrap().to_string());
                    let _ = tx.send(timeout);
                    async move {
                        if matches!(silent, Silent::Before) {
                            std::future::pending::<()>().await;
                        }
                        let mut response = http::Response::new(Never);
                        response
                            .headers_mut()
                            .insert("content-type", HeaderValue::from_static("application/grpc"));
                        Ok::<_, Infallible>(response)
                    }
                });
            tokio::spawn(async move {
                let _ =
                    hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .serve_connection(hyper_util::rt::TokioIo::new(socket), service)
                        .await;
            });
        }
    });
    (addr, timeouts)
}

/// A unary gRPC request to `/echo.Echo/Echo`, with `grpc-timeout: timeout` if given.
fn request(timeout: Option<&'static str>) -> http::Request<tonic::body::Body> {
    let body = http_body_util::Full::new(Bytes::from_static(b"\0\0\0\0\0"));
    let mut request = http::Request::new(tonic::body::Body::new(body));
    *request.method_mut() = http::Method::POST;
    *request.uri_mut() = "/echo.Echo/Echo".parse().unwrap();
    let headers = request.headers_mut();
    headers.insert("content-type", HeaderValue::from_static("application/grpc"));
    headers.insert("te", HeaderValue::from_static("trailers"));
    if let Some(timeout) = timeout {
        headers.insert("grpc-timeout", HeaderValue::from_static(timeout));
    }
    request
}

/// The call's gRPC status code, from its headers or its trailers.
async fn code(channel: Channel, request: http::Request<tonic::body::Body>) -> String {
    let response = channel.oneshot(request).await.unwrap();
    let (parts, body) = response.into_parts();
    if let Some(status) = parts.headers.get("grpc-status") {
        return status.to_str().unwrap().to_string();
    }
    let collected = body.collect().await.unwrap();
    let trailers = collected.trailers().expect("trailers");
    trailers["grpc-status"].to_str().unwrap().to_string()
}

fn channel(addr: std::net::SocketAddr, default_timeout: Option<Duration>) -> Channel {
    let options = ChannelOptions::new().client_config(ClientConfig {
        default_timeout,
        ..ClientConfig::default()
    });
    Channel::target_with(&addr.to_string(), &options).unwrap()
}

/// Seconds in a `grpc-timeout` value.
fn seconds(value: &str) -> f64 {
    let (number, unit) = value.split_at(value.len() - 1);
    let number: f64 = number.parse().unwrap();
    number
        * match unit {
            "S" => 1.0,
            "m" => 1e-3,
            "u" => 1e-6,
            "n" => 1e-9,
            other => panic!("unit {other}"),
        }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_server_fails_a_call_at_the_default_timeout() {
    for silent in [Silent::Before, Silent::After] {
        let (addr, timeouts) = server(silent).await;
        let channel = channel(addr, Some(Duration::from_millis(500)));
        let started = Instant::now();
        let outcome =
            tokio::time::timeout(Duration::from_secs(10), code(channel, request(None))).await;
        let took = started.elapsed();
        assert_eq!(outcome.as_deref(), Ok("4"), "{silent:?}: after {took:?}");
        assert!(took >= Duration::from_millis(400), "{silent:?}: {took:?}");
        assert!(took < Duration::from_secs(5), "{silent:?}: {took:?}");
        // The server was told.
        let seen = timeouts.recv().unwrap().expect("a grpc-timeout");
        assert!((0.3..=0.5).contains(&seconds(&seen)), "{silent:?}: {seen}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_calls_own_deadline_beats_the_default_and_none_adds_none() {
    let (addr, timeouts) = server(Silent::After).await;
    let started = Instant::now();
    let own = channel(addr, Some(Duration::from_secs(60)));
    let outcome = tokio::time::timeout(Duration::from_secs(5), code(own, request(Some("300m"))));
    assert_eq!(outcome.await.as_deref(), Ok("4"));
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(timeouts.recv().unwrap().as_deref(), Some("300m"));

    // No default, no deadline: nothing is added (and the call waits on).
    let none = channel(addr, None);
    let waiting = tokio::time::timeout(Duration::from_millis(700), code(none, request(None)));
    assert!(waiting.await.is_err());
    assert_eq!(timeouts.recv().unwrap(), None);
}
