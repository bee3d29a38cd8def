//! What a local caller reaches through the gateway's egress, in one process: a bare hyper
//! HTTP/2 server stands for the remote and tells the test every request it gets (path,
//! authority, headers), and netless clients call the egress service `shop.Orders` in
//! front of it. The caller reaches only the service's own methods, its metadata goes on
//! less the transport's headers, and a caller that goes away mid-call cancels the call at
//! the remote and frees the service's worker. Also: any `GrpcServer` takes only paths to
//! its own service's methods.

use std::convert::Infallible;
use std::sync::mpsc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue};
use http_body_util::BodyExt;
use netless::{CallOptions, Client, ClientConfig, Code};
use netless_grpc::{Gateway, GatewayLimits, GrpcServer};
use netless_testing::TestDir;
use tower_service::Service;

const SERVICE: &str = "shop.Orders";
/// A request the remote got.
#[derive(Debug)]
struct Seen {
    path: String,
    authority: Option<String>,
    headers: HeaderMap,
}

/// The remote: answers every call with `grpc-status: 0`, except `/shop.Orders/Hang`, which
/// it never answers (and says so on `dropped` when the call is dropped, as hyper does when
/// the client resets the stream). Every request goes to `seen` first.
struct Remote {
    addr: std::net::SocketAddr,
    seen: mpsc::Receiver<Seen>,
    dropped: mpsc::Receiver<()>,
}

/// Sends on its channel when dropped.
struct Tell(mpsc::Sender<()>);

impl Drop for Tell {
    fn drop(&mut self) {
        let _ = self.0.send(());
    }
}

impl Remote {
    fn start() -> Remote {
        let (seen_tx, seen) = mpsc::channel();
        let (dropped_tx, dropped) = mpsc::channel();
        let (addr_tx, addr_rx) = mpsc::channel();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                addr_tx.send(listener.local_addr().unwrap()).unwrap();
                loop {
                    let (socket, _) = listener.accept().await.unwrap();
                    let (seen_tx, dropped_tx) = (seen_tx.clone(), dropped_tx.clone());
                    let service = hyper::service::service_fn(
                        move |request: http::Request<hyper::body::Incoming>| {
                            let (seen_tx, dropped_tx) = (seen_tx.clone(), dropped_tx.clone());
                            async move { answer(request, seen_tx, dropped_tx).await }
                        },
                    );
                    tokio::spawn(async move {
                        let _ = hyper::server::conn::http2::Builder::new(
                            hyper_util::rt::TokioExecutor::new(),
                        )
                        .serve_connection(hyper_util::rt::TokioIo::new(socket), service)
                        .await;
                    });
                }
            });
        });
        Remote {
            addr: addr_rx.recv().unwrap(),
            seen,
            dropped,
        }
    }

    /// The next request the remote got, if one comes soon.
    fn next(&self) -> Option<Seen> {
        self.seen.recv_timeout(Duration::from_secs(2)).ok()
    }
}

type Reply = http::Response<http_body_util::combinators::BoxBody<Bytes, Infallible>>;

async fn answer(
    request: http::Request<hyper::body::Incoming>,
    seen: mpsc::Sender<Seen>,
    dropped: mpsc::Sender<()>,
) -> Result<Reply, Infallible> {
    let path = request.uri().path_and_query().unwrap().to_string();
    let _ = seen.send(Seen {
        path: path.clone(),
        authority: request.uri().authority().map(|a| a.to_string()),
        headers: request.headers().clone(),
    });
    if path == "/shop.Orders/Hang" {
        let _tell = Tell(dropped);
        std::future::pending::<()>().await;
    }
    let _ = request.into_body().collect().await;
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    let body = http_body_util::Full::new(Bytes::new())
        .with_trailers(async { Some(Ok::<_, Infallible>(trailers)) })
        .boxed();
    let mut response = http::Response::new(body);
    response
        .headers_mut()
        .insert("content-type", HeaderValue::from_static("application/grpc"));
    Ok(response)
}

/// Serves egress `shop.Orders` to `remote` in `dir`, with `limits`.
fn egress(dir: &TestDir, remote: &Remote, limits: GatewayLimits) -> netless_grpc::GrpcServing {
    Gateway::builder(config(dir))
        .limits(limits)
        .egress(SERVICE, [format!("http://{}", remote.addr)])
        .build()
        .unwrap()
        .serve_egress()
        .unwrap()
}

