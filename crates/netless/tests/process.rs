//! Multi-process tests of the RPC runtime: real processes, real memfd segments, real sockets.
//!
//! Each test that needs a peer spawns this test binary again, running only
//! `child_process_entry` with a role in the environment.

mod common;

use std::io::{BufReader, Read, Write};
use std::process::Child;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use netless::fault::{inject, ClientFault};
use netless::{CallOptions, Client, Code, Server, ServerConfig, Slo};

/// Entry point of spawned peers (run only by them, via `--ignored`).
#[test]
#[ignore = "entry point of the peer processes the other tests spawn"]
fn child_process_entry() {
    let Some((role, dir, service)) = role() else {
        return;
    };
    match role.as_str() {
        // Serve the test service until stdin closes.
        "server" | "garbage-server-header" | "garbage-server-scribble" => {
            let server = Server::bind(&service, server_config(&dir), test_handler).unwrap();
            match role.as_str() {
                "garbage-server-header" => server.fault_corrupt_responses(1),
                "garbage-server-scribble" => server.fault_corrupt_responses(2),
                _ => {}
            }
            println!("READY");
            std::io::stdout().flush().unwrap();
            let mut sink = Vec::new();
            let _ = std::io::stdin().read_to_end(&mut sink);
            drop(server);
        }
        // A server with `workers` and wait `mode` from the role name: server-<workers>-<mode>.
        configured if configured.starts_with("server-") => {
            let mut parts = configured.split('-').skip(1);
            let workers: usize = parts.next().unwrap().parse().unwrap();
            let mode: netless::WaitMode = parts.next().unwrap().parse().unwrap();
            let wait = netless::WaitPolicy {
                mode,
                spin: Duration::from_micros(5),
            };
            let config = netless::ServerConfig {
                workers,
                wait,
                ..server_config(&dir)
            };
            let _server = Server::bind(&service, config, test_handler).unwrap();
            println!("READY");
            std::io::stdout().flush().unwrap();
            let mut sink = Vec::new();
            let _ = std::io::stdin().read_to_end(&mut sink);
        }
        // Connect, make calls, then keep a slow call in flight until killed.
        "doomed-client" => {
            let client = Client::connect_with(&service, client_config(&dir)).unwrap();
            for _ in 0..50 {
                client
                    .call("Echo", &[7u8; 3000], &CallOptions::new())
                    .unwrap();
            }
            let c2 = client.clone();
            thread::spawn(move || c2.call("Slow", &300u64.to_le_bytes(), &CallOptions::new()));
            thread::sleep(Duration::from_millis(50));
            println!("READY");
            std::io::stdout().flush().unwrap();
            thread::sleep(Duration::from_secs(60));
        }
        // Connect, make one call, then sit idle.
        "idle-client" => {
            let client = Client::connect_with(&service, client_config(&dir)).unwrap();
            client.call("Echo", b"x", &CallOptions::new()).unwrap();
            println!("READY");
            std::io::stdout().flush().unwrap();
            let mut sink = Vec::new();
            let _ = std::io::stdin().read_to_end(&mut sink);
        }
        // Misbehave, then report whether the server closed our connection.
        fault if fault.starts_with("fault-") => {
            let kind = match fault {
                "fault-bad-length" => ClientFault::BadLength,
                "fault-bad-offset" => ClientFault::BadOffset,
                "fault-foreign-blocks" => ClientFault::ForeignBlocks,
                "fault-huge-body" => ClientFault::HugeBody,
                "fault-bad-kind" => ClientFault::BadKind,
                "fault-stale-head" => ClientFault::StaleHead,
                "fault-bad-compact-batch" => ClientFault::BadCompactBatch,
                "fault-bad-same-method" => ClientFault::BadSameMethod,
                "fault-bad-short-header" => ClientFault::BadShortHeader,
                "fault-plain-batch" => ClientFault::PlainBatch,
                _ => ClientFault::GarbageQueue,
            };
            let client = Client::connect_with(&service, client_config(&dir)).unwrap();
            client.call("Echo", b"before", &CallOptions::new()).unwrap();
            inject(&client, kind);
            if kind == ClientFault::StaleHead {
                // Nothing for the server to close: it should just recover.
                return;
            }
            let start = Instant::now();
            while !client.is_closed() && start.elapsed() < Duration::from_secs(5) {
                thread::sleep(Duration::from_millis(5));
            }
            println!("CLOSED={}", client.is_closed());
            std::io::stdout().flush().unwrap();
        }
        // Hammer the service from several threads with varied sizes (some fragmented),
        // checking every reply, until killed or done.
        "hammer-client" => {
            let client = Client::connect_with(&service, client_config(&dir)).unwrap();
            println!("READY");
            std::io::stdout().flush().unwrap();
            let threads: Vec<_> = (0..3u64)
                .map(|t| {
                    let client = client.clone();
                    thread::spawn(move || {
                        let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (t + 1);
                        for i in 0..400u64 {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            let size = match x % 10 {
                                0 => (x >> 8) as usize % 300_000,
                                1..=3 => (x >> 8) as usize % 5_000,
                                _ => (x >> 8) as usize % 200,
                            };
                            let payload: Vec<u8> =
                                (0..size).map(|k| (k as u64 ^ i) as u8).collect();
                            let method = if x.is_multiple_of(2) {
                                "Echo"
                            } else {
                                "EchoRef"
                            };
                            let reply = call_retrying(&client, method, &payload);
                            assert_eq!(reply.payload, payload);
                        }
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap();
            }
            println!("DONE");
        }
        other => panic!("unknown role {other}"),
    }
}

struct Peer {
    child: Child,
    _stdout: BufReader<std::process::ChildStdout>,
}

impl Peer {
    fn start(role: &str, dir: &TestDir, service: &str) -> Peer {
        let mut child = spawn_role("child_process_entry", role, dir.path(), service);
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        wait_for_line(&mut stdout, "READY");
        Peer {
            child,
            _stdout: stdout,
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn connect(dir: &TestDir, service: &str) -> Client {
    Client::connect_with(service, client_config(dir.path())).unwrap()
}

#[test]
fn calls_across_processes_carry_payload_metadata_and_status() {
    let dir = TestDir::new("calls");
    let _server = Peer::start("server", &dir, "test.Calls");
    let client = connect(&dir, "test.Calls");
    // Sizes around block, fragment and ring boundaries, up to the 4 MiB default maximum.
    for size in [
        0usize,
        1,
        63,
        64,
        960,
        961,
        4096,
        65_000,
        65_473,
        200_000,
        4 * 1024 * 1024 - 100,
    ] {
        let payload: Vec<u8> = (0..size).map(|i| (i * 7 % 256) as u8).collect();
        for method in ["Echo", "EchoRef"] {
            let reply = client.call(method, &payload, &CallOptions::new()).unwrap();
            assert!(reply.payload == payload, "{method} of {size} bytes differs");
        }
    }
    // Large responses are fragmented through the response ring.
    let reply = client
        .call("Big", &3_000_000u64.to_le_bytes(), &CallOptions::new())
        .unwrap();
    assert_eq!(reply.payload.len(), 3_000_000);
    assert!(reply
        .payload
        .iter()
        .enumerate()
        .all(|(i, &b)| b == (i % 251) as u8));
    // Metadata both ways.
    let opts = CallOptions::new()
        .metadata("echo-trace", "abc")
        .metadata("other", "x");
    let reply = client.call("Echo", b"m", &opts).unwrap();
    assert_eq!(reply.metadata.get("echo-trace"), Some(&b"abc"[..]));
    assert_eq!(reply.metadata.get("other"), None);
    // Status codes and messages.
    let err = client.call("Fail", b"", &CallOptions::new()).unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert_eq!(err.message(), "no such thing");
    let err = client.call("Nope", b"", &CallOptions::new()).unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented);
    // Oversized requests are refused up front.
    let err = client
        .call("Echo", &vec![0u8; 5 * 1024 * 1024], &CallOptions::new())
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert!(err.message().contains("maximum message size"), "{err}");
    // Still healthy.
    assert_eq!(
        client
            .call("Echo", b"ok", &CallOptions::new())
            .unwrap()
            .payload,
        b"ok"
    );
}

#[test]
fn many_threads_share_one_client() {
    let dir = TestDir::new("threads");
    let _server = Peer::start("server", &dir, "test.Threads");
    let client = connect(&dir, "test.Threads");
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let client = client.clone();
            thread::spawn(move || {
                for i in 0..300u32 {
                    let size = ((t * 977 + i * 31) % 3000) as usize;
                    let payload: Vec<u8> = (0..size).map(|k| (k as u32 + t + i) as u8).collect();
                    let reply = client.call("Echo", &payload, &CallOptions::new()).unwrap();
                    assert_eq!(reply.payload, payload);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn async_calls_many_in_flight() {
    let dir = TestDir::new("async");
    let _server = Peer::start("server", &dir, "test.Async");
    let client = connect(&dir, "test.Async");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut tasks = Vec::new();
        for i in 0..200u32 {
            let client = client.clone();
            tasks.push(tokio::spawn(async move {
                let payload = i.to_le_bytes().repeat((i % 50) as usize + 1);
                let reply = client
                    .call_async("Echo", &payload, &CallOptions::new())
                    .await
                    .unwrap();
                assert_eq!(reply.payload, payload);
            }));
        }
        // A large async call goes in fragments.
        let big = vec![9u8; 300_000];
        let reply = client
            .call_async("Echo", &big, &CallOptions::new())
            .await
            .unwrap();
        assert_eq!(reply.payload, big);
        for t in tasks {
            t.await.unwrap();
        }
        // Deadlines apply to async calls too.
        let opts = CallOptions::new().timeout(Duration::from_millis(50));
        let err = client
            .call_async("Slow", &1000u64.to_le_bytes(), &opts)
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::DeadlineExceeded);
    });
}

#[test]
fn deadline_expires_and_connection_survives() {
    let dir = TestDir::new("deadline");
    let _server = Peer::start("server", &dir, "test.Deadline");
    let client = connect(&dir, "test.Deadline");
    let start = Instant::now();
    let opts = CallOptions::new().timeout(Duration::from_millis(100));
    let err = client
        .call("Slow", &2000u64.to_le_bytes(), &opts)
        .unwrap_err();
    let took = start.elapsed();
    assert_eq!(err.code(), Code::DeadlineExceeded);
    assert!(
        took >= Duration::from_millis(100) && took < Duration::from_millis(1500),
        "{took:?}"
    );
    // The other worker still answers while the first sleeps; the late reply is discarded.
    assert_eq!(
        client
            .call("Echo", b"after", &CallOptions::new())
            .unwrap()
            .payload,
        b"after"
    );
}

#[test]
fn unknown_service_is_unavailable_and_names_the_directory() {
    let dir = TestDir::new("unknown");
    let err = Client::connect_with("no.Such", client_config(dir.path())).unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    assert!(err.message().contains("no.Such"), "{err}");
    assert!(
        err.message().contains(&dir.path().display().to_string()),
        "{err}"
    );
}

#[test]
fn server_killed_fails_every_waiting_call_within_100ms() {
    let dir = TestDir::new("kill-server");
    let mut server = Peer::start("server", &dir, "test.Kill");
    let client = connect(&dir, "test.Kill");
    client.call("Echo", b"warm", &CallOptions::new()).unwrap();
    let callers: Vec<_> = (0..4)
        .map(|_| {
            let client = client.clone();
            thread::spawn(move || {
                let opts = CallOptions::new().timeout(Duration::from_secs(30));
                let result = client.call("Slow", &20_000u64.to_le_bytes(), &opts);
                (result, Instant::now())
            })
        })
        .collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let async_call = {
        let client = client.clone();
        thread::spawn(move || {
            let opts = CallOptions::new().timeout(Duration::from_secs(30));
            let r = rt.block_on(client.call_async("Slow", &20_000u64.to_le_bytes(), &opts));
            (r, Instant::now())
        })
    };
    thread::sleep(Duration::from_millis(300));
    sigkill(&server.child);
    let killed_at = Instant::now();
    let _ = server.child.wait();
    for handle in callers.into_iter().chain([async_call].map(|h| {
        thread::spawn(move || {
            let (r, t) = h.join().unwrap();
            (r.map(|_| ()).map(|_| netless::Reply::default()), t)
        })
    })) {
        let (result, failed_at) = handle.join().unwrap();
        let err = result.unwrap_err();
        assert_eq!(err.code(), Code::Unavailable, "{err}");
        let after = failed_at.saturating_duration_since(killed_at);
        assert!(
            after < Duration::from_millis(100),
            "call failed {after:?} after the kill"
        );
    }
    // New calls fail at once, too.
    let err = client.call("Echo", b"x", &CallOptions::new()).unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
}

#[test]
fn client_killed_server_reclaims_and_keeps_serving() {
    let dir = TestDir::new("kill-client");
    let server = Server::bind("test.Reclaim", server_config(dir.path()), test_handler).unwrap();
    let total = server.stats().total_blocks;
    let honest = connect(&dir, "test.Reclaim");
    let mut doomed = Vec::new();
    for _ in 0..3 {
        let mut child = spawn_role(
            "child_process_entry",
            "doomed-client",
            dir.path(),
            "test.Reclaim",
        );
        let mut out = BufReader::new(child.stdout.take().unwrap());
        wait_for_line(&mut out, "READY");
        doomed.push(child);
    }
    assert_eq!(server.stats().connections, 4);
    assert!(server.stats().free_blocks < total);
    for child in &mut doomed {
        sigkill(child);
        let _ = child.wait();
        assert_eq!(
            honest
                .call("Echo", b"still here", &CallOptions::new())
                .unwrap()
                .payload,
            b"still here"
        );
    }
    drop(honest);
    let start = Instant::now();
    loop {
        let stats = server.stats();
        if stats.connections == 0 && stats.free_blocks == total {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "not reclaimed: {stats:?}"
        );
        thread::sleep(Duration::from_millis(10));
    }
    // And it serves new clients.
    let fresh = connect(&dir, "test.Reclaim");
    assert_eq!(
        fresh
            .call("Echo", b"new", &CallOptions::new())
            .unwrap()
            .payload,
        b"new"
    );
}

/// Runs a child in `role` to its end and returns what it printed; panics if it failed.
fn run_child(role: &str, dir: &TestDir, service: &str) -> String {
    let mut child = spawn_role("child_process_entry", role, dir.path(), service);
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    assert!(
        child.wait().unwrap().success(),
        "{role} child failed: {out}"
    );
    out
}

#[test]
fn garbage_from_a_client_costs_only_its_connection() {
    let dir = TestDir::new("garbage-client");
    let server = Server::bind("test.Garbage", server_config(dir.path()), test_handler).unwrap();
    let honest = connect(&dir, "test.Garbage");
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let background = {
        let honest = honest.clone();
        let stop = stop.clone();
        thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let payload = n.to_le_bytes();
                let reply = honest.call("Echo", &payload, &CallOptions::new()).unwrap();
                assert_eq!(reply.payload, payload);
                n += 1;
            }
            n
        })
    };
    let attributable = [
        "fault-bad-length",
        "fault-bad-offset",
        "fault-foreign-blocks",
        "fault-huge-body",
        "fault-bad-kind",
        "fault-bad-compact-batch",
        "fault-bad-same-method",
        "fault-bad-short-header",
        "fault-plain-batch",
    ];
    for role in attributable.iter().chain(["fault-garbage-queue"].iter()) {
        let out = run_child(role, &dir, "test.Garbage");
        if attributable.contains(role) {
            assert!(
                out.contains("CLOSED=true"),
                "{role}: connection was not closed: {out}"
            );
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let calls = background.join().unwrap();
    assert!(calls > 0);
    let stats = server.stats();
    assert!(
        stats.protocol_violations >= attributable.len() as u64,
        "{stats:?}"
    );
    assert!(stats.dropped > 0, "{stats:?}");
    assert_eq!(
        honest
            .call("Echo", b"fine", &CallOptions::new())
            .unwrap()
            .payload,
        b"fine"
    );
}

/// A client that rewinds the queue head the server publishes makes the queue look deeper
/// than the SLO allows, so every client refuses to call and none rings: the server must
/// republish its real head by itself, not sit idle for good.
#[test]
fn a_rewound_queue_head_refuses_calls_only_briefly() {
    let dir = TestDir::new("stale-head");
    let config = ServerConfig {
        slo: Some(Slo::new(Duration::from_millis(10)).mean_service(Duration::from_millis(1))),
        ..server_config(dir.path())
    };
    let server = Server::bind("test.StaleHead", config, test_handler).unwrap();
    let limit = u64::from(server.stats().depth_limit);
    assert!(limit > 0);
    let honest = connect(&dir, "test.StaleHead");
    // Enough requests through the queue that a rewound head reads as far over the limit.
    for _ in 0..4 * limit {
        honest.call("Echo", b"x", &CallOptions::new()).unwrap();
    }
    run_child("fault-stale-head", &dir, "test.StaleHead");
    let start = Instant::now();
    let mut refused = 0;
    loop {
        match honest.call("Echo", b"after", &CallOptions::new()) {
            Ok(reply) => {
                assert_eq!(reply.payload, b"after");
                break;
            }
            Err(status) => {
                assert!(status.is_nack(), "{status}");
                refused += 1;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "still refused after {:?} ({refused} NACKs): the server never republished its head",
            start.elapsed()
        );
        thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn garbage_from_a_server_fails_the_call_not_the_client() {
    for role in ["garbage-server-header", "garbage-server-scribble"] {
        let dir = TestDir::new(role);
        let _server = Peer::start(role, &dir, "test.BadServer");
        let client = connect(&dir, "test.BadServer");
        let start = Instant::now();
        let opts = CallOptions::new().timeout(Duration::from_secs(2));
        let err = client.call("Echo", b"hello", &opts).unwrap_err();
        assert!(
            matches!(
                err.code(),
                Code::Internal | Code::DeadlineExceeded | Code::Unavailable
            ),
            "{role}: {err}"
        );
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "{role}: took {:?}",
            start.elapsed()
        );
        // The connection is closed or at least every later call fails cleanly, never hangs.
        let err = client.call("Echo", b"again", &opts).unwrap_err();
        assert_ne!(err.code(), Code::Ok);
    }
}

#[test]
fn acl_refuses_other_users_before_passing_fds() {
    let dir = TestDir::new("acl");
    let config = netless::ServerConfig {
        acl: netless::Acl::new().allow_uid(4_000_000),
        ..server_config(dir.path())
    };
    let _server = Server::bind("test.Acl", config, test_handler).unwrap();
    let err = Client::connect_with("test.Acl", client_config(dir.path())).unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err}");
    assert!(err.message().contains("not allowed"), "{err}");
}

#[test]
fn second_server_for_a_live_service_is_refused() {
    let dir = TestDir::new("dup");
    let _first = Server::bind("test.Dup", server_config(dir.path()), test_handler).unwrap();
    let err = Server::bind("test.Dup", server_config(dir.path()), test_handler).unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists);
}

#[test]
fn full_receive_buffer_fails_fast_with_resource_exhausted() {
    let dir = TestDir::new("full");
    let config = netless::ServerConfig {
        workers: 1,
        block_size: 1024,
        buffer_bytes: Some(4 * 1024),
        ..server_config(dir.path())
    };
    let _server = Server::bind("test.Full", config, test_handler).unwrap();
    let client = connect(&dir, "test.Full");
    let callers: Vec<_> = (0..12)
        .map(|_| {
            let client = client.clone();
            thread::spawn(move || {
                let start = Instant::now();
                let r = client.call("Slow", &200u64.to_le_bytes(), &CallOptions::new());
                (r.map(|_| ()), start.elapsed())
            })
        })
        .collect();
    let results: Vec<_> = callers.into_iter().map(|h| h.join().unwrap()).collect();
    let nacked: Vec<_> = results.iter().filter(|(r, _)| r.is_err()).collect();
    assert!(
        !nacked.is_empty(),
        "4 blocks cannot hold 12 concurrent requests"
    );
    for (r, took) in &nacked {
        let err = r.as_ref().unwrap_err();
        assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
        assert!(*took < Duration::from_millis(150), "NACK took {took:?}");
    }
    assert!(results.iter().any(|(r, _)| r.is_ok()));
}

#[test]
fn idle_server_and_client_use_under_one_percent_of_a_core() {
    let dir = TestDir::new("idle");
    let server = Peer::start("server", &dir, "test.Idle");
    let client = Peer::start("idle-client", &dir, "test.Idle");
    thread::sleep(Duration::from_millis(1000));
    let (s0, c0) = (cpu_time(server.child.id()), cpu_time(client.child.id()));
    let window = Duration::from_secs(2);
    thread::sleep(window);
    let (s1, c1) = (cpu_time(server.child.id()), cpu_time(client.child.id()));
    let limit = window / 100;
    assert!(
        s1 - s0 < limit,
        "idle server used {:?} in {window:?}",
        s1 - s0
    );
    assert!(
        c1 - c0 < limit,
        "idle client used {:?} in {window:?}",
        c1 - c0
    );
}

/// Calls, retrying NACKs with backoff: under load the shared receive buffer may be full for a
/// moment, and failing fast with RESOURCE_EXHAUSTED is how the server says so.
fn call_retrying(client: &Client, method: &str, payload: &[u8]) -> netless::Reply {
    let mut backoff = Duration::from_micros(100);
    let started = Instant::now();
    loop {
        match client.call(method, payload, &CallOptions::new()) {
            Err(e)
                if e.code() == Code::ResourceExhausted
                    && started.elapsed() < Duration::from_secs(20) =>
            {
                thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_millis(20));
            }
            other => return other.unwrap(),
        }
    }
}

#[test]
fn chaos_many_clients_killed_at_random_leak_nothing() {
    let dir = TestDir::new("chaos");
    let server = Server::bind("test.Chaos", server_config(dir.path()), test_handler).unwrap();
    let total = server.stats().total_blocks;
    // The readers stay alive so the children can still print.
    let (mut children, _outputs): (Vec<Child>, Vec<_>) = (0..6)
        .map(|_| {
            let mut child = spawn_role(
                "child_process_entry",
                "hammer-client",
                dir.path(),
                "test.Chaos",
            );
            let mut out = BufReader::new(child.stdout.take().unwrap());
            wait_for_line(&mut out, "READY");
            (child, out)
        })
        .unzip();
    // Kill half of them at staggered moments while all of them are mid-call.
    for (k, child) in children.iter_mut().enumerate().filter(|(k, _)| k % 2 == 0) {
        thread::sleep(Duration::from_millis(40 + 30 * k as u64));
        sigkill(child);
    }
    let honest = connect(&dir, "test.Chaos");
    for size in [10usize, 3000, 100_000] {
        let payload = vec![5u8; size];
        assert_eq!(call_retrying(&honest, "Echo", &payload).payload, payload);
    }
    // The survivors finish with every reply correct.
    for (k, child) in children.iter_mut().enumerate() {
        let status = child.wait().unwrap();
        if k % 2 == 1 {
            assert!(status.success(), "surviving client {k} failed: {status}");
        }
    }
    drop(honest);
    let start = Instant::now();
    loop {
        let stats = server.stats();
        if stats.connections == 0 && stats.free_blocks == total {
            assert_eq!(stats.protocol_violations, 0, "{stats:?}");
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "leaked: {stats:?}"
        );
        thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn single_worker_and_pure_futex_modes_serve_concurrent_callers() {
    // One worker takes the single-consumer, lock-free path; futex mode sleeps at once, so
    // every call crosses processes through the doorbell's futex wake-up.
    for (workers, mode) in [(1, "adaptive"), (1, "futex"), (2, "futex"), (1, "spin")] {
        let dir = TestDir::new("modes");
        let _server = Peer::start(&format!("server-{workers}-{mode}"), &dir, "test.Modes");
        let wait = netless::WaitPolicy {
            mode: mode.parse().unwrap(),
            spin: Duration::from_micros(5),
        };
        let client = Client::connect_with(
            "test.Modes",
            netless::ClientConfig {
                wait,
                ..client_config(dir.path())
            },
        )
        .unwrap();
        let threads: Vec<_> = (0..4u32)
            .map(|t| {
                let client = client.clone();
                let mode = mode.to_string();
                thread::spawn(move || {
                    for i in 0..150u32 {
                        let payload = vec![(t * 7 + i) as u8; ((t * 311 + i * 97) % 5000) as usize];
                        let method = if i % 2 == 0 { "Echo" } else { "EchoRef" };
                        let reply = client.call(method, &payload, &CallOptions::new()).unwrap();
                        assert_eq!(reply.payload, payload, "{workers} worker(s), {mode}");
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }
}

#[test]
fn abandoned_calls_with_large_replies_do_not_clog_the_connection() {
    // A caller gives up on calls whose multi-megabyte replies then arrive while nobody is
    // calling: they must be drained, or the single worker stalls on the full ring and, after
    // its stall limit (2 s), closes this honest connection.
    let dir = TestDir::new("abandon");
    let _server = Peer::start("server-1-adaptive", &dir, "test.Abandon");
    let client = connect(&dir, "test.Abandon");
    let hurry = CallOptions::new().timeout(Duration::from_millis(1));
    for _ in 0..3 {
        let _ = client.call("Big", &3_000_000u64.to_le_bytes(), &hurry);
    }
    thread::sleep(Duration::from_millis(2600));
    assert!(!client.is_closed(), "the server closed the connection");
    let reply = client
        .call("Echo", b"still here", &CallOptions::new())
        .unwrap();
    assert_eq!(reply.payload, b"still here");
}
