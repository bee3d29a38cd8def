//! What operators watch, checked with clients nobody here wrote (`tests/observe/observe.py`:
//! the official Prometheus text parser, grpcio-health-checking, grpcio-reflection), against
//! real processes: `netless stat --prometheus` on a `netless echo-server`, and `netless
//! gateway --metrics` in front of a backend process (this test binary, run as its
//! `observe_backend_entry` test) serving a greeter that answers with the `traceparent` it
//! received, the route guide, and `tonic-reflection` over netless, on TCP too. Every wait
//! is bounded; every address is 127.0.0.1:0.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use netless_examples::helloworld::greeter_client::GreeterClient;
use netless_examples::helloworld::greeter_server::{Greeter, GreeterServer};
use netless_examples::helloworld::{HelloReply, HelloRequest};
use serde_json::Value;

use common::interop::python;
use common::{run, run_until_ok, spawn, Proc, TestDir, SHORT};

/// A greeter that answers with the `traceparent` its call carried, and fails when asked.
struct TraceGreeter;

#[tonic::async_trait]
impl Greeter for TraceGreeter {
    async fn say_hello(
        &self,
        request: tonic::Request<HelloRequest>,
    ) -> Result<tonic::Response<HelloReply>, tonic::Status> {
        let traceparent = request
            .metadata()
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("none")
            .to_string();
        if request.get_ref().name == "fail" {
            return Err(tonic::Status::invalid_argument("asked to fail"));
        }
        Ok(tonic::Response::new(HelloReply {
            message: format!("traceparent={traceparent}"),
        }))
    }
}

/// Entry point of the backend process (run only by it, via `--ignored`): the greeter, the
/// route guide and reflection of both over netless and on TCP, until stdin closes; its
/// `netless_grpc` spans go to stderr as they close.
#[test]
#[ignore = "entry point of the backend process the other tests spawn"]
fn observe_backend_entry() {
    use tracing_subscriber::filter::{LevelFilter, Targets};
    use tracing_subscriber::fmt::format::FmtSpan;
    use tracing_subscriber::prelude::*;
    if std::env::var_os("NETLESS_OBSERVE_BACKEND").is_none() {
        return;
    }
    let spans = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_span_events(FmtSpan::CLOSE)
        .with_filter(Targets::new().with_target("netless_grpc", LevelFilter::DEBUG));
    tracing_subscriber::registry().with(spans).init();
    let protos = common::interop::workspace().join("examples/proto");
    let descriptors =
        protox::compile(["helloworld.proto", "route_guide.proto"], [&protos]).unwrap();
    let reflection = tonic_reflection::server::Builder::configure()
        .register_file_descriptor_set(descriptors)
        .build_v1()
        .unwrap();
    let observer = std::sync::Arc::new(|_event: String| {});
    let serving = netless_grpc::GrpcServer::new()
        .add_service(GreeterServer::new(TraceGreeter))
        .add_service(
            netless_examples::routeguide_pb::route_guide_server::RouteGuideServer::new(
                netless_examples::routeguide::RouteGuideService::new(1000, observer),
            ),
        )
        .add_service(reflection)
        .tcp("127.0.0.1:0".parse().unwrap())
        .serve()
        .unwrap();
    println!("\nBACKEND READY {}", serving.tcp_addr().unwrap());
    std::io::stdout().flush().unwrap();
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    drop(serving);
}

