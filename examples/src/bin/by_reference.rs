//! Pass by reference (DmRPC): processes that join one page-pool domain pass large payloads
//! as 32-byte Refs to shared pages instead of copying them through the receive buffer.
//!
//! ```sh
//! cargo run --release -p netless-examples --bin by_reference
//! ```
//!
//! The client and the server (a process of its own) join the domain `example-pool`. The
//! client sends a 3 MiB payload with a plain `call`: above `ref_threshold` (16 KiB by
//! default) it travels as a Ref on its own, and the server's handler reads the pages in
//! place. Then the client shares a buffer explicitly and sends the Ref in a payload of its
//! own; writes to a shared buffer are copy-on-write per 4 KiB page, so a view mapped before
//! a write never changes under its reader.

use std::time::Duration;

use netless::netless_pool::{Domain, DomainConfig, Ref};
use netless::{
    CallOptions, Client, ClientConfig, Request, ResponseBuilder, Server, ServerConfig, Status,
};
use netless_examples::peer::{self, Peer, RunDir};

const SERVICE: &str = "example.Sum";

fn domain(dir: &std::path::Path) -> anyhow::Result<Domain> {
    let mut config = DomainConfig::new("example-pool");
    config.dir = Some(dir.to_path_buf());
    Ok(Domain::join(&config)?)
}

/// `Sum` adds up the payload's bytes (which may have come as a Ref: the handler cannot
/// tell); `SumRef` maps a Ref the caller shared and adds up its pages.
fn serve(pool: Domain) -> impl Fn(&Request<'_>, &mut ResponseBuilder<'_>) -> Result<(), Status> {
    move |req, resp| {
        let sum = match req.method {
            "Sum" => req.payload.iter().map(|&b| u64::from(b)).sum::<u64>(),
            "SumRef" => {
                let shared = pool.map(&Ref::from_bytes(req.payload)?)?;
                shared.to_vec().iter().map(|&b| u64::from(b)).sum()
            }
            other => return Err(Status::unimplemented(format!("no method `{other}`"))),
        };
        resp.payload.extend_from_slice(&sum.to_le_bytes());
        Ok(())
    }
}

fn main() -> anyhow::Result<()> {
    if let Some((_, dir)) = peer::role() {
        let pool = domain(&dir)?;
        let config = ServerConfig {
            dir: Some(dir),
            domain: Some(pool.clone()),
            ..ServerConfig::default()
        };
        let _server = Server::bind(SERVICE, config, serve(pool))?;
        peer::serve_until_released();
        return Ok(());
    }
    let dir = RunDir::new("by-reference")?;
    // The first process to join founds the domain: this one, before the server.
    let pool = domain(dir.path())?;
    let _server = Peer::start("server", dir.path())?;
    let config = ClientConfig {
        dir: Some(dir.path().to_path_buf()),
        domain: Some(pool.clone()),
        ..ClientConfig::default()
    };
    let client = Client::connect_with(SERVICE, config)?;
    let options = CallOptions::new().timeout(Duration::from_secs(10));
    let sum = |reply: netless::Reply| u64::from_le_bytes(reply.payload[..8].try_into().unwrap());

    // 1. Invisibly: a large payload goes by reference on its own.
    let payload = vec![3u8; 3 << 20];
    let got = sum(client.call("Sum", &payload, &options)?);
    println!("Sum of 3 MiB sent with call(): {got}");
    anyhow::ensure!(got == 3 * (3 << 20), "wrong sum");

    // 2. Explicitly: share a buffer and send its Ref (a Ref maps once: share again to send
    //    the buffer again). Writing to a shared buffer copies the pages written, so a view
    //    mapped before the write keeps reading what was there.
    let mut buf = pool.alloc_from(&vec![1u8; 1 << 20])?;
    let first = sum(client.call("SumRef", &buf.share()?.to_bytes(), &options)?);
    let before = pool.map(&buf.share()?)?;
    buf.write(0, &[9u8; 4096])?; // copies that one page
    let second = sum(client.call("SumRef", &buf.share()?.to_bytes(), &options)?);
    let kept: u64 = before.to_vec().iter().map(|&b| u64::from(b)).sum();
    println!("SumRef of a shared 1 MiB buffer: {first}; after writing a page: {second}, the view from before: {kept}");
    anyhow::ensure!(first == 1 << 20 && second == first + 8 * 4096, "wrong sums");
    anyhow::ensure!(kept == first, "copy-on-write did not hold");
    Ok(())
}
