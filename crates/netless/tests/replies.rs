//! Replies out of the ordinary: deferred ones (a handler hands its call to another thread and
//! returns; the reply arrives later, in any order, while the single worker keeps serving),
//! ones from a handler that panicked (that call fails, the worker lives), and ones too large
//! for the client (that call fails, the connection stays).

mod common;

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use common::*;
use netless::{
    control, CallOptions, Client, Code, Metadata, Pipeline, Request, ResponseBuilder, Server,
    Status,
};

/// A server for `service` in `dir` with one worker, so calls are served in order.
fn one_worker(service: &str, dir: &TestDir, handler: impl netless::Handler) -> Server {
    let config = netless::ServerConfig {
        workers: 1,
        ..server_config(dir.path())
    };
    Server::bind(service, config, handler).unwrap()
}

#[test]
fn deferred_replies_arrive_out_of_order_and_unsent_ones_fail() {
    let dir = TestDir::new("deferred");
    let service = "test.Deferred";
    let (tx, rx) = mpsc::channel::<(String, netless::DeferredReply)>();
    // The replier answers "b" before "a", however they arrive.
    let replier = thread::spawn(move || {
        let mut held = None;
        for (method, reply) in rx {
            match method.as_str() {
                "a" => held = Some(reply),
                "b" => {
                    reply.send(&Metadata::new(), b"b").unwrap();
                    if let Some(a) = held.take() {
                        a.send(&Metadata::new(), b"a").unwrap();
                    }
                }
                _ => drop(reply),
            }
        }
    });
    let tx = std::sync::Mutex::new(tx);
    let server = one_worker(
        service,
        &dir,
        move |req: &Request<'_>, resp: &mut ResponseBuilder<'_>| -> Result<(), Status> {
            if req.method == "now" {
                resp.payload.extend_from_slice(b"now");
                return Ok(());
            }
            let reply = resp.defer()?;
            tx.lock()
                .unwrap()
                .send((req.method.to_string(), reply))
                .unwrap();
            Ok(())
        },
    );
    let client = Client::connect_with(service, client_config(dir.path())).unwrap();
    let opts = CallOptions::new().timeout(Duration::from_secs(10));
    let a = {
        let client = client.clone();
        let opts = opts.clone();
        thread::spawn(move || client.call("a", b"", &opts))
    };
    // While "a" waits, the worker serves other calls.
    thread::sleep(Duration::from_millis(50));
    assert_eq!(client.call("now", b"", &opts).unwrap().payload, b"now");
    assert_eq!(client.call("b", b"", &opts).unwrap().payload, b"b");
    assert_eq!(a.join().unwrap().unwrap().payload, b"a");
    let err = client.call("dropped", b"", &opts).unwrap_err();
    assert_eq!(err.code(), Code::Internal, "{err}");
    assert!(err.message().contains("without replying"), "{err}");
    drop(server);
    let _ = replier.join();
}

/// A batch's requests that repeat one method are served on the worker's lean path, which
/// keeps one builder for them all: each deferred reply must still answer its own call, and
/// a panic must fail only the call that panicked.
#[test]
fn batched_calls_defer_and_panic_one_by_one() {
    let dir = TestDir::new("batchdefer");
    let service = "test.BatchDefer";
    const CALLS: u64 = 24;
    let (tx, rx) = mpsc::channel::<(Vec<u8>, netless::DeferredReply)>();
    // Answers once all have arrived, in reverse order, each with its request's payload.
    let replier = thread::spawn(move || {
        let mut held: Vec<_> = rx.iter().take(CALLS as usize).collect();
        while let Some((payload, reply)) = held.pop() {
            reply.send(&Metadata::new(), &payload).unwrap();
        }
    });
    let tx = std::sync::Mutex::new(tx);
    let server = one_worker(
        service,
        &dir,
        move |req: &Request<'_>, resp: &mut ResponseBuilder<'_>| -> Result<(), Status> {
            match req.method {
                "Later" => {
                    let reply = resp.defer()?;
                    tx.lock()
                        .unwrap()
                        .send((req.payload.to_vec(), reply))
                        .unwrap();
                }
                "Boom" if req.payload[0] % 3 == 1 => panic!("boom {}", req.payload[0]),
                _ => resp.payload.extend_from_slice(req.payload),
            }
            Ok(())
        },
    );
    let client = Client::connect_with(service, client_config(dir.path())).unwrap();
    for line in ["batch_mode=fixed", "batch=32"] {
        client
            .call(control::SET, line.as_bytes(), &CallOptions::new())
            .unwrap();
    }
    let mut pipe = Pipeline::connect(service, client_config(dir.path())).unwrap();
    // Runs `calls` of `method` in one batch; returns each call's payload and reply.
    let mut batch = |method: &str| {
        let (batches, _) = pipe.batch_counts();
        let mut sent = std::collections::HashMap::new();
        for i in 0..CALLS {
            let payload = vec![i as u8; 40 + i as usize];
            sent.insert(pipe.submit(method, &payload).unwrap(), payload);
        }
        pipe.flush();
        let mut got = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while got.len() < CALLS as usize {
            assert!(
                std::time::Instant::now() < deadline,
                "{method}: {} replies",
                got.len()
            );
            let n = pipe
                .poll(|id, reply| {
                    got.push((sent[&id].clone(), reply.map(<[u8]>::to_vec)));
                })
                .unwrap();
            if n == 0 {
                pipe.wait(Some(Duration::from_secs(5))).unwrap();
            }
        }
        assert_eq!(pipe.batch_counts().0, batches + 1, "{method}: one batch");
        got
    };
    for (payload, reply) in batch("Later") {
        assert_eq!(reply.unwrap(), payload);
    }
    let mut failed = 0;
    for (payload, reply) in batch("Boom") {
        if payload[0] % 3 == 1 {
            let err = reply.unwrap_err();
            assert_eq!(err.code(), Code::Internal, "{err}");
            assert!(err.message().contains("`Boom` panicked"), "{err}");
            failed += 1;
        } else {
            assert_eq!(reply.unwrap(), payload);
        }
    }
    assert_eq!(failed, CALLS / 3);
    drop(pipe);
    drop(server);
    replier.join().unwrap();
}

