//! A forwarding tier: a server whose handler does not answer at once. It defers each reply
//! (`ResponseBuilder::defer`), sends the call on to a backend on a `Pipeline`, and answers
//! from `Handler::poll` when the backend's reply arrives; its worker sleeps on its own queue
//! and on the pipeline's replies at once (`Handler::wake_sources`). One worker thread serves
//! any number of calls in flight, as a tier of a microservice chain does.
//!
//! ```sh
//! cargo run --release -p netless-examples --bin forwarder
//! ```
//!
//! Three processes: the backend (it upper-cases), the forwarder, and this client.

use std::sync::Mutex;
use std::time::Duration;

use netless::{
    CallOptions, Client, ClientConfig, DeferredReply, Handler, Metadata, Pipeline, Request,
    ResponseBuilder, Server, ServerConfig, Status, WakeSource,
};
use netless_examples::peer::{self, Peer, RunDir};

/// The most calls the forwarder keeps in flight to the backend.
const IN_FLIGHT: u32 = 256;

fn upper<'a>(req: &Request<'a>, resp: &mut ResponseBuilder<'a>) -> Result<(), Status> {
    resp.payload
        .extend(req.payload.iter().map(u8::to_ascii_uppercase));
    Ok(())
}

/// Forwards every call to the backend and answers when the backend does.
struct Forwarder {
    /// The pipeline to the backend, and the deferred reply of each call in flight on it (by
    /// its slot, `Pipeline::slot`).
    next: Mutex<(Pipeline, Vec<Option<DeferredReply>>)>,
}

impl Handler for Forwarder {
    fn call<'a>(&self, req: &Request<'a>, resp: &mut ResponseBuilder<'a>) -> Result<(), Status> {
        let reply = resp.defer()?;
        let mut next = self.next.lock().unwrap_or_else(|e| e.into_inner());
        let (pipe, waiting) = &mut *next;
        match pipe.submit(req.method, req.payload) {
            Ok(id) => waiting[Pipeline::slot(id)] = Some(reply),
            // The backend's NACK (or its death) is this call's answer.
            Err(status) => {
                let _ = reply.fail(&status);
            }
        }
        Ok(())
    }

    fn poll(&self, _worker: usize) -> bool {
        let mut next = self.next.lock().unwrap_or_else(|e| e.into_inner());
        let (pipe, waiting) = &mut *next;
        let answered = pipe.poll(|id, outcome| {
            if let Some(reply) = waiting[Pipeline::slot(id)].take() {
                let _ = match outcome {
                    Ok(bytes) => reply.send(&Metadata::new(), bytes),
                    Err(status) => reply.fail(&status),
                };
            }
        });
        answered.is_ok_and(|n| n > 0)
    }

    fn wake_sources(&self, _worker: usize) -> Vec<WakeSource> {
        let next = self.next.lock().unwrap_or_else(|e| e.into_inner());
        vec![next.0.wake_source()]
    }
}

fn main() -> anyhow::Result<()> {
    if let Some((role, dir)) = peer::role() {
        let config = ServerConfig {
            dir: Some(dir.clone()),
            workers: 1,
            ..ServerConfig::default()
        };
        let _server = if role == "backend" {
            Server::bind("example.Upper", config, upper)?
        } else {
            let client = ClientConfig {
                dir: Some(dir),
                max_in_flight: IN_FLIGHT,
                ..ClientConfig::default()
            };
            let pipe = Pipeline::connect("example.Upper", client)?;
            let waiting = (0..IN_FLIGHT).map(|_| None).collect();
            let next = Mutex::new((pipe, waiting));
            Server::bind("example.Front", config, Forwarder { next })?
        };
        peer::serve_until_released();
        return Ok(());
    }
    let dir = RunDir::new("forwarder")?;
    let _backend = Peer::start("backend", dir.path())?;
    let _forwarder = Peer::start("forwarder", dir.path())?;
    let config = ClientConfig {
        dir: Some(dir.path().to_path_buf()),
        ..ClientConfig::default()
    };
    let client = Client::connect_with("example.Front", config)?;
    let options = CallOptions::new().timeout(Duration::from_secs(5));
    for word in ["shared", "memory", "forwarded"] {
        let reply = client.call("Upper", word.as_bytes(), &options)?;
        let answer = String::from_utf8_lossy(&reply.payload);
        println!("{word} -> {answer}");
        anyhow::ensure!(
            answer == word.to_uppercase(),
            "the backend's answer did not come back"
        );
    }
    Ok(())
}
