//! A memory fabric between two containers on one host: a server and a client, each pid 1 of
//! its own pid, mount, IPC and network namespaces with a private `/tmp`, sharing one
//! directory that holds nothing but the fabric's region file (each sees it at a path of its
//! own). Their socket directories (`NETLESS_DIR`) are private to each container, so a call
//! that goes through went through the region. Calls of every size go through; SIGKILL of the
//! server fails the client's calls UNAVAILABLE within the region's lease; SIGKILL of the
//! client frees its connection, its receive-buffer blocks and, a few leases on, the region
//! memory it held.
//!
//! Making a container needs root: without it the tests say `SKIPPED:` and pass. The peers
//! are this test binary again, running only `fabric_container_peer`, driven by line commands.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{test_handler, test_wait, TestDir, ROLE, SERVICE};
use netless::fabric::{Coherence, Fabric, FabricOptions};
use netless::netless_pool::{Domain, DomainConfig, PoolGeometry};
use netless::{CallOptions, Client, ClientConfig, Server, ServerConfig, Status};

/// Env var: the region's path as the peer sees it.
const FABRIC: &str = "NETLESS_TEST_FABRIC";
/// Env var: `software` for a software-coherent region (made so by the server, which opens
/// it first).
const COHERENCE: &str = "NETLESS_TEST_COHERENCE";
/// The region's file name in the shared directory.
const REGION: &str = "region";
/// The socket directory each container has to itself (on its private `/tmp`).
const PRIVATE_DIR: &str = "/tmp/netless-private";
/// How long anything that should be prompt may take on a loaded two-core machine.
const PATIENCE: Duration = Duration::from_secs(30);

// ----- The peers, inside their containers. -----

/// Entry point of the container processes the other tests spawn.
#[test]
#[ignore = "entry point of the container processes the other tests spawn"]
fn fabric_container_peer() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let service = std::env::var(SERVICE).unwrap();
    let path = std::env::var(FABRIC).unwrap();
    // The host's copy of the shared directory must be out of sight: /tmp is private.
    let host_dir = std::env::var(common::DIR).unwrap();
    let software = std::env::var(COHERENCE).is_ok_and(|c| c == "software");
    let fabric = Fabric::open(
        Path::new(&path),
        &FabricOptions {
            size: 64 << 20,
            coherence: if software {
                Coherence::Software
            } else {
                Coherence::Hardware
            },
            ..FabricOptions::default()
        },
    )
    .unwrap();
    // Both containers in one page pool, in the region: large payloads go by reference.
    let mut pool = DomainConfig::new("containers");
    pool.geometry = PoolGeometry {
        pages: 4096,
        ref_slots: 256,
    };
    let domain = Domain::join_fabric(&pool, &fabric).unwrap();
    say(&format!(
        "ready {} {} {} {} {}",
        std::process::id(),
        namespace("pid"),
        namespace("net"),
        Path::new(&host_dir).exists(),
        Path::new(PRIVATE_DIR).exists(),
    ));
    match role.as_str() {
        "server" => serve(&service, &fabric, &domain),
        "client" => call(&service, &fabric, &domain),
        other => panic!("unknown role {other}"),
    }
}

/// The inode of this process's namespace of `kind`.
fn namespace(kind: &str) -> u64 {
    rustix::fs::stat(format!("/proc/self/ns/{kind}").as_str()).map_or(0, |st| st.st_ino)
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "@@{line}").unwrap();
    out.flush().unwrap();
}

/// Milliseconds since the epoch: one clock for every namespace of a kernel.
fn unix_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

/// Runs each line of stdin through `exec` until `exit` or EOF, answering `ok ...` or `err ...`.
fn command_loop(mut exec: impl FnMut(&[&str]) -> Result<String, String>) {
    for line in std::io::stdin().lock().lines() {
        let line = line.unwrap();
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.first() == Some(&"exit") {
            break;
        }
        match exec(&words) {
            Ok(out) => say(&format!("ok {out}")),
            Err(e) => say(&format!("err {e}")),
        }
    }
}

fn serve(service: &str, fabric: &Fabric, domain: &Domain) {
    let config = ServerConfig {
        workers: 2,
        wait: test_wait(),
        fabric: Some(fabric.clone()),
        domain: Some(domain.clone()),
        ..ServerConfig::default()
    };
    let server = Server::bind(service, config, test_handler).unwrap();
    say("serving");
    command_loop(|w| match w[0] {
        // Connections, free and total receive-buffer blocks, and the region's free bytes.
        "stats" => {
            let s = server.stats();
            Ok(format!(
                "{} {} {} {}",
                s.connections,
                s.free_blocks,
                s.total_blocks,
                fabric.free_bytes()
            ))
        }
        other => panic!("unknown command {other}"),
    });
}

