//! A client that stops reading its response ring, against a `GrpcServer` in a process of its
//! own: the stream replies the server's tokio tasks send it must not hold those tasks' threads
//! (a full ring keeps them in the connection's backlog), so other clients' streams go on.
//!
//! The service is `flood.Flood`, written here as a raw tower service: its response streams
//! `x-chunks` data frames of `x-size` bytes, one every `x-interval-ms` (without them: 32 KiB
//! every 50 ms, forever), then the OK trailers. The first frame comes a period after the
//! call, so every byte travels in the replies to `recv` that the server's tasks send.

use std::convert::Infallible;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::pin::Pin;
use std::process::{Child, Command, Stdio};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue};
use http_body::Frame;
use http_body_util::BodyExt;
use netless::{ClientConfig, Pipeline};
use netless_testing::TestDir;
use tower_service::Service;

const SERVICE: &str = "flood.Flood";
const PATH: &str = "/flood.Flood/Flood";

#[derive(Clone)]
struct Flood;

impl tonic::server::NamedService for Flood {
    const NAME: &'static str = SERVICE;
}

fn header(headers: &HeaderMap, name: &str, default: u64) -> u64 {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(default)
}

impl Service<http::Request<tonic::body::Body>> for Flood {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let h = request.headers();
        // The first frame a period from now: every byte goes out in the replies to `recv`.
        let period = Duration::from_millis(header(h, "x-interval-ms", 50));
        let body = Chunks {
            left: header(h, "x-chunks", u64::MAX),
            size: header(h, "x-size", 32 * 1024) as usize,
            tick: tokio::time::interval_at(tokio::time::Instant::now() + period, period),
            ended: false,
        };
        let mut response = http::Response::new(tonic::body::Body::new(body));
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        std::future::ready(Ok(response))
    }
}

/// The response body: `left` frames of `size` bytes, one per tick, then the trailers.
struct Chunks {
    left: u64,
    size: usize,
    tick: tokio::time::Interval,
    ended: bool,
}

impl http_body::Body for Chunks {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        if self.left == 0 {
            if self.ended {
                return Poll::Ready(None);
            }
            self.ended = true;
            let mut trailers = HeaderMap::new();
            trailers.insert("grpc-status", HeaderValue::from_static("0"));
            return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
        }
        if self.tick.poll_tick(cx).is_pending() {
            return Poll::Pending;
        }
        self.left -= 1;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(vec![7u8; self.size])))))
    }
}

/// Entry point of the server process (run only by it, via `--ignored`).
#[test]
#[ignore = "entry point of the server process the other test spawns"]
fn server_process_entry() {
    if std::env::var_os("NETLESS_FLOOD_SERVER").is_none() {
        return;
    }
    let serving = netless_grpc::GrpcServer::new()
        .add_service(Flood)
        .runtime_threads(2)
        .serve()
        .unwrap();
    println!("\nSERVER READY");
    std::io::stdout().flush().unwrap();
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    drop(serving);
}

/// The server process; killed on drop.
struct ServerProcess(Child);

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
            .env("NETLESS_FLOOD_SERVER", "1")
            .env("NETLESS_DIR", dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let started = Instant::now();
        let mut line = String::new();
        while !line.contains("SERVER READY") {
            line.clear();
            assert!(out.read_line(&mut line).unwrap() > 0, "the server exited");
            assert!(started.elapsed() < Duration::from_secs(20), "no server");
        }
        std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
        ServerProcess(child)
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A stream call's payload: the stream's id (the wire format of `netless.stream/*`).
fn stream_id(id: u64) -> [u8; 8] {
    id.to_le_bytes()
}

#[test]
fn a_client_that_stops_reading_holds_no_runtime_thread() {
    let dir = TestDir::new("stuck");
    let _server = ServerProcess::start(&dir.path);
    let config = ClientConfig {
        dir: Some(dir.path.clone()),
        ring_bytes: 64 * 1024,
        ..Default::default()
    };

    // Four endless streams (the server's first, so ids 1 to 4), then a `recv` on each every
    // 20 ms for a second, whose replies the server's tasks send as the flood comes in. Not
    // one reply is read: the 64 KiB ring is full at once.
    let mut stuck = Pipeline::connect(SERVICE, config.clone()).unwrap();
    for _ in 0..4 {
        stuck.submit(PATH, b"").unwrap();
    }
    stuck.flush();
    let flooding = std::thread::spawn(move || {
        for _ in 0..50 {
            for id in 1..=4 {
                let _ = stuck.submit("netless.stream/recv", &stream_id(id));
            }
            stuck.flush();
            std::thread::sleep(Duration::from_millis(20));
        }
        stuck
    });

    // Meanwhile, another client's streams (each carried by the server's tasks) are served.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let honest = netless_grpc::Channel::connect_with(SERVICE, config).unwrap();
    runtime.block_on(async {
        let started = Instant::now();
        let mut calls = 0;
        while started.elapsed() < Duration::from_secs(3) || calls < 10 {
            let call = Instant::now();
            let mut request = http::Request::new(tonic::body::Body::empty());
            *request.uri_mut() = PATH.parse().unwrap();
            for (k, v) in [("x-chunks", "3"), ("x-size", "100"), ("x-interval-ms", "1")] {
                request.headers_mut().insert(k, HeaderValue::from_static(v));
            }
            let mut channel = honest.clone();
            let Ok(response) = channel.call(request).await;
            let body =
                tokio::time::timeout(Duration::from_secs(10), response.into_body().collect())
                    .await
                    .expect("an honest stream stalled for 10 s")
                    .unwrap();
            let trailers = body.trailers().cloned().unwrap_or_default();
            assert_eq!(trailers.get("grpc-status").unwrap(), "0", "{trailers:?}");
            assert_eq!(body.to_bytes().len(), 300);
            assert!(
                call.elapsed() < Duration::from_millis(1500),
                "an honest stream took {:?}",
                call.elapsed()
            );
            calls += 1;
        }
    });

    // The stuck client's connection is closed for it, and it hears why. (Only the replies
    // to its `recv`s can have filled its ring: the streams' ids were right.)
    let mut stuck = flooding.join().unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    while !stuck.is_closed() {
        assert!(
            Instant::now() < deadline,
            "the stuck connection stayed open"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = stuck.poll(|_, _| {});
    let status = stuck
        .poll(|_, _| {})
        .expect_err("a closed pipeline says so");
    assert!(
        status
            .message()
            .contains("stopped draining its response ring"),
        "{status}"
    );
}