fn config(dir: &TestDir) -> ClientConfig {
    ClientConfig {
        dir: Some(dir.path.clone()),
        ..ClientConfig::default()
    }
}

/// An empty gRPC message.
const EMPTY: &[u8] = b"\0\0\0\0\0";

fn options() -> CallOptions {
    CallOptions::new().timeout(Duration::from_secs(10))
}

/// The gRPC status (code, message) of a call: a netless reply's `grpc-status` (a trailer
/// key, a header of a trailers-only reply, or nothing for OK), or the netless call's own
/// failure, which a netless-grpc `Channel` passes on as the call's status.
fn status(outcome: &Result<netless::Reply, netless::Status>) -> (u16, String) {
    match outcome {
        Ok(reply) => {
            let text = |key: &str| {
                let value = reply
                    .metadata
                    .get(&format!("trailer/{key}"))
                    .or(reply.metadata.get(key));
                String::from_utf8_lossy(value.unwrap_or_default()).into_owned()
            };
            (
                text("grpc-status").parse().unwrap_or(0),
                text("grpc-message"),
            )
        }
        Err(status) => (status.code() as u16, status.message().to_string()),
    }
}

fn code(outcome: &Result<netless::Reply, netless::Status>) -> u16 {
    status(outcome).0
}

#[test]
fn a_caller_reaches_only_the_egress_services_own_methods() {
    let remote = Remote::start();
    let dir = TestDir::new("egress-paths");
    let _serving = egress(&dir, &remote, GatewayLimits::default());
    let client = Client::connect_with(SERVICE, config(&dir)).unwrap();

    let ok = client.call("/shop.Orders/Get", EMPTY, &options());
    assert_eq!(code(&ok), 0, "{ok:?}");
    let seen = remote.next().expect("the remote got the call");
    assert_eq!(seen.path, "/shop.Orders/Get");
    // The endpoint's authority, whatever the caller asks for.
    assert_eq!(seen.authority.as_deref(), Some(&*remote.addr.to_string()));
    assert_eq!(seen.headers["content-type"], "application/grpc");

    for path in [
        "/admin.Admin/DropAllTables",
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        "/shop.Orders/Get?x=1",
        "/shop.Orders/Get#x",
        "http://evil.example:9/shop.Orders/Get",
        "http://evil.example:9/grpc.reflection.v1.ServerReflection/Info",
        "/shop.Orders/",
        "/shop.Orders/Get/More",
        "/shop.Orders/../admin.Admin/DropAllTables",
        "/shop.Orders/Get%2F..%2Fadmin",
        "/shop.Orders/a.b",
        "shop.Orders/Get",
    ] {
        let outcome = client.call(path, EMPTY, &options());
        let (code, message) = status(&outcome);
        assert_eq!(code, Code::Unimplemented as u16, "{path}: {outcome:?}");
        assert!(message.contains("unknown method"), "{path}: {message}");
        assert!(!message.contains("127.0.0.1"), "{path}: {message}");
        if let Ok(seen) = remote.seen.try_recv() {
            panic!("{path} reached the remote as {seen:?}");
        }
    }
    assert!(remote
        .seen
        .recv_timeout(Duration::from_millis(200))
        .is_err());
}

#[test]
fn caller_metadata_goes_on_but_not_the_transports_headers() {
    let remote = Remote::start();
    let dir = TestDir::new("egress-headers");
    let _serving = egress(&dir, &remote, GatewayLimits::default());
    let client = Client::connect_with(SERVICE, config(&dir)).unwrap();
    let mut options = options();
    for (key, value) in [
        ("host", "evil.example"),
        ("content-length", "999"),
        ("connection", "close"),
        ("keep-alive", "timeout=5"),
        ("proxy-connection", "keep-alive"),
        ("transfer-encoding", "chunked"),
        ("upgrade", "h2c"),
        ("te", "gzip"),
        ("authorization", "Bearer caller-chosen"),
        ("x-forwarded-for", "10.9.9.9"),
        ("x-id", "7"),
    ] {
        options = options.metadata(key, value.as_bytes());
    }
    let outcome = client.call("/shop.Orders/Get", EMPTY, &options);
    assert_eq!(code(&outcome), 0, "{outcome:?}");
    let seen = remote.next().expect("the remote got the call");
    let headers = &seen.headers;
    // hyper gives the body's own length, if it knows it.
    let length = headers.get("content-length");
    assert!(length.is_none_or(|v| v == "5"), "{length:?}");
    for gone in [
        "host",
        "connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "upgrade",
    ] {
        assert!(headers.get(gone).is_none(), "{gone} went on: {headers:?}");
    }
    assert_eq!(seen.authority.as_deref(), Some(&*remote.addr.to_string()));
    assert_eq!(headers["te"], "trailers");
    assert_eq!(headers["content-type"], "application/grpc");
    assert_eq!(headers["authorization"], "Bearer caller-chosen");
    assert_eq!(headers["x-forwarded-for"], "10.9.9.9");
    assert_eq!(headers["x-id"], "7");
}

