//! Socket mode between two containers on one host: a server and a client, each pid 1 of its
//! own pid, mount, IPC and network namespaces, with a private `/tmp`, sharing nothing but
//! the socket directory, which each sees bind-mounted at a path of its own (`NETLESS_DIR`).
//! Calls go through; killing either side by SIGKILL makes the survivor's calls fail with
//! UNAVAILABLE, or frees the dead client's connection; with both in one page-pool domain
//! (its socket in the same directory), large payloads pass by reference, Refs cross between
//! the containers with copy-on-write, and every pool page the dead side held comes back.
//!
//! Making a container needs root: without it the tests say `SKIPPED:` and pass. The peers
//! are this test binary again, running only `container_peer`, driven by line commands.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use common::{test_wait, TestDir, ROLE, SERVICE};
use netless::netless_pool::{Domain, DomainConfig, PoolGeometry, Ref, SharedBuf};
use netless::{CallOptions, Client, Code, Request, ResponseBuilder, Server, Status};

/// Env var: "1" if the peer joins the page-pool domain.
const POOL: &str = "NETLESS_TEST_POOL";
/// How long anything that should be prompt may take on a loaded two-core machine.
const PATIENCE: Duration = Duration::from_secs(30);
/// How long the `Slow` call a dying server never answers sleeps.
const SLOW_MS: u64 = 120_000;
/// A payload over the client's Ref threshold.
const LARGE: usize = 300_000;

// ----- The peers, inside their containers. -----

/// Entry point of the container processes the other tests spawn.
#[test]
#[ignore = "entry point of the container processes the other tests spawn"]
fn container_peer() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let service = std::env::var(SERVICE).unwrap();
    let domain = (std::env::var(POOL).as_deref() == Ok("1")).then(|| {
        let mut config = DomainConfig::new("containers");
        config.geometry = PoolGeometry {
            pages: 2048,
            ref_slots: 256,
        };
        config.join_timeout = PATIENCE;
        Domain::join(&config).unwrap()
    });
    // The host's copy of the shared directory must be out of sight: /tmp is private.
    let host_dir = std::env::var(common::DIR).unwrap();
    say(&format!(
        "ready {} {} {} {} {}",
        std::process::id(),
        namespace("pid"),
        namespace("net"),
        Path::new(&host_dir).exists(),
        domain.as_ref().is_some_and(|d| d.is_coordinator()),
    ));
    match role.as_str() {
        "server" => serve(&service, domain),
        "client" => call(&service, domain),
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

fn pool_stats(domain: &Option<Domain>) -> String {
    domain.as_ref().map_or("none".into(), |d| {
        let s = d.stats();
        format!(
            "{} {} {} {} {}",
            s.members,
            s.free_pages,
            s.held_pages,
            s.pages,
            d.is_coordinator()
        )
    })
}

fn serve(service: &str, domain: Option<Domain>) {
    let in_handler = domain.clone();
    let handler = move |req: &Request<'_>, resp: &mut ResponseBuilder<'_>| -> Result<(), Status> {
        match req.method {
            "Echo" => resp.payload.extend_from_slice(req.payload),
            "Digest" => resp.payload.extend_from_slice(&digest(req.payload)),
            "Slow" => std::thread::sleep(Duration::from_millis(SLOW_MS)),
            // The payload is a Ref to the caller's buffer: map it, then overwrite every
            // byte; reply what it read, then what it wrote.
            "Scribble" => {
                let domain = in_handler.as_ref().ok_or(Status::internal("no domain"))?;
                let mut buf = domain.map(&Ref::from_bytes(req.payload)?)?;
                let before = buf.to_vec();
                buf.write(0, &scribbled(buf.len()))?;
                resp.payload.extend_from_slice(&digest(&before));
                resp.payload.extend_from_slice(&digest(&buf.to_vec()));
            }
            other => return Err(Status::unimplemented(format!("no method {other}"))),
        }
        Ok(())
    };
    let config = netless::ServerConfig {
        workers: 2,
        wait: test_wait(),
        domain: domain.clone(),
        ..netless::ServerConfig::default()
    };
    let server = Server::bind(service, config, handler).unwrap();
    say("serving");
    command_loop(|w| match w[0] {
        "stats" => Ok(format!(
            "{} {}",
            server.stats().connections,
            pool_stats(&domain)
        )),
        other => panic!("unknown command {other}"),
    });
}

fn call(service: &str, domain: Option<Domain>) {
    let config = netless::ClientConfig {
        wait: test_wait(),
        domain: domain.clone(),
        ref_threshold: 16 * 1024,
        ..netless::ClientConfig::default()
    };
    let client = Client::connect_with(service, config).unwrap();
    let opts = CallOptions::new().timeout(Duration::from_secs(60));
    let copied = || domain.as_ref().map_or(0, |d| d.stats().bytes_copied);
    // Buffers kept, so this process holds pool pages when it is killed.
    let mut held: Vec<SharedBuf> = Vec::new();
    command_loop(|w| {
        let num = |i: usize| -> usize { w[i].parse().unwrap() };
        let status = |e: Status| format!("{:?} {e}", e.code());
        match w[0] {
            // A call whose reply must be its payload; answers the bytes the client wrote
            // into the pool for it (the payload, if it went as a Ref).
            "echo" | "digest" => {
                let payload = pattern(num(1) as u64, num(1));
                let before = copied();
                let method = if w[0] == "echo" { "Echo" } else { "Digest" };
                let reply = client.call(method, &payload, &opts).map_err(status)?;
                let want = if w[0] == "echo" {
                    payload
                } else {
                    digest(&payload).to_vec()
                };
                if reply.payload != want {
                    return Err("the reply differs".into());
                }
                Ok((copied() - before).to_string())
            }
            // A buffer of ours passed by reference: the server reads our bytes, then writes
            // its own into its copy, and ours stay as they were.
            "scribble" => {
                let d = domain.as_ref().ok_or("no domain")?;
                let data = pattern(7, num(1));
                let buf = d.alloc_from(&data).map_err(|e| e.to_string())?;
                let r = buf.share().map_err(|e| e.to_string())?;
                let reply = client
                    .call("Scribble", &r.to_bytes(), &opts)
                    .map_err(status)?;
                let mut want = digest(&data).to_vec();
                want.extend_from_slice(&digest(&scribbled(data.len())));
                if reply.payload != want {
                    return Err("the server read or wrote other bytes".into());
                }
                if buf.to_vec() != data {
                    return Err("the caller's buffer changed".into());
                }
                Ok(String::new())
            }
            "hold" => {
                let d = domain.as_ref().ok_or("no domain")?;
                let buf = d.alloc_from(&pattern(9, num(1)));
                held.push(buf.map_err(|e| e.to_string())?);
                Ok(String::new())
            }
            // A call the server never answers in time: how it ended, and after how long.
            "slow" => {
                let start = Instant::now();
                let result = client.call("Slow", b"", &opts);
                let code = result.map_or_else(|e| e.code(), |_| Code::Ok);
                Ok(format!("{code:?} {}", start.elapsed().as_millis()))
            }
            "stats" => Ok(pool_stats(&domain)),
            other => panic!("unknown command {other}"),
        }
    });
}

/// `len` bytes determined by `seed`.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// What the server writes over a buffer of `len` bytes.
fn scribbled(len: usize) -> Vec<u8> {
    pattern(1234, len)
}

/// The payload's length and a checksum.
fn digest(payload: &[u8]) -> [u8; 16] {
    let sum = payload.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&(payload.len() as u64).to_le_bytes());
    out[8..].copy_from_slice(&sum.to_le_bytes());
    out
}

