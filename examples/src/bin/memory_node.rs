//! The memory node: a large argument passed as a 48-byte reference that works across
//! processes and hosts, read page by page on demand and edited copy-on-write.
//!
//! ```sh
//! cargo run --release -p netless-examples --bin memory_node
//! ```
//!
//! Three processes: a memory node (`netless_memnode::serve` on a free TCP port, as
//! `netless memnode --listen ADDR` runs one), a callee (a netless server), and this one, the
//! caller. The caller puts a 1 MiB array on the node and sends the callee only its
//! `RemoteRef`. The callee maps it, reads two pages (fetching only those), writes into a
//! private copy of page 0 and publishes a new object that shares the other 255 pages with
//! the caller's. The caller reads its array back unchanged, the node's stats show the
//! shared pages, a reference with its length altered is refused with `PERMISSION_DENIED`,
//! and as the sessions close the node frees everything.

use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use netless::{
    CallOptions, Client, ClientConfig, Request, ResponseBuilder, Server, ServerConfig, Status,
};
use netless_examples::peer::{self, Peer, RunDir};
use netless_memnode::{MemNode, MemNodeConfig, RemoteRef, Session, Stats, PAGE_SIZE, REF_LEN};
use tonic::transport::{Channel, Endpoint};

const SERVICE: &str = "example.Editor";
/// Where the memory node's process leaves its TCP address, in the run's directory.
const ADDRESS_FILE: &str = "memnode.tcp";
const PAGE: u64 = PAGE_SIZE as u64;

/// The memory node's process: a node on a free port, its address announced in `dir`.
fn memory_node(dir: &Path) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new()?;
    let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
    std::fs::write(dir.join(ADDRESS_FILE), listener.local_addr()?.to_string())?;
    runtime.spawn(netless_memnode::serve(listener, MemNodeConfig::default()));
    peer::serve_until_released();
    Ok(())
}

/// A channel to the memory node whose address is in `dir` (any tonic transport will do).
async fn node_channel(dir: &Path) -> anyhow::Result<Channel> {
    let addr = std::fs::read_to_string(dir.join(ADDRESS_FILE))?;
    let endpoint = Endpoint::from_shared(format!("http://{addr}"))?;
    Ok(endpoint.connect().await?)
}

/// The callee's process: `Edit` takes a reference and answers with the reference of an
/// edited copy, followed by an account of what it did.
fn callee(dir: &Path) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new()?;
    let session = runtime
        .block_on(async { anyhow::Ok(Session::open(node_channel(dir).await?, "callee").await?) })?;
    let (handle, editor) = (runtime.handle().clone(), session.clone());
    let config = ServerConfig {
        dir: Some(dir.to_path_buf()),
        ..ServerConfig::default()
    };
    let handler = move |req: &Request<'_>, resp: &mut ResponseBuilder<'_>| -> Result<(), Status> {
        let reference = RemoteRef::from_bytes(req.payload)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let (edited, account) = handle
            .block_on(edit(&editor, &reference))
            .map_err(|e| Status::internal(e.to_string()))?;
        resp.payload.extend_from_slice(&edited.to_bytes());
        resp.payload.extend_from_slice(account.as_bytes());
        Ok(())
    };
    let server = Server::bind(SERVICE, config, handler)?;
    peer::serve_until_released();
    drop(server);
    // The edited object was held by this session: closing it frees the object.
    runtime.block_on(session.close())?;
    Ok(())
}

/// What the callee does with the caller's object: maps it, reads a little, writes a little
/// and publishes the result as a new object, held by its own session.
async fn edit(
    session: &Session<Channel>,
    reference: &RemoteRef,
) -> Result<(RemoteRef, String), tonic::Status> {
    let mut view = session.map(reference); // fetches nothing yet
    view.read(PAGE..PAGE + 8).await?; // page 1
    view.read(200 * PAGE..200 * PAGE + 8).await?; // page 200
    let read = view.fetched_pages();
    view.write(0, b"EDITED").await?; // page 0, written in part: fetched, then copied
    let (fetched, dirty) = (view.fetched_pages(), view.dirty_pages());
    let edited = view.publish().await?; // sends page 0 only
    let account = format!(
        "mapped a RemoteBuf of {} bytes; read pages 1 and 200: fetched_pages() = {read}\n\
         wrote 6 bytes at 0 (copy-on-write): fetched_pages() = {fetched}, dirty_pages() = {dirty}\n\
         published a new object: {edited:?}",
        view.len()
    );
    Ok((edited, account))
}

fn summary(s: &Stats) -> String {
    format!(
        "objects {}, pages {}, sessions {}, holds {}",
        s.objects, s.pages, s.sessions, s.holds
    )
}

fn main() -> anyhow::Result<()> {
    if let Some((role, dir)) = peer::role() {
        return match role.as_str() {
            "memnode" => memory_node(&dir),
            _ => callee(&dir),
        };
    }
    let run = RunDir::new("memory-node")?;
    let _node_process = Peer::start("memnode", run.path())?;
    let callee_process = Peer::start("callee", run.path())?;
    let config = ClientConfig {
        dir: Some(run.path().to_path_buf()),
        ..ClientConfig::default()
    };
    let callee = Client::connect_with(SERVICE, config)?;
    let options = CallOptions::new().timeout(Duration::from_secs(10));

    tokio::runtime::Runtime::new()?.block_on(async {
        let channel = node_channel(run.path()).await?;
        let node = MemNode::new(channel.clone());
        let session = Session::open(channel, "caller").await?;
        let array: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
        let reference = session.put(&array).await?;
        let bytes = reference.to_bytes();
        println!("caller: put 1 MiB, got a {REF_LEN}-byte {reference:?}");

        // Only the 48 bytes travel: here to another process, as well to another host.
        let reply = callee.call("Edit", &bytes, &options)?;
        let (edited, account) = reply.payload.split_at(REF_LEN);
        let edited = RemoteRef::from_bytes(edited)?;
        for line in String::from_utf8_lossy(account).lines() {
            println!("callee: {line}");
        }

        let mine = session.read(&reference).await?;
        let theirs = session.read(&edited).await?;
        anyhow::ensure!(mine == array, "the caller's array changed");
        anyhow::ensure!(theirs[..6] == *b"EDITED" && theirs[4096..] == array[4096..]);
        println!("caller: read its array back unchanged; the callee's differs in page 0");

        let stats = node.stats().await?;
        let shared = reference.pages() + edited.pages() - stats.pages;
        println!("node: {} ({shared} pages shared)", summary(&stats));
        anyhow::ensure!(stats.objects == 2 && shared == 255, "{stats:?}");

        // A reference is a capability: claiming 2 MiB of a 1 MiB object breaks its MAC.
        let mut forged = bytes;
        forged[24..32].copy_from_slice(&(2u64 << 20).to_le_bytes());
        let forged = RemoteRef::from_bytes(&forged)?;
        let refused = session
            .read(&forged)
            .await
            .err()
            .context("a forgery was read")?;
        anyhow::ensure!(refused.code() == tonic::Code::PermissionDenied, "{refused}");
        println!(
            "caller: a forged reference: PERMISSION_DENIED, {}",
            refused.message()
        );

        session.release(&reference).await?;
        session.close().await?;
        println!("node, the caller gone: {}", summary(&node.stats().await?));
        drop(callee_process); // its session closes, freeing the edited object
        let stats = node.stats().await?;
        println!("node, the callee gone: {}", summary(&stats));
        anyhow::ensure!(stats.objects == 0 && stats.pages == 0, "{stats:?}");
        Ok(())
    })
}