#[test]
fn a_caller_that_goes_away_cancels_its_unary_call_and_frees_the_worker() {
    let remote = Remote::start();
    let dir = TestDir::new("egress-gone");
    // One worker: a call stuck on the remote holds the whole service.
    let limits = GatewayLimits {
        egress_concurrency: 1,
        default_timeout: Some(Duration::from_secs(60)),
        ..GatewayLimits::default()
    };
    let _serving = egress(&dir, &remote, limits);

    // A caller with no deadline waits for a remote that never answers, then goes away
    // (its runtime, its call and its client dropped: its connection closes).
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let gone = Client::connect_with(SERVICE, config(&dir)).unwrap();
    runtime.spawn(async move {
        let _ = gone
            .call_async("/shop.Orders/Hang", EMPTY, &CallOptions::new())
            .await;
    });
    let seen = remote.next().expect("the remote got the call");
    assert_eq!(seen.path, "/shop.Orders/Hang");
    let left = Instant::now();
    runtime.shutdown_background();

    // The remote sees its stream reset, soon.
    remote
        .dropped
        .recv_timeout(Duration::from_secs(5))
        .expect("the remote's call goes on after its caller went away");
    // And the service's one worker takes the next caller's call.
    let next = Client::connect_with(SERVICE, config(&dir)).unwrap();
    let outcome = next.call("/shop.Orders/Get", EMPTY, &options());
    assert_eq!(code(&outcome), 0, "{outcome:?}");
    assert!(
        left.elapsed() < Duration::from_secs(8),
        "{:?}",
        left.elapsed()
    );
}

/// A tonic-like service named `echo.Echo` that answers every call, telling the test its
/// path.
#[derive(Clone)]
struct Recorder(mpsc::Sender<String>);

impl tonic::server::NamedService for Recorder {
    const NAME: &'static str = "echo.Echo";
}

impl Service<http::Request<tonic::body::Body>> for Recorder {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let _ = self.0.send(request.uri().to_string());
        let mut response = http::Response::new(tonic::body::Body::empty());
        response
            .headers_mut()
            .insert("grpc-status", HeaderValue::from_static("0"));
        std::future::ready(Ok(response))
    }
}

#[test]
fn a_grpc_server_takes_only_paths_to_its_own_methods() {
    let dir = TestDir::new("grpc-paths");
    let (tx, paths) = mpsc::channel();
    let _serving = GrpcServer::new()
        .config(netless::ServerConfig {
            dir: Some(dir.path.clone()),
            ..Default::default()
        })
        .add_service(Recorder(tx))
        .serve()
        .unwrap();
    let client = Client::connect_with("echo.Echo", config(&dir)).unwrap();
    let outcome = client.call("/echo.Echo/Echo", EMPTY, &options());
    assert_eq!(code(&outcome), 0, "{outcome:?}");
    assert_eq!(paths.try_recv().unwrap(), "/echo.Echo/Echo");
    for path in [
        "/other.Service/Echo",
        "/echo.Echo/Echo?x=1",
        "/echo.Echo/Echo/x",
        "http://h:1/echo.Echo/Echo",
        "/echo.Echo/",
        "Echo",
    ] {
        let outcome = client.call(path, EMPTY, &options());
        let (code, message) = status(&outcome);
        assert_eq!(code, Code::Unimplemented as u16, "{path}: {outcome:?}");
        assert!(message.contains("unknown method"), "{path}: {message}");
        assert!(paths.try_recv().is_err(), "{path} reached the service");
    }
}
