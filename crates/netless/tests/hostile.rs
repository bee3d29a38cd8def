//! A hostile peer, for real: the server runs in a process of its own, and this test process
//! plays a client that attacks it through the real socket and shared memory, while honest
//! clients call the same service. Each test asserts what the honest side sees.

mod common;

use std::io::{BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::process::Child;
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use netless::{CallOptions, Client, Server};

/// Entry point of the spawned server (run only by it, via `--ignored`).
#[test]
#[ignore = "entry point of the peer processes the other tests spawn"]
fn hostile_peer_entry() {
    let Some((_, dir, service)) = role() else {
        return;
    };
    let server = Server::bind(&service, server_config(&dir), test_handler).unwrap();
    println!("READY");
    std::io::stdout().flush().unwrap();
    // Each line on stdin: start a frame on every connection and never finish it.
    let mut line = String::new();
    while std::io::stdin().read_line(&mut line).is_ok_and(|n| n > 0) {
        server.fault_partial_frame();
        line.clear();
    }
    drop(server);
}

/// The server process, stopped (stdin closed, then killed) on drop.
struct ServerProcess {
    child: Child,
}

impl ServerProcess {
    fn start(dir: &TestDir, service: &str) -> ServerProcess {
        let mut child = spawn_role("hostile_peer_entry", "server", dir.path(), service);
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        wait_for_line(&mut stdout, "READY");
        drain_in_background(stdout);
        ServerProcess { child }
    }
}

impl Drop for ServerProcess {
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

/// A client that calls `Echo` once and says how long connecting and calling took.
fn honest_call(dir: &TestDir, service: &str) -> Duration {
    let started = Instant::now();
    let client = Client::connect_with(service, client_config(dir.path())).unwrap();
    let options = CallOptions::new().timeout(Duration::from_secs(5));
    let reply = client.call("Echo", b"honest", &options).unwrap();
    assert_eq!(reply.payload, b"honest");
    started.elapsed()
}

/// How long until `socket` reads end-of-file (the server closed it), reading and dropping
/// whatever comes first (a greeting, a refusal); `None` if it stays open for `limit`.
fn closed_within(socket: &mut UnixStream, limit: Duration) -> Option<Duration> {
    let started = Instant::now();
    let mut buf = [0u8; 256];
    while started.elapsed() < limit {
        let left = limit
            .saturating_sub(started.elapsed())
            .max(Duration::from_millis(1));
        socket.set_read_timeout(Some(left)).unwrap();
        match socket.read(&mut buf) {
            Ok(0) => return Some(started.elapsed()),
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return None,
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => return None,
            Err(_) => return Some(started.elapsed()),
        }
    }
    None
}

#[test]
fn a_trickled_handshake_holds_up_no_one_and_is_cut_off() {
    let dir = TestDir::new("trickle");
    let service = "hostile.Trickle";
    let _server = ServerProcess::start(&dir, service);
    let path = client_config(dir.path()).socket_path(service).unwrap();
    // Twenty clients connect and never say a word, and one sends its Hello a byte at a time,
    // each byte well inside any per-read timeout.
    let mut silent: Vec<UnixStream> = (0..20)
        .map(|_| UnixStream::connect(&path).unwrap())
        .collect();
    let mut trickler = UnixStream::connect(&path).unwrap();
    let mut writer = trickler.try_clone().unwrap();
    let trickling = thread::spawn(move || {
        let _ = writer.write_all(&17u32.to_le_bytes());
        for _ in 0..40 {
            if writer.write_all(&[1]).is_err() {
                return;
            }
            thread::sleep(Duration::from_millis(200));
        }
    });
    // Meanwhile honest clients are admitted and served as usual.
    for _ in 0..3 {
        let took = honest_call(&dir, service);
        assert!(
            took < Duration::from_secs(2),
            "an honest connect and call took {took:?}"
        );
    }
    // The handshakes that do not finish in time are cut off: one deadline for the whole
    // handshake (2 s), however the bytes come.
    let cut = closed_within(&mut trickler, Duration::from_secs(6));
    assert!(
        cut.is_some(),
        "a trickled handshake was still open after 6 s"
    );
    for socket in &mut silent {
        assert!(
            closed_within(socket, Duration::from_secs(6)).is_some(),
            "a silent handshake stayed open"
        );
    }
    trickling.join().unwrap();
    // And the server still admits and serves.
    assert!(honest_call(&dir, service) < Duration::from_secs(2));
}

/// Calls `Echo` until one succeeds (NACKs, the queue's refusals, are retried) or `limit`
/// passes; how long it took.
fn call_until_served(client: &Client, limit: Duration) -> Option<Duration> {
    let started = Instant::now();
    while started.elapsed() < limit {
        let options = CallOptions::new().timeout(Duration::from_secs(2));
        match client.call("Echo", b"after", &options) {
            Ok(reply) => {
                assert_eq!(reply.payload, b"after");
                return Some(started.elapsed());
            }
            Err(status) if status.is_nack() => thread::sleep(Duration::from_millis(5)),
            Err(status) => panic!("an honest call failed with {status}"),
        }
    }
    None
}

#[test]
fn a_tail_thrown_laps_ahead_is_put_back_within_a_second() {
    let dir = TestDir::new("tailjump");
    let service = "hostile.TailJump";
    let _server = ServerProcess::start(&dir, service);
    let honest = Client::connect_with(service, client_config(dir.path())).unwrap();
    assert!(call_until_served(&honest, Duration::from_secs(5)).is_some());
    let hostile = Client::connect_with(service, client_config(dir.path())).unwrap();
    for _ in 0..3 {
        // One store to the shared tail: without repair no producer could enqueue again.
        netless::fault::inject(&hostile, netless::fault::ClientFault::TailJump);
        let took = call_until_served(&honest, Duration::from_secs(5));
        let took = took.expect("the queue stayed jammed for 5 s");
        assert!(
            took < Duration::from_secs(1),
            "served again only after {took:?}"
        );
    }
    // A new client, and the hostile one itself, are served as usual.
    assert!(honest_call(&dir, service) < Duration::from_secs(2));
    assert!(call_until_served(&hostile, Duration::from_secs(1)).is_some());
}

#[test]
fn a_client_that_stops_reading_its_replies_stalls_no_worker() {
    let dir = TestDir::new("undrained");
    let service = "hostile.Undrained";
    let _server = ServerProcess::start(&dir, service);
    // A pipeline that keeps 256 calls of 4 KiB in flight and never reads a reply: its ring
    // (64 KiB by default) fills after a dozen.
    let mut stuck = netless::Pipeline::connect(service, client_config(dir.path())).unwrap();
    let payload = vec![7u8; 4096];
    let mut sent = 0;
    while sent < 256 {
        match stuck.submit("Echo", &payload) {
            Ok(_) => sent += 1,
            Err(status) if status.is_nack() => thread::sleep(Duration::from_millis(1)),
            Err(status) => panic!("submit: {status}"),
        }
    }
    stuck.flush();
    // The server's two workers serve everyone else at once meanwhile (a worker that waited
    // for room in the stuck ring would hold every call behind it for up to 2 s).
    let honest = Client::connect_with(service, client_config(dir.path())).unwrap();
    let options = CallOptions::new().timeout(Duration::from_secs(5));
    let started = Instant::now();
    for i in 0..200u32 {
        let reply = honest.call("Echo", &i.to_le_bytes(), &options).unwrap();
        assert_eq!(reply.payload, i.to_le_bytes());
    }
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(1500),
        "200 honest calls took {took:?}"
    );
    // The stuck client's connection is closed once its replies have waited past the stall
    // limit (2 s), and it hears why.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !stuck.is_closed() {
        assert!(
            Instant::now() < deadline,
            "the stuck connection was never closed"
        );
        thread::sleep(Duration::from_millis(20));
    }
    let mut why = None;
    let _ = stuck.poll(|_, reply| {
        if let Err(status) = reply {
            why.get_or_insert(status);
        }
    });
    let status = stuck
        .poll(|_, _| {})
        .expect_err("a closed pipeline says so");
    assert!(
        status
            .message()
            .contains("stopped draining its response ring"),
        "{status}"
    );
    drop(why);
    // And the server serves on.
    assert!(honest_call(&dir, service) < Duration::from_secs(2));
}

