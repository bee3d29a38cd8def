//! Trust groups, for real: a server that admits two uids (this test's, root, and `nobody`),
//! clients of each in processes of their own, and a hostile client of one uid that attacks
//! everything it can write. Clients of different uids share no writable segment, so what
//! the hostile one does costs the other uid nothing; clients of its own uid may suffer
//! while it runs, and are served again within a second of its exit.
//!
//! The tests need root (to run peers as `nobody`) and skip with a message without it.

mod common;

use std::io::{BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Child;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use netless::{Acl, CallOptions, Client, Code, Server};

/// The uid the other trust group runs as.
const NOBODY: u32 = 65534;
/// Env var: how long a flipper or caller role runs, in milliseconds.
const RUN_MS: &str = "NETLESS_TEST_RUN_MS";
/// Env var: a victim connection's `index,tag,token` for the forger.
const VICTIM: &str = "NETLESS_TEST_VICTIM";
/// Env var: the server's dispatch (`jbsq2`, or the default) with one worker, if set.
const ONE_WORKER: &str = "NETLESS_TEST_ONE_WORKER";
/// Env var: the server's `max_connections`, if set.
const MAX_CONNECTIONS: &str = "NETLESS_TEST_MAX_CONNECTIONS";

/// Entry point of the peers (run only by them, via `--ignored`).
#[test]
#[ignore = "entry point of the peer processes the other tests spawn"]
fn trust_peer_entry() {
    let Some((role, dir, service)) = role() else {
        return;
    };
    let run = Duration::from_millis(
        std::env::var(RUN_MS)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1000),
    );
    match role.as_str() {
        "server" => {
            let mut config = netless::ServerConfig {
                acl: Acl::same_user().allow_uid(NOBODY),
                ..server_config(&dir)
            };
            if let Some(n) = std::env::var(MAX_CONNECTIONS)
                .ok()
                .and_then(|v| v.parse().ok())
            {
                config.max_connections = n;
            }
            if let Ok(dispatch) = std::env::var(ONE_WORKER) {
                config.workers = 1;
                if dispatch == "jbsq2" {
                    config.dispatch = netless::Dispatch::Jbsq2;
                }
            }
            let server = Server::bind(&service, config, test_handler).unwrap();
            println!("READY");
            std::io::stdout().flush().unwrap();
            let mut sink = Vec::new();
            let _ = std::io::stdin().read_to_end(&mut sink);
            drop(server);
        }
        "flipper" => flipper(&dir, &service, run),
        "caller" => caller(&dir, &service, run),
        "flooder" => flooder(&dir, &service, run),
        "hoarder" => hoarder(&dir, &service),
        "restore" => {
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(5) {
                if let Ok(client) = Client::connect_with(&service, client_config(&dir)) {
                    let options = CallOptions::new().timeout(Duration::from_secs(1));
                    if let Ok(reply) = client.call("Echo", b"restored", &options) {
                        if reply.payload == b"restored" {
                            break;
                        }
                    }
                }
                thread::sleep(Duration::from_millis(5));
            }
            println!("RESULT restored_ms={}", started.elapsed().as_millis());
        }
        "setter" => {
            let client = Client::connect_with(&service, client_config(&dir)).unwrap();
            let options = CallOptions::new().timeout(Duration::from_secs(5));
            let code = match client.call(netless::control::SET, b"wait=spin", &options) {
                Ok(_) => 0,
                Err(status) => status.code() as u32,
            };
            let get = client.call(netless::control::GET, b"", &options).unwrap();
            let spin = String::from_utf8_lossy(&get.payload).contains("wait=spin");
            println!("RESULT code={code} spin={}", u32::from(spin));
        }
        "forger" => {
            // The victim's identity, as if its secret had leaked.
            let victim: Vec<u64> = std::env::var(VICTIM)
                .unwrap()
                .split(',')
                .map(|v| v.parse().unwrap())
                .collect();
            let identity = (victim[0] as u32, victim[1] as u32, victim[2]);
            let client = Client::connect_with(&service, client_config(&dir)).unwrap();
            let visible = netless::fault::segments_contain(&client, &identity.2.to_le_bytes());
            let sent = netless::fault::forge_requests(&client, identity, 64);
            // Its own connection still works.
            let options = CallOptions::new().timeout(Duration::from_secs(5));
            let own = client.call("Echo", b"mine", &options).is_ok();
            println!(
                "RESULT visible={} forged={sent} own_ok={}",
                u32::from(visible),
                u32::from(own)
            );
        }
        other => panic!("unknown role {other}"),
    }
}

