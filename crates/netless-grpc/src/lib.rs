//! tonic on netless: the gRPC path, metadata, the length-prefixed message bytes and the
//! trailers travel in netless messages, so a call never runs HTTP/2 framing or touches a
//! socket.
//!
//! A tonic-generated client accepts a netless [`Channel`] unchanged, and a
//! [`GrpcServer`] serves tonic-generated services unchanged, each `pkg.Service` as the
//! netless service of that name (and, with [`GrpcServer::tcp`], over HTTP/2 on TCP too).
//!
//! [`Channel::target`] reaches a service wherever it is: the local netless service by its
//! name, or a remote gRPC server over HTTP/2 (`http://host:port`, `https://host:port`),
//! chosen by the target alone or by a [`Resolver`] table (`NETLESS_TARGETS`).
//!
//! Unary, server-, client- and bidirectional-streaming calls work, with metadata, trailers,
//! status details, `grpc-timeout` deadlines, cancellation and flow control; how the calls
//! map onto netless messages is described in the `protocol` module's source.
//!
//! ```no_run
//! # mod pb { pub mod greeter_client { pub struct GreeterClient<T>(T); impl<T> GreeterClient<T> { pub fn new(t: T) -> Self { GreeterClient(t) } } } }
//! use netless_grpc::Channel;
//! let channel = Channel::connect("helloworld.Greeter")?;
//! let client = pb::greeter_client::GreeterClient::new(channel);
//! # Ok::<(), netless::Status>(())
//! ```
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod channel;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod gateway;
mod mapping;
pub mod prometheus;
mod protocol;
mod server;
mod session;
mod stream;
mod trace;

pub use channel::{Channel, ChannelOptions, Location, Resolver, TARGETS_ENV, TLS_CA_ENV};
pub use gateway::{
    read_token_file, tls_acceptor, tls_acceptor_verifying_clients, Egress, Gateway, GatewayBuilder,
    GatewayLimits,
};
pub use server::{GrpcServer, GrpcServing};
/// The TLS acceptor [`Gateway::serve`] takes (from [`tls_acceptor`]).
pub use tokio_rustls::TlsAcceptor;

/// The README's examples (core and gRPC), compiled and run as doc tests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
