//! Benchmarks: programs that run client and server processes, print a table and write JSON.
//!
//! `echo` orchestrates; `grpc_http2` and `floor` are the baseline and the physical limit it is
//! compared with; `grpc` and `split` compare tonic paths and the split gateway, with `peer`
//! spawning and stopping their server processes; `report` formats the figures; `proto` holds
//! the generated protobuf types. `dmrpc` reproduces DmRPC's pass-by-reference experiments
//! with the domain page pool, each tier its own process; `transfer` measures the payload size
//! from which pass by reference beats pass by value (the default `ref_threshold`).

pub mod clock;
pub mod dagger;
pub mod dmrpc;
pub mod echo;
pub mod floor;
pub mod grpc;
pub mod grpc_http2;
pub mod kvs;
pub mod peer;
pub mod proto;
pub mod report;
pub mod split;
pub mod transfer;