/// Waits until `client`'s group's buffer is all free but for `spare` blocks at most (the
/// spare runs honest clients keep); how long that took, or `None` after `limit`.
fn blocks_back(client: &Client, spare: u32, limit: Duration) -> Option<Duration> {
    let started = Instant::now();
    while started.elapsed() < limit {
        let (free, total) = netless::fault::table_census(client);
        if free + spare >= total {
            return Some(started.elapsed());
        }
        thread::sleep(Duration::from_millis(10));
    }
    None
}

#[test]
fn a_client_that_hogs_the_buffer_is_closed_and_its_blocks_come_back() {
    let dir = TestDir::new("hog");
    let service = "hostile.Hog";
    let _server = ServerProcess::start(&dir, service);
    // One store per free block: every block of the shared buffer under the hog's own tag,
    // far past its quota.
    let hog = Client::connect_with(service, client_config(dir.path())).unwrap();
    assert!(call_until_served(&hog, Duration::from_secs(5)).is_some());
    // Twice: the server frees the blocks of the hog's last request a moment after replying.
    netless::fault::inject(&hog, netless::fault::ClientFault::HogBlocks);
    thread::sleep(Duration::from_millis(50));
    netless::fault::inject(&hog, netless::fault::ClientFault::HogBlocks);
    let (free, _) = netless::fault::table_census(&hog);
    assert_eq!(free, 0, "the hog left {free} blocks free");
    // A new client finds no room (NACKs) until the server closes the hog for holding more
    // than its quota past a one-second grace, and frees its blocks.
    let honest = Client::connect_with(service, client_config(dir.path())).unwrap();
    // A timeout is a deadline from when the options are made: new options per call.
    let options = || CallOptions::new().timeout(Duration::from_secs(2));
    let refused = honest.call("Echo", b"first", &options()).unwrap_err();
    assert!(refused.is_nack(), "{refused}");
    let took = call_until_served(&honest, Duration::from_secs(10)).expect("never served again");
    assert!(took < Duration::from_secs(3), "served again after {took:?}");
    // The hog hears why.
    let started = Instant::now();
    let status = loop {
        match hog.call("Echo", b"x", &options()) {
            Err(status) if !status.is_nack() => break status,
            _ if started.elapsed() > Duration::from_secs(5) => panic!("the hog is not closed"),
            _ => thread::sleep(Duration::from_millis(10)),
        }
    };
    assert_eq!(status.code(), netless::Code::ResourceExhausted, "{status}");
    assert!(status.message().contains("quota"), "{status}");
    // Every block comes back (but the honest client's runs).
    assert!(blocks_back(&honest, 64, Duration::from_secs(2)).is_some());
    assert!(honest_call(&dir, service) < Duration::from_secs(2));
}

