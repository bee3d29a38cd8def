//! A server whose handler forwards: it defers each reply, sends the call on to another
//! service on a `Pipeline`, and answers from `Handler::poll` when the reply comes; its worker
//! sleeps on its queue and the pipeline at once (`Handler::wake_sources`). Three processes:
//! this test (the client), the forwarder and the backend.

mod common;

use std::io::{BufReader, Read, Write};
use std::process::Child;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::*;
use netless::{
    CallOptions, Client, ClientConfig, DeferredReply, Handler, Metadata, Pipeline, Request,
    ResponseBuilder, Server, ServerConfig, Status, WaitMode, WaitPolicy, WakeSource,
};

/// Sleep at once: every wake-up is a real one, so a missing wake source or a missing ring
/// shows up as a stall of the bounded sleep (100 ms for workers, 50 ms for clients).
fn futex_only() -> WaitPolicy {
    WaitPolicy {
        mode: WaitMode::Futex,
        spin: Duration::ZERO,
    }
}

/// Forwards every call to the backend and answers when it does.
struct Forwarder {
    next: Mutex<(Pipeline, Vec<Option<DeferredReply>>)>,
}

impl Handler for Forwarder {
    fn call<'a>(&self, req: &Request<'a>, resp: &mut ResponseBuilder<'a>) -> Result<(), Status> {
        let reply = resp.defer()?;
        let mut next = self.next.lock().unwrap();
        let (pipe, waiting) = &mut *next;
        match pipe.submit(req.method, req.payload) {
            Ok(id) => waiting[Pipeline::slot(id)] = Some(reply),
            Err(status) => {
                let _ = reply.fail(&status);
            }
        }
        Ok(())
    }

    fn poll(&self, _worker: usize) -> bool {
        let mut next = self.next.lock().unwrap();
        let (pipe, waiting) = &mut *next;
        let delivered = pipe.poll(|id, outcome| {
            if let Some(reply) = waiting[Pipeline::slot(id)].take() {
                let _ = match outcome {
                    Ok(bytes) => reply.send(&Metadata::new(), bytes),
                    Err(status) => reply.fail(&status),
                };
            }
        });
        delivered.is_ok_and(|n| n > 0)
    }

    fn wake_sources(&self, _worker: usize) -> Vec<WakeSource> {
        vec![self.next.lock().unwrap().0.wake_source()]
    }
}

/// Entry point of spawned peers (run only by them, via `--ignored`).
#[test]
#[ignore = "entry point of the peer processes the other tests spawn"]
fn forwarding_child_entry() {
    let Some((role, dir, service)) = role() else {
        return;
    };
    let config = ServerConfig {
        workers: 1,
        wait: futex_only(),
        ..server_config(&dir)
    };
    let _server = match role.as_str() {
        "backend" => Server::bind(&service, config, test_handler).unwrap(),
        "forwarder" => {
            let pipe = Pipeline::connect(
                &format!("{service}.backend"),
                ClientConfig {
                    wait: futex_only(),
                    ..client_config(&dir)
                },
            )
            .unwrap();
            let waiting = (0..256).map(|_| None).collect();
            let handler = Forwarder {
                next: Mutex::new((pipe, waiting)),
            };
            Server::bind(&service, config, handler).unwrap()
        }
        other => panic!("unknown role {other}"),
    };
    println!("READY");
    std::io::stdout().flush().unwrap();
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
}

fn start(role: &str, dir: &TestDir, service: &str) -> Child {
    let mut child = spawn_role("forwarding_child_entry", role, dir.path(), service);
    let mut out = BufReader::new(child.stdout.take().unwrap());
    wait_for_line(&mut out, "READY");
    child
}

#[test]
fn a_forwarding_handler_answers_from_its_poll_without_stalls() {
    let dir = TestDir::new("fwd");
    let mut backend = start("backend", &dir, "fwd.backend");
    let mut forwarder = start("forwarder", &dir, "fwd");
    let client = Client::connect_with(
        "fwd",
        ClientConfig {
            wait: futex_only(),
            ..client_config(dir.path())
        },
    )
    .unwrap();
    let options = CallOptions::new().timeout(Duration::from_secs(10));
    // One call at a time, everyone sleeping between calls: each reply needs the forwarder's
    // worker woken by the backend's reply (its wake source) and the client woken by the ring
    // at the end of the worker's poll. A missed one stalls a call by a bounded sleep (50 or
    // 100 ms), so 100 calls would take 5 s or more; done right, they take milliseconds.
    let started = Instant::now();
    for i in 0..100u32 {
        let payload = i.to_le_bytes().repeat(1 + (i % 40) as usize);
        let reply = client.call("Echo", &payload, &options).unwrap();
        assert_eq!(reply.payload, payload);
    }
    let sequential = started.elapsed();
    assert!(
        sequential < Duration::from_millis(2500),
        "100 forwarded calls took {sequential:?}: a wake-up was missed"
    );
    // Many in flight: replies come back through the forwarder's poll in batches.
    let mut pipe = Pipeline::connect("fwd", client_config(dir.path())).unwrap();
    let mut expected = std::collections::HashMap::new();
    let (mut sent, mut done) = (0u32, 0u32);
    let deadline = Instant::now() + Duration::from_secs(30);
    while done < 2000 {
        assert!(Instant::now() < deadline, "stalled at {done}/2000");
        while sent < 2000 && pipe.in_flight() < 64 {
            let payload = sent.to_le_bytes().to_vec();
            expected.insert(pipe.submit("Echo", &payload).unwrap(), payload);
            sent += 1;
        }
        pipe.wait(Some(Duration::from_secs(5))).unwrap();
        let mut got = Vec::new();
        pipe.poll(|id, reply| got.push((id, reply.map(<[u8]>::to_vec))))
            .unwrap();
        for (id, reply) in got {
            assert_eq!(reply.unwrap(), expected.remove(&id).unwrap());
            done += 1;
        }
    }
    assert!(expected.is_empty());
    // A backend error comes back as that error.
    let status = client.call("Fail", b"", &options).unwrap_err();
    assert_eq!(status.code(), netless::Code::NotFound);
    for child in [&mut forwarder, &mut backend] {
        sigkill(child);
        child.wait().unwrap();
    }
}