/// The backend process in socket directory `dir`; its TCP address.
fn start_backend(dir: &TestDir) -> (Proc, String) {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args([
            "--exact",
            "observe_backend_entry",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("NETLESS_OBSERVE_BACKEND", "1")
        .env("NETLESS_DIR", &dir.path)
        // Open while the handle lives: the backend serves until it is killed.
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let mut backend = Proc::spawn_command(command, "observe backend");
    let tcp = backend.wait_for_line("BACKEND READY ", Duration::from_secs(20));
    (backend, tcp)
}

/// `netless gateway --threads 2 --metrics 127.0.0.1:0 <args>` in `dir`: the process, its
/// metrics address, and its gRPC address if it listens (`--allow`).
fn start_gateway(dir: &TestDir, args: &[&str]) -> (Proc, String, Option<String>) {
    let mut all = vec!["gateway", "--threads", "2", "--metrics", "127.0.0.1:0"];
    all.extend_from_slice(args);
    let mut gateway = spawn(dir, &all);
    let metrics = gateway.wait_for_line("METRICS ", Duration::from_secs(20));
    let listening = args.contains(&"--allow").then(|| {
        let line = gateway.wait_for_line("LISTENING ", Duration::from_secs(20));
        line.split_whitespace().next().unwrap().to_string()
    });
    (gateway, metrics, listening)
}

/// Runs `observe.py <args>` (with `input` on stdin) and returns its JSON lines.
fn observe_py(args: &[&str], input: &str) -> Vec<Value> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/observe/observe.py");
    let mut child = Command::new(python())
        .arg(script)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let output = wait_output(child, Duration::from_secs(60));
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(
        output.status.success(),
        "observe.py {args:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// `child`'s output, killing it if it runs past `timeout`.
fn wait_output(child: std::process::Child, timeout: Duration) -> std::process::Output {
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(timeout) {
        Ok(output) => output.unwrap(),
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("a client ran past {timeout:?}");
        }
    }
}

/// Parsed samples: `name{labels}` → value.
struct Samples(Vec<Value>);

impl Samples {
    fn parse(args: &[&str], input: &str) -> Samples {
        Samples(observe_py(args, input))
    }

    /// The value of the sample `name` whose labels include `labels`; panics if there is
    /// not exactly one.
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let found: Vec<&Value> = self.matching(name, labels);
        assert_eq!(found.len(), 1, "{name} {labels:?} in\n{}", self.dump());
        found[0]["value"].as_f64().unwrap()
    }

    fn matching(&self, name: &str, labels: &[(&str, &str)]) -> Vec<&Value> {
        self.0
            .iter()
            .filter(|s| s["name"] == name)
            .filter(|s| labels.iter().all(|(k, v)| s["labels"][*k] == *v))
            .collect()
    }

    /// Checks every histogram of family `name` with `labels`: cumulative buckets, `+Inf`
    /// equal to `_count`.
    fn check_histogram(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        let buckets = self.matching(&format!("{name}_bucket"), labels);
        assert!(buckets.len() >= 25, "{name} {labels:?}: {}", self.dump());
        let values: Vec<f64> = buckets
            .iter()
            .map(|b| b["value"].as_f64().unwrap())
            .collect();
        assert!(values.windows(2).all(|w| w[0] <= w[1]), "{values:?}");
        let inf = buckets
            .iter()
            .find(|b| b["labels"]["le"] == "+Inf")
            .unwrap();
        let count = self.get(&format!("{name}_count"), labels);
        assert_eq!(inf["value"].as_f64().unwrap(), count);
        count as u64
    }

    fn dump(&self) -> String {
        self.0.iter().map(|s| format!("{s}\n")).collect()
    }
}

#[test]
fn stat_prometheus_parses_and_counts_every_call() {
    let dir = TestDir::new("op");
    let service = "t.Prom";
    let mut server = spawn(&dir, &["echo-server", "--service", service]);
    run_until_ok(&dir, &mut server, &["stat", service, "--json"]);
    let calls = 37;
    let count = calls.to_string();
    run(
        &dir,
        &["ping", service, "--count", &count, "--interval-ms", "0"],
        SHORT,
    )
    .ok();
    let out = run(&dir, &["stat", service, "--prometheus"], SHORT).ok();
    let samples = Samples::parse(&["metrics", "-"], &out.stdout);
    let me = [("netless_service", service)];
    assert_eq!(
        samples.get("grpc_server_call_started_total", &me),
        calls as f64
    );
    let ok = [("netless_service", service), ("grpc_status", "OK")];
    assert_eq!(samples.get("netless_server_calls_total", &ok), calls as f64);
    assert!(samples.get("netless_server_received_bytes_total", &me) > 0.0);
    assert_eq!(samples.get("netless_server_workers", &me), 1.0);
    // One queue entry in 16 is timed: with one worker and one call an entry, calls / 16.
    let name = "netless_server_sampled_service_duration_seconds";
    assert_eq!(samples.check_histogram(name, &me), calls / 16);
    server.kill();
}

#[test]
fn gateway_metrics_count_calls_in_and_traceparent_reaches_the_handler() {
    let dir = TestDir::new("om");
    let (mut backend, _tcp) = start_backend(&dir);
    let allow = ["--listen", "127.0.0.1:0", "--allow", "helloworld.*"];
    let (_gateway, metrics, address) = start_gateway(&dir, &allow);
    let address = address.unwrap();
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let traceparent = format!("00-{trace_id}-00f067aa0ba902b7-01");
    let (ok, failed) = (5, 2);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
            .unwrap()
            .timeout(Duration::from_secs(20));
        let mut client = GreeterClient::new(endpoint.connect().await.unwrap());
        for i in 0..ok {
            let mut request = tonic::Request::new(HelloRequest { name: "x".into() });
            if i == 0 {
                request
                    .metadata_mut()
                    .insert("traceparent", traceparent.parse().unwrap());
            }
            let reply = client.say_hello(request).await.unwrap().into_inner();
            // The header reached the handler as it was sent.
            let expected = if i == 0 { traceparent.as_str() } else { "none" };
            assert_eq!(reply.message, format!("traceparent={expected}"));
        }
        for _ in 0..failed {
            let request = HelloRequest {
                name: "fail".into(),
            };
            let err = client.say_hello(request).await.unwrap_err();
            assert_eq!(err.code(), tonic::Code::InvalidArgument);
        }
        // Not allowed: refused by the gateway, counted as `other`.
        let mut grpc = tonic::client::Grpc::new(endpoint.connect().await.unwrap());
        grpc.ready().await.unwrap();
        let err = grpc
            .unary(
                tonic::Request::new(HelloRequest::default()),
                "/routeguide.RouteGuide/GetFeature".parse().unwrap(),
                tonic_prost::ProstCodec::<HelloRequest, HelloRequest>::default(),
            )
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unimplemented);
    });
    drop(runtime);

    let url = format!("http://{metrics}/metrics");
    let samples = Samples::parse(&["metrics", &url], "");
    let content_type = &samples.0[0]["content_type"];
    assert_eq!(content_type, "text/plain; version=0.0.4; charset=utf-8");
    let method = ("grpc_method", "helloworld.Greeter/SayHello");
    let started = samples.get("grpc_server_call_started_total", &[method]);
    assert_eq!(started, (ok + failed) as f64);
    let name = "grpc_server_call_duration_seconds";
    assert_eq!(
        samples.check_histogram(name, &[method, ("grpc_status", "OK")]),
        ok
    );
    let invalid = ("grpc_status", "INVALID_ARGUMENT");
    assert_eq!(samples.check_histogram(name, &[method, invalid]), failed);
    let other = ("grpc_method", "other");
    assert_eq!(samples.get("grpc_server_call_started_total", &[other]), 1.0);
    let unimplemented = ("grpc_status", "UNIMPLEMENTED");
    assert_eq!(samples.check_histogram(name, &[other, unimplemented]), 1);
    let refused = samples.get("netless_gateway_calls_refused_total", &[unimplemented]);
    assert_eq!(refused, 1.0);
    assert!(samples.get("netless_gateway_connections_accepted_total", &[]) >= 2.0);
    // The backend's own counters, from the gateway's link: every call it forwarded is OK
    // at the netless level (the gRPC status travels in the trailers), and a call whose
    // service had to wait may have become a stream, whose operations are netless calls too.
    let backend_ok = [
        ("netless_service", "helloworld.Greeter"),
        ("grpc_status", "OK"),
    ];
    let forwarded = samples.get("netless_server_calls_total", &backend_ok);
    assert!(forwarded >= (ok + failed) as f64, "{forwarded}");
    let errors = [("netless_service", "helloworld.Greeter"), invalid];
    assert!(samples
        .matching("netless_server_calls_total", &errors)
        .is_empty());

    // The backend's server span recorded the trace id of the call that carried one.
    backend.kill();
    let status = backend.exited().unwrap();
    let stderr = backend.collect(status).stderr;
    let spans: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("netless.server.call") && l.contains("close"))
        .collect();
    assert_eq!(spans.len() as u64, ok + failed, "{stderr}");
    let traced: Vec<&&str> = spans.iter().filter(|l| l.contains(trace_id)).collect();
    assert_eq!(traced.len(), 1, "{stderr}");
    assert!(traced[0].contains("00f067aa0ba902b7"), "{}", traced[0]);
}

