//! The shared memory of a connection: the replica segment a server creates per trust group
//! (receive queues, control lines, block table, blocks), the server's control segment
//! (registers, worker stats; read-only to clients) and the connection segment a client
//! creates (doorbell, response ring), their layouts, the client's block leases, and the one
//! validated view of a run of blocks.
//!
//! - [`layout`]: the `#[repr(C)]` structs of the segments and the block-table encoding;
//! - [`replica`], [`control`] and [`conn`]: mapping, validating and viewing each segment;
//! - [`run`]: [`BlockRun`], the only code that reads or writes request memory;
//! - [`blocks`]: how a client claims runs of blocks ([`BlockLease`]);
//! - [`wake`]: [`WakeSource`], a connection's doorbell handed to a server worker.
//!
//! Every value a peer can write is validated here, or handed out only as a hint.

pub(crate) mod blocks;
pub(crate) mod conn;
pub(crate) mod control;
pub(crate) mod layout;
pub(crate) mod place;
pub(crate) mod replica;
pub(crate) mod run;
pub(crate) mod wake;

pub(crate) use blocks::BlockLease;
pub(crate) use conn::ConnSegment;
pub(crate) use control::ControlSegment;
pub(crate) use place::Place;
pub(crate) use replica::{ReplicaSegment, ReplicaSpec};
pub(crate) use run::BlockRun;
pub use wake::WakeSource;
