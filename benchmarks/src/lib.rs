//! The netless experiments: one binary per question (`src/bin/`), each a thin `main` over a
//! module here, all on one shared [`harness`].
//!
//! - `echo_latency` ([`echo`]), NotNets Table 1: a sequential call over gRPC/HTTP2, over
//!   netless (protobuf and raw bytes) and the shared-memory floor;
//! - `grpc_paths` ([`grpc`]): the same tonic client over TCP, over the netless `Channel`,
//!   and through the gateway;
//! - `split_offload` ([`split`]), Split gRPC Figure 2: one tonic process against the
//!   gateway and a business-logic process;
//! - `pass_by_reference` ([`dmrpc`]), DmRPC Figures 5–7: pass by value against by
//!   reference (the domain page pool), copy-on-write;
//! - `slo_buffers` ([`kvs`]), NEBULA: receive-buffer provisioning and dispatch of a
//!   key-value service under open-loop load, judged by an SLO;
//! - `batching` ([`dagger`]), Dagger Figures 5–6: pipelined echo throughput and latency by
//!   request batching;
//! - `cross_host` ([`hosts`]), DmRPC-net Figure 5 across two hosts: the nested chain by value
//!   through the gateways against by reference through the memory node;
//! - `image_app` ([`images`]), DmRPC's image pipeline: a 7-tier image service written as
//!   tonic services, over tonic's TCP transport, netless by value and netless by reference,
//!   at rising offered load.
//!
//! Each binary spawns its peer processes (servers, tiers, load generators) by running itself
//! again as `<binary> peer <role> …`; the user's `echo-server` and `gateway` are among those
//! roles, run from the `netless` command's own code ([`netless_cli::cmd`]). The
//! micro-benchmarks of the data structures are `cargo bench` targets (`benches/`).

pub mod dagger;
pub mod dmrpc;
pub mod echo;
pub mod gateway;
pub mod grpc;
pub mod grpc_http2;
pub mod harness;
pub mod hosts;
pub mod images;
pub mod kvs;
pub mod proto;
pub mod split;