/// Flips random bytes in every segment it maps writable for `run`, after checking that the
/// server's registers are out of its reach.
fn flipper(dir: &Path, service: &str, run: Duration) {
    let client = Client::connect_with(service, client_config(dir)).unwrap();
    let registers = match netless::fault::try_write_registers(&client) {
        Ok(()) => 1,
        Err(how) => {
            eprintln!("the control segment is writable: {how}");
            0
        }
    };
    let mut seed = u64::from(std::process::id()) << 20 | 0x9e37;
    let started = Instant::now();
    let mut flips = 0u64;
    while started.elapsed() < run {
        netless::fault::flip_random_bytes(&client, &mut seed, 16);
        flips += 16;
        // Calls too, while its connection lasts, so its own requests go through the
        // corrupted memory.
        if flips.is_multiple_of(1024) {
            let options = CallOptions::new().timeout(Duration::from_millis(200));
            let _ = client.call("Echo", b"chaos", &options);
        }
        thread::sleep(Duration::from_micros(100));
    }
    println!("RESULT flips={flips} registers_sealed={registers}");
}

/// Calls `Echo` for `run`, reconnecting when its connection is closed; counts.
fn caller(dir: &Path, service: &str, run: Duration) {
    let started = Instant::now();
    let (mut ok, mut failed, mut wrong, mut slowest) = (0u64, 0u64, 0u64, Duration::ZERO);
    let mut client: Option<Client> = None;
    let mut i = 0u64;
    while started.elapsed() < run {
        let Some(c) = client.as_ref() else {
            client = Client::connect_with(service, client_config(dir)).ok();
            if client.is_none() {
                failed += 1;
                thread::sleep(Duration::from_millis(5));
            }
            continue;
        };
        i += 1;
        let payload = i.to_le_bytes();
        let t = Instant::now();
        let options = CallOptions::new().timeout(Duration::from_secs(2));
        match c.call("Echo", &payload, &options) {
            Ok(reply) if reply.payload == payload => ok += 1,
            Ok(_) => wrong += 1,
            Err(status) if status.is_nack() => thread::sleep(Duration::from_millis(1)),
            Err(status) => {
                failed += 1;
                if matches!(status.code(), Code::Unavailable | Code::Internal) {
                    client = None;
                }
            }
        }
        slowest = slowest.max(t.elapsed());
    }
    println!(
        "RESULT ok={ok} failed={failed} wrong={wrong} slowest_ms={}",
        slowest.as_millis()
    );
}

/// Keeps its queue full for `run`: 64 calls of 1 ms in flight, batched, replaced as they
/// return.
fn flooder(dir: &Path, service: &str, run: Duration) {
    let mut pipeline = netless::Pipeline::connect(service, client_config(dir)).unwrap();
    let started = Instant::now();
    let mut served = 0u64;
    while started.elapsed() < run {
        while pipeline.in_flight() < 64 {
            if pipeline.submit("Slow", &1u64.to_le_bytes()).is_err() {
                break;
            }
        }
        pipeline.flush();
        let _ = pipeline.wait(Some(Duration::from_millis(100)));
        served += pipeline.poll(|_, _| {}).unwrap() as u64;
    }
    println!("RESULT served={served}");
}

/// Takes every connection it is given, then opens 200 sockets to the server and says
/// nothing on them; reports, and holds it all until its stdin closes.
fn hoarder(dir: &Path, service: &str) {
    let mut held = Vec::new();
    let refusal = loop {
        match Client::connect_with(service, client_config(dir)) {
            Ok(client) if held.len() < 64 => held.push(client),
            Ok(_) => break None,
            Err(status) => break Some(status),
        }
    };
    let path = client_config(dir).socket_path(service).unwrap();
    let silent: Vec<_> = (0..200)
        .filter_map(|_| std::os::unix::net::UnixStream::connect(&path).ok())
        .collect();
    let (code, says) = refusal.map_or((0, false), |s| {
        (
            s.code() as u32,
            s.message().contains("max_connections_per_uid"),
        )
    });
    println!(
        "RESULT held={} code={code} says_why={} silent={}",
        held.len(),
        u32::from(says),
        silent.len()
    );
    std::io::stdout().flush().unwrap();
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
}

