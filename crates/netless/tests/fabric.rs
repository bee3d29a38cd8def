//! Serving and calling through a memory fabric: processes that share nothing but the region
//! (no socket directory) find each other in its directory, connect through its connect
//! slots, and learn of each other's death from its member table.

mod common;

use std::io::{BufReader, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{
    drain_in_background, role, role_command, sigkill, test_handler, test_wait, wait_for_line,
};
use netless::fabric::{Coherence, Fabric, FabricOptions, Faults};
use netless::{CallOptions, Client, ClientConfig, Code, Server, ServerConfig};

fn region(tag: &str) -> PathBuf {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let path = std::env::temp_dir().join(format!(
        "netless-fabric-{}-{tag}-{}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let _ = std::fs::remove_file(&path);
    path
}

/// Env var telling a child which coherence its region has (and to emulate it).
const COHERENCE: &str = "NETLESS_TEST_COHERENCE";

/// Env var telling a child to play a process on another host.
const ANOTHER_KERNEL: &str = "NETLESS_TEST_ANOTHER_KERNEL";

fn open(path: &Path) -> Fabric {
    let software = std::env::var(COHERENCE).is_ok_and(|c| c == "software");
    let elsewhere = std::env::var(ANOTHER_KERNEL).is_ok();
    open_on(path, software, None, elsewhere)
}

fn open_as(path: &Path, software: bool, faults: Option<Faults>) -> Fabric {
    open_on(path, software, faults, false)
}

/// A member of the region at `path`; in a software-coherent region it works through the
/// non-coherent emulator, leaving out what `faults` names; `elsewhere`, it plays a process
/// on another host (another kernel: judged by its heartbeat, woken by no futex).
fn open_on(path: &Path, software: bool, faults: Option<Faults>, elsewhere: bool) -> Fabric {
    Fabric::open(
        path,
        &FabricOptions {
            size: 64 << 20,
            coherence: if software {
                Coherence::Software
            } else {
                Coherence::Hardware
            },
            emulation: software.then(|| faults.unwrap_or_default()),
            another_kernel: elsewhere,
            ..FabricOptions::default()
        },
    )
    .unwrap()
}

fn server_config(fabric: &Fabric) -> ServerConfig {
    ServerConfig {
        workers: 2,
        wait: test_wait(),
        fabric: Some(fabric.clone()),
        ..ServerConfig::default()
    }
}

fn client_config(fabric: &Fabric) -> ClientConfig {
    ClientConfig {
        wait: test_wait(),
        fabric: Some(fabric.clone()),
        ..ClientConfig::default()
    }
}

fn opts() -> CallOptions {
    CallOptions::new().timeout(Duration::from_secs(20))
}

#[test]
fn a_client_calls_a_server_through_the_fabric_alone() {
    calls_through_the_fabric_alone(false);
}

#[test]
fn a_client_calls_a_server_through_a_software_coherent_fabric_alone() {
    calls_through_the_fabric_alone(true);
}

fn calls_through_the_fabric_alone(software: bool) {
    let path = region("calls");
    let (sf, cf) = (
        open_as(&path, software, None),
        open_as(&path, software, None),
    );
    let free = cf.free_bytes();
    let server = Server::bind("pkg.Echo", server_config(&sf), test_handler).unwrap();
    assert!(!sf.lookup("pkg.Echo", None).is_empty());
    let again = Server::bind("pkg.Echo", server_config(&sf), test_handler).unwrap_err();
    assert_eq!(again.code(), Code::AlreadyExists, "{again}");
    let client = Client::connect_with("pkg.Echo", client_config(&cf)).unwrap();
    for size in [0usize, 1, 64, 1000, 70_000, 1 << 20] {
        let payload: Vec<u8> = (0..size).map(|i| (i % 253) as u8).collect();
        let reply = client.call("Echo", &payload, &opts()).unwrap();
        assert_eq!(reply.payload, payload, "size {size}");
    }
    let err = client.call("Fail", b"", &opts()).unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert_eq!(server.stats().connections, 1);
    drop(client);
    let deadline = Instant::now() + Duration::from_secs(20);
    while server.stats().connections != 0 {
        assert!(
            Instant::now() < deadline,
            "the dropped client's connection stayed"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(server);
    assert!(cf.lookup("pkg.Echo", None).is_empty());
    let missing = Client::connect_with("pkg.Echo", client_config(&cf)).unwrap_err();
    assert_eq!(missing.code(), Code::Unavailable, "{missing}");
    assert!(
        missing.message().contains("not found in the fabric"),
        "{missing}"
    );
    // Everything the server and the client took comes back (two leases after).
    while cf.free_bytes() != free {
        assert!(
            Instant::now() < deadline,
            "fabric memory was not given back"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = std::fs::remove_file(path);
}

#[test]
fn a_late_reply_never_lands_in_memory_given_to_someone_else() {
    // The client gives up on a slow call and drops its connection; its memory must not go
    // back to the region (and on to another member) while the server may still reply.
    let path = region("late");
    let (sf, cf, tf) = (open(&path), open(&path), open(&path));
    let server = Server::bind("pkg.Late", server_config(&sf), test_handler).unwrap();
    let client = Client::connect_with("pkg.Late", client_config(&cf)).unwrap();
    let slow = 2 * cf.lease() + Duration::from_millis(900);
    let err = client
        .call(
            "Slow",
            &(slow.as_millis() as u64).to_le_bytes(),
            &CallOptions::new().timeout(Duration::from_millis(100)),
        )
        .unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err}");
    drop(client);
    std::thread::sleep(2 * cf.lease() + Duration::from_millis(300));
    // A third member takes all the memory there is now, and clears it.
    let mut taken = Vec::new();
    while let Ok(extent) = tf.alloc(netless_shm::fabric::UNIT) {
        let segment = tf.map(extent).unwrap();
        // SAFETY: the unit was just taken by this member, which alone writes it.
        unsafe { std::ptr::write_bytes(segment.as_ptr(), 0, segment.len()) };
        taken.push(segment);
    }
    // The slow call ends and its reply is written (into the client's ring, still held).
    std::thread::sleep(Duration::from_millis(1200));
    for segment in &taken {
        // SAFETY: this member's units, mapped for the segment's length.
        let bytes = unsafe { std::slice::from_raw_parts(segment.as_ptr(), segment.len()) };
        assert!(
            bytes.iter().all(|&b| b == 0),
            "a reply landed in another member's memory"
        );
    }
    drop(taken);
    // Once the server let go of the connection, the client's memory is back.
    let deadline = Instant::now() + Duration::from_secs(20);
    while server.stats().connections != 0 {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = std::fs::remove_file(path);
}

#[test]
fn refused_clients_leave_their_connect_slots_free() {
    let path = region("refused");
    // A short lease: the server looks at its slots every tick, a tenth of it.
    let quick = || {
        Fabric::open(
            &path,
            &FabricOptions {
                size: 64 << 20,
                lease: Duration::from_millis(200),
                ..FabricOptions::default()
            },
        )
        .unwrap()
    };
    let (sf, cf) = (quick(), quick());
    let config = ServerConfig {
        max_connections: 1,
        ..server_config(&sf)
    };
    let _server = Server::bind("pkg.Full", config, test_handler).unwrap();
    let kept = Client::connect_with("pkg.Full", client_config(&cf)).unwrap();
    // More refusals than there are slots: each slot comes back once its client read why.
    for _ in 0..(netless_shm::fabric::SLOTS_PER_UNIT + 20) {
        let err = Client::connect_with("pkg.Full", client_config(&cf)).unwrap_err();
        assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
        assert!(err.message().contains("connections"), "{err}");
        assert!(!err.message().contains("connect slots"), "{err}");
    }
    assert_eq!(
        kept.call("Echo", b"still", &opts()).unwrap().payload,
        b"still"
    );
    let _ = std::fs::remove_file(path);
}

#[test]
fn a_software_coherent_reply_at_the_clients_limit_fails_alone() {
    let path = region("limit");
    let (sf, cf) = (open_as(&path, true, None), open_as(&path, true, None));
    let _server = Server::bind("pkg.Limit", server_config(&sf), test_handler).unwrap();
    let client = Client::connect_with(
        "pkg.Limit",
        ClientConfig {
            max_message: 64 * 1024,
            ring_bytes: 16 * 1024,
            ..client_config(&cf)
        },
    )
    .unwrap();
    // A 64 KiB body, and the reply's header on top: over the client's limit, refused by the
    // server as it would be over a shared receive queue; the connection goes on.
    let err = client
        .call("Big", &(64u64 * 1024).to_le_bytes(), &opts())
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
    for len in [100u64, 60 * 1024] {
        let reply = client.call("Big", &len.to_le_bytes(), &opts()).unwrap();
        assert_eq!(reply.payload.len() as u64, len);
    }
    let _ = std::fs::remove_file(path);
}

#[test]
#[ignore = "a child role of the process tests"]
fn fabric_child() {
    let Some((role, path, service)) = role() else {
        return;
    };
    let fabric = open(&path);
    match role.as_str() {
        "server" => {
            let _server = Server::bind(&service, server_config(&fabric), test_handler).unwrap();
            println!("READY");
            std::io::stdout().flush().unwrap();
            let mut line = String::new();
            let _ = std::io::stdin().read_line(&mut line);
        }
        "client" => {
            let client = Client::connect_with(&service, client_config(&fabric)).unwrap();
            client.call("Echo", b"x", &opts()).unwrap();
            println!("READY");
            std::io::stdout().flush().unwrap();
            let mut line = String::new();
            let _ = std::io::stdin().read_line(&mut line);
        }
        other => panic!("unknown role {other}"),
    }
}

#[test]
fn a_killed_server_fails_its_clients_calls_within_the_lease() {
    killed_server(false);
}

#[test]
fn a_killed_server_fails_software_coherent_calls_within_the_lease() {
    killed_server(true);
}

#[test]
fn a_killed_server_on_another_host_fails_calls_when_its_lease_runs_out() {
    killed_server_on(false, true);
}

fn killed_server(software: bool) {
    killed_server_on(software, false);
}

fn killed_server_on(software: bool, elsewhere: bool) {
    let path = region("kill-server");
    let mut command = role_command("fabric_child", "server", &path, "pkg.Victim");
    command.env(COHERENCE, if software { "software" } else { "hardware" });
    if elsewhere {
        command.env(ANOTHER_KERNEL, "1");
    }
    let mut child = command.spawn().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    wait_for_line(&mut out, "READY");
    drain_in_background(out);
    let fabric = open_as(&path, software, None);
    let client = Client::connect_with("pkg.Victim", client_config(&fabric)).unwrap();
    assert_eq!(client.call("Echo", b"hi", &opts()).unwrap().payload, b"hi");
    sigkill(&child);
    child.wait().unwrap();
    let killed = Instant::now();
    let err = loop {
        match client.call("Echo", b"hi", &opts()) {
            Ok(_) => assert!(killed.elapsed() < Duration::from_secs(20), "still answered"),
            Err(e) => break e,
        }
    };
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    // One kernel: its lock byte went with it, so within a tick or two. Another host: its
    // heartbeat stopped, so within the lease (and a tick).
    let bound = if elsewhere {
        fabric.lease() + Duration::from_millis(500)
    } else {
        Duration::from_millis(500)
    };
    assert!(killed.elapsed() < bound, "took {:?}", killed.elapsed());
    if elsewhere {
        assert!(
            killed.elapsed() >= fabric.lease() / 2,
            "judged dead before its lease ran out: by something other than its heartbeat"
        );
    }
    let _ = std::fs::remove_file(path);
}

#[test]
fn a_killed_client_is_reclaimed() {
    killed_client(false);
}

#[test]
fn a_killed_software_coherent_client_is_reclaimed() {
    killed_client(true);
}

fn killed_client(software: bool) {
    let path = region("kill-client");
    let fabric = open_as(&path, software, None);
    let free = fabric.free_bytes();
    let server = Server::bind("pkg.Host", server_config(&fabric), test_handler).unwrap();
    let bound = fabric.free_bytes();
    assert!(bound < free);
    let mut child = role_command("fabric_child", "client", &path, "pkg.Host")
        .env(COHERENCE, if software { "software" } else { "hardware" })
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    wait_for_line(&mut out, "READY");
    drain_in_background(out);
    assert_eq!(server.stats().connections, 1);
    sigkill(&child);
    child.wait().unwrap();
    let killed = Instant::now();
    while server.stats().connections != 0 {
        assert!(
            killed.elapsed() < Duration::from_secs(20),
            "the dead client stayed"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let stats = server.stats();
    assert_eq!(
        stats.free_blocks, stats.total_blocks,
        "blocks held by the dead client"
    );
    let _ = std::fs::remove_file(path);
}

#[test]
fn large_payloads_travel_by_reference_through_the_fabric_pool() {
    by_reference(false);
}

#[test]
fn large_payloads_travel_by_reference_over_software_coherence() {
    by_reference(true);
}

fn by_reference(software: bool) {
    use netless::netless_pool::{Domain, DomainConfig, PoolGeometry};
    let path = region("by-ref");
    let (sf, cf) = (
        open_as(&path, software, None),
        open_as(&path, software, None),
    );
    let mut pool = DomainConfig::new("calls");
    pool.geometry = PoolGeometry {
        pages: 4096,
        ref_slots: 256,
    };
    let server_pool = Domain::join_fabric(&pool, &sf).unwrap();
    let client_pool = Domain::join_fabric(&pool, &cf).unwrap();
    assert_eq!(server_pool.id(), client_pool.id());
    let server = Server::bind(
        "pkg.ByRef",
        ServerConfig {
            domain: Some(server_pool.clone()),
            ..server_config(&sf)
        },
        test_handler,
    )
    .unwrap();
    let client = Client::connect_with(
        "pkg.ByRef",
        ClientConfig {
            domain: Some(client_pool.clone()),
            ref_threshold: 16 * 1024,
            ..client_config(&cf)
        },
    )
    .unwrap();
    let start = client_pool.stats();
    let mut sent_by_ref = 0;
    for len in [100usize, 16 * 1024, 300_000, 1 << 20] {
        let payload: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
        let reply = client.call("Echo", &payload, &opts()).unwrap();
        assert_eq!(reply.payload, payload, "{len} bytes");
        if len >= 16 * 1024 {
            sent_by_ref += len as u64;
        }
    }
    // Written into the pool once each, every Ref mapped and given back.
    let end = client_pool.stats();
    assert_eq!(end.bytes_copied - start.bytes_copied, sent_by_ref);
    assert_eq!(end.outstanding_refs, 0);
    drop((client, server));
    let _ = std::fs::remove_file(path);
}

#[test]
fn a_client_playing_another_host_is_served_across_idle_pauses() {
    // Both sides then sleep at most a tenth of a millisecond at a time, as they must with a
    // peer whose futex wake-ups cannot reach them. (On this one kernel the wake-ups still
    // arrive: this checks the calls and the judging of the peer, not the absence of a
    // wake-up.)
    let path = region("elsewhere");
    let server_side = open_as(&path, false, None);
    let client_side = open_on(&path, false, None, true);
    assert!(!server_side.same_kernel(client_side.member()));
    let server = Server::bind("pkg.Far", server_config(&server_side), test_handler).unwrap();
    let client = Client::connect_with("pkg.Far", client_config(&client_side)).unwrap();
    for i in 0..200u32 {
        let payload = i.to_le_bytes();
        // Pauses long enough for both sides to go to sleep between calls.
        if i % 50 == 0 {
            std::thread::sleep(Duration::from_millis(30));
        }
        assert_eq!(
            client.call("Echo", &payload, &opts()).unwrap().payload,
            payload
        );
    }
    drop(client);
    drop(server);
    let _ = std::fs::remove_file(path);
}

#[test]
fn replies_deferred_to_another_thread_arrive_over_software_coherence() {
    let path = region("deferred");
    let (sf, cf) = (open_as(&path, true, None), open_as(&path, true, None));
    fn handler<'a>(
        req: &netless::Request<'a>,
        resp: &mut netless::ResponseBuilder<'a>,
    ) -> Result<(), netless::Status> {
        static GATE: std::sync::Mutex<Option<netless::DeferredReply>> = std::sync::Mutex::new(None);
        match req.method {
            // Held until `Open` comes, on the same connection: a call waiting for its reply
            // must not keep the next one from being sent.
            "Gate" => {
                *GATE.lock().unwrap() = Some(resp.defer()?);
                return Ok(());
            }
            "Open" => {
                let gate = GATE.lock().unwrap().take();
                if let Some(gate) = gate {
                    let _ = gate.send(&netless::Metadata::new(), b"opened");
                }
                return Ok(());
            }
            "Later" => {}
            _ => return test_handler(req, resp),
        }
        let reply = resp.defer()?;
        let payload = req.payload.to_vec();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(5));
            if payload == b"fail" {
                let _ = reply.fail(&netless::Status::new(Code::Aborted, "asked to"));
            } else {
                let _ = reply.send(&netless::Metadata::new(), &payload);
            }
        });
        Ok(())
    }
    let _server = Server::bind("pkg.Later", server_config(&sf), handler).unwrap();
    let client = Client::connect_with("pkg.Later", client_config(&cf)).unwrap();
    for i in 0..20u32 {
        let payload = i.to_le_bytes();
        assert_eq!(
            client.call("Later", &payload, &opts()).unwrap().payload,
            payload
        );
        // Calls answered at once in between.
        assert_eq!(
            client.call("Echo", b"now", &opts()).unwrap().payload,
            b"now"
        );
    }
    let err = client.call("Later", b"fail", &opts()).unwrap_err();
    assert_eq!((err.code(), err.message()), (Code::Aborted, "asked to"));
    // Calls from several threads on one connection, each waiting for its own reply.
    std::thread::scope(|scope| {
        let gated = scope.spawn(|| client.call("Gate", b"", &opts()));
        let callers: Vec<_> = (0..4u32)
            .map(|t| {
                let client = &client;
                scope.spawn(move || {
                    for i in 0..20u32 {
                        let payload = (t * 1000 + i).to_le_bytes();
                        let reply = client.call("Later", &payload, &opts()).unwrap();
                        assert_eq!(reply.payload, payload);
                    }
                })
            })
            .collect();
        for c in callers {
            c.join().unwrap();
        }
        // Open once the gated call is held (a few tries: it may not have been sent yet).
        for _ in 0..500 {
            client.call("Open", b"", &opts()).unwrap();
            if gated.is_finished() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(gated.join().unwrap().unwrap().payload, b"opened");
    });
    let _ = std::fs::remove_file(path);
}

/// A software-coherent call whose client or server leaves out flushes or invalidations on
/// its data (`data`: rings and pool pages) or on the region's tables (`control`): what the
/// emulator is for. On coherent hardware every one of these would pass.
fn call_with_faults(
    client: (Faults, Faults),
    server: (Faults, Faults),
) -> Result<netless::Reply, netless::Status> {
    let path = region("faults");
    let member = |(data, control): (Faults, Faults)| {
        Fabric::open(
            &path,
            &FabricOptions {
                size: 64 << 20,
                coherence: Coherence::Software,
                emulation: Some(data),
                control_faults: control,
                ..FabricOptions::default()
            },
        )
        .unwrap()
    };
    let server_side = member(server);
    let client_side = member(client);
    let _server = Server::bind("pkg.Faulty", server_config(&server_side), test_handler).unwrap();
    let result = Client::connect_with("pkg.Faulty", client_config(&client_side)).and_then(|c| {
        c.call(
            "Echo",
            b"through the fabric",
            &CallOptions::new().timeout(Duration::from_millis(1500)),
        )
    });
    let _ = std::fs::remove_file(path);
    result
}

const NO_FLUSH: Faults = Faults {
    skip_flush: true,
    skip_invalidate: false,
};
const NO_INVALIDATE: Faults = Faults {
    skip_flush: false,
    skip_invalidate: true,
};
const NONE: Faults = Faults {
    skip_flush: false,
    skip_invalidate: false,
};

#[test]
fn software_coherence_without_faults_delivers() {
    let reply = call_with_faults((NONE, NONE), (NONE, NONE)).unwrap();
    assert_eq!(reply.payload, b"through the fabric");
}

#[test]
fn a_client_that_does_not_flush_cannot_even_lay_out_its_rings() {
    // Laying out its rings, it reads back lines it never wrote back: they are not there.
    let err = call_with_faults((NO_FLUSH, NONE), (NONE, NONE)).unwrap_err();
    assert!(err.message().contains("not a polled ring"), "{err}");
}

#[test]
fn a_server_that_does_not_flush_is_never_heard() {
    let err = call_with_faults((NONE, NONE), (NO_FLUSH, NONE)).unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err}");
}

#[test]
fn a_client_that_does_not_invalidate_never_sees_its_reply() {
    let err = call_with_faults((NO_INVALIDATE, NONE), (NONE, NONE)).unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err}");
}

#[test]
fn a_server_that_does_not_invalidate_never_sees_the_request() {
    let err = call_with_faults((NONE, NONE), (NO_INVALIDATE, NONE)).unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err}");
}

#[test]
fn a_server_that_does_not_write_back_its_directory_entry_is_never_found() {
    let err = call_with_faults((NONE, NONE), (NONE, NO_FLUSH)).unwrap_err();
    assert!(err.message().contains("not found in the fabric"), "{err}");
}

#[test]
fn a_client_that_does_not_invalidate_the_directory_never_finds_a_new_service() {
    // It opened the region before the server published: its copy of the directory is stale.
    let err = call_with_faults((NONE, NO_INVALIDATE), (NONE, NONE)).unwrap_err();
    assert!(err.message().contains("not found in the fabric"), "{err}");
}

#[test]
fn a_server_that_does_not_invalidate_connect_slots_admits_nobody() {
    // It reads the request words from its stale copy: no client there, so nobody is
    // admitted and nothing of anyone's is mapped.
    let err = call_with_faults((NONE, NONE), (NONE, NO_INVALIDATE)).unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
}

#[test]
fn a_client_that_does_not_write_back_its_request_is_never_admitted() {
    let err = call_with_faults((NONE, NO_FLUSH), (NONE, NONE)).unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
}
