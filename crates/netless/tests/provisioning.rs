//! Receive-buffer provisioning modes and dispatch policies (NEBULA §V-B, §V-E) across real
//! processes: the server runs in the test process (so the test reads its stats), clients in
//! spawned processes.

mod common;

use std::io::{BufReader, Write};
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use netless::{
    CallOptions, Client, ClientConfig, Dispatch, Provisioning, Request, ResponseBuilder, Server,
    ServerConfig, Status,
};

/// Entry point of spawned peers (run only by them, via `--ignored`).
#[test]
#[ignore = "entry point of the peer processes the other tests spawn"]
fn provisioning_child_entry() {
    let Some((role, dir, service)) = role() else {
        return;
    };
    // Connect as from a CPU (told, or pinned there), ask the server where it serves us.
    let (hint, pinned) = match role.split_once('-') {
        Some(("hint", cpu)) => (Some(cpu.parse().unwrap()), None),
        Some(("pinned", cpu)) => (None, Some(cpu.parse().unwrap())),
        _ => (None, None),
    };
    if hint.is_some() || pinned.is_some() {
        if let Some(cpu) = pinned {
            netless_shm::pin_current_thread(cpu).unwrap();
        }
        let config = ClientConfig {
            cpu: hint,
            ..client_config(&dir)
        };
        let client = Client::connect_with(&service, config).unwrap();
        let served_on: Vec<u32> = (0..50)
            .map(|_| {
                let reply = client.call("Where", b"", &CallOptions::new()).unwrap();
                u32::from_le_bytes(reply.payload[..4].try_into().unwrap())
            })
            .collect();
        let same = served_on.iter().all(|&c| c == served_on[0]);
        println!("RESULT cpu={} same={}", served_on[0], u8::from(same));
        std::io::stdout().flush().unwrap();
        let mut sink = String::new();
        let _ = std::io::stdin().read_line(&mut sink);
    }
    // Connect and stay connected until stdin closes.
    if role == "idle" {
        let client = Client::connect_with(&service, client_config(&dir)).unwrap();
        client.call("Echo", b"x", &CallOptions::new()).unwrap();
        println!("READY");
        std::io::stdout().flush().unwrap();
        let mut sink = String::new();
        let _ = std::io::stdin().read_line(&mut sink);
    }
}

/// Receive-buffer memory per provisioning mode as connections come and go.
#[test]
fn provisioning_modes_account_their_memory() {
    let dir = TestDir::new("prov");
    for (i, provisioning) in [
        Provisioning::Shared,
        Provisioning::PerWorker,
        Provisioning::PerConnection,
    ]
    .into_iter()
    .enumerate()
    {
        let service = format!("t.Prov{i}");
        let config = ServerConfig {
            provisioning,
            buffer_bytes: Some(64 * 1024),
            max_connections: 64,
            dispatch: if i == 1 {
                Dispatch::Partitioned
            } else {
                Dispatch::SingleQueue
            },
            ..server_config(dir.path())
        };
        let server = Server::bind(&service, config, test_handler).unwrap();
        let idle = server.stats().receive_buffer_bytes;
        let children: Vec<_> = (0..3)
            .map(|_| {
                let mut c = spawn_role("provisioning_child_entry", "idle", dir.path(), &service);
                let mut out = BufReader::new(c.stdout.take().unwrap());
                wait_for_line(&mut out, "READY");
                (c, out)
            })
            .collect();
        // And calls from here, of several sizes (some fragmented), all answered.
        let client = Client::connect_with(&service, client_config(dir.path())).unwrap();
        for size in [0usize, 1, 63, 64, 200, 5000, 100_000] {
            let payload = vec![size as u8; size];
            let reply = client.call("Echo", &payload, &CallOptions::new()).unwrap();
            assert_eq!(reply.payload, payload, "{provisioning:?} size {size}");
        }
        let busy = server.stats().receive_buffer_bytes;
        match provisioning {
            Provisioning::Shared => assert_eq!((idle, busy), (65536, 65536)),
            Provisioning::PerWorker => assert_eq!((idle, busy), (2 * 65536, 2 * 65536)),
            Provisioning::PerConnection => assert_eq!((idle, busy), (0, 4 * 65536)),
        }
        drop(client);
        for (mut c, _) in children {
            drop(c.stdin.take());
            c.wait().unwrap();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let s = server.stats();
            if s.connections == 0 && s.free_blocks == s.total_blocks {
                break;
            }
            assert!(Instant::now() < deadline, "{provisioning:?}: {s:?}");
            thread::sleep(Duration::from_millis(10));
        }
    }
}

