//! The gateway's egress, with real processes: remote servers (tonic over TCP, this test
//! binary run as its `remote_process_entry`), `netless gateway --egress` in front of them,
//! and a business-logic process (this binary as its `client_process_entry`) that calls the
//! remote services by name over a plain netless `Channel`, driven line by line from its
//! stdin, and that must hold no socket but Unix ones while it does.
//!
//! Bounds are generous (seconds where the gateway takes milliseconds): a test fails when a
//! call fails or hangs, never on speed.

mod common;

use std::future::Future;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::process::{ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use netless_examples::greeter::MyGreeter;
use netless_examples::helloworld::greeter_client::GreeterClient;
use netless_examples::helloworld::greeter_server::GreeterServer;
use netless_examples::helloworld::HelloRequest;
use netless_examples::routeguide::RouteGuideService;
use netless_examples::routeguide_pb::route_guide_client::RouteGuideClient;
use netless_examples::routeguide_pb::route_guide_server::RouteGuideServer;
use netless_examples::routeguide_pb::{Point, RouteNote};
use netless_testing::sockets::{assert_only_unix_sockets, non_unix_sockets, SocketKind};
use tonic::body::Body;
use tonic::codegen::http;
use tonic::server::NamedService;

use common::interop::{read_marker, Running};
use common::{TestDir, BIN, SHORT};

const GREETER: &str = "helloworld.Greeter";
const GUIDE: &str = "routeguide.RouteGuide";
/// How long a client command may take.
const COMMAND: Duration = Duration::from_secs(60);
/// Features of the remote's RouteGuide: rows of 100 (`grid_point`).
const FEATURES: usize = 400_000;

/// Entry point of the remote server processes (run only by them, via `--ignored`).
#[test]
#[ignore = "entry point of the remote server processes the other tests spawn"]
fn remote_process_entry() {
    remote_main();
}

/// Entry point of the business-logic process (run only by it, via `--ignored`).
#[test]
#[ignore = "entry point of the client process the other tests spawn"]
fn client_process_entry() {
    client_main();
}

// ---------------------------------------------------------------------------------------
// The remote server process.

/// Serves the example services over TCP (TLS if a certificate is given) at
/// `NETLESS_EGRESS_LISTEN` (else 127.0.0.1:0), each response tagged `x-remote:
/// $NETLESS_EGRESS_REMOTE` and, if the call came with one, `x-seen-grpc-timeout`; a call
/// with `x-hang` metadata is never answered (`EVENT hang: started`, and `EVENT hang:
/// dropped` once the call is cancelled); prints `REMOTE LISTENING ADDR` and serves until
/// stdin closes.
fn remote_main() {
    let Ok(tag) = std::env::var("NETLESS_EGRESS_REMOTE") else {
        return;
    };
    let listen: SocketAddr = std::env::var("NETLESS_EGRESS_LISTEN")
        .unwrap_or_else(|_| "127.0.0.1:0".into())
        .parse()
        .unwrap();
    std::thread::spawn(|| {
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
        std::process::exit(0);
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        // Coming back at the address of a remote that died: the port may take a moment.
        let started = Instant::now();
        let listener = loop {
            match tokio::net::TcpListener::bind(listen).await {
                Ok(listener) => break listener,
                Err(e) if started.elapsed() < Duration::from_secs(10) => {
                    eprintln!("remote: binding {listen}: {e}; again");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("binding {listen}: {e}"),
            }
        };
        let mut server = tonic::transport::Server::builder();
        if let Ok(cert) = std::env::var("NETLESS_EGRESS_TLS_CERT") {
            let key = std::env::var("NETLESS_EGRESS_TLS_KEY").unwrap();
            let identity = tonic::transport::Identity::from_pem(
                std::fs::read(cert).unwrap(),
                std::fs::read(key).unwrap(),
            );
            server = server
                .tls_config(tonic::transport::ServerTlsConfig::new().identity(identity))
                .unwrap();
        }
        println!("\nREMOTE LISTENING {}", listener.local_addr().unwrap());
        std::io::stdout().flush().unwrap();
        let observer = std::sync::Arc::new(|event: String| {
            println!("EVENT {event}");
            let _ = std::io::stdout().flush();
        });
        // More features than the buffers on the way hold, so that a stream dropped early
        // is noticed by the remote before it has sent them all.
        let guide = RouteGuideServer::new(RouteGuideService::new(FEATURES, observer));
        server
            .add_service(Tagged::new(GreeterServer::new(MyGreeter), &tag))
            .add_service(Tagged::new(guide, &tag))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
            .await
            .unwrap();
    });
}

/// Prints `EVENT hang: dropped` when dropped.
struct Hanging;

impl Drop for Hanging {
    fn drop(&mut self) {
        println!("EVENT hang: dropped");
        let _ = std::io::stdout().flush();
    }
}

/// A service whose responses say which remote answered, and the deadline it was given;
/// a call with `x-hang` it never answers.
#[derive(Clone)]
struct Tagged<S> {
    inner: S,
    tag: http::HeaderValue,
}

impl<S> Tagged<S> {
    fn new(inner: S, tag: &str) -> Tagged<S> {
        Tagged {
            inner,
            tag: tag.parse().unwrap(),
        }
    }
}

impl<S: NamedService> NamedService for Tagged<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> tower_service::Service<http::Request<Body>> for Tagged<S>
where
    S: tower_service::Service<
        http::Request<Body>,
        Response = http::Response<Body>,
        Error = std::convert::Infallible,
    >,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = std::convert::Infallible;
    type Future = Pin<
        Box<dyn Future<Output = Result<http::Response<Body>, std::convert::Infallible>> + Send>,
    >;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        if request.headers().contains_key("x-hang") {
            println!("EVENT hang: started");
            let _ = std::io::stdout().flush();
            return Box::pin(async {
                let _hanging = Hanging;
                std::future::pending().await
            });
        }
        let seen = request.headers().get("grpc-timeout").cloned();
        let tag = self.tag.clone();
        let response = self.inner.call(request);
        Box::pin(async move {
            let mut response = response.await?;
            response.headers_mut().insert("x-remote", tag);
            if let Some(seen) = seen {
                response.headers_mut().insert("x-seen-grpc-timeout", seen);
            }
            Ok(response)
        })
    }
}