// ----- The host's side. -----

/// A container running `container_peer`, in a process group of its own (killed on drop).
struct Container {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    /// Its pid and namespaces as it sees them, and whether it founded the domain.
    pid: u32,
    pid_ns: u64,
    net_ns: u64,
    founded: bool,
}

impl Container {
    /// Starts `role` in a container that sees `shared` at `/tmp/inside`; `None` (the reason
    /// printed) if this machine cannot make one.
    fn start(shared: &TestDir, inside: &str, role: &str, pool: bool) -> Option<Container> {
        if rustix::process::geteuid().as_raw() != 0 {
            eprintln!("SKIPPED: making a container (namespaces, mounts) needs root");
            return None;
        }
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args([
            "--exact",
            "container_peer",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROLE, role)
        .env(SERVICE, "test.Containers")
        .env(POOL, if pool { "1" } else { "0" })
        .env(common::DIR, shared.path())
        .env("NETLESS_DIR", format!("/tmp/{inside}"))
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
        let mut c = Container {
            child,
            stdin,
            lines,
            pid: 0,
            pid_ns: 0,
            net_ns: 0,
            founded: false,
        };
        let ready = c.line();
        let w: Vec<&str> = ready.split_whitespace().collect();
        assert_eq!(w[0], "ready", "the container did not start: {ready}");
        c.pid = w[1].parse().unwrap();
        c.pid_ns = w[2].parse().unwrap();
        c.net_ns = w[3].parse().unwrap();
        assert_eq!(w[4], "false", "the container sees the host's /tmp");
        c.founded = w[5] == "true";
        assert_eq!(c.pid, 1, "the peer is pid 1 of its container");
        assert_ne!(c.pid_ns, namespace("pid"), "the container has its own pids");
        assert_ne!(
            c.net_ns,
            namespace("net"),
            "the container has its own network"
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

    /// Sends a command without waiting for its answer.
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

    /// The answer to the command sent last, which must have succeeded: what follows `ok`.
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

    /// The pool as the peer sees it: (members, free, held, pages, coordinates), after
    /// `skip` words (the server's connection count).
    fn pool(&mut self, skip: usize) -> (usize, usize, usize, usize, bool) {
        let s = self.ok("stats");
        let w: Vec<&str> = s.split_whitespace().skip(skip).collect();
        let n = |i: usize| w[i].parse::<usize>().unwrap();
        (n(0), n(1), n(2), n(3), w[4] == "true")
    }

    /// The server's live connections.
    fn connections(&mut self) -> u32 {
        let s = self.ok("stats");
        s.split_whitespace().next().unwrap().parse().unwrap()
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

/// Polls `cond` until it holds; panics with `what` after [`PATIENCE`].
fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The client's `slow` call, cut short by its server's death: it must end UNAVAILABLE, and
/// long before the server would have answered.
fn assert_cut_short_by_death(answer: &str) {
    let (code, ms) = answer.split_once(' ').unwrap();
    assert_eq!(code, "Unavailable", "the call in flight ended {answer}");
    let ms: u64 = ms.parse().unwrap();
    assert!(
        ms < PATIENCE.as_millis() as u64,
        "the call in flight took {ms} ms to fail"
    );
}

/// A call by a client whose server died fails UNAVAILABLE.
fn assert_unavailable(client: &mut Container) {
    client.send("echo 10");
    let answer = client.line();
    assert!(
        answer.starts_with("err Unavailable"),
        "a call to a dead server ended {answer}"
    );
}

#[test]
fn calls_cross_containers_that_share_only_the_socket_directory() {
    let shared = TestDir::new("containers");
    let Some(mut server) = Container::start(&shared, "sockets", "server", false) else {
        return;
    };
    let Some(mut client) = Container::start(&shared, "run-netless", "client", false) else {
        return;
    };
    assert_ne!(client.pid_ns, server.pid_ns);
    assert_ne!(client.net_ns, server.net_ns);
    for len in [0, 100, 64 * 1024, 1 << 20] {
        assert_eq!(client.ok(&format!("echo {len}")), "0");
    }
    assert_eq!(server.connections(), 1);

    // The client dies: the server frees its connection and serves the next.
    client.kill();
    eventually("the server freed the dead client's connection", || {
        server.connections() == 0
    });
    let mut client = Container::start(&shared, "elsewhere", "client", false).unwrap();
    assert_eq!(client.ok("echo 1000"), "0");

    // The server dies with a call in flight: it fails UNAVAILABLE at once, and so do the
    // calls after it.
    client.send("slow");
    std::thread::sleep(Duration::from_millis(300));
    server.kill();
    assert_cut_short_by_death(&client.answer());
    assert_unavailable(&mut client);
}

/// Both containers in one domain: (server, client), the server coordinating it.
fn domain_pair(shared: &TestDir) -> Option<(Container, Container)> {
    let server = Container::start(shared, "sockets", "server", true)?;
    let client = Container::start(shared, "run-netless", "client", true)?;
    assert!(server.founded && !client.founded);
    Some((server, client))
}

#[test]
fn containers_in_one_domain_share_pool_pages_with_copy_on_write() {
    let shared = TestDir::new("containers-pool");
    let Some((mut server, mut client)) = domain_pair(&shared) else {
        return;
    };
    assert_eq!(server.pool(1).0, 2, "both containers are members");
    assert_eq!(client.ok("echo 1000"), "0");
    // A buffer of the client's, passed by Ref: the server reads its bytes in place, and
    // its writes go to pages of its own.
    for len in [100, 3 * 4096 + 5, LARGE] {
        client.ok(&format!("scribble {len}"));
    }
    // A large payload goes by reference: the client proved its membership to the server,
    // with no pid that either could make sense of.
    assert_eq!(client.ok(&format!("digest {LARGE}")), LARGE.to_string());
    assert_eq!(client.ok("digest 1000"), "0", "a small one by value");
}

#[test]
fn a_dead_containers_pool_pages_come_back_and_its_peer_sees_it_die() {
    let shared = TestDir::new("containers-kill");
    let Some((mut server, mut client)) = domain_pair(&shared) else {
        return;
    };
    client.ok(&format!("hold {LARGE}"));
    client.ok(&format!("scribble {LARGE}"));
    assert!(client.pool(0).2 > 0, "the client holds pages");

    // The client dies: the server (the coordinator) frees its connection and reaps its pages.
    client.kill();
    eventually("the dead client's connection and pages are freed", || {
        let (members, free, held, pages, _) = server.pool(1);
        server.connections() == 0 && members == 1 && free + held == pages
    });

    // Another client; then the server dies with a call in flight: the call fails
    // UNAVAILABLE, the client takes the domain over and reaps the server's pages.
    let mut client = Container::start(&shared, "elsewhere", "client", true).unwrap();
    client.ok(&format!("hold {LARGE}"));
    assert_eq!(client.ok("echo 1000"), "0");
    assert_eq!(client.ok(&format!("digest {LARGE}")), LARGE.to_string());
    assert!(server.pool(1).2 > 0, "the server holds pages");
    client.send("slow");
    std::thread::sleep(Duration::from_millis(300));
    server.kill();
    assert_cut_short_by_death(&client.answer());
    assert_unavailable(&mut client);
    eventually(
        "the client took over and the dead server's pages are back",
        || {
            let (members, free, held, pages, coordinates) = client.pool(0);
            coordinates && members == 1 && free + held == pages
        },
    );
}