#[test]
fn blocks_marked_with_a_tag_nobody_owns_are_freed() {
    let dir = TestDir::new("orphans");
    let service = "hostile.Orphans";
    let _server = ServerProcess::start(&dir, service);
    let honest = Client::connect_with(service, client_config(dir.path())).unwrap();
    assert!(call_until_served(&honest, Duration::from_secs(5)).is_some());
    // Every free block marked with a tag no connection has: nobody, the writer included,
    // could claim them, and no connection's death would ever free them.
    let hostile = Client::connect_with(service, client_config(dir.path())).unwrap();
    // Twice: the server frees the blocks of the last honest request a moment after replying.
    netless::fault::inject(&hostile, netless::fault::ClientFault::ForeignTags);
    thread::sleep(Duration::from_millis(50));
    netless::fault::inject(&hostile, netless::fault::ClientFault::ForeignTags);
    let (free, _) = netless::fault::table_census(&honest);
    assert_eq!(free, 0, "{free} blocks left free");
    // A new client (the old one cycles the run it holds) finds room again once the
    // server frees them, within a second.
    let honest = Client::connect_with(service, client_config(dir.path())).unwrap();
    let took = call_until_served(&honest, Duration::from_secs(10)).expect("never served again");
    assert!(took < Duration::from_secs(1), "served again after {took:?}");
    assert!(
        blocks_back(&honest, 64, Duration::from_secs(2)).is_some(),
        "(free, total) = {:?}",
        netless::fault::table_census(&honest)
    );
    // The writer is anonymous: nothing to close, and it is served like anyone.
    assert!(call_until_served(&hostile, Duration::from_secs(1)).is_some());
}

