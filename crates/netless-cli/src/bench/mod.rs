//! Benchmarks: programs that run client and server processes, print a table and write JSON.
//!
//! `echo` orchestrates; `grpc_http2` and `floor` are the baseline and the physical limit it is
//! compared with; `grpc` and `split` compare tonic paths and the split gateway, with `peer`
//! spawning and stopping their server processes; `report` formats the figures; `proto` holds
//! the generated protobuf types.

pub mod clock;
pub mod echo;
pub mod floor;
pub mod grpc;
pub mod grpc_http2;
pub mod peer;
pub mod proto;
pub mod report;
pub mod split;
