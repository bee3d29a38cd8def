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
//!
//! The crate by role, each module depending only on those above it in this list:
//!
//! - `status`, `spin_lock`: status codes; the lock of a ring's end;
//! - `wire`: the bytes of headers, replies, metadata and handshake frames;
//! - `segment`: the shared segments, their layouts, block leases and the one validated view
//!   of a run of blocks;
//! - `polled`: the rings and messages of a connection in a software-coherent fabric;
//! - `slo`: SLO sizing ([`sizing`]) and admission; `config`: servers' and clients'
//!   settings; [`control`]: live stats and soft registers;
//! - `server`: [`Server`] and the handler API; `client`: [`Client`], [`Replicas`];
//!   `pipeline`: [`Pipeline`].
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub mod fabric {
    //! Memory fabrics: one region several processes, containers or hosts map, in which
    //! servers publish their services and clients that share nothing else with them connect
    //! (`ServerConfig::fabric`, `ClientConfig::fabric`). See `netless_shm::fabric` for the
    //! region itself.
    //!
    //! ```
    //! use netless::fabric::{Fabric, FabricOptions};
    //! use netless::{CallOptions, Client, ClientConfig, Server, ServerConfig};
    //!
    //! let path = std::env::temp_dir().join(format!("netless-doc-{}", std::process::id()));
    //! let fabric = Fabric::open(&path, &FabricOptions::default())?;
    //! let config = ServerConfig { fabric: Some(fabric.clone()), ..Default::default() };
    //! let _server = Server::bind("doc.Echo", config, |req: &netless::Request<'_>, resp: &mut netless::ResponseBuilder<'_>| {
    //!     resp.payload.extend_from_slice(req.payload);
    //!     Ok(())
    //! })?;
    //! let client = Client::connect_with(
    //!     "doc.Echo",
    //!     ClientConfig { fabric: Some(fabric), ..Default::default() },
    //! )?;
    //! assert_eq!(client.call("Echo", b"hi", &CallOptions::default())?.payload, b"hi");
    //! # std::fs::remove_file(path).ok();
    //! # Ok::<(), Box<dyn std::error::Error>>(())
    //! ```
    pub use netless_shm::coherence::{Coherence, Faults};
    pub use netless_shm::fabric::{Fabric, FabricOptions, DEFAULT_LEASE, DEFAULT_SIZE};
}
mod client;
mod config;
pub mod control;
#[cfg(test)]
mod decode_props;
#[cfg(feature = "fault-injection")]
#[doc(hidden)]
pub mod fault;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod pipeline;
mod polled;
mod segment;
mod server;
mod slo;
mod spin_lock;
mod status;
mod wire;

pub(crate) use netless_shm::sync;

pub use client::{CallOptions, Client, Replicas, Reply};
pub use config::{
    replica_of, ClientConfig, Dispatch, Provisioning, RetryPolicy, ServerConfig,
    DEFAULT_BUFFER_BYTES, DEFAULT_CONNECTION_BUFFER_BYTES, DEFAULT_MAX_CLIENT_RING,
    DEFAULT_MAX_MESSAGE, DEFAULT_REF_THRESHOLD,
};
pub use control::ReplicaStats;
pub use netless_pool;
pub use netless_ring::{WaitMode, WaitPolicy};
pub use netless_shm::Acl;
pub use pipeline::Pipeline;
pub use segment::WakeSource;
pub use server::{
    ConnectionWatch, DeferredReply, Handler, Request, ResponseBuilder, Server, ServerStats,
    MAX_BACKLOG_BYTES,
};
pub use slo::{sizing, Slo};
pub use status::{Code, Status};
pub use wire::metadata::{Metadata, MAX_KEY_LEN};

/// Whether this build has the test-only fault-injection hooks (feature `fault-injection`):
/// false in every build a user runs.
#[doc(hidden)]
pub const fn fault_injection_enabled() -> bool {
    cfg!(feature = "fault-injection")
}
