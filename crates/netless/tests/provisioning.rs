//! Receive-buffer provisioning modes and dispatch policies (NEBULA §V-B, §V-E) across real
//! processes: the server runs in the test process (so the test reads its stats), clients in
//! spawned processes.

mod common;

use std::io::{BufReader, Write};
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use netless::{CallOptions, Client, Dispatch, Provisioning, Server, ServerConfig};

/// Entry point of spawned peers (run only by them, via `--ignored`).
#[test]
#[ignore = "entry point of the peer processes the other tests spawn"]
fn provisioning_child_entry() {
    let Some((role, dir, service)) = role() else {
        return;
    };
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
