//! Several replicas of one service, in separate processes: discovery, power-of-two-choices
//! selection from published queue depths, retry of NACKed calls on another replica or after
//! a backoff, and failover when a replica dies.

mod common;

use std::io::{BufReader, Read, Write};
use std::process::Child;
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use netless::{
    CallOptions, Client, ClientConfig, Replicas, Request, ResponseBuilder, RetryPolicy, Server,
    ServerConfig, Slo, Status,
};

/// `Who`: sleeps the milliseconds in the payload (u64 LE), answers with the replica number.
fn who(replica: u8) -> impl Fn(&Request<'_>, &mut ResponseBuilder<'_>) -> Result<(), Status> {
    move |req: &Request<'_>, resp: &mut ResponseBuilder<'_>| {
        let ms = req
            .payload
            .get(..8)
            .map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap()));
        thread::sleep(Duration::from_millis(ms));
        resp.payload.push(replica);
        Ok(())
    }
}

/// Entry point of spawned peers (run only by them, via `--ignored`).
#[test]
#[ignore = "entry point of the peer processes the other tests spawn"]
fn replicas_child_entry() {
    let Some((role, dir, service)) = role() else {
        return;
    };
    let config = match role.as_str() {
        // Four workers, no SLO: never NACKs.
        "roomy" => ServerConfig {
            workers: 4,
            replica: Some(1),
            ..server_config(&dir)
        },
        // One worker and an SLO of two service times: one request may wait, the next is
        // NACKed.
        _ => ServerConfig {
            workers: 1,
            replica: Some(0),
            slo: Some(Slo::new(Duration::from_millis(20)).mean_service(Duration::from_millis(10))),
            ..server_config(&dir)
        },
    };
    let id = config.replica.unwrap() as u8;
    let _server = Server::bind(&service, config, who(id)).unwrap();
    println!("READY");
    std::io::stdout().flush().unwrap();
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
}

fn start(role: &str, dir: &TestDir, service: &str) -> Child {
    let mut child = spawn_role("replicas_child_entry", role, dir.path(), service);
    let mut out = BufReader::new(child.stdout.take().unwrap());
    wait_for_line(&mut out, "READY");
    drain_in_background(out);
    child
}

fn ms(n: u64) -> [u8; 8] {
    n.to_le_bytes()
}

#[test]
fn nacked_calls_move_to_another_replica_and_dead_ones_are_skipped() {
    let dir = TestDir::new("rep");
    let mut limited = start("limited", &dir, "t.Rep");
    let mut roomy = start("roomy", &dir, "t.Rep");
    let config = ClientConfig {
        retry: RetryPolicy::OtherReplica,
        ..client_config(dir.path())
    };
    let replicas = std::sync::Arc::new(Replicas::connect("t.Rep", config).unwrap());
    assert_eq!(replicas.len(), 2);
    // Six callers at once: more than the limited replica's one worker and one queue slot
    // can take, so some of its calls are NACKed; with OtherReplica every one still succeeds.
    let threads: Vec<_> = (0..6)
        .map(|_| {
            let replicas = replicas.clone();
            thread::spawn(move || {
                let mut served = [0u32; 2];
                for _ in 0..8 {
                    let reply = replicas
                        .call("Who", &ms(15), &CallOptions::new())
                        .expect("no call may fail with a replica to spare");
                    served[reply.payload[0] as usize] += 1;
                }
                served
            })
        })
        .collect();
    let mut served = [0u32; 2];
    for t in threads {
        let s = t.join().unwrap();
        served[0] += s[0];
        served[1] += s[1];
    }
    eprintln!("served {served:?}, retries {}", replicas.retries());
    assert_eq!(served[0] + served[1], 48);
    // The shorter queue wins: the four-worker replica takes most calls.
    assert!(served[1] > served[0], "{served:?}");

    // Kill the roomy replica: a refresh drops it at once (it checks the sockets itself
    // rather than wait for the monitor threads), and calls go to the other.
    sigkill(&roomy);
    roomy.wait().unwrap();
    assert_eq!(replicas.refresh().unwrap(), 1);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut ok_after = 0;
    while ok_after < 5 {
        assert!(
            Instant::now() < deadline,
            "calls kept failing after a replica died"
        );
        match replicas.call("Who", &ms(0), &CallOptions::new()) {
            Ok(reply) => {
                assert_eq!(reply.payload, [0]);
                ok_after += 1;
            }
            // A call racing the death sees UNAVAILABLE (it may have been sent: not retried).
            Err(s) => assert_eq!(s.code(), netless::Code::Unavailable, "{s}"),
        }
    }
    assert_eq!(replicas.refresh().unwrap(), 1);
    drop(limited.stdin.take());
    limited.wait().unwrap();
    // No replica left.
    let err = Replicas::connect("t.Rep", client_config(dir.path())).unwrap_err();
    assert_eq!(err.code(), netless::Code::Unavailable, "{err}");
}

#[test]
fn backoff_retries_nacked_calls_until_they_fit() {
    let dir = TestDir::new("backoff");
    let mut limited = start("limited", &dir, "t.Back");
    let config = ClientConfig {
        retry: RetryPolicy::Backoff {
            attempts: 1000,
            initial: Duration::from_millis(1),
            max: Duration::from_millis(5),
        },
        ..client_config(dir.path())
    };
    let replicas = Replicas::connect("t.Back", config.clone()).unwrap();
    let client = replicas.pick().unwrap();
    // Four callers against one worker that lets one request wait: the rest are NACKed and
    // come back after a pause until they fit.
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let client: Client = client.clone();
            thread::spawn(move || {
                for _ in 0..5 {
                    client.call("Who", &ms(10), &CallOptions::new()).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    drop(limited.stdin.take());
    limited.wait().unwrap();
}

#[test]
fn replica_sockets_are_named_and_found() {
    let dir = TestDir::new("names");
    let servers: Vec<Server> = [None, Some(3), Some(12)]
        .into_iter()
        .map(|replica| {
            let config = ServerConfig {
                replica,
                ..server_config(dir.path())
            };
            Server::bind("t.Names", config, who(replica.unwrap_or(0) as u8)).unwrap()
        })
        .collect();
    let names: Vec<String> = servers
        .iter()
        .map(|s| {
            s.socket_path()
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into()
        })
        .collect();
    assert_eq!(names, ["t.Names.sock", "t.Names#3.sock", "t.Names#12.sock"]);
    // A service whose name extends this one's is not one of its replicas.
    let _other = Server::bind("t.Names2", server_config(dir.path()), who(9)).unwrap();
    let replicas = Replicas::connect("t.Names", client_config(dir.path())).unwrap();
    assert_eq!(replicas.len(), 3);
}
