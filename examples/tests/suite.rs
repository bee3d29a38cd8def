//! The example services, each one implementation served by its example binary in another
//! process with `--transport both`, and called by the same tonic-generated client code over
//! a TCP channel and over a netless `Channel`: both transports must pass the same checks.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{runtime, ServerProcess};
use netless_examples::checks;
use netless_examples::helloworld::greeter_client::GreeterClient;
use netless_examples::routeguide::grid_point;
use netless_examples::routeguide_pb::route_guide_client::RouteGuideClient;
use netless_examples::routeguide_pb::Rectangle;
use netless_grpc::Channel;
use tokio_stream::StreamExt;

#[test]
fn greeter_passes_the_same_suite_on_tcp_and_on_netless() {
    let server = ServerProcess::start(env!("CARGO_BIN_EXE_greeter_server"), &["--domain", "ex"]);
    runtime().block_on(async {
        checks::greeter(GreeterClient::new(server.tcp_channel().await), "tcp").await;
        let channel = server.netless_channel("helloworld.Greeter");
        checks::greeter(GreeterClient::new(channel), "netless").await;
        // The same suite with large messages passed by reference through the page pool.
        let (channel, domain) = server.by_ref_channel("helloworld.Greeter");
        checks::greeter(GreeterClient::new(channel), "netless-by-ref").await;
        assert!(
            domain.stats().bytes_copied >= 3 << 20,
            "the suite's 3 MiB message went through the pool: {:?}",
            domain.stats()
        );
    });
}

#[test]
fn routeguide_passes_the_same_suite_on_tcp_and_on_netless() {
    let server = ServerProcess::start(env!("CARGO_BIN_EXE_routeguide_server"), &["--domain", "ex"]);
    runtime().block_on(async {
        checks::routeguide(RouteGuideClient::new(server.tcp_channel().await), "tcp").await;
        let channel = server.netless_channel("routeguide.RouteGuide");
        checks::routeguide(RouteGuideClient::new(channel), "netless").await;
        let (channel, _domain) = server.by_ref_channel("routeguide.RouteGuide");
        checks::routeguide(RouteGuideClient::new(channel), "netless-by-ref").await;
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
        // ~40 bytes a feature. netless: a 256 KiB window at each end, ~13 000 features.
        // HTTP/2: hyper's windows grow with the bandwidth-delay product, to a few MiB.
        let bound = if transport == "tcp" {
            FEATURES * 3 / 4
        } else {
            20_000
        };
        assert!(
            sent < bound,
            "{transport}: the writer produced {sent} of {FEATURES} features for a reader of one"
        );
    }
}

/// Entry point of the reader process the next test kills (run only by it, via `--ignored`):
/// opens a long stream over netless, reads one message, says so, and waits to be killed.
#[test]
#[ignore = "entry point of the reader process another test spawns"]
fn stalled_reader_process_entry() {
    let Some(dir) = std::env::var_os("NETLESS_STALLED_READER_DIR") else {
        return;
    };
    runtime().block_on(async {
        let config = netless::ClientConfig {
            dir: Some(dir.into()),
            ..Default::default()
        };
        let channel = Channel::connect_with("routeguide.RouteGuide", config).unwrap();
        let mut stream = RouteGuideClient::new(channel)
            .list_features(Rectangle {
                lo: Some(grid_point(0)),
                hi: Some(grid_point(99_999)),
            })
            .await
            .unwrap()
            .into_inner();
        stream.next().await.unwrap().unwrap();
        println!("\nREADING");
        std::future::pending::<()>().await;
    });
}

/// A client process killed mid-stream: the server sees its stream cancelled (its writer's
/// channel closes) instead of waiting forever for a reader that is gone.
#[test]
fn a_killed_client_process_cancels_its_stream_on_the_server() {
    let server = ServerProcess::start(
        env!("CARGO_BIN_EXE_routeguide_server"),
        &["--features", "100000"],
    );
    let mut reader = common::this_test_running("stalled_reader_process_entry")
        .env("NETLESS_STALLED_READER_DIR", &server.dir)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(reader.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("READING") {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "the reader exited before reading"
        );
    }
    reader.kill().unwrap();
    reader.wait().unwrap();
    let event = server
        .event(Duration::from_secs(10))
        .expect("the server never saw the killed client's stream end");
    assert!(
        event.starts_with("list_features: client went away after "),
        "{event}"
    );
}

/// A server holds a bounded number of streams: one more fails at once with
/// `RESOURCE_EXHAUSTED`, and finishing a stream makes room again.
#[test]
fn streams_beyond_the_server_limit_are_refused_with_resource_exhausted() {
    use netless_examples::routeguide::RouteGuideService;
    use netless_examples::routeguide_pb::route_guide_server::RouteGuideServer;
    use netless_examples::routeguide_pb::Point;

    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "nl-ex-lim-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let serving = netless_grpc::GrpcServer::new()
        .config(netless::ServerConfig {
            dir: Some(dir.clone()),
            ..Default::default()
        })
        .max_streams(2)
        .add_service(RouteGuideServer::new(RouteGuideService::new(
            10,
            std::sync::Arc::new(|_| {}),
        )))
        .serve()
        .unwrap();
    runtime().block_on(async {
        let config = netless::ClientConfig {
            dir: Some(dir.clone()),
            ..Default::default()
        };
        let client =
            RouteGuideClient::new(Channel::connect_with("routeguide.RouteGuide", config).unwrap());
        // Two client streams that stay open.
        let mut open = Vec::new();
        for _ in 0..2 {
            let (tx, rx) = tokio::sync::mpsc::channel::<Point>(1);
            let mut client = client.clone();
            let call = tokio::spawn(async move {
                client
                    .record_route(tokio_stream::wrappers::ReceiverStream::new(rx))
                    .await
            });
            open.push((tx, call));
        }
        // Let both reach the server.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (_tx, rx) = tokio::sync::mpsc::channel::<Point>(1);
        let err = client
            .clone()
            .record_route(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err:?}");
        assert!(err.message().contains("streams open"), "{err:?}");
        // Finishing one makes room.
        let (tx, call) = open.pop().unwrap();
        drop(tx);
        assert_eq!(call.await.unwrap().unwrap().into_inner().point_count, 0);
        let (tx, rx) = tokio::sync::mpsc::channel::<Point>(1);
        let mut again = client.clone();
        let call = tokio::spawn(async move {
            again
                .record_route(tokio_stream::wrappers::ReceiverStream::new(rx))
                .await
        });
        drop(tx);
        assert_eq!(call.await.unwrap().unwrap().into_inner().point_count, 0);
        drop(open);
    });
    drop(serving);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs an example of the raw netless API to its end; its output.
fn run_example(binary: &str, args: &[&str]) -> String {
    common::run_to_end(Command::new(binary).args(args), Duration::from_secs(120)).out
}

#[test]
fn the_pipeline_example_checks_every_reply() {
    let out = run_example(env!("CARGO_BIN_EXE_pipeline"), &["--calls", "20000"]);
    assert!(out.contains("20000 calls, 64 in flight"), "{out}");
}

#[test]
fn the_forwarder_example_answers_through_its_backend() {
    let out = run_example(env!("CARGO_BIN_EXE_forwarder"), &[]);
    assert!(out.contains("forwarded -> FORWARDED"), "{out}");
}

#[test]
fn the_by_reference_example_sums_what_it_shared() {
    let out = run_example(env!("CARGO_BIN_EXE_by_reference"), &[]);
    assert!(out.contains("the view from before: 1048576"), "{out}");
}
