//! The example services, each one implementation served by its example binary in another
//! process with `--transport both`, and called by the same tonic-generated client code over
//! a TCP channel and over a netless `Channel`: both transports must pass the same checks.

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use netless_examples::helloworld::greeter_client::GreeterClient;
use netless_examples::helloworld::HelloRequest;
use netless_examples::routeguide::grid_point;
use netless_examples::routeguide_pb::route_guide_client::RouteGuideClient;
use netless_examples::routeguide_pb::{Point, Rectangle, RouteNote};
use netless_grpc::Channel;
use tokio_stream::StreamExt;
use tonic::Request;

/// The checks every transport must pass.
async fn greeter_suite<T>(mut client: GreeterClient<T>, transport: &str)
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<tonic::codegen::StdError>,
    T::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <T::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    let reply = client
        .say_hello(HelloRequest {
            name: "netless".into(),
        })
        .await
        .unwrap();
    assert_eq!(reply.get_ref().message, "Hello netless!", "{transport}");

    let mut request = Request::new(HelloRequest {
        name: "meta".into(),
    });
    request.metadata_mut().insert("x-id", "42".parse().unwrap());
    let reply = client.say_hello(request).await.unwrap();
    assert_eq!(reply.metadata().get("x-id").unwrap(), "42", "{transport}");

    let err = client
        .say_hello(HelloRequest {
            name: "nobody".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound, "{transport}: {err:?}");
    assert_eq!(err.message(), "no such person: nobody", "{transport}");

    let mut request = Request::new(HelloRequest {
        name: "slow".into(),
    });
    request.set_timeout(Duration::from_millis(200));
    let err = client.say_hello(request).await.unwrap_err();
    // tonic's own TCP channel reports its client-side timer as CANCELLED ("Timeout
    // expired"); a deadline enforced anywhere else is DEADLINE_EXCEEDED.
    assert!(
        matches!(
            err.code(),
            tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
        ),
        "{transport}: {err:?}"
    );

    // Still healthy after an error and a timeout.
    let reply = client
        .say_hello(HelloRequest {
            name: "again".into(),
        })
        .await
        .unwrap();
    assert_eq!(reply.get_ref().message, "Hello again!", "{transport}");
}

