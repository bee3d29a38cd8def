//! One `Channel` type, any location: a `GrpcServer` in a process of its own serves a raw
//! echo service on netless and on TCP from one builder, and the same calls reach it through
//! a local target and through a remote one (by the resolver's table), with metadata and
//! deadlines; a remote target that refuses connections fails the call with `UNAVAILABLE`
//! at once, and a stopped server's listener is closed.
//!
//! The service is `echo.Echo`, a raw tower service: its response is the request's body,
//! with the request's `x-id` metadata; with `x-sleep-ms` it answers that much later.

use std::convert::Infallible;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue};
use http_body_util::BodyExt;
use netless_grpc::{Channel, ChannelOptions, Location, Resolver};
use netless_testing::TestDir;
use tower::ServiceExt as _;
use tower_service::Service;

const PATH: &str = "/echo.Echo/Echo";

#[derive(Clone)]
struct Echo;

impl tonic::server::NamedService for Echo {
    const NAME: &'static str = "echo.Echo";
}

type BoxFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;

impl Service<http::Request<tonic::body::Body>> for Echo {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let sleep = parts
                .headers
                .get("x-sleep-ms")
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(0);
            tokio::time::sleep(Duration::from_millis(sleep)).await;
            let bytes = body
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            let mut trailers = HeaderMap::new();
            trailers.insert("grpc-status", HeaderValue::from_static("0"));
            let body = http_body_util::Full::new(bytes).with_trailers(async { Some(Ok(trailers)) });
            let mut response = http::Response::new(tonic::body::Body::new(body));
            let headers = response.headers_mut();
            headers.insert("content-type", HeaderValue::from_static("application/grpc"));
            if let Some(id) = parts.headers.get("x-id") {
                headers.insert("x-id", id.clone());
            }
            Ok(response)
        })
    }
}

/// What a call came back with: headers, the message bytes, the trailers.
struct Answer {
    headers: HeaderMap,
    message: Bytes,
    trailers: HeaderMap,
}

impl Answer {
    /// `grpc-status`, from the trailers or (trailers-only) the headers.
    fn status(&self) -> u16 {
        let value = self
            .trailers
            .get("grpc-status")
            .or_else(|| self.headers.get("grpc-status"))
            .expect("a grpc-status");
        value.to_str().unwrap().parse().unwrap()
    }

    fn message(&self) -> String {
        let value = self
            .trailers
            .get("grpc-message")
            .or_else(|| self.headers.get("grpc-message"));
        value.map_or(String::new(), |v| {
            percent_decode(v.to_str().unwrap_or_default())
        })
    }
}