#[test]
fn gateway_metrics_count_egress_tries() {
    let backend_dir = TestDir::new("oe");
    let (_backend, tcp) = start_backend(&backend_dir);
    let dir = TestDir::new("og");
    let target = format!("http://{tcp}");
    let egress = format!("helloworld.Greeter={target}");
    let (_gateway, metrics, _) = start_gateway(&dir, &["--egress", &egress]);
    let calls = 4;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let config = netless::ClientConfig {
            dir: Some(dir.path.clone()),
            ..Default::default()
        };
        let channel = netless_grpc::Channel::connect_with("helloworld.Greeter", config).unwrap();
        let mut client = GreeterClient::new(channel);
        for _ in 0..calls {
            let request = tonic::Request::new(HelloRequest { name: "x".into() });
            client.say_hello(request).await.unwrap();
        }
    });
    let samples = Samples::parse(&["metrics", &format!("http://{metrics}/metrics")], "");
    let labels = [
        ("grpc_method", "helloworld.Greeter/SayHello"),
        ("grpc_target", target.as_str()),
    ];
    let tries = samples.get("grpc_client_attempt_started_total", &labels);
    assert_eq!(tries, calls as f64);
    let ok = [labels[0], labels[1], ("grpc_status", "OK")];
    let name = "grpc_client_attempt_duration_seconds";
    assert_eq!(samples.check_histogram(name, &ok), calls);
}