fn call(service: &str, fabric: &Fabric, domain: &Domain) {
    let config = || ClientConfig {
        wait: test_wait(),
        fabric: Some(fabric.clone()),
        domain: Some(domain.clone()),
        ref_threshold: 16 * 1024,
        ..ClientConfig::default()
    };
    let client = Client::connect_with(service, config()).unwrap();
    let opts = CallOptions::new().timeout(Duration::from_secs(60));
    let status = |e: Status| format!("{:?} {e}", e.code());
    command_loop(|w| {
        let echo = |len: usize| -> Result<(), String> {
            let payload: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let reply = client.call("Echo", &payload, &opts).map_err(status)?;
            if reply.payload != payload {
                return Err("the reply differs".into());
            }
            Ok(())
        };
        match w[0] {
            "echo" => echo(w[1].parse().unwrap()).map(|()| String::new()),
            // An echo whose payload must go by reference: written into the pool once, and
            // its Ref mapped by the server (nothing outstanding after).
            "byref" => {
                let len: usize = w[1].parse().unwrap();
                let before = domain.stats().bytes_copied;
                echo(len)?;
                let stats = domain.stats();
                if stats.bytes_copied - before != len as u64 || stats.outstanding_refs != 0 {
                    return Err(format!("not by reference: {stats:?}"));
                }
                Ok(String::new())
            }
            // Calls until one fails (for at most PATIENCE): its code and when, in unix ms.
            "until-fail" => {
                let start = Instant::now();
                while start.elapsed() < PATIENCE {
                    if let Err(e) = client.call("Echo", b"x", &opts) {
                        return Ok(format!("{:?} {} {e}", e.code(), unix_ms()));
                    }
                }
                Err("every call succeeded".into())
            }
            "connect" => Client::connect_with(service, config())
                .map(|_| String::new())
                .map_err(status),
            other => panic!("unknown command {other}"),
        }
    });
}

// ----- The host's side. -----

/// A container running `fabric_container_peer`, in a process group of its own (killed on
/// drop).
struct Container {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

impl Container {
    /// Starts `role` in a container that sees `shared` at `/tmp/inside`; `None` (the reason
    /// printed) if this machine cannot make one.
    fn start(shared: &TestDir, inside: &str, role: &str) -> Option<Container> {
        Container::start_as(shared, inside, role, false)
    }

