//! Two hosts on this machine (two network namespaces on one veth link, each with its own
//! socket directory: `netless_testing::TwoHosts`), each with its netless services and its
//! `netless gateway`:
//! - the same client code reaches a service on its own host (netless) and on the other host
//!   (HTTP/2 to that host's gateway) by target name alone, and the RouteGuide suite passes
//!   both ways;
//! - a business-logic process on host A reaches host B's service through A's gateway
//!   (egress) and B's gateway (ingress), in a network namespace of its own with no
//!   interface but loopback, holding no TCP socket;
//! - Python grpcio on host A calls host B's gateway;
//! - killing host B's gateway gives A's callers `UNAVAILABLE`, and they recover when it
//!   comes back;
//! - with `netless memnode` on host A, a callee on host B writes to the array a caller on A
//!   put there (copy-on-write on the node: the caller's array is unchanged), and once host
//!   B's link is cut mid-run and the caller killed, the node holds no page a lease later.
//!
//! Needs root and `ip`: without them each test says `SKIPPED:` and passes. The processes on
//! the hosts are this test binary again, running only `two_hosts_peer`, and `netless`.

mod common;

use std::os::unix::process::CommandExt as _;
use std::time::Duration;

use netless_examples::checks;
use netless_examples::greeter::MyGreeter;
use netless_examples::helloworld::greeter_client::GreeterClient;
use netless_examples::helloworld::greeter_server::GreeterServer;
use netless_examples::routeguide::{grid_point, RouteGuideService};
use netless_examples::routeguide_pb::route_guide_client::RouteGuideClient;
use netless_examples::routeguide_pb::route_guide_server::RouteGuideServer;
use netless_testing::{Host, Proc, TwoHosts};

use common::BIN;

/// The role of a peer process (`two_hosts_peer`).
const ROLE: &str = "NETLESS_TWO_HOSTS_ROLE";
/// The target a `suite` peer calls.
const TARGET: &str = "NETLESS_TWO_HOSTS_TARGET";
/// How long a peer may take to start or to finish its calls on a loaded two-core machine.
const PATIENCE: Duration = Duration::from_secs(60);
/// Where each host's gateway listens, inside its namespace.
const PORT: u16 = 50051;
/// The memory node's URI (`memnode` peers), a reference and a published one (hex).
const MEMNODE: &str = "NETLESS_TWO_HOSTS_MEMNODE";
const REF: &str = "NETLESS_TWO_HOSTS_REF";
const PUBLISHED: &str = "NETLESS_TWO_HOSTS_PUBLISHED";
/// The array the caller puts on the memory node: 16 pages of a known pattern.
const ARRAY: usize = 16 * 4096;
/// Where the callee writes, and what.
const WRITES: [(u64, &[u8]); 2] = [(3 * 4096 + 5, b"callee was here"), (10 * 4096, b"and here")];

fn pattern() -> Vec<u8> {
    (0..ARRAY).map(|i| (i * 31 + 7) as u8).collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}

fn env_ref(name: &str) -> netless_memnode::RemoteRef {
    netless_memnode::RemoteRef::from_bytes(&unhex(&std::env::var(name).unwrap())).unwrap()
}

/// The memory node's roles: a session over TCP to `MEMNODE`.
async fn memnode_role(role: &str) {
    let uri = std::env::var(MEMNODE).unwrap();
    let channel = tonic::transport::Endpoint::from_shared(uri)
        .unwrap()
        .connect_lazy();
    let session = netless_memnode::Session::open(channel, role).await.unwrap();
    match role {
        // Puts the array and holds it until killed.
        "caller" => {
            let reference = session.put(&pattern()).await.unwrap();
            println!("REF {}", hex(&reference.to_bytes()));
            std::future::pending::<()>().await;
        }
        // Writes to the caller's array and publishes what it wrote.
        "callee" => {
            let mut buf = session.map(&env_ref(REF));
            for (offset, bytes) in WRITES {
                buf.write(offset, bytes).await.unwrap();
            }
            let published = buf.publish().await.unwrap();
            session.retain(&published).await.unwrap();
            println!("PUBLISHED {}", hex(&published.to_bytes()));
            println!("PASS");
            // Holds what it published until killed.
            std::future::pending::<()>().await;
        }
        // Reads both: the caller's array unchanged, the callee's with its writes.
        "check" => {
            let original = session.read(&env_ref(REF)).await.unwrap();
            assert!(original == pattern(), "the caller's array changed");
            let mut want = pattern();
            for (offset, bytes) in WRITES {
                let at = offset as usize;
                want[at..at + bytes.len()].copy_from_slice(bytes);
            }
            let published = session.read(&env_ref(PUBLISHED)).await.unwrap();
            assert!(
                published == want,
                "the published array lacks the callee's writes"
            );
            println!("PASS");
        }
        // Puts and derives arrays until killed.
        "holder" => {
            for n in 0u32.. {
                let reference = session.put(&pattern()).await.unwrap();
                session
                    .derive(&reference, ARRAY as u64, &[(0, b"x")])
                    .await
                    .unwrap();
                if n == 4 {
                    println!("HOLDING");
                }
            }
        }
        other => panic!("unknown memnode role {other}"),
    }
}