/// Whether peers can run as `nobody` here; says why not if they cannot.
fn can_run_as_nobody() -> bool {
    if !rustix::process::geteuid().is_root() {
        eprintln!("SKIPPED: these tests need root, to run peers as uid {NOBODY}");
        return false;
    }
    true
}

/// A directory `nobody` can reach (the socket in it is opened to the uids the ACL admits).
fn shared_dir(tag: &str) -> TestDir {
    let dir = TestDir::new(tag);
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// Runs `role` as `nobody` for `run`; `None` (with a message) if the test binary cannot be
/// executed by `nobody` here.
fn spawn_nobody(role: &str, dir: &TestDir, service: &str, run: Duration) -> Option<Child> {
    spawn_nobody_with(role, dir, service, run, &[])
}

/// [`spawn_nobody`] with more environment.
fn spawn_nobody_with(
    role: &str,
    dir: &TestDir,
    service: &str,
    run: Duration,
    env: &[(&str, String)],
) -> Option<Child> {
    let mut command = role_command("trust_peer_entry", role, dir.path(), service);
    command
        .uid(NOBODY)
        .gid(NOBODY)
        .env(RUN_MS, run.as_millis().to_string());
    for (k, v) in env {
        command.env(k, v);
    }
    match command.spawn() {
        Ok(child) => Some(child),
        Err(e) => {
            eprintln!("SKIPPED: cannot run the test binary as uid {NOBODY}: {e}");
            None
        }
    }
}

/// The server, stopped on drop.
struct ServerProcess(Child);

impl ServerProcess {
    fn start(dir: &TestDir, service: &str) -> ServerProcess {
        ServerProcess::start_with(dir, service, &[])
    }

    /// [`ServerProcess::start`] with more environment.
    fn start_with(dir: &TestDir, service: &str, env: &[(&str, &str)]) -> ServerProcess {
        let mut command = role_command("trust_peer_entry", "server", dir.path(), service);
        command.envs(env.iter().copied());
        let mut child = command.spawn().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        wait_for_line(&mut stdout, "READY");
        drain_in_background(stdout);
        ServerProcess(child)
    }

    /// Whether it is still running.
    fn alive(&mut self) -> bool {
        matches!(self.0.try_wait(), Ok(None))
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        drop(self.0.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            thread::sleep(Duration::from_millis(10));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A peer's `RESULT` line, and that it exited successfully within `limit`.
fn finish(mut child: Child, limit: Duration) -> String {
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    drop(child.stdin.take());
    let line = read_result(&mut stdout, limit);
    drain_in_background(stdout);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match child.try_wait().unwrap() {
            Some(status) => {
                assert!(status.success(), "a peer crashed: {status}");
                return line;
            }
            None if Instant::now() > deadline => {
                let _ = child.kill();
                panic!("a peer hung after its result");
            }
            None => thread::sleep(Duration::from_millis(10)),
        }
    }
}

#[test]
fn clients_of_another_uid_can_neither_write_nor_set_the_registers() {
    if !can_run_as_nobody() {
        return;
    }
    let dir = shared_dir("registers");
    let service = "trust.Registers";
    let _server = ServerProcess::start(&dir, service);
    // Its mapping is read-only, and no other way to write the control segment works.
    let Some(flipper) = spawn_nobody("flipper", &dir, service, Duration::from_millis(50)) else {
        return;
    };
    let line = finish(flipper, Duration::from_secs(20));
    assert_eq!(field(&line, "registers_sealed"), 1, "{line}");
    // `netless.ctl/Set` is for the service owner's uid (or root) only.
    let Some(setter) = spawn_nobody("setter", &dir, service, Duration::ZERO) else {
        return;
    };
    let line = finish(setter, Duration::from_secs(20));
    assert_eq!(
        field(&line, "code"),
        Code::PermissionDenied as u64,
        "{line}"
    );
    assert_eq!(field(&line, "spin"), 0, "{line}");
    // The owner (root here) may.
    let client = Client::connect_with(service, client_config(dir.path())).unwrap();
    let options = CallOptions::new().timeout(Duration::from_secs(5));
    let set = client
        .call(netless::control::SET, b"wait=futex", &options)
        .unwrap();
    assert!(String::from_utf8_lossy(&set.payload).contains("wait=futex"));
}

#[test]
fn random_bytes_from_one_uid_cost_another_uid_nothing() {
    if !can_run_as_nobody() {
        return;
    }
    let chaos = Duration::from_secs(20);
    let dir = shared_dir("chaos");
    let service = "trust.Chaos";
    let mut server = ServerProcess::start(&dir, service);
    // Four honest clients of our uid call throughout.
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let honest: Vec<_> = (0..4u64)
        .map(|n| {
            let (stop, ok, failed) = (stop.clone(), ok.clone(), failed.clone());
            let dir = dir.path().to_path_buf();
            thread::spawn(move || {
                let client = Client::connect_with(service, client_config(&dir)).unwrap();
                let mut i = n << 48;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let payload = i.to_le_bytes();
                    // A deadline is a point in time: a new one per call.
                    let options = CallOptions::new().timeout(Duration::from_secs(5));
                    match client.call("Echo", &payload, &options) {
                        Ok(reply) if reply.payload == payload => ok.fetch_add(1, Ordering::Relaxed),
                        Ok(_) => failed.fetch_add(1, Ordering::Relaxed),
                        Err(status) => {
                            eprintln!("an honest call of the other uid failed: {status}");
                            failed.fetch_add(1, Ordering::Relaxed)
                        }
                    };
                    thread::sleep(Duration::from_micros(200));
                }
            })
        })
        .collect();
    // Two honest clients of the hostile one's uid, and the hostile one.
    let Some(flipper) = spawn_nobody("flipper", &dir, service, chaos) else {
        stop.store(true, Ordering::Relaxed);
        return;
    };
    let mates: Vec<Child> = (0..2)
        .filter_map(|_| spawn_nobody("caller", &dir, service, chaos))
        .collect();
    let flipped = finish(flipper, chaos + Duration::from_secs(20));
    let after_exit = Instant::now();
    // Its uid's service comes back within a second of its exit.
    let restore = spawn_nobody("restore", &dir, service, Duration::ZERO).unwrap();
    let restored = finish(restore, Duration::from_secs(20));
    stop.store(true, Ordering::Relaxed);
    for t in honest {
        t.join().unwrap();
    }
    for mate in mates {
        // No crash, no hang (each call has a deadline); failures are allowed.
        let line = finish(mate, chaos + Duration::from_secs(20));
        eprintln!("same-uid caller: {line}");
    }
    eprintln!(
        "hostile: {}; restore: {} ({:?} after its exit); the other uid: {} calls served, {} \
         failed",
        flipped.trim(),
        restored.trim(),
        after_exit.elapsed(),
        ok.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed)
    );
    assert!(field(&flipped, "flips") > 10_000, "{flipped}");
    assert_eq!(
        failed.load(Ordering::Relaxed),
        0,
        "failed honest calls of the other uid"
    );
    assert!(
        ok.load(Ordering::Relaxed) > 1000,
        "too few honest calls: {ok:?}"
    );
    let restored_ms = field(&restored, "restored_ms");
    assert!(
        restored_ms < 1000,
        "service restored only after {restored_ms} ms"
    );
    assert!(server.alive(), "the server crashed");
}

#[test]
fn a_client_of_another_uid_cannot_impersonate_a_connection_even_knowing_its_secret() {
    if !can_run_as_nobody() {
        return;
    }
    let dir = shared_dir("forge");
    let service = "trust.Forge";
    let _server = ServerProcess::start(&dir, service);
    let victim = Client::connect_with(service, client_config(dir.path())).unwrap();
    let call = |payload: &[u8]| {
        let options = CallOptions::new().timeout(Duration::from_secs(5));
        victim.call("Echo", payload, &options)
    };
    assert_eq!(call(b"before").unwrap().payload, b"before");
    let (index, tag, token) = netless::fault::identity(&victim);
    let served_before = victim.replica_stats().calls;
    // Requests in the victim's name (index, tag and token: as if its secret leaked) through
    // the forger's own buffer and queue, the only ones it can write.
    let env = [(VICTIM, format!("{index},{tag},{token}"))];
    let Some(forger) = spawn_nobody_with("forger", &dir, service, Duration::ZERO, &env) else {
        return;
    };
    let line = finish(forger, Duration::from_secs(20));
    assert_eq!(
        field(&line, "visible"),
        0,
        "the victim's token is in reach: {line}"
    );
    assert!(field(&line, "forged") > 0, "{line}");
    assert_eq!(field(&line, "own_ok"), 1, "{line}");
    // None of them ran as the victim's: its connection is open and its replies are its own.
    for i in 0..100u32 {
        assert_eq!(call(&i.to_le_bytes()).unwrap().payload, i.to_le_bytes());
    }
    assert!(!victim.is_closed());
    // And the server ran none of them at all: it served the victim's 100 calls and the
    // forger's own one, nothing else.
    let served = victim.replica_stats().calls - served_before;
    assert_eq!(served, 101, "the server served {served} calls");
}

#[test]
fn a_uid_that_keeps_its_queue_full_cannot_starve_another() {
    if !can_run_as_nobody() {
        return;
    }
    for dispatch in ["jbsq2", "one-queue"] {
        let dir = shared_dir("flood");
        let service = "trust.Flood";
        let _server = ServerProcess::start_with(&dir, service, &[(ONE_WORKER, dispatch)]);
        // One worker, and `nobody` keeps 64 calls of 1 ms queued on its group's queue.
        let flood = Duration::from_secs(3);
        let Some(flooder) = spawn_nobody("flooder", &dir, service, flood) else {
            return;
        };
        let client = Client::connect_with(service, client_config(dir.path())).unwrap();
        thread::sleep(Duration::from_millis(300));
        let (mut failed, mut slowest) = (Vec::new(), Duration::ZERO);
        for i in 0..50u32 {
            let options = CallOptions::new().timeout(Duration::from_secs(2));
            let t = Instant::now();
            match client.call("Echo", &i.to_le_bytes(), &options) {
                Ok(reply) => assert_eq!(reply.payload, i.to_le_bytes()),
                Err(status) => failed.push(status),
            }
            slowest = slowest.max(t.elapsed());
        }
        let line = finish(flooder, Duration::from_secs(10));
        assert!(
            field(&line, "served") > 0,
            "{dispatch}: the flood ran no calls: {line}"
        );
        assert!(
            failed.is_empty(),
            "{dispatch}: {} of 50 calls failed under the flood, the first: {}",
            failed.len(),
            failed[0]
        );
        println!("{dispatch}: slowest of 50 calls {slowest:?} under the flood ({line})");
    }
}

#[test]
fn a_uid_cannot_take_every_connection_or_handshake() {
    if !can_run_as_nobody() {
        return;
    }
    let dir = shared_dir("hoard");
    let service = "trust.Hoard";
    let _server = ServerProcess::start_with(&dir, service, &[(MAX_CONNECTIONS, "8")]);
    let Some(mut hoarder) = spawn_nobody("hoarder", &dir, service, Duration::ZERO) else {
        return;
    };
    // `nobody` holds all the connections it may and 200 silent handshakes (more than the
    // server runs at once).
    let mut stdout = BufReader::new(hoarder.stdout.take().unwrap());
    let line = read_result(&mut stdout, Duration::from_secs(10));
    assert_eq!(field(&line, "held"), 4, "half of 8 slots: {line}");
    assert_eq!(
        field(&line, "code"),
        Code::ResourceExhausted as u64,
        "{line}"
    );
    assert_eq!(field(&line, "says_why"), 1, "{line}");
    // Its handshakes have 2 s to run out: the server's own uid gets in meanwhile, and takes
    // the other slots.
    let started = Instant::now();
    let clients: Vec<Client> = (0..4)
        .map(|_| Client::connect_with(service, client_config(dir.path())).unwrap())
        .collect();
    for client in &clients {
        let options = CallOptions::new().timeout(Duration::from_secs(2));
        assert_eq!(client.call("Echo", b"in", &options).unwrap().payload, b"in");
    }
    let took = started.elapsed();
    assert!(took < Duration::from_secs(1), "admitted after {took:?}");
    println!("hoarder: {}; the owner admitted in {took:?}", line.trim());
    drop(hoarder.stdin.take());
    let _ = hoarder.wait();
}