    /// As [`Container::start`], in a software-coherent region if `software`.
    fn start_as(shared: &TestDir, inside: &str, role: &str, software: bool) -> Option<Container> {
        if rustix::process::geteuid().as_raw() != 0 {
            eprintln!("SKIPPED: making a container (namespaces, mounts) needs root");
            return None;
        }
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args([
            "--exact",
            "fabric_container_peer",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROLE, role)
        .env(SERVICE, "test.FabricContainers")
        .env(FABRIC, format!("/tmp/{inside}/{REGION}"))
        .env(COHERENCE, if software { "software" } else { "hardware" })
        .env(common::DIR, shared.path())
        .env("NETLESS_DIR", PRIVATE_DIR)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .process_group(0);
        let spawned = netless_testing::in_container(&mut cmd, shared.path(), inside)
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
        let stdin = child.stdin.take();
        let c = Container {
            child,
            stdin,
            lines,
        };
        let ready = c.line();
        let w: Vec<&str> = ready.split_whitespace().collect();
        assert_eq!(w[0], "ready", "the container did not start: {ready}");
        assert_eq!(w[1], "1", "the peer is pid 1 of its container");
        assert_ne!(w[2], namespace("pid").to_string(), "its own pids");
        assert_ne!(w[3], namespace("net").to_string(), "its own network");
        assert_eq!(w[4], "false", "the container sees the host's /tmp");
        assert_eq!(
            w[5], "false",
            "a socket directory appeared in the container"
        );
        if role == "server" {
            assert_eq!(c.line(), "serving");
        }
        Some(c)
    }

    fn line(&self) -> String {
        match self.lines.recv_timeout(PATIENCE) {
            Ok(line) => line,
            Err(e) => panic!("container {} did not answer: {e:?}", self.child.id()),
        }
    }

    fn send(&mut self, command: &str) {
        let stdin = self.stdin.as_mut().expect("container still running");
        writeln!(stdin, "{command}").unwrap();
        stdin.flush().unwrap();
    }

    /// Runs a command that must succeed; returns what follows `ok`.
    fn ok(&mut self, command: &str) -> String {
        self.send(command);
        self.answer()
    }

    /// The answer to the command sent last, which must have succeeded.
    fn answer(&self) -> String {
        let answer = self.line();
        match answer.strip_prefix("ok") {
            Some(rest) => rest.trim().to_owned(),
            None => panic!(
                "a command failed in container {}: {answer}",
                self.child.id()
            ),
        }
    }

    /// The server's (connections, free blocks, total blocks, region bytes free).
    fn stats(&mut self) -> (u64, u64, u64, u64) {
        let s = self.ok("stats");
        let n: Vec<u64> = s.split_whitespace().map(|w| w.parse().unwrap()).collect();
        (n[0], n[1], n[2], n[3])
    }

    /// SIGKILL to its whole process group (the peer is the waiting parent's child).
    fn kill(&mut self) {
        self.stdin = None;
        let group = rustix::process::Pid::from_child(&self.child);
        let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
        let _ = self.child.wait();
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The names in `dir`.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// The shared directory holds the region and nothing else.
fn assert_only_the_region(shared: &TestDir) {
    assert_eq!(listing(shared.path()), vec![REGION.to_string()]);
}

#[test]
fn calls_cross_containers_that_share_only_a_fabric_file() {
    calls_cross_containers(false);
}

#[test]
fn software_coherent_calls_cross_containers_that_share_only_a_fabric_file() {
    calls_cross_containers(true);
}

fn calls_cross_containers(software: bool) {
    let shared = TestDir::new("fabric-ct");
    let Some(_server) = Container::start_as(&shared, "fabric", "server", software) else {
        return;
    };
    let Some(mut client) = Container::start_as(&shared, "elsewhere", "client", software) else {
        return;
    };
    for len in [0, 1, 100, 4096, 64 * 1024, 300_000, 1 << 20] {
        client.ok(&format!("echo {len}"));
    }
    for len in [16 * 1024, 300_000, 1 << 20] {
        client.ok(&format!("byref {len}"));
    }
    assert_only_the_region(&shared);
}

#[test]
fn a_killed_server_fails_the_clients_calls_within_the_lease() {
    killed_server(false);
}

#[test]
fn a_killed_software_coherent_server_fails_the_clients_calls_within_the_lease() {
    killed_server(true);
}

fn killed_server(software: bool) {
    let shared = TestDir::new("fabric-ct-ks");
    let Some(mut server) = Container::start_as(&shared, "fabric", "server", software) else {
        return;
    };
    let Some(mut client) = Container::start_as(&shared, "elsewhere", "client", software) else {
        return;
    };
    client.ok("echo 1000");
    // Calls back to back while the server dies.
    client.send("until-fail");
    std::thread::sleep(Duration::from_millis(300));
    let killed = unix_ms();
    server.kill();
    let answer = client.answer();
    let w: Vec<&str> = answer.split_whitespace().collect();
    assert_eq!(w[0], "Unavailable", "{answer}");
    let took = Duration::from_millis(w[1].parse::<u64>().unwrap().saturating_sub(killed as u64));
    // The region's liveness token (a lock byte the kernel drops with the process) tells the
    // client at once; the lease is the bound that holds across kernels too.
    let bound = netless::fabric::DEFAULT_LEASE + Duration::from_millis(1000);
    eprintln!("the client's calls failed {took:?} after the server was killed");
    assert!(took < bound, "took {took:?} (bound {bound:?}): {answer}");
    // And so do the calls after it, and a new connection finds no service.
    client.send("echo 10");
    let again = client.line();
    assert!(again.starts_with("err Unavailable"), "{again}");
    client.send("connect");
    let connect = client.line();
    assert!(connect.starts_with("err Unavailable"), "{connect}");
    assert!(connect.contains("not found in the fabric"), "{connect}");
    assert_only_the_region(&shared);
}

#[test]
fn a_killed_clients_connection_blocks_and_region_memory_come_back() {
    let shared = TestDir::new("fabric-ct-kc");
    let Some(mut server) = Container::start(&shared, "fabric", "server") else {
        return;
    };
    let (_, _, _, free_before) = server.stats();
    let Some(mut client) = Container::start(&shared, "elsewhere", "client") else {
        return;
    };
    client.ok("echo 300000");
    let (connections, _, _, free_with_client) = server.stats();
    assert_eq!(connections, 1);
    assert!(
        free_with_client < free_before,
        "the client's connection segment is in the region"
    );
    // A large call in flight when the client dies holds receive-buffer blocks.
    client.send(&format!("echo {}", 1 << 20));
    client.kill();
    let killed = Instant::now();
    let deadline = killed + PATIENCE;
    loop {
        let (connections, free, total, _) = server.stats();
        if connections == 0 && free == total {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the dead client's connection or blocks stayed: {connections} connections, \
             {free} of {total} blocks free"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!(
        "the dead client's connection was freed in {:?}",
        killed.elapsed()
    );
    // Its region memory comes back two leases after it is seen dead.
    loop {
        let (_, _, _, free) = server.stats();
        if free == free_before {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the region holds {} bytes less than before the client came",
            free_before - free
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let took = killed.elapsed();
    eprintln!("the dead client's region memory came back in {took:?}");
    let bound = 2 * netless::fabric::DEFAULT_LEASE + Duration::from_secs(3);
    assert!(took < bound, "took {took:?} (bound {bound:?})");
    // A new client is served.
    let mut client = Container::start(&shared, "again", "client").unwrap();
    client.ok("echo 1000");
    assert_only_the_region(&shared);
}
