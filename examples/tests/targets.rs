//! One `Channel` type, any location: the example suites pass through `Channel::target`
//! both to the local netless service and, by a `NETLESS_TARGETS` table alone, to the same
//! service served over HTTP/2 by a server in another process; the example clients, left
//! unchanged, go either way by target name; a remote target that refuses connections fails
//! with `UNAVAILABLE` at once; an `https` target verifies its server with the CA given.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{run_to_end, runtime, ServerProcess};
use netless_examples::checks;
use netless_examples::greeter::MyGreeter;
use netless_examples::helloworld::greeter_client::GreeterClient;
use netless_examples::helloworld::greeter_server::GreeterServer;
use netless_examples::helloworld::HelloRequest;
use netless_examples::routeguide_pb::route_guide_client::RouteGuideClient;
use netless_grpc::{Channel, ChannelOptions, Location, Resolver};
use netless_testing::TestDir;

const ROUTEGUIDE: &str = "routeguide.RouteGuide";

/// Options for a client of `server`: its socket directory, and `resolver` for names.
fn options(server: &ServerProcess, resolver: Resolver) -> ChannelOptions {
    ChannelOptions::new()
        .client_config(netless::ClientConfig {
            dir: Some(server.dir.clone()),
            ..Default::default()
        })
        .resolver(resolver)
}

fn remote(addr: &str) -> Location {
    Location::Remote {
        uris: vec![format!("http://{addr}")],
    }
}

/// A target table file mapping `name` to `target`, in `dir`.
fn table(dir: &Path, name: &str, target: &str) -> std::path::PathBuf {
    let path = dir.join("targets");
    std::fs::write(&path, format!("# where {name} runs\n{name} {target}\n")).unwrap();
    path
}

#[test]
fn greeter_passes_the_suite_through_a_target_to_the_local_and_the_remote_service() {
    let server = ServerProcess::start(env!("CARGO_BIN_EXE_greeter_server"), &[]);
    runtime().block_on(async {
        let local =
            Channel::target_with("helloworld.Greeter", &options(&server, Resolver::new())).unwrap();
        assert_eq!(
            local.location(),
            &Location::Local {
                service: "helloworld.Greeter".into()
            }
        );
        checks::greeter(GreeterClient::new(local), "target-local").await;

        let resolver = Resolver::parse(&format!("helloworld.* http://{}", server.tcp)).unwrap();
        let remote_channel =
            Channel::target_with("helloworld.Greeter", &options(&server, resolver)).unwrap();
        assert_eq!(remote_channel.location(), &remote(&server.tcp));
        checks::greeter(GreeterClient::new(remote_channel), "target-remote").await;
    });
}

/// Entry point of the client processes the next test starts (run only by it, via
/// `--ignored`): `Channel::target("routeguide.RouteGuide")` with default options, so the
/// environment alone (`NETLESS_TARGETS`, `NETLESS_DIR`) decides where it goes; checks that
/// it went to `NETLESS_EXPECT_LOCATION`, then runs the RouteGuide suite there.
#[test]
#[ignore = "entry point of the client processes another test spawns"]
fn target_client_process_entry() {
    let Some(expected) = std::env::var_os("NETLESS_EXPECT_LOCATION") else {
        return;
    };
    let expected = expected.into_string().unwrap();
    runtime().block_on(async {
        let channel = Channel::target(ROUTEGUIDE).unwrap();
        assert_eq!(channel.location().to_string(), expected);
        let label = if channel.location().is_local() {
            "target-local"
        } else {
            "target-remote"
        };
        checks::routeguide(RouteGuideClient::new(channel), label).await;
        println!("PASSED {label} {expected}");
    });
}

/// Runs [`target_client_process_entry`] in a process of its own with `env`.
fn target_client(expected: &str, env: &[(&str, &std::ffi::OsStr)]) -> String {
    let mut command = common::this_test_running("target_client_process_entry");
    command
        .env_remove("NETLESS_TARGETS")
        .env("NETLESS_EXPECT_LOCATION", expected);
    for (name, value) in env {
        command.env(name, value);
    }
    run_to_end(&mut command, Duration::from_secs(120)).out
}

#[test]
fn routeguide_passes_the_suite_through_a_target_both_ways_by_the_environment_alone() {
    let server = ServerProcess::start(env!("CARGO_BIN_EXE_routeguide_server"), &[]);
    let dir = server.dir.as_os_str();

    // No table: the name is the local netless service.
    let out = target_client("netless:routeguide.RouteGuide", &[("NETLESS_DIR", dir)]);
    assert!(out.contains("PASSED target-local"), "{out}");

    // A table maps the name to the server's TCP address: the same code goes over HTTP/2.
    let tables = TestDir::new("targets");
    let remote_target = format!("http://{}", server.tcp);
    let path = table(&tables.path, ROUTEGUIDE, &remote_target);
    let out = target_client(
        &remote_target,
        &[("NETLESS_DIR", dir), ("NETLESS_TARGETS", path.as_os_str())],
    );
    assert!(out.contains("PASSED target-remote"), "{out}");
}