/// gRPC percent-encodes `grpc-message`.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 3 <= bytes.len() {
            if let Ok(b) = u8::from_str_radix(&text[i + 1..i + 3], 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// One unary call of `echo.Echo/Echo` with `message` (framed as gRPC does) and `headers`.
async fn call(channel: &Channel, message: &[u8], headers: &[(&'static str, &str)]) -> Answer {
    let mut framed = vec![0u8];
    framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
    framed.extend_from_slice(message);
    let body = http_body_util::Full::new(Bytes::from(framed));
    let mut request = http::Request::new(tonic::body::Body::new(body));
    *request.method_mut() = http::Method::POST;
    *request.uri_mut() = PATH.parse().unwrap();
    let h = request.headers_mut();
    h.insert("content-type", HeaderValue::from_static("application/grpc"));
    h.insert("te", HeaderValue::from_static("trailers"));
    for (name, value) in headers {
        h.insert(*name, value.parse().unwrap());
    }
    let Ok(response) = channel.clone().oneshot(request).await;
    let (parts, body) = response.into_parts();
    let collected = body.collect().await.expect("the response body");
    let trailers = collected.trailers().cloned().unwrap_or_default();
    let bytes = collected.to_bytes();
    Answer {
        headers: parts.headers,
        message: bytes.slice(5.min(bytes.len())..),
        trailers,
    }
}

/// Entry point of the server process (run only by it, via `--ignored`).
#[test]
#[ignore = "entry point of the server process the other tests spawn"]
fn server_process_entry() {
    if std::env::var_os("NETLESS_ECHO_SERVER").is_none() {
        return;
    }
    let serving = netless_grpc::GrpcServer::new()
        .add_service(Echo)
        .tcp("127.0.0.1:0".parse().unwrap())
        .serve()
        .unwrap();
    println!("\nLISTENING tcp={}", serving.tcp_addr().unwrap());
    std::io::stdout().flush().unwrap();
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    serving.stop();
}

/// The server process, serving `echo.Echo` on netless (in `dir`) and on TCP; killed on drop.
struct ServerProcess {
    child: Child,
    tcp: String,
}

impl ServerProcess {
    fn start(dir: &Path) -> ServerProcess {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "server_process_entry",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("NETLESS_ECHO_SERVER", "1")
            .env("NETLESS_DIR", dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let started = Instant::now();
        let mut line = String::new();
        let tcp = loop {
            line.clear();
            assert!(out.read_line(&mut line).unwrap() > 0, "the server exited");
            if let Some(addr) = line.trim().strip_prefix("LISTENING tcp=") {
                break addr.to_string();
            }
            assert!(started.elapsed() < Duration::from_secs(20), "no server");
        };
        std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
        ServerProcess { child, tcp }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn local_options(dir: &Path) -> ChannelOptions {
    ChannelOptions::new().client_config(netless::ClientConfig {
        dir: Some(dir.to_path_buf()),
        ..Default::default()
    })
}

#[test]
fn one_channel_type_reaches_a_server_on_both_transports_either_way() {
    let dir = TestDir::new("anyloc");
    let server = ServerProcess::start(&dir.path);
    let remote = format!("http://{}", server.tcp);
    runtime().block_on(async {
        let local = Channel::target_with(
            "echo.Echo",
            &local_options(&dir.path).resolver(Resolver::new()),
        )
        .unwrap();
        let table = Resolver::parse(&format!("echo.* {remote}")).unwrap();
        let by_table =
            Channel::target_with("echo.Echo", &local_options(&dir.path).resolver(table)).unwrap();
        let explicit = Channel::target(&server.tcp).unwrap();
        assert_eq!(
            local.location(),
            &Location::Local {
                service: "echo.Echo".into()
            }
        );
        let remote_location = Location::Remote {
            uris: vec![remote.clone()],
        };
        assert_eq!(by_table.location(), &remote_location);
        assert_eq!(explicit.location(), &remote_location);

        for (channel, how) in [
            (&local, "local"),
            (&by_table, "table"),
            (&explicit, "explicit"),
        ] {
            let answer = call(channel, b"hello", &[("x-id", "42")]).await;
            assert_eq!(answer.status(), 0, "{how}: {}", answer.message());
            assert_eq!(&answer.message[..], b"hello", "{how}");
            assert_eq!(answer.headers.get("x-id").unwrap(), "42", "{how}");

            // A deadline shorter than the service takes.
            let started = Instant::now();
            let answer = call(
                channel,
                b"late",
                &[("x-sleep-ms", "3000"), ("grpc-timeout", "200m")],
            )
            .await;
            // DEADLINE_EXCEEDED, or CANCELLED from tonic's server when its timer wins.
            assert!(
                matches!(answer.status(), 4 | 1),
                "{how}: {} {}",
                answer.status(),
                answer.message()
            );
            assert!(started.elapsed() < Duration::from_secs(2), "{how}");
        }
    });
}

#[test]
fn a_list_target_balances_across_its_servers() {
    let dir = TestDir::new("anylist");
    let server = ServerProcess::start(&dir.path);
    let port = server.tcp.rsplit_once(':').unwrap().1;
    // Two endpoints (by address and by name) of the one server.
    let target = format!("http://{}, localhost:{port}", server.tcp);
    runtime().block_on(async {
        let channel = Channel::target(&target).unwrap();
        assert_eq!(
            channel.location(),
            &Location::Remote {
                uris: vec![
                    format!("http://{}", server.tcp),
                    format!("http://localhost:{port}")
                ]
            }
        );
        for i in 0..20 {
            let answer = call(&channel, format!("m{i}").as_bytes(), &[]).await;
            assert_eq!(answer.status(), 0, "{}", answer.message());
            assert_eq!(answer.message, format!("m{i}").as_bytes());
        }
    });
}

#[test]
fn a_remote_target_that_refuses_connections_is_unavailable_at_once() {
    // A port nobody listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let target = format!("http://127.0.0.1:{port}");
    runtime().block_on(async {
        let channel = Channel::target(&target).unwrap();
        let started = Instant::now();
        let answer = tokio::time::timeout(Duration::from_secs(5), call(&channel, b"x", &[]))
            .await
            .expect("an answer within 5 s");
        assert_eq!(answer.status(), 14, "{}", answer.message());
        let message = answer.message();
        eprintln!("refused: {message}");
        assert!(
            message.starts_with(&format!("`{target}` is unavailable: ")),
            "{message}"
        );
        assert!(message.to_lowercase().contains("refused"), "{message}");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        // Still a channel: the next call fails the same way.
        assert_eq!(call(&channel, b"x", &[]).await.status(), 14);
    });
}

#[test]
fn a_tcp_only_server_stops_listening_when_stopped() {
    // The handle's lifecycle (not a transport) is under test, so the server runs here.
    let serving = netless_grpc::GrpcServer::new()
        .add_service(Echo)
        .tcp("127.0.0.1:0".parse().unwrap())
        .netless(false)
        .serve()
        .unwrap();
    assert!(serving.servers().is_empty());
    let addr = serving.tcp_addr().unwrap();
    assert!(addr.ip().is_loopback() && addr.port() != 0);
    runtime().block_on(async {
        let channel = Channel::target(&addr.to_string()).unwrap();
        assert_eq!(call(&channel, b"up", &[]).await.status(), 0);
    });
    serving.stop();
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "still listening"
    );
    runtime().block_on(async {
        let channel = Channel::target(&addr.to_string()).unwrap();
        assert_eq!(call(&channel, b"down", &[]).await.status(), 14);
    });
}

#[test]
fn a_server_without_netless_needs_a_listener() {
    let err = netless_grpc::GrpcServer::new()
        .add_service(Echo)
        .netless(false)
        .serve()
        .unwrap_err();
    assert_eq!(err.code(), netless::Code::InvalidArgument);
}