#[test]
fn a_server_that_stops_halfway_through_a_frame_holds_up_no_drop() {
    let dir = TestDir::new("halfframe");
    let service = "hostile.HalfFrame";
    let mut server = ServerProcess::start(&dir, service);
    let client = Client::connect_with(service, client_config(dir.path())).unwrap();
    assert!(call_until_served(&client, Duration::from_secs(5)).is_some());
    // The server starts a frame (the client's monitor reads it) and goes silent.
    let stdin = server.child.stdin.as_mut().unwrap();
    stdin.write_all(b"go\n").unwrap();
    stdin.flush().unwrap();
    thread::sleep(Duration::from_millis(100));
    let started = Instant::now();
    drop(client);
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(500),
        "dropping the client took {took:?}"
    );
}

#[test]
fn a_response_ring_larger_than_the_server_maps_is_refused() {
    let dir = TestDir::new("bigring");
    let service = "hostile.BigRing";
    let _server = ServerProcess::start(&dir, service);
    let config = netless::ClientConfig {
        ring_bytes: 64 << 20,
        ..client_config(dir.path())
    };
    let err = Client::connect_with(service, config).unwrap_err();
    assert_eq!(err.code(), netless::Code::InvalidArgument, "{err}");
    assert!(err.message().contains("max_client_ring"), "{err}");
    // One the server takes is served.
    let config = netless::ClientConfig {
        ring_bytes: netless::DEFAULT_MAX_CLIENT_RING,
        ..client_config(dir.path())
    };
    let client = Client::connect_with(service, config).unwrap();
    assert!(call_until_served(&client, Duration::from_secs(5)).is_some());
}

/// A client of another protocol (its `Hello` shorter or longer than ours) is refused with a
/// status naming both versions, not dropped without a word; the server serves on.
#[test]
fn a_hello_of_another_protocol_is_refused_by_name() {
    let dir = TestDir::new("oldhello");
    let service = "hostile.OldHello";
    let _server = ServerProcess::start(&dir, service);
    let path = client_config(dir.path()).socket_path(service).unwrap();
    let deadline = || Instant::now() + Duration::from_secs(5);
    // Protocol 11's Hello: version, max_message, domain, member, generation (25 bytes), and
    // a later one's, 40 bytes long.
    for (version, len) in [(11u32, 25usize), (99, 40)] {
        let socket = UnixStream::connect(&path).unwrap();
        let (greeting, _) = netless_shm::recv_frame_by(&socket, 0, 64, deadline()).unwrap();
        assert_eq!(greeting[0], 5, "a greeting first: {greeting:?}");
        let mut hello = vec![1u8];
        hello.extend_from_slice(&version.to_le_bytes());
        hello.resize(len, 0);
        netless_shm::send_frame(&socket, &hello, &[]).unwrap();
        let (reject, _) = netless_shm::recv_frame_by(&socket, 0, 1024, deadline()).unwrap();
        assert_eq!(reject[0], 3, "a reject: {reject:?}");
        let message = String::from_utf8_lossy(&reject[3..]);
        assert!(
            message.contains(&format!("protocol {version}")) && message.contains("server 12"),
            "{message}"
        );
    }
    assert!(honest_call(&dir, service) < Duration::from_secs(2));
}
