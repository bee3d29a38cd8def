//! The wire format: the bytes a request, a reply or a handshake frame is made of, and their
//! encoding and validation. Plain bytes and the structs that describe them; no shared state,
//! no segment, no socket.
//!
//! - [`header`]: the message headers in shared memory (`WireHeader`, its short and compact
//!   forms, `ResponseHeader`, `CompactReply`) and their shape checks;
//! - [`reply`]: reply records, encoded by the server and validated by the clients;
//! - [`metadata`]: call metadata and its encoding in a message body;
//! - [`handshake`]: the frames of the connection handshake over the Unix socket;
//! - [`bytes`]: the method-name comparison of the per-call paths.

pub(crate) mod bytes;
pub(crate) mod handshake;
pub(crate) mod header;
pub(crate) mod metadata;
pub(crate) mod reply;
