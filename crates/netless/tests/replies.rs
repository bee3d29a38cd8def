//! Replies out of the ordinary: deferred ones (a handler hands its call to another thread and
//! returns; the reply arrives later, in any order, while the single worker keeps serving),
//! and ones too large for the client (that call fails, the connection stays).

mod common;

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use common::*;
use netless::{CallOptions, Client, Code, Metadata, Request, ResponseBuilder, Server, Status};

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
    let server = Server::bind(
        service,
        netless::ServerConfig {
            workers: 1,
            ..server_config(dir.path())
        },
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
    )
    .unwrap();
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
