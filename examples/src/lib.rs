//! The canonical gRPC examples, each one service implementation served by a flag on TCP
//! (plain tonic), on netless, or both at once:
//!
//! - [`greeter`], `helloworld.Greeter/SayHello`;
//! - [`routeguide`], `routeguide.RouteGuide`, with a unary, a server-streaming, a
//!   client-streaming and a bidirectional method;
//! - [`interop`], gRPC's interop test service `grpc.testing.TestService` and the client
//!   side of its test cases (`interop_server`, `interop_client`).
//!
//! The binaries (`greeter_server`, `greeter_client`, `routeguide_server`,
//! `routeguide_client`) take `--transport tcp|netless|both`; the service code never changes.
//! The servers serve both transports from one `GrpcServer`; the clients also take
//! `--target TARGET` (`pkg.Service`, `http://host:port`, ...), so a `NETLESS_TARGETS` table
//! alone decides whether they call a local service over netless or a remote one over HTTP/2,
//! as `any_location` shows.
//!
//! And the raw netless API, each a binary that starts its servers as processes of their
//! own ([`peer`]) and calls them:
//!
//! - `pipeline`: many calls in flight from one thread on a `Pipeline`, batched;
//! - `forwarder`: a middle tier that defers each reply, forwards the call on a `Pipeline`
//!   and answers from `Handler::poll`;
//! - `by_reference`: large payloads as Refs to pool pages, copy-on-write;
//! - `memory_node`: a large argument as a `RemoteRef` to a memory node's pages, which
//!   works across processes and hosts, read on demand and edited copy-on-write.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod checks;
pub mod greeter;
pub mod interop;
pub mod peer;
pub mod routeguide;
pub mod serve;

/// Generated code of `proto/helloworld.proto`.
#[allow(missing_docs)]
pub mod helloworld {
    tonic::include_proto!("helloworld");
}

/// Generated code of `proto/route_guide.proto`.
#[allow(missing_docs)]
pub mod routeguide_pb {
    tonic::include_proto!("routeguide");
}
