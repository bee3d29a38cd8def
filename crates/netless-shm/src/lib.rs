//! The OS layer of netless: sealed `memfd` segments, file-descriptor passing over Unix
//! sockets, peer credentials and ACLs, the checked socket directory and the one server per
//! name in it, liveness tokens, process-shared futexes, CPU pinning, the host-wide monotonic
//! clock, bulk copies that stay fast at every alignment, and views of regions shared without
//! hardware cache coherence ([`coherence`]).
//!
//! This crate owns every system call netless makes for its shared-memory transport and
//! exposes them as safe functions. It never interprets the bytes inside a segment: rings,
//! queues and RPC framing live in the crates above (`netless-ring`, `netless`). Linux only.
//!
//! ```
//! use netless_shm::Segment;
//!
//! let segment = Segment::create("doc-example", 4096)?;
//! assert_eq!(segment.len(), 4096);
//! # Ok::<(), netless_shm::Error>(())
//! ```
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]
// Without loom the shim's atomics are std's own types, so clippy.toml's ban on std's atomics
// (by type, not by path) cannot tell them from a direct use; clippy enforces it under
// `--cfg loom`, where the shim's are loom's and any std atomic left escapes the models.
#![cfg_attr(not(loom), allow(clippy::disallowed_types, clippy::disallowed_methods))]

#[cfg(not(target_os = "linux"))]
compile_error!("netless-shm supports Linux only (memfd, SCM_RIGHTS, SO_PEERCRED, futex)");

mod affinity;
mod clock;
// Raw pointers into a mapping and real atomics: not modelled under loom.
#[cfg(not(loom))]
pub mod coherence;
pub mod copy;
mod error;
#[cfg(not(loom))]
pub mod fabric;
mod fdpass;
mod futex;
mod liveness;
mod peercred;
mod segment;
mod socket_claim;
mod socket_dir;
pub mod sync;

pub use affinity::{
    allowed_cpus, available_cpus, current_cpu, pin_current_thread, pin_current_thread_to,
};
pub use clock::{instant_to_monotonic_ns, monotonic_ns, monotonic_ns_to_instant};
#[cfg(not(loom))]
pub use coherence::{Coherence, View, ViewError};
pub use error::Error;
pub use fdpass::{recv_frame, recv_frame_by, send_frame, send_frame_by, MAX_FDS, MAX_FRAME};
pub use futex::{futex_wait, futex_wait_any, futex_wake, FutexWait, WAIT_ANY_MAX};
pub use liveness::{
    hold_liveness_token, liveness_token_held, liveness_token_lock, TokenLock, MAX_LIVENESS_TOKEN,
};
pub use peercred::{peer_cred, Acl, PeerCred};
pub use segment::{Published, PublishedView, Segment};
pub use socket_claim::SocketClaim;
pub use socket_dir::{
    nobody_listens, service_socket_path, socket_dir, SocketDir, MAX_SERVICE_NAME,
};