#[test]
fn the_example_clients_reach_either_location_by_target_name_alone() {
    let routeguide = ServerProcess::start(env!("CARGO_BIN_EXE_routeguide_server"), &[]);
    let greeter = ServerProcess::start(env!("CARGO_BIN_EXE_greeter_server"), &[]);
    let tables = TestDir::new("targets");
    for (server, binary, name) in [
        (
            &routeguide,
            env!("CARGO_BIN_EXE_routeguide_client"),
            ROUTEGUIDE,
        ),
        (
            &greeter,
            env!("CARGO_BIN_EXE_greeter_client"),
            "helloworld.Greeter",
        ),
    ] {
        let remote_target = format!("http://{}", server.tcp);
        let path = table(&tables.path, name, &remote_target);
        for (targets, location) in [
            (None, format!("netless:{name}")),
            (Some(&path), remote_target.clone()),
        ] {
            let mut command = Command::new(binary);
            command
                .args(["--target", name])
                .env("NETLESS_DIR", &server.dir)
                .env_remove("NETLESS_TARGETS");
            if let Some(path) = targets {
                command.env("NETLESS_TARGETS", path);
            }
            let run = run_to_end(&mut command, Duration::from_secs(60));
            assert!(
                run.err.contains(&format!("calling {location}")),
                "{binary}: {}",
                run.err
            );
            let answered = if name == ROUTEGUIDE {
                "RouteChat: got"
            } else {
                "Hello world!"
            };
            assert!(
                run.out.contains(answered),
                "{binary} via {location}: {}",
                run.out
            );
        }
    }
}

#[test]
fn a_remote_target_that_refuses_connections_fails_with_unavailable_at_once() {
    // A port nobody listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    runtime().block_on(async {
        let target = format!("127.0.0.1:{port}");
        let channel = Channel::target(&target).unwrap();
        assert_eq!(channel.location(), &remote(&target));
        let started = Instant::now();
        let mut client = GreeterClient::new(channel);
        let call = client.say_hello(HelloRequest {
            name: "anyone".into(),
        });
        let err = tokio::time::timeout(Duration::from_secs(5), call)
            .await
            .expect("an answer within 5 s")
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
        assert!(
            err.message()
                .starts_with(&format!("`http://{target}` is unavailable: ")),
            "{err:?}"
        );
        assert!(err.message().contains("refused"), "{err:?}");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
    });
}

/// Entry point of the TLS server process the next test starts (run only by it): serves
/// `helloworld.Greeter` over TLS on TCP alone, with the certificate and key in
/// `NETLESS_TLS_SERVER_DIR`, until its stdin closes.
#[test]
#[ignore = "entry point of the server process another test spawns"]
fn tls_server_process_entry() {
    let Some(dir) = std::env::var_os("NETLESS_TLS_SERVER_DIR") else {
        return;
    };
    let dir = Path::new(&dir);
    let identity = tonic::transport::Identity::from_pem(
        std::fs::read(dir.join("cert.pem")).unwrap(),
        std::fs::read(dir.join("key.pem")).unwrap(),
    );
    let serving = netless_grpc::GrpcServer::new()
        .add_service(GreeterServer::new(MyGreeter))
        .tcp("127.0.0.1:0".parse().unwrap())
        .tls(tonic::transport::ServerTlsConfig::new().identity(identity))
        .netless(false)
        .serve()
        .unwrap();
    println!("\nLISTENING tcp={}", serving.tcp_addr().unwrap());
    std::io::stdout().flush().unwrap();
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    serving.stop();
}

/// The TLS server process; killed on drop.
struct TlsServer {
    child: Child,
    port: u16,
}

impl TlsServer {
    fn start(dir: &Path) -> TlsServer {
        let mut child = common::this_test_running("tls_server_process_entry")
            .env("NETLESS_TLS_SERVER_DIR", dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let out = BufReader::new(child.stdout.take().unwrap());
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                if let Some(addr) = line.strip_prefix("LISTENING tcp=") {
                    let _ = tx.send(addr.to_string());
                }
            }
        });
        let addr: std::net::SocketAddr = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("the TLS server listening")
            .parse()
            .unwrap();
        TlsServer {
            child,
            port: addr.port(),
        }
    }
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn an_https_target_verifies_the_server_with_the_ca_given() {
    let dir = TestDir::new("tls");
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    std::fs::write(dir.path.join("cert.pem"), cert.cert.pem()).unwrap();
    std::fs::write(dir.path.join("key.pem"), cert.signing_key.serialize_pem()).unwrap();
    let server = TlsServer::start(&dir.path);
    let target = format!("https://localhost:{}", server.port);
    runtime().block_on(async {
        let trusted = ChannelOptions::new().tls_ca_pem(cert.cert.pem());
        let channel = Channel::target_with(&target, &trusted).unwrap();
        assert_eq!(
            channel.location(),
            &Location::Remote {
                uris: vec![target.clone()]
            }
        );
        checks::greeter(GreeterClient::new(channel), "https").await;

        // A CA that did not issue the server's certificate: the handshake fails.
        let other = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
        let untrusted = ChannelOptions::new().tls_ca_pem(other.cert.pem());
        let channel = Channel::target_with(&target, &untrusted).unwrap();
        let err = tokio::time::timeout(
            Duration::from_secs(5),
            GreeterClient::new(channel).say_hello(HelloRequest {
                name: "mallory".into(),
            }),
        )
        .await
        .expect("an answer within 5 s")
        .unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    });
}

#[test]
fn the_any_location_example_reaches_the_greeter_locally_and_remotely() {
    let run = run_to_end(
        &mut Command::new(env!("CARGO_BIN_EXE_any_location")),
        Duration::from_secs(60),
    );
    let lines: Vec<&str> = run.out.lines().collect();
    assert_eq!(lines.len(), 3, "{}", run.out);
    assert!(
        lines[0].contains("netless:helloworld.Greeter") && lines[0].ends_with("Hello by name!"),
        "{}",
        run.out
    );
    assert!(lines[1].contains("-> http://127.0.0.1:"), "{}", run.out);
    assert!(lines[2].contains("-> http://127.0.0.1:"), "{}", run.out);
    assert!(
        lines[2].ends_with("Hello by name, through a table!"),
        "{}",
        run.out
    );
}
