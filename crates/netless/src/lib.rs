//! netless: RPC between processes on one host through lock-free rings in shared memory.
//!
//! A [`Server`] serves a named service; a [`Client`] connects to it by name and calls it.
//! Requests travel through the server's one shared receive buffer and queue, responses
//! through the client's own response ring; both are `memfd` segments passed over a Unix
//! socket after an `SO_PEERCRED` check. Nothing on the call path makes a system call unless
//! a side is asleep.
//!
//! ```no_run
//! use netless::{CallOptions, Client, Request, ResponseBuilder, Server, ServerConfig, Status};
//!
//! let _server = Server::bind("demo.Echo", ServerConfig::default(),
//!     |req: &Request<'_>, resp: &mut ResponseBuilder| -> Result<(), Status> {
//!         resp.payload.extend_from_slice(req.payload);
//!         Ok(())
//!     })?;
//! let client = Client::connect("demo.Echo")?;
//! let reply = client.call("Echo", b"ping", &CallOptions::new())?;
//! assert_eq!(reply.payload, b"ping");
//! # Ok::<(), netless::Status>(())
//! ```
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

mod admission;
mod blocks;
mod bytes;
mod call;
mod client;
mod config;
pub mod control;
#[cfg(test)]
mod decode_props;
#[cfg(feature = "fault-injection")]
#[doc(hidden)]
pub mod fault;
mod handshake;
mod layout;
mod metadata;
mod pipeline;
mod replicas;
mod segments;
mod server;
pub mod sizing;
mod spin_lock;
mod status;
mod wake;

pub(crate) use netless_shm::sync;

pub use call::{CallOptions, Reply, Request, ResponseBuilder};
pub use client::Client;
pub use config::{
    replica_of, ClientConfig, Dispatch, Provisioning, RetryPolicy, ServerConfig, Slo,
    DEFAULT_BUFFER_BYTES, DEFAULT_CONNECTION_BUFFER_BYTES, DEFAULT_MAX_MESSAGE,
    DEFAULT_REF_THRESHOLD,
};
pub use control::ReplicaStats;
pub use metadata::{Metadata, MAX_KEY_LEN};
pub use netless_pool;
pub use netless_ring::{WaitMode, WaitPolicy};
pub use netless_shm::Acl;
pub use pipeline::Pipeline;
pub use replicas::Replicas;
pub use server::{ConnectionWatch, DeferredReply, Handler, Server, ServerStats};
pub use status::{Code, Status};
pub use wake::WakeSource;