// ---------------------------------------------------------------------------------------
// The business-logic process.

/// Requests of a client stream, from a channel.
struct Notes(tokio::sync::mpsc::Receiver<RouteNote>);

impl tonic::codegen::tokio_stream::Stream for Notes {
    type Item = RouteNote;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<RouteNote>> {
        self.0.poll_recv(cx)
    }
}

/// Calls the remote services by name over netless, one command per stdin line:
/// - `checks`: every kind of call, metadata, trailers, errors, deadlines (`OK checks`);
/// - `timeouts`: the deadlines the remote is given (`OK timeouts`);
/// - `hold`, `release`: opens a bidirectional stream and keeps it open (`HOLDING`) until
///   `release` (`OK released`);
/// - `cancel`: reads a few features of a long stream and drops it (`OK cancelled`);
/// - `hello N`: N calls, each printed as `HELLO CODE REMOTE MILLISECONDS MESSAGE`, then
///   `DONE`;
/// - `cross`: calls RouteGuide's `GetFeature` through the Greeter's service (`CROSS CODE`);
/// - `hang`: starts a SayHello with `x-hang` and no deadline, and leaves it running
///   (`HANGING`).
fn client_main() {
    if std::env::var_os("NETLESS_EGRESS_CLIENT").is_none() {
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let greeter = GreeterClient::new(netless_grpc::Channel::connect(GREETER).unwrap());
    // Connected when first used: not every gateway serves it.
    let mut guide_channel = None;
    let mut guide = move || {
        let channel =
            guide_channel.get_or_insert_with(|| netless_grpc::Channel::connect(GUIDE).unwrap());
        RouteGuideClient::new(channel.clone())
    };
    let mut held = None;
    let mut holds = 0;
    // On a line of its own: the test harness's `test ... ` has none.
    println!("\nCLIENT READY");
    std::io::stdout().flush().unwrap();
    for line in std::io::stdin().lines() {
        let line = line.unwrap();
        let mut words = line.split_whitespace();
        match words.next() {
            Some("checks") => {
                runtime.block_on(netless_examples::checks::greeter(greeter.clone(), "egress"));
                runtime.block_on(netless_examples::checks::routeguide(guide(), "egress"));
                println!("OK checks");
            }
            Some("timeouts") => {
                runtime.block_on(timeouts(greeter.clone()));
                println!("OK timeouts");
            }
            Some("hold") => {
                holds += 1;
                held = Some(runtime.block_on(hold(guide(), holds)));
                println!("HOLDING");
            }
            Some("release") => {
                let (tx, mut replies) = held.take().expect("release without hold");
                drop(tx);
                let rest = runtime.block_on(async {
                    tokio::time::timeout(Duration::from_secs(20), replies.message()).await
                });
                assert!(matches!(rest, Ok(Ok(None))), "{rest:?}");
                println!("OK released");
            }
            Some("cancel") => {
                runtime.block_on(cancel(guide()));
                println!("OK cancelled");
            }
            Some("cross") => {
                let code = runtime.block_on(cross());
                println!("CROSS {code:?}");
            }
            Some("hang") => {
                let mut greeter = greeter.clone();
                runtime.spawn(async move {
                    let mut request = tonic::Request::new(HelloRequest {
                        name: "hang".into(),
                    });
                    request
                        .metadata_mut()
                        .insert("x-hang", "1".parse().unwrap());
                    let _ = greeter.say_hello(request).await;
                });
                println!("HANGING");
            }
            Some("hello") => {
                let n: usize = words.next().unwrap().parse().unwrap();
                for _ in 0..n {
                    println!("{}", runtime.block_on(hello(greeter.clone())));
                }
                println!("DONE");
            }
            other => panic!("unknown command {other:?}"),
        }
        std::io::stdout().flush().unwrap();
    }
}

type Channel = netless_grpc::Channel;

/// One SayHello, as a `HELLO` line.
async fn hello(mut greeter: GreeterClient<Channel>) -> String {
    let started = Instant::now();
    let mut request = tonic::Request::new(HelloRequest {
        name: "egress".into(),
    });
    request.set_timeout(Duration::from_secs(20));
    let outcome = greeter.say_hello(request).await;
    let ms = started.elapsed().as_millis();
    match outcome {
        Ok(reply) => {
            let remote = reply.metadata().get("x-remote").unwrap().to_str().unwrap();
            let remote = remote.to_string();
            format!("HELLO Ok {remote} {ms} {}", reply.into_inner().message)
        }
        Err(status) => format!("HELLO {:?} - {ms} {}", status.code(), status.message()),
    }
}

/// The code of a `GetFeature` call sent to the Greeter's netless service.
async fn cross() -> tonic::Code {
    let channel = netless_grpc::Channel::connect(GREETER).unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let outcome = grpc
        .unary(
            tonic::Request::new(netless_examples::routeguide::grid_point(7)),
            "/routeguide.RouteGuide/GetFeature".parse().unwrap(),
            tonic_prost::ProstCodec::<Point, netless_examples::routeguide_pb::Feature>::default(),
        )
        .await;
    match outcome {
        Ok(_) => tonic::Code::Ok,
        Err(status) => status.code(),
    }
}

/// The deadline the remote sees, in seconds, for a call that asks for `timeout`.
async fn seen_timeout(greeter: &mut GreeterClient<Channel>, timeout: Option<Duration>) -> f64 {
    let mut request = tonic::Request::new(HelloRequest {
        name: "deadline".into(),
    });
    if let Some(timeout) = timeout {
        request.set_timeout(timeout);
    }
    let reply = greeter.say_hello(request).await.unwrap();
    let seen = reply.metadata().get("x-seen-grpc-timeout").unwrap();
    let seen = seen.to_str().unwrap();
    let (number, unit) = seen.split_at(seen.len() - 1);
    let number: f64 = number.parse().unwrap();
    number
        * match unit {
            "H" => 3600.0,
            "M" => 60.0,
            "S" => 1.0,
            "m" => 1e-3,
            "u" => 1e-6,
            "n" => 1e-9,
            _ => panic!("grpc-timeout `{seen}`"),
        }
}

/// The gateway runs with `--default-timeout 30s --max-timeout 120s`.
async fn timeouts(mut greeter: GreeterClient<Channel>) {
    let own = seen_timeout(&mut greeter, Some(Duration::from_secs(5))).await;
    assert!(
        (3.0..=5.0).contains(&own),
        "a 5 s deadline reached the remote as {own} s"
    );
    let default = seen_timeout(&mut greeter, None).await;
    assert!(
        (25.0..=30.0).contains(&default),
        "no deadline: {default} s at the remote"
    );
    let capped = seen_timeout(&mut greeter, Some(Duration::from_secs(3600))).await;
    assert!(
        (115.0..=120.0).contains(&capped),
        "a 1 h deadline: {capped} s"
    );
}

/// Reads 3 features of a stream of all of them, then drops it.
async fn cancel(mut guide: RouteGuideClient<Channel>) {
    let everywhere = netless_examples::routeguide_pb::Rectangle {
        lo: Some(netless_examples::routeguide::grid_point(0)),
        hi: Some(netless_examples::routeguide::grid_point(FEATURES - 1)),
    };
    let mut stream = guide.list_features(everywhere).await.unwrap().into_inner();
    for _ in 0..3 {
        stream.message().await.unwrap().unwrap();
    }
}

/// A bidirectional stream, open and answered once (so the remote has it).
async fn hold(
    mut guide: RouteGuideClient<Channel>,
    n: i32,
) -> (
    tokio::sync::mpsc::Sender<RouteNote>,
    tonic::Streaming<RouteNote>,
) {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let mut replies = guide.route_chat(Notes(rx)).await.unwrap().into_inner();
    let note = |message: &str| RouteNote {
        location: Some(Point {
            latitude: 5_000 + n,
            longitude: 5_000,
        }),
        message: message.into(),
    };
    tx.send(note("first")).await.unwrap();
    tx.send(note("second")).await.unwrap();
    let reply = tokio::time::timeout(Duration::from_secs(20), replies.message())
        .await
        .expect("a reply while the stream is open")
        .unwrap()
        .unwrap();
    assert_eq!(reply.message, "first");
    (tx, replies)
}

// ---------------------------------------------------------------------------------------
// The tests' side.

/// A process of this test binary, run as its entry test `entry` with `env`, whose stdout
/// lines arrive on a channel; killed when dropped.
struct Child {
    running: Running,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
}

impl Child {
    fn start(entry: &str, env: &[(&str, &std::ffi::OsStr)]) -> Child {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                entry,
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Child {
            running: Running(child),
            stdin,
            lines,
        }
    }

    fn pid(&self) -> u32 {
        self.running.0.id()
    }

    fn send(&mut self, command: &str) {
        writeln!(self.stdin, "{command}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// The next line that starts with `prefix`; panics if none comes within `limit` or the
    /// process ended (its panic is on stderr).
    fn expect(&mut self, prefix: &str, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.starts_with(prefix) => return line,
                Ok(_) => {}
                Err(e) => panic!("no `{prefix}` line within {limit:?}: {e}"),
            }
        }
    }
}

/// Starts a remote server process tagged `tag` at `listen`, TLS with `tls` (certificate,
/// key); returns it and its address.
fn remote(tag: &str, listen: &str, tls: Option<(&Path, &Path)>) -> (Child, String) {
    let mut env = vec![
        ("NETLESS_EGRESS_REMOTE", tag.as_ref()),
        ("NETLESS_EGRESS_LISTEN", listen.as_ref()),
    ];
    if let Some((cert, key)) = tls {
        env.push(("NETLESS_EGRESS_TLS_CERT", cert.as_os_str()));
        env.push(("NETLESS_EGRESS_TLS_KEY", key.as_os_str()));
    }
    let mut remote = Child::start("remote_process_entry", &env);
    let line = remote.expect("REMOTE LISTENING ", COMMAND);
    let address = line.trim_start_matches("REMOTE LISTENING ").to_string();
    (remote, address)
}

/// `netless gateway --threads 2 <args>` on socket directory `dir`, once its egress
/// services are served.
fn gateway(dir: &TestDir, args: &[&str]) -> Running {
    let mut child = Command::new(BIN)
        .args(["gateway", "--threads", "2"])
        .args(args)
        .env("NETLESS_DIR", &dir.path)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    read_marker(&mut child, "EGRESS ");
    Running(child)
}

/// The business-logic process, driven by commands.
struct Client(Child);

impl std::ops::Deref for Client {
    type Target = Child;

    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Client {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Client {
    fn start(dir: &TestDir) -> Client {
        let env = [
            ("NETLESS_EGRESS_CLIENT", "1".as_ref()),
            ("NETLESS_DIR", dir.path.as_os_str()),
        ];
        let mut client = Client(Child::start("client_process_entry", &env));
        client.expect("CLIENT READY", COMMAND);
        client
    }

    /// Runs `hello n` and returns its lines.
    fn hello(&mut self, n: usize) -> Vec<Hello> {
        self.send(&format!("hello {n}"));
        let mut calls = Vec::new();
        loop {
            let line = self.expect("", COMMAND);
            if line == "DONE" {
                assert_eq!(calls.len(), n);
                return calls;
            }
            if let Some(rest) = line.strip_prefix("HELLO ") {
                let mut parts = rest.splitn(4, ' ');
                let mut next = || parts.next().unwrap_or_default().to_string();
                calls.push(Hello {
                    code: next(),
                    remote: next(),
                    took: Duration::from_millis(next().parse().unwrap()),
                    message: next(),
                });
            }
        }
    }
}

/// One SayHello as the client saw it.
#[derive(Debug)]
struct Hello {
    code: String,
    remote: String,
    took: Duration,
    message: String,
}

/// A loopback address nothing listens on (a port just given back).
fn dead_address() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().to_string()
}

#[test]
fn every_kind_of_call_reaches_the_remote_and_the_caller_holds_no_tcp_socket() {
    let dir = TestDir::new("egress");
    let (mut remote, address) = remote("a", "127.0.0.1:0", None);
    let url = format!("http://{address}");
    let gateway = gateway(
        &dir,
        &[
            "--egress",
            &format!("{GREETER}={url}"),
            "--egress",
            &format!("{GUIDE}={url}"),
            "--default-timeout",
            "30s",
            "--max-timeout",
            "120s",
        ],
    );
    let mut client = Client::start(&dir);
    client.send("checks");
    client.expect("OK checks", COMMAND);
    client.send("timeouts");
    client.expect("OK timeouts", COMMAND);

    // A stream the caller drops is cancelled at the remote.
    client.send("cancel");
    client.expect("OK cancelled", COMMAND);
    // (Earlier streams were read to their end: `sent all` lines come first.)
    remote.expect("EVENT list_features: client went away", COMMAND);

    // With a stream open through the gateway to the remote: Unix sockets only.
    client.send("hold");
    client.expect("HOLDING", COMMAND);
    let held = assert_only_unix_sockets(client.pid(), "the client, a stream in flight");
    assert!(
        held > 0,
        "the client holds no socket at all: is it connected?"
    );
    client.send("release");
    client.expect("OK released", COMMAND);
    let calls = client.hello(3);
    assert!(
        calls.iter().all(|c| c.code == "Ok" && c.remote == "a"),
        "{calls:?}"
    );
    assert_only_unix_sockets(client.pid(), "the client, after its calls");

    // The check sees TCP where there is some: the gateway's own connection to the remote.
    let gateway_sockets = non_unix_sockets(gateway.0.id()).unwrap();
    assert!(
        gateway_sockets
            .iter()
            .any(|s| matches!(s.kind, SocketKind::Tcp | SocketKind::Tcp6)),
        "the gateway holds no TCP socket: {gateway_sockets:?}"
    );
}

#[test]
fn a_caller_reaches_only_its_services_methods_and_a_caller_that_dies_frees_its_call() {
    let dir = TestDir::new("egress-reach");
    let (mut remote, address) = remote("a", "127.0.0.1:0", None);
    // One worker: a call stuck at the remote holds the whole service.
    let _gateway = gateway(
        &dir,
        &[
            "--egress",
            &format!("{GREETER}=http://{address}"),
            "--egress-concurrency",
            "1",
        ],
    );
    let mut client = Client::start(&dir);
    // The remote serves RouteGuide too; the Greeter's egress leads only to the Greeter.
    client.send("cross");
    assert_eq!(client.expect("CROSS ", COMMAND), "CROSS Unimplemented");

    // A caller that dies in the middle of a unary call with no deadline: the remote's call
    // is cancelled, long before the gateway's default deadline (60 s) would end it.
    client.send("hang");
    client.expect("HANGING", COMMAND);
    remote.expect("EVENT hang: started", COMMAND);
    let died = Instant::now();
    drop(client);
    remote.expect("EVENT hang: dropped", Duration::from_secs(10));
    // And the service's one worker serves the next caller.
    let mut next = Client::start(&dir);
    let calls = next.hello(1);
    assert!(
        calls.iter().all(|c| c.code == "Ok" && c.remote == "a"),
        "{calls:?}"
    );
    assert!(
        died.elapsed() < Duration::from_secs(15),
        "{:?}",
        died.elapsed()
    );
}

#[test]
fn dead_endpoints_are_skipped_and_a_remote_that_returns_is_found() {
    let dir = TestDir::new("egress-dead");
    let (a, a_address) = remote("a", "127.0.0.1:0", None);
    let (b, b_address) = remote("b", "127.0.0.1:0", None);
    let endpoints = [dead_address(), a_address.clone(), b_address]
        .map(|address| format!("http://{address}"))
        .join(",");
    let _gateway = gateway(&dir, &["--egress", &format!("{GREETER}={endpoints}")]);
    let mut client = Client::start(&dir);

    // One endpoint of three refuses connections: every call lands on one of the others,
    // and both of those take calls.
    let calls = client.hello(12);
    assert!(calls.iter().all(|c| c.code == "Ok"), "{calls:?}");
    for tag in ["a", "b"] {
        assert!(
            calls.iter().any(|c| c.remote == tag),
            "none to {tag}: {calls:?}"
        );
    }

    // Every endpoint dead: UNAVAILABLE, soon, naming the service and no address.
    drop((a, b));
    let calls = client.hello(3);
    for call in &calls {
        assert_eq!(call.code, "Unavailable", "{calls:?}");
        assert!(call.took < Duration::from_secs(5), "{calls:?}");
        assert!(call.message.contains(GREETER), "{calls:?}");
        assert!(!call.message.contains("127.0.0.1"), "{calls:?}");
    }
    let last = &calls[2].message;
    assert!(last.contains("unreachable from this gateway"), "{last}");

    // The remote comes back at its address: calls reach it again, without any restart.
    let (_a, _) = remote("a", &a_address, None);
    let started = Instant::now();
    loop {
        let call = client.hello(1).remove(0);
        if call.code == "Ok" {
            assert_eq!(call.remote, "a");
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "the remote came back and calls still fail: {call:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_only_unix_sockets(client.pid(), "the client");
}

#[test]
fn egress_speaks_tls_to_remotes_the_ca_vouches_for() {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let certs = TestDir::new("egress-certs");
    let write = |name: &str, pem: String| {
        let path = certs.path.join(name);
        std::fs::write(&path, pem).unwrap();
        path
    };
    let ca = |name: &str| {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
    };
    let (remotes_ca, other_ca) = (ca("remotes"), ca("others"));
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&key, &remotes_ca)
        .unwrap();
    let cert_path = write("remote.pem", cert.pem());
    let key_path = write("remote.key", key.serialize_pem());
    let ca_path = write("remotes-ca.pem", remotes_ca.pem());
    let other_path = write("other-ca.pem", other_ca.pem());
    let (_remote, address) = remote("tls", "127.0.0.1:0", Some((&cert_path, &key_path)));
    let egress = format!("{GREETER}=https://{address}");

    let dir = TestDir::new("egress-tls");
    let _gateway = gateway(
        &dir,
        &[
            "--egress",
            &egress,
            "--egress-ca",
            ca_path.to_str().unwrap(),
        ],
    );
    let mut client = Client::start(&dir);
    let calls = client.hello(2);
    assert!(
        calls.iter().all(|c| c.code == "Ok" && c.remote == "tls"),
        "{calls:?}"
    );

    // A gateway that trusts another CA does not talk to it, and says why.
    let wrong = TestDir::new("egress-tls-wrong");
    let _gateway = gateway(
        &wrong,
        &[
            "--egress",
            &egress,
            "--egress-ca",
            other_path.to_str().unwrap(),
        ],
    );
    let mut client = Client::start(&wrong);
    let call = client.hello(1).remove(0);
    assert_eq!(call.code, "Unavailable", "{call:?}");
    assert!(call.message.contains("TLS"), "{call:?}");
}

#[test]
fn egress_names_that_cannot_be_served_are_refused_at_startup() {
    let dir = TestDir::new("egress-refused");
    // A live local server has the name already.
    let _local = netless::Server::bind(
        GREETER,
        netless::ServerConfig {
            dir: Some(dir.path.clone()),
            ..Default::default()
        },
        |_req: &netless::Request<'_>, resp: &mut netless::ResponseBuilder<'_>| {
            resp.payload.extend_from_slice(b"local");
            Ok(())
        },
    )
    .unwrap();
    let egress = format!("{GREETER}=http://127.0.0.1:9");
    let cases: [(&[&str], &str); 5] = [
        (&["gateway", "--egress", &egress], "already"),
        (
            &["gateway", "--egress", "netless.ctl=http://127.0.0.1:9"],
            "internal",
        ),
        (
            &["gateway", "--allow", "helloworld.*", "--egress", &egress],
            "relay",
        ),
        (
            &[
                "gateway",
                "--egress",
                "a.B=http://127.0.0.1:9",
                "--listen",
                "127.0.0.1:0",
            ],
            "--allow",
        ),
        (&["gateway", "--egress", "a.B=https://127.0.0.1:9"], "CA"),
    ];
    for (args, why) in cases {
        let out = common::run(&dir, args, SHORT);
        assert_ne!(out.status.code(), Some(0), "{}", out.describe());
        assert!(out.stderr.contains(why), "{why}: {}", out.describe());
    }
}