#[test]
fn a_builder_not_made_by_a_server_cannot_defer() {
    let mut builder = ResponseBuilder::default();
    assert_eq!(
        builder.defer().unwrap_err().code(),
        Code::FailedPrecondition
    );
}

#[test]
fn a_reply_larger_than_the_client_accepts_fails_that_call_only() {
    let dir = TestDir::new("bigreply");
    let service = "test.BigReply";
    let server = Server::bind(
        service,
        server_config(dir.path()),
        |req: &Request<'_>, resp: &mut ResponseBuilder<'_>| -> Result<(), Status> {
            let n: usize = std::str::from_utf8(req.payload).unwrap().parse().unwrap();
            resp.payload.resize(n, 7);
            Ok(())
        },
    )
    .unwrap();
    let client = Client::connect_with(
        service,
        netless::ClientConfig {
            max_message: 64 * 1024,
            ..client_config(dir.path())
        },
    )
    .unwrap();
    let opts = CallOptions::new().timeout(Duration::from_secs(10));
    let err = client.call("M", b"100000", &opts).unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
    assert!(err.message().contains("ClientConfig::max_message"), "{err}");
    // The connection is still good.
    assert_eq!(
        client.call("M", b"1000", &opts).unwrap().payload.len(),
        1000
    );
    drop(server);
}

/// A reply larger than the client's response ring goes in as the client reads: the rest
/// waits in the server's backlog, and the workers push it on as soon as the client has made
/// room, not when an idle worker's 100 ms sleep ends. So a 1 MiB reply through a 64 KiB ring
/// (some thirty refills) meets a one-second deadline; and one a thread other than the
/// worker sends while the worker sleeps (a deferred reply) wakes the worker to push its
/// rest: eight such take a fraction of the 800 ms that eight such sleeps would.
#[test]
fn a_reply_larger_than_the_ring_moves_as_the_client_reads_it() {
    const SIZE: usize = 1 << 20;
    let dir = TestDir::new("ringful");
    let service = "test.Ringful";
    let server = one_worker(
        service,
        &dir,
        |req: &Request<'_>, resp: &mut ResponseBuilder<'_>| -> Result<(), Status> {
            if req.method == "now" {
                resp.payload.resize(SIZE, 7);
                return Ok(());
            }
            let reply = resp.defer()?;
            thread::spawn(move || {
                // Long enough for the idle worker to go to sleep.
                thread::sleep(Duration::from_millis(5));
                let _ = reply.send(&Metadata::new(), &vec![7; SIZE]);
            });
            Ok(())
        },
    );
    let client = Client::connect_with(
        service,
        netless::ClientConfig {
            ring_bytes: 64 * 1024,
            ..client_config(dir.path())
        },
    )
    .unwrap();
    let opts = CallOptions::new().timeout(Duration::from_secs(1));
    let call = |method: &str| {
        let reply = client
            .call(method, b"", &opts)
            .unwrap_or_else(|e| panic!("{method}: {e}"));
        assert_eq!(reply.payload.len(), SIZE, "{method}");
    };
    call("now");
    call("now");
    let started = std::time::Instant::now();
    for _ in 0..8 {
        call("later");
    }
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(400),
        "8 deferred replies took {took:?}: each waited for the worker's sleep to end"
    );
    drop(server);
}