/// `(service, status or error)` of each line of `observe.py health`.
fn health_of(lines: &[Value]) -> BTreeMap<String, String> {
    lines
        .iter()
        .map(|l| {
            let answer = l.get("status").or(l.get("error")).unwrap();
            (
                l["service"].as_str().unwrap().to_string(),
                answer.as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn health_and_reflection_answer_within_the_allow_list() {
    let dir = TestDir::new("oh");
    let (mut backend, _tcp) = start_backend(&dir);
    let args = [
        "--listen",
        "127.0.0.1:0",
        "--allow",
        "helloworld.*",
        "--allow",
        "missing.Service",
    ];
    let (_gateway, metrics, address) = start_gateway(&dir, &args);
    let address = address.unwrap();
    let names = [
        "",
        "helloworld.Greeter",
        "missing.Service",
        "helloworld.Nobody",
        "routeguide.RouteGuide",
        "netless.ctl",
        "grpc.reflection.v1.ServerReflection",
    ];
    let mut args = vec!["health", address.as_str()];
    args.extend(names);
    let health = health_of(&observe_py(&args, ""));
    let expected = [
        ("", "SERVING"),
        ("helloworld.Greeter", "SERVING"),
        // Named by the allow-list, not running.
        ("missing.Service", "NOT_SERVING"),
        // Let in by a pattern, not running: as unknown as what is not let in.
        ("helloworld.Nobody", "NOT_FOUND"),
        // Running, not let in.
        ("routeguide.RouteGuide", "NOT_FOUND"),
        ("netless.ctl", "NOT_FOUND"),
        ("grpc.reflection.v1.ServerReflection", "SERVING"),
    ];
    let expected: BTreeMap<String, String> = expected
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    assert_eq!(health, expected);

    let lines = observe_py(&["reflection", &address], "");
    let find = |key: &str, value: &str| {
        lines
            .iter()
            .find(|l| l[key] == value)
            .unwrap_or_else(|| panic!("no {key}={value} in {lines:?}"))
    };
    let listed = serde_json::json!([
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
        "grpc.reflection.v1alpha.ServerReflection",
        "helloworld.Greeter"
    ]);
    assert_eq!(find("version", "v1alpha")["services"], listed);
    let greeter = find("symbol", "helloworld.Greeter");
    assert_eq!(greeter["file"], "helloworld.proto", "{greeter}");
    assert_eq!(greeter["methods"], serde_json::json!(["SayHello"]));
    let health = find("symbol", "grpc.health.v1.Health");
    assert_eq!(health["methods"], serde_json::json!(["Check", "Watch"]));
    assert_eq!(
        find("symbol", "routeguide.RouteGuide")["error"],
        "NOT_FOUND"
    );
    assert_eq!(find("symbol", "netless.ctl")["error"], "NOT_FOUND");
    let request = find("message", "helloworld.HelloRequest");
    assert_eq!(request["fields"], serde_json::json!(["name"]));
    let v1: Vec<&Value> = lines.iter().filter(|l| l["version"] == "v1").collect();
    assert_eq!(v1[0]["services"], listed);
    assert_eq!(v1[1]["files"], 1);
    // NOT_FOUND, as for a method of a service that does not exist.
    assert_eq!(v1[2]["hidden_method_error"], 5);

    // Watch: SERVING, then NOT_SERVING once the backend is gone.
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/observe/observe.py");
    let mut watch = Command::new(python())
        .arg(script)
        .args(["watch", &address, "helloworld.Greeter"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(watch.stdout.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        while out.read_line(&mut line).unwrap_or(0) > 0 {
            let _ = tx.send(std::mem::take(&mut line));
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let next = || {
        rx.recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("observe.py watch said nothing in time")
    };
    assert!(next().contains("\"first\": \"SERVING\""));
    assert_eq!(next().trim(), "WAITING");
    backend.kill();
    assert!(next().contains("\"then\": \"NOT_SERVING\""));
    let status = wait_output(watch, Duration::from_secs(20)).status;
    assert!(status.success());

    // The gateway answered all of this itself, under its own method names.
    let samples = Samples::parse(&["metrics", &format!("http://{metrics}/metrics")], "");
    let check = ("grpc_method", "grpc.health.v1.Health/Check");
    let checks = samples.get("grpc_server_call_started_total", &[check]);
    assert_eq!(checks, names.len() as f64);
    let not_found = ("grpc_status", "NOT_FOUND");
    let name = "grpc_server_call_duration_seconds";
    assert_eq!(samples.check_histogram(name, &[check, not_found]), 3);
    let reflection = (
        "grpc_method",
        "grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
    );
    assert_eq!(
        samples.get("grpc_server_call_started_total", &[reflection]),
        1.0
    );
}