#[test]
fn jbsq2_serves_every_call() {
    let dir = TestDir::new("jbsq");
    let config = ServerConfig {
        dispatch: Dispatch::Jbsq2,
        ..server_config(dir.path())
    };
    let _server = Server::bind("t.Jbsq", config, test_handler).unwrap();
    let client = Client::connect_with("t.Jbsq", client_config(dir.path())).unwrap();
    let threads: Vec<_> = (0..4u8)
        .map(|t| {
            let client = client.clone();
            thread::spawn(move || {
                for i in 0..300u32 {
                    let payload = vec![t; (i as usize * 37) % 2000];
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

/// Replies with the CPU the serving worker runs on.
fn where_handler<'a>(_: &Request<'a>, resp: &mut ResponseBuilder<'a>) -> Result<(), Status> {
    resp.payload
        .extend_from_slice(&(netless_shm::current_cpu() as u32).to_le_bytes());
    Ok(())
}

/// The CPU a client process in `role` was served on, for every one of its calls.
fn served_on(dir: &TestDir, service: &str, role: &str) -> (u64, std::process::Child) {
    let mut child = spawn_role("provisioning_child_entry", role, dir.path(), service);
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let line = read_result(&mut out, Duration::from_secs(20));
    drain_in_background(out);
    assert_eq!(
        field(&line, "same"),
        1,
        "{role}: served on several CPUs: {line}"
    );
    (field(&line, "cpu"), child)
}

/// `Dispatch::CpuLocal` serves each connection on the worker pinned to the CPU its client
/// named or connected from, whatever the order of connections; a CPU with no worker, or
/// `Partitioned`, falls back to the connection's index.
#[test]
fn cpu_local_dispatch_serves_a_client_on_its_own_cpu() {
    let cpus = netless_shm::allowed_cpus();
    if cpus.len() < 2 {
        eprintln!("skipped: needs two CPUs, this process may use {cpus:?}");
        return;
    }
    let (a, b) = (cpus[0], cpus[1]);
    // Where pinning is forbidden (a seccomp filter), workers run anywhere: nothing to test.
    let pinned = thread::spawn(move || {
        netless_shm::pin_current_thread(b).is_ok() && netless_shm::current_cpu() == b
    });
    if !pinned.join().unwrap() {
        eprintln!("skipped: this process cannot pin a thread to CPU {b}");
        return;
    }
    let dir = TestDir::new("cpulocal");
    let bind = |service: &str, dispatch| {
        let config = ServerConfig {
            workers: 2,
            pin_cpus: vec![a, b],
            dispatch,
            ..server_config(dir.path())
        };
        Server::bind(service, config, where_handler).unwrap()
    };
    let _local = bind("t.CpuLocal", Dispatch::CpuLocal);
    let mut children = Vec::new();
    // The first connection (index 0, queue 0: CPU `a` by index) asks for `b`.
    for (role, expect) in [
        (format!("hint-{b}"), b),
        (format!("hint-{b}"), b),
        (format!("hint-{a}"), a),
        (format!("pinned-{b}"), b),
        (format!("pinned-{a}"), a),
    ] {
        let (cpu, child) = served_on(&dir, "t.CpuLocal", &role);
        assert_eq!(cpu, expect as u64, "{role}");
        children.push(child);
    }
    // A CPU no worker runs on: served all the same.
    let (cpu, child) = served_on(&dir, "t.CpuLocal", "hint-100000");
    assert!(cpu == a as u64 || cpu == b as u64);
    children.push(child);
    // Without pin_cpus there is no CPU to serve a client on: a clear refusal at bind.
    let unpinned = ServerConfig {
        workers: 2,
        dispatch: Dispatch::CpuLocal,
        ..server_config(dir.path())
    };
    let refused = Server::bind("t.Unpinned", unpinned, where_handler).unwrap_err();
    assert_eq!(refused.code(), netless::Code::InvalidArgument);
    assert!(refused.message().contains("pin_cpus"), "{refused:?}");
    // Partitioned ignores the hint: the first connection is served by worker 0, on `a`.
    let _partitioned = bind("t.Partitioned", Dispatch::Partitioned);
    let (cpu, child) = served_on(&dir, "t.Partitioned", &format!("hint-{b}"));
    assert_eq!(cpu, a as u64);
    children.push(child);
    for mut c in children {
        drop(c.stdin.take());
        c.wait().unwrap();
    }
}
