//! The memory node (DmRPC-net): a gRPC service that holds pages for references that leave
//! their host.
//!
//! A pool `Ref` names pages in one host's shared memory and means nothing elsewhere. When a
//! large argument must reach another host by reference, it goes to a memory node instead:
//! [`Session::put`] stores it as an immutable object of 4 KiB pages and returns a 48-byte
//! [`RemoteRef`] that any message can carry. Whoever receives it reads only the pages it
//! touches ([`MemNode::read_pages`], [`RemoteBuf::read`]); a callee that changes the data
//! writes private copies of the touched pages ([`RemoteBuf::write`]) and publishes a new
//! object that shares every other page with the original ([`RemoteBuf::publish`]): the
//! caller's view never changes (page-granular copy-on-write, on the node).
//!
//! **Who holds what.** An object lives while a session holds it. The session that puts or
//! derives an object holds it; another retains it ([`Session::retain`]) to keep it. A
//! caller holds the object for the length of its call; a callee that keeps the reference
//! longer retains it under its own session before replying. A session that closes, or
//! whose process dies (no KeepAlive within the lease), loses its holds, and an object with
//! no hold is freed at once.
//!
//! **A reference is a capability.** The node signs each reference (HMAC-SHA256 with a key
//! drawn at start) and checks it on every use: a forged or altered one is
//! `PERMISSION_DENIED`, one from before a restart `NOT_FOUND`, a malformed one
//! `INVALID_ARGUMENT`. Anyone with a valid reference may read its object; only sessions
//! hold objects.
//!
//! **Who may reach it.** `Open` asks for no credential: anyone who reaches the node can
//! open sessions and fill it up to its capacity. Bounds per client address
//! ([`MemNodeConfig::max_sessions_per_peer`]) and over all sessions keep one client from
//! taking everything, not a stranger from taking a share: serve the node on a network
//! only the services' hosts share.
//!
//! The client works over any tonic transport: `tonic::transport::Channel` across hosts,
//! `netless_grpc::Channel` on the node's own host.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use netless_memnode::Session;
//!
//! let channel = tonic::transport::Endpoint::from_static("http://10.0.0.7:7070")
//!     .connect()
//!     .await?;
//! let session = Session::open(channel, "resizer").await?;
//! let image = vec![7u8; 1 << 20];
//! let r = session.put(&image).await?;
//! // send r.to_bytes() in any message; the callee, on any host:
//! let mut view = session.map(&r);
//! assert_eq!(view.read(4096..4100).await?, [7; 4]); // fetches one page
//! view.write(0, b"header").await?;                   // a private copy of page 0
//! let edited = view.publish().await?;                // sends page 0 only
//! assert_eq!(session.read(&r).await?, image);        // the original is unchanged
//! session.release(&r).await?;
//! # drop(edited);
//! session.close().await?;
//! # Ok(())
//! # }
//! ```
//!
//! The node itself is `netless memnode --listen ADDR`, or [`serve`] in a program of one's
//! own.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod building;
mod client;
mod config;
mod pages;
mod reference;
mod remote_buf;
mod server;
mod state;

/// The generated code of `proto/memnode.proto` (package `netless.memnode`).
#[allow(missing_docs, unreachable_pub, clippy::all, clippy::pedantic)]
pub mod proto {
    tonic::include_proto!("netless.memnode");
}

pub use client::{MemNode, Session, Transport};
pub use config::MemNodeConfig;
pub use reference::{RefError, RemoteRef, REF_LEN, REF_VERSION};
pub use remote_buf::RemoteBuf;
pub use server::{serve, serve_with_shutdown, MemNodeService, PageStream};

/// What the node holds ([`MemNode::stats`]).
pub use proto::StatsReply as Stats;

/// Bytes of a page: the unit the node stores, shares, copies on write and reads.
pub const PAGE_SIZE: usize = 4096;
/// The most data one Put chunk carries.
pub const MAX_CHUNK_BYTES: usize = 256 * 1024;
/// The most pages one Read chunk or one Derive chunk carries (256 KiB).
pub const PAGES_PER_CHUNK: usize = MAX_CHUNK_BYTES / PAGE_SIZE;
/// The largest message either side decodes: a chunk and its framing.
pub const MAX_MESSAGE_BYTES: usize = MAX_CHUNK_BYTES + 64 * 1024;
