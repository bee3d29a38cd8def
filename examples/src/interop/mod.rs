//! gRPC's interop test service, `grpc.testing.TestService` (`proto/grpc/testing/`), and
//! the client side of its test cases, as grpc's `doc/interop-test-descriptions.md` describes
//! them:
//!
//! - [`server`]: the service ([`server::InteropService`]) and the metadata echo around it
//!   ([`server::EchoMetadata`]); [`server::service`] gives both together, ready for a
//!   `GrpcServer` (the `interop_server` binary serves it on netless, TCP or both);
//! - [`client`]: the test cases ([`client::CASES`]), run by tonic's generated client over
//!   any channel, a netless `Channel` among them (the `interop_client` binary).
//!
//! Any gRPC implementation's interop client can call the server through `netless gateway`
//! (grpc-go's is run so in the CLI's `interop_suite` test); the Rust client calls it over
//! netless directly.

pub mod client;
pub mod server;

/// Generated code of `proto/grpc/testing/{empty,messages,test}.proto`.
#[allow(missing_docs, clippy::all)]
pub mod pb {
    tonic::include_proto!("grpc.testing");
}

/// Metadata whose value the server sends back in its initial metadata.
pub const ECHO_INITIAL: &str = "x-grpc-test-echo-initial";
/// Binary metadata whose value the server sends back in its trailers.
pub const ECHO_TRAILING: &str = "x-grpc-test-echo-trailing-bin";