/// The RouteGuide checks every transport must pass: all four kinds of call, metadata,
/// trailers, errors before and after messages, deadlines on a stream.
async fn routeguide_suite<T>(mut client: RouteGuideClient<T>, transport: &str)
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<tonic::codegen::StdError>,
    T::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <T::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    // Unary.
    let feature = client
        .get_feature(grid_point(7))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(feature.name, "feature 7", "{transport}");
    let nothing = client
        .get_feature(Point {
            latitude: 1,
            longitude: 1,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(nothing.name, "", "{transport}");

    // Server streaming, with response metadata.
    let rect = Rectangle {
        lo: Some(grid_point(0)),
        hi: Some(grid_point(909)),
    };
    let mut request = Request::new(rect);
    request
        .metadata_mut()
        .insert("x-request-id", "r-1".parse().unwrap());
    let response = client.list_features(request).await.unwrap();
    assert_eq!(
        response.metadata().get("x-request-id").unwrap(),
        "r-1",
        "{transport}"
    );
    let mut stream = response.into_inner();
    let mut names = Vec::new();
    while let Some(feature) = stream.next().await {
        names.push(feature.unwrap().name);
    }
    // Rows 0..=9, columns 0..=9.
    assert_eq!(names.len(), 100, "{transport}");
    assert_eq!(names[0], "feature 0", "{transport}");
    assert_eq!(names[99], "feature 909", "{transport}");

    // A status after some messages arrives in the trailers, with its metadata.
    let mut request = Request::new(rect);
    request
        .metadata_mut()
        .insert("x-limit", "5".parse().unwrap());
    let mut stream = client.list_features(request).await.unwrap().into_inner();
    let mut got = 0;
    let status = loop {
        match stream.next().await {
            Some(Ok(_)) => got += 1,
            Some(Err(status)) => break status,
            None => panic!("{transport}: stream ended without the status"),
        }
    };
    assert_eq!(got, 5, "{transport}");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{transport}");
    assert_eq!(status.message(), "limit of 5 reached", "{transport}");
    assert_eq!(status.metadata().get("x-sent").unwrap(), "5", "{transport}");

    // An error before any message.
    let err = client
        .list_features(Rectangle { lo: None, hi: None })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{transport}");

    // Client streaming, from a stream that is not ready all at once.
    let route = tokio_stream::iter((0..20).map(grid_point)).throttle(Duration::from_millis(2));
    let summary = client.record_route(route).await.unwrap().into_inner();
    assert_eq!(summary.point_count, 20, "{transport}");
    assert_eq!(summary.feature_count, 20, "{transport}");
    assert!(summary.distance > 0, "{transport}");

    // A large client stream (past the flow-control window).
    let many = tokio_stream::iter((0..50_000).map(|i| grid_point(i % 1000)));
    let summary = client.record_route(many).await.unwrap().into_inner();
    assert_eq!(summary.point_count, 50_000, "{transport}");

    // Bidirectional: a reply arrives before the request stream ends.
    // The guide remembers notes across calls: each transport uses its own locations.
    let base = if transport == "tcp" { 7_000 } else { 8_000 };
    let at = |i: i32, message: &str| RouteNote {
        location: Some(Point {
            latitude: base + i,
            longitude: 7_000,
        }),
        message: format!("{transport}-{message}"),
    };
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let mut replies = client
        .route_chat(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    tx.send(at(1, "a")).await.unwrap();
    tx.send(at(2, "b")).await.unwrap();
    tx.send(at(1, "c")).await.unwrap();
    let first = tokio::time::timeout(Duration::from_secs(10), replies.next())
        .await
        .expect("a reply while the request stream is open")
        .unwrap()
        .unwrap();
    assert_eq!(first.message, format!("{transport}-a"));
    tx.send(at(2, "d")).await.unwrap();
    drop(tx);
    let rest: Vec<String> = replies.map(|n| n.unwrap().message).collect().await;
    assert_eq!(rest, vec![format!("{transport}-b")]);

    // A deadline on a call whose request stream never ends. (tonic enforces `grpc-timeout`
    // until the response headers, so the deadline is checked on a client-streaming call.)
    let (tx, rx) = tokio::sync::mpsc::channel::<Point>(1);
    let mut request = Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    request.set_timeout(Duration::from_millis(300));
    let err = client.record_route(request).await.unwrap_err();
    drop(tx);
    assert!(
        matches!(
            err.code(),
            tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
        ),
        "{transport}: {err:?}"
    );
}

/// An example server process serving on both transports.
struct ServerProcess {
    child: Child,
    tcp: String,
    dir: std::path::PathBuf,
    events: mpsc::Receiver<String>,
}

impl ServerProcess {
    fn start(binary: &str, args: &[&str]) -> ServerProcess {
        let dir = std::env::temp_dir().join(format!(
            "netless-examples-{}-{}",
            std::process::id(),
            binary
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let mut child = Command::new(binary)
            .args(["--transport", "both", "--listen", "127.0.0.1:0"])
            .args(args)
            .env("NETLESS_DIR", &dir)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let (mut tcp, mut netless) = (None, false);
        while tcp.is_none() || !netless {
            let mut line = String::new();
            assert!(
                out.read_line(&mut line).unwrap() > 0,
                "{binary} exited before listening"
            );
            match line.trim().strip_prefix("LISTENING ") {
                Some(rest) if rest.starts_with("tcp=") => tcp = Some(rest[4..].to_string()),
                Some(rest) if rest.starts_with("netless=") => netless = true,
                _ => {}
            }
        }
        ServerProcess {
            child,
            tcp: tcp.unwrap(),
            dir,
            events: forward_events(out),
        }
    }

    fn tcp_channel(&self) -> impl std::future::Future<Output = tonic::transport::Channel> {
        let endpoint =
            tonic::transport::Endpoint::from_shared(format!("http://{}", self.tcp)).unwrap();
        async move { endpoint.connect().await.unwrap() }
    }

    fn netless_channel(&self, service: &str) -> Channel {
        let config = netless::ClientConfig {
            dir: Some(self.dir.clone()),
            ..Default::default()
        };
        Channel::connect_with(service, config).unwrap()
    }

    /// The next `EVENT` line the server printed (within `limit`).
    fn event(&self, limit: Duration) -> Option<String> {
        self.events.recv_timeout(limit).ok()
    }
}

fn forward_events(out: BufReader<ChildStdout>) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            if let Some(event) = line.strip_prefix("EVENT ") {
                let _ = tx.send(event.to_string());
            }
        }
    });
    rx
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn greeter_passes_the_same_suite_on_tcp_and_on_netless() {
    let server = ServerProcess::start(env!("CARGO_BIN_EXE_greeter_server"), &[]);
    runtime().block_on(async {
        greeter_suite(GreeterClient::new(server.tcp_channel().await), "tcp").await;
        let channel = server.netless_channel("helloworld.Greeter");
        greeter_suite(GreeterClient::new(channel), "netless").await;
    });
}

#[test]
fn routeguide_passes_the_same_suite_on_tcp_and_on_netless() {
    let server = ServerProcess::start(env!("CARGO_BIN_EXE_routeguide_server"), &[]);
    runtime().block_on(async {
        routeguide_suite(RouteGuideClient::new(server.tcp_channel().await), "tcp").await;
        let channel = server.netless_channel("routeguide.RouteGuide");
        routeguide_suite(RouteGuideClient::new(channel), "netless").await;
    });
}

/// A client that reads one message of a long stream and stops: the server's writer waits
/// (flow control) instead of producing the whole stream, and sees the cancellation when the
/// client drops the stream.
#[test]
fn a_slow_reader_back_pressures_the_writer_and_dropping_cancels_on_both_transports() {
    const FEATURES: usize = 100_000;
    let server = ServerProcess::start(
        env!("CARGO_BIN_EXE_routeguide_server"),
        &["--features", &FEATURES.to_string()],
    );
    let everything = Rectangle {
        lo: Some(grid_point(0)),
        hi: Some(grid_point(FEATURES - 1)),
    };
    for transport in ["tcp", "netless"] {
        runtime().block_on(async {
            let mut stream = if transport == "tcp" {
                let mut client = RouteGuideClient::new(server.tcp_channel().await);
                client.list_features(everything).await.unwrap().into_inner()
            } else {
                let mut client =
                    RouteGuideClient::new(server.netless_channel("routeguide.RouteGuide"));
                client.list_features(everything).await.unwrap().into_inner()
            };
            stream.next().await.unwrap().unwrap();
            // A slow reader.
            tokio::time::sleep(Duration::from_millis(500)).await;
            drop(stream);
        });
        let event = server
            .event(Duration::from_secs(10))
            .unwrap_or_else(|| panic!("{transport}: the server never saw the stream end"));
        let sent: usize = event
            .strip_prefix("list_features: client went away after ")
            .unwrap_or_else(|| panic!("{transport}: expected a cancellation, got `{event}`"))
            .parse()
            .unwrap();
        eprintln!("{transport}: the writer produced {sent} features for a reader of one");
        // ~40 bytes a feature: the writer stopped within a window or so of the reader.
        assert!(
            sent < FEATURES / 4,
            "{transport}: the writer produced {sent} of {FEATURES} features for a reader of one"
        );
    }
}
