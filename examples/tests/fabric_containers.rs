//! The example services over a memory fabric between two containers: a `GrpcServer` serving
//! `helloworld.Greeter` and `routeguide.RouteGuide` in the region, and tonic-generated
//! clients on a netless `Channel` connected through it, each pid 1 of its own pid, mount, IPC
//! and network namespaces with a private `/tmp` and socket directory, sharing one directory
//! that holds nothing but the region's file. Both suites of `checks` (all four kinds of call,
//! metadata, errors, deadlines, a 3 MiB message) must pass.
//!
//! Making a container needs root: without it the test says `SKIPPED:` and passes. The peers
//! are this test binary again, running only `fabric_grpc_peer`.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::sync::Arc;
use std::time::Duration;

use netless::fabric::{Fabric, FabricOptions};
use netless_examples::checks;
use netless_examples::greeter::MyGreeter;
use netless_examples::helloworld::greeter_client::GreeterClient;
use netless_examples::helloworld::greeter_server::GreeterServer;
use netless_examples::routeguide::RouteGuideService;
use netless_examples::routeguide_pb::route_guide_client::RouteGuideClient;
use netless_examples::routeguide_pb::route_guide_server::RouteGuideServer;
use netless_grpc::{Channel, GrpcServer};
use netless_testing::TestDir;

/// Env vars of a peer: its role, and the region's path as it sees it.
const ROLE: &str = "NETLESS_EXAMPLE_ROLE";
const FABRIC: &str = "NETLESS_EXAMPLE_FABRIC";
/// The region's file name in the shared directory.
const REGION: &str = "region";
/// How long a peer may take to start, or to run both suites, on a loaded two-core machine.
const PATIENCE: Duration = Duration::from_secs(60);

/// Entry point of the container processes the test spawns.
#[test]
#[ignore = "entry point of the container processes the test spawns"]
fn fabric_grpc_peer() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let path = std::env::var(FABRIC).unwrap();
    let options = FabricOptions {
        size: 64 << 20,
        ..FabricOptions::default()
    };
    let fabric = Fabric::open(Path::new(&path), &options).unwrap();
    match role.as_str() {
        "server" => {
            let config = netless::ServerConfig {
                fabric: Some(fabric),
                ..netless::ServerConfig::default()
            };
            let _serving = GrpcServer::new()
                .config(config)
                .add_service(GreeterServer::new(MyGreeter))
                .add_service(RouteGuideServer::new(RouteGuideService::new(
                    1000,
                    Arc::new(|_| {}),
                )))
                .serve()
                .unwrap();
            say("serving");
            // Until the test is done with it (stdin closes) or kills it.
            let _ = std::io::stdin().lock().lines().count();
        }
        "client" => {
            let channel = |service: &str| {
                let config = netless::ClientConfig {
                    fabric: Some(fabric.clone()),
                    ..netless::ClientConfig::default()
                };
                Channel::connect_with(service, config).unwrap()
            };
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                let greeter = GreeterClient::new(channel("helloworld.Greeter"));
                checks::greeter(greeter, "fabric").await;
                let guide = RouteGuideClient::new(channel("routeguide.RouteGuide"));
                checks::routeguide(guide, "fabric").await;
            });
            say("passed");
        }
        other => panic!("unknown role {other}"),
    }
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "@@{line}").unwrap();
    out.flush().unwrap();
}

/// A container running `fabric_grpc_peer`, in a process group of its own (killed on drop).
struct Container {
    child: Child,
    lines: Receiver<String>,
}

impl Container {
    /// Starts `role` in a container that sees `shared` at `/tmp/inside`; `None` (the reason
    /// printed) if this machine cannot make one.
    fn start(shared: &TestDir, inside: &str, role: &str) -> Option<Container> {
        if rustix::process::geteuid().as_raw() != 0 {
            eprintln!("SKIPPED: making a container (namespaces, mounts) needs root");
            return None;
        }
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args([
            "--exact",
            "fabric_grpc_peer",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROLE, role)
        .env(FABRIC, format!("/tmp/{inside}/{REGION}"))
        .env("NETLESS_DIR", "/tmp/netless-private")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .process_group(0);
        let spawned = netless_testing::in_container(&mut cmd, &shared.path, inside)
            .and_then(|cmd| cmd.spawn());
        let mut child = match spawned {
            Ok(child) => child,
            Err(e) => {
                eprintln!("SKIPPED: cannot make a container here: {e}");
                return None;
            }
        };
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(at) = line.find("@@") {
                    if tx.send(line[at + 2..].to_owned()).is_err() {
                        break;
                    }
                }
            }
        });
        Some(Container { child, lines })
    }

    /// The peer's next line; panics if none comes within [`PATIENCE`].
    fn line(&self) -> String {
        self.lines
            .recv_timeout(PATIENCE)
            .unwrap_or_else(|e| panic!("container {} did not answer: {e:?}", self.child.id()))
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let group = rustix::process::Pid::from_child(&self.child);
        let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
        let _ = self.child.wait();
    }
}

#[test]
fn tonic_services_pass_their_suites_between_containers_that_share_only_a_fabric_file() {
    let shared = TestDir::new("fabric-grpc");
    let Some(server) = Container::start(&shared, "fabric", "server") else {
        return;
    };
    assert_eq!(server.line(), "serving");
    let Some(mut client) = Container::start(&shared, "elsewhere", "client") else {
        return;
    };
    assert_eq!(client.line(), "passed");
    let status = client.child.wait().unwrap();
    assert!(status.success(), "the client container exited {status:?}");
    let names: Vec<_> = std::fs::read_dir(&shared.path)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        names,
        [REGION],
        "the shared directory holds the region alone"
    );
}
