//! Pipelined calls: one thread keeps many calls in flight on one connection, without
//! tokio. `submit` returns a call id at once; `poll` hands over whichever replies have come,
//! in any order. Consecutive submits go to the server in batches, one queue entry each, as
//! the server's soft registers say (`netless ctl SERVICE set batch=32 batch_mode=fixed`).
//!
//! ```sh
//! cargo run --release -p netless-examples --bin pipeline
//! ```
//!
//! Starts the echo server as a process of its own, keeps 64 calls in flight until 200 000
//! (or `--calls N`) have come back, checks every reply, and prints the rate and the mean
//! batch.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Context as _;

use netless::{ClientConfig, Pipeline, Request, ResponseBuilder, Server, ServerConfig, Status};
use netless_examples::peer::{self, Peer, RunDir};

const SERVICE: &str = "example.Echo";
const WINDOW: u32 = 64;

fn echo<'a>(req: &Request<'a>, resp: &mut ResponseBuilder<'a>) -> Result<(), Status> {
    resp.reply_with(req.payload);
    Ok(())
}

fn main() -> anyhow::Result<()> {
    if let Some((_, dir)) = peer::role() {
        let config = ServerConfig {
            dir: Some(dir),
            ..ServerConfig::default()
        };
        let _server = Server::bind(SERVICE, config, echo)?;
        peer::serve_until_released();
        return Ok(());
    }
    let args: Vec<String> = std::env::args().collect();
    let calls: u64 = match args.iter().position(|a| a == "--calls") {
        Some(i) => args.get(i + 1).context("--calls takes a number")?.parse()?,
        None => 200_000,
    };
    let dir = RunDir::new("pipeline")?;
    let _server = Peer::start("server", dir.path())?;
    let config = ClientConfig {
        dir: Some(dir.path().to_path_buf()),
        ..ClientConfig::default()
    };
    let mut pipe = Pipeline::connect(SERVICE, config)?;
    // What each call in flight sent, by call id, to check its reply.
    let mut sent: HashMap<u64, u64> = HashMap::new();
    let (mut next, mut done) = (0u64, 0u64);
    let started = Instant::now();
    while done < calls {
        while next < calls && pipe.in_flight() < WINDOW {
            let id = pipe.submit("Echo", &next.to_le_bytes())?;
            sent.insert(id, next);
            next += 1;
        }
        pipe.wait(Some(Duration::from_secs(10)))?;
        let mut failure = None;
        pipe.poll(|id, reply| {
            let request = sent.remove(&id).map(u64::to_le_bytes);
            match reply {
                Ok(bytes) if request.is_some_and(|r| r == bytes) => done += 1,
                Ok(_) => failure = Some(format!("call {id}: a reply that is not its request")),
                Err(status) => failure = Some(format!("call {id}: {status}")),
            }
        })?;
        if let Some(why) = failure {
            anyhow::bail!(why);
        }
    }
    let elapsed = started.elapsed();
    let (batches, requests) = pipe.batch_counts();
    println!(
        "{calls} calls, {WINDOW} in flight: {:.2} Mcalls/s, {:.1} requests per batch",
        calls as f64 / elapsed.as_secs_f64() / 1e6,
        requests as f64 / batches.max(1) as f64
    );
    Ok(())
}
