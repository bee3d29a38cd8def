//! The canonical gRPC examples, each one service implementation served by a flag on TCP
//! (plain tonic), on netless, or both at once:
//!
//! - [`greeter`], `helloworld.Greeter/SayHello`;
//! - [`routeguide`], `routeguide.RouteGuide`, with a unary, a server-streaming, a
//!   client-streaming and a bidirectional method.
//!
//! The binaries (`greeter_server`, `greeter_client`, `routeguide_server`,
//! `routeguide_client`) take `--transport tcp|netless|both`; the service code never changes.
//!
//! And the raw netless API, each a binary that starts its servers as processes of their
//! own ([`peer`]) and calls them:
//!
//! - `pipeline`: many calls in flight from one thread on a `Pipeline`, batched;
//! - `forwarder`: a middle tier that defers each reply, forwards the call on a `Pipeline`
//!   and answers from `Handler::poll`;
//! - `by_reference`: large payloads as Refs to pool pages, copy-on-write.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod checks;
pub mod greeter;
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