/// Entry point of the peer processes the tests start on the hosts.
#[test]
#[ignore = "entry point of the peer processes the two-host tests start"]
fn two_hosts_peer() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    // Ends the test harness's `test two_hosts_peer ... ` line: each line below stands alone.
    println!();
    match role.as_str() {
        // The example services over netless in the host's socket directory, until killed.
        "backend" => {
            let observer = std::sync::Arc::new(|_event: String| {});
            let _serving = netless_grpc::GrpcServer::new()
                .add_service(GreeterServer::new(MyGreeter))
                .add_service(RouteGuideServer::new(RouteGuideService::new(
                    1000, observer,
                )))
                .serve()
                .unwrap();
            println!("READY backend");
            loop {
                std::thread::sleep(Duration::from_secs(1));
            }
        }
        // Both suites through `Channel::target(TARGET)`.
        "suite" => {
            let target = std::env::var(TARGET).unwrap();
            let runtime = tokio::runtime::Runtime::new().unwrap();
            runtime.block_on(async {
                let routeguide = netless_grpc::Channel::target(&target).unwrap();
                println!("LOCATION {:?}", routeguide.location());
                checks::routeguide(RouteGuideClient::new(routeguide), &target).await;
                let greeter = netless_grpc::Channel::target("helloworld.Greeter").unwrap();
                checks::greeter(GreeterClient::new(greeter), &target).await;
            });
            println!("PASS");
        }
        // The business logic: both suites by service name through this host's gateway,
        // then the sockets it holds.
        "business" => {
            let runtime = tokio::runtime::Runtime::new().unwrap();
            runtime.block_on(async {
                let routeguide = netless_grpc::Channel::connect("routeguide.RouteGuide").unwrap();
                checks::routeguide(RouteGuideClient::new(routeguide), "egress").await;
                let greeter = netless_grpc::Channel::connect("helloworld.Greeter").unwrap();
                checks::greeter(GreeterClient::new(greeter), "egress").await;
            });
            let pid = std::process::id();
            let held = netless_testing::sockets::sockets_of(pid).unwrap();
            let others = netless_testing::sockets::non_unix_sockets(pid).unwrap();
            println!("SOCKETS held={} not_unix={}", held.len(), others.len());
            println!("PASS");
        }
        // A call every 50 ms for at most a minute, each outcome on a line.
        "loop" => {
            let runtime = tokio::runtime::Runtime::new().unwrap();
            runtime.block_on(async {
                let channel = netless_grpc::Channel::connect("routeguide.RouteGuide").unwrap();
                let mut client = RouteGuideClient::new(channel);
                for _ in 0..1200 {
                    let mut request = tonic::Request::new(grid_point(7));
                    request.set_timeout(Duration::from_secs(2));
                    match client.get_feature(request).await {
                        Ok(_) => println!("OK"),
                        Err(status) => println!("ERR {:?} {}", status.code(), status.message()),
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            });
        }
        memnode => {
            let runtime = tokio::runtime::Runtime::new().unwrap();
            runtime.block_on(memnode_role(memnode));
        }
    }
}

fn hosts(tag: &str) -> Option<TwoHosts> {
    match TwoHosts::new(tag) {
        Ok(hosts) => Some(hosts),
        Err(why) => {
            println!("SKIPPED: {why}");
            None
        }
    }
}

/// This test binary on `host` in role `role`, with `env`.
fn peer(host: &Host, role: &str, env: &[(&str, &str)]) -> std::process::Command {
    let mut command = host.command(std::env::current_exe().unwrap());
    command
        .args(["--exact", "two_hosts_peer", "--ignored", "--nocapture"])
        .args(["--test-threads=1"])
        .env(ROLE, role)
        // Where a name goes is the test's to say, not the environment it runs in.
        .env_remove("NETLESS_TARGETS")
        .env_remove("NETLESS_TLS_CA")
        .envs(env.iter().copied());
    command
}

fn start_backend(host: &Host) -> Proc {
    let mut backend = Proc::spawn_command(peer(host, "backend", &[]), "backend");
    backend.wait_for_line("READY backend", PATIENCE);
    backend
}

/// `netless gateway` on `host`, listening on its address, with `args`.
fn start_gateway(host: &Host, args: &[&str]) -> Proc {
    let listen = format!("{}:{PORT}", host.addr);
    let mut gateway = host.spawn(BIN, &[&["gateway", "--listen", &listen][..], args].concat());
    gateway.wait_for_line("LISTENING", PATIENCE);
    gateway
}

fn remote(host: &Host) -> String {
    format!("http://{}:{PORT}", host.addr)
}

/// Runs a peer to its end and checks that it printed `PASS`.
fn passes(command: std::process::Command, what: &str) -> String {
    let out = Proc::spawn_command(command, what).finish(PATIENCE);
    assert!(
        out.status.success() && out.stdout.contains("\nPASS"),
        "{}",
        out.describe()
    );
    out.stdout
}

#[test]
fn the_same_client_reaches_its_host_and_the_other_by_target_name() {
    let Some(hosts) = hosts("by-name") else {
        return;
    };
    let _local = start_backend(&hosts.a);
    let _remote = start_backend(&hosts.b);
    let _gateway_b = start_gateway(
        &hosts.b,
        &["--allow", "routeguide.*", "--allow", "helloworld.*"],
    );

    // No table: the name is the service on this host.
    let target = [(TARGET, "routeguide.RouteGuide")];
    let stdout = passes(peer(&hosts.a, "suite", &target), "suite, local");
    assert!(stdout.contains("LOCATION Local"), "{stdout}");

    // The same binary and target, with a table naming the other host's gateway.
    let table = hosts.a.dir.path.join("targets");
    std::fs::write(
        &table,
        format!(
            "# the services of host B\nrouteguide.RouteGuide {b}\nhelloworld.* {b}\n",
            b = remote(&hosts.b)
        ),
    )
    .unwrap();
    let table = table.to_str().unwrap();
    let mut command = peer(&hosts.a, "suite", &target);
    command.env("NETLESS_TARGETS", table);
    let stdout = passes(command, "suite, remote");
    assert!(stdout.contains("LOCATION Remote"), "{stdout}");
}

#[test]
fn business_logic_reaches_the_other_host_through_its_gateway_without_a_socket() {
    let Some(hosts) = hosts("egress") else { return };
    let _backend_b = start_backend(&hosts.b);
    let _gateway_b = start_gateway(
        &hosts.b,
        &["--allow", "routeguide.*", "--allow", "helloworld.*"],
    );
    let b = remote(&hosts.b);
    let egress_routeguide = format!("routeguide.RouteGuide={b}");
    let egress_greeter = format!("helloworld.Greeter={b}");
    let _gateway_a = start_gateway(
        &hosts.a,
        &[
            "--allow",
            "none.None",
            "--egress",
            &egress_routeguide,
            "--egress",
            &egress_greeter,
        ],
    );
    // The business logic shares host A's socket directory and nothing of its network: a
    // namespace of its own, with no interface but a loopback that is down.
    let mut command = peer(&hosts.a, "business", &[]);
    // SAFETY: runs in the forked child before `exec` (after the host's setns): one system
    // call, unshare.
    unsafe {
        command.pre_exec(|| {
            if libc::unshare(libc::CLONE_NEWNET) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let stdout = passes(command, "business logic");
    let sockets = stdout
        .lines()
        .find_map(|l| l.strip_prefix("SOCKETS "))
        .unwrap_or_else(|| panic!("no SOCKETS line: {stdout}"));
    assert!(sockets.ends_with(" not_unix=0"), "{sockets}");
    assert!(
        !sockets.starts_with("held=0 "),
        "it holds its netless connections: {sockets}"
    );
}

#[test]
fn python_grpcio_on_one_host_calls_the_other_hosts_gateway() {
    let Some(hosts) = hosts("python") else { return };
    let _backend_b = start_backend(&hosts.b);
    let _gateway_b = start_gateway(
        &hosts.b,
        &["--allow", "routeguide.*", "--allow", "helloworld.*"],
    );
    let out_dir = netless_testing::TestDir::new("py-two-hosts");
    let workspace = common::interop::workspace();
    let mut command = hosts.a.command(common::interop::python());
    command
        .arg(workspace.join("crates/netless-cli/tests/interop/client.py"))
        .arg(format!("{}:{PORT}", hosts.b.addr))
        .arg(workspace.join("examples/proto"))
        .arg(&out_dir.path);
    let out = Proc::spawn_command(command, "python client").finish(PATIENCE);
    assert!(out.status.success(), "{}", out.describe());
    assert!(out.stdout.contains("PASS"), "{}", out.describe());
}

#[test]
fn killing_the_other_hosts_gateway_gives_unavailable_then_recovery() {
    let Some(hosts) = hosts("kill") else { return };
    let _backend_b = start_backend(&hosts.b);
    let ingress = ["--allow", "routeguide.*"];
    let mut gateway_b = start_gateway(&hosts.b, &ingress);
    let egress = format!("routeguide.RouteGuide={}", remote(&hosts.b));
    let _gateway_a = start_gateway(&hosts.a, &["--allow", "none.None", "--egress", &egress]);
    let mut caller = Proc::spawn_command(peer(&hosts.a, "loop", &[]), "caller");
    caller.wait_for_line("OK", PATIENCE);
    gateway_b.kill();
    let failure = caller.wait_for_line("ERR", PATIENCE);
    assert!(failure.starts_with("Unavailable"), "{failure}");
    // Its calls keep failing fast, not hanging: a hung call would end `DeadlineExceeded`
    // after its 2 s, and ten would take 20 s.
    let started = std::time::Instant::now();
    for _ in 0..10 {
        let failure = caller.wait_for_line("ERR", PATIENCE);
        assert!(failure.starts_with("Unavailable"), "{failure}");
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "ten failed calls took {:?}",
        started.elapsed()
    );
    let _gateway_b = start_gateway(&hosts.b, &ingress);
    caller.wait_for_line("OK", PATIENCE);
}

/// What `netless memnode stat --json` on `host` says of the node at `uri`.
fn memnode_stats(host: &Host, uri: &str) -> serde_json::Value {
    host.spawn(BIN, &["memnode", "stat", "--addr", uri, "--json"])
        .finish(PATIENCE)
        .ok()
        .json()
}

#[test]
fn a_remote_callee_writes_copy_on_write_and_dead_hosts_leak_no_page() {
    let Some(hosts) = hosts("memnode") else {
        return;
    };
    let listen = format!("{}:7070", hosts.a.addr);
    let mut node = hosts
        .a
        .spawn(BIN, &["memnode", "--listen", &listen, "--lease", "1s"]);
    node.wait_for_line("LISTENING", PATIENCE);
    let uri = format!("http://{listen}");
    let env = |extra: &[(&'static str, String)]| {
        let mut all = vec![(MEMNODE, uri.clone())];
        all.extend(extra.iter().cloned());
        all
    };
    let with = |host: &Host, role: &str, vars: Vec<(&'static str, String)>| {
        let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
        Proc::spawn_command(peer(host, role, &vars), role)
    };

    let mut caller = with(&hosts.a, "caller", env(&[]));
    let reference = caller.wait_for_line("REF", PATIENCE);
    let mut callee = with(&hosts.b, "callee", env(&[(REF, reference.clone())]));
    let published = callee.wait_for_line("PUBLISHED", PATIENCE);
    let check = with(
        &hosts.b,
        "check",
        env(&[(REF, reference), (PUBLISHED, published)]),
    );
    let out = check.finish(PATIENCE);
    assert!(
        out.status.success() && out.stdout.contains("PASS"),
        "{}",
        out.describe()
    );
    // The node shares the 14 pages the callee did not write: 16 + 2.
    let stats = memnode_stats(&hosts.a, &uri);
    assert_eq!(stats["objects"], 2, "{stats}");
    assert_eq!(stats["pages"], 18, "{stats}");

    // Host B vanishes mid-run (its link cut while a holder puts and derives: no reset
    // reaches the node, its sessions just fall silent), then the caller on A is killed.
    let mut holder = with(&hosts.b, "holder", env(&[]));
    holder.wait_for_line("HOLDING", PATIENCE);
    hosts.b.cut_link();
    caller.kill();
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        let stats = memnode_stats(&hosts.a, &uri);
        if stats["objects"] == 0 && stats["pages"] == 0 && stats["sessions"] == 0 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "still held: {stats}");
        std::thread::sleep(Duration::from_millis(200));
    }
}
