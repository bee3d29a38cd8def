//! How a gRPC call becomes netless messages.
//!
//! A call whose request and response are each ready at once (unary, and most server replies
//! to it) is one netless call on the gRPC path: the request body in, the response body and
//! trailers out. A call that goes on longer becomes a *stream*, a session on the server that
//! the client drives with calls on the `netless.stream/*` methods:
//!
//! - the request on the gRPC path carries [`MORE`] when the client has more to send; the
//!   reply carries [`SESSION`] when the response goes on (or, with [`MORE`], at once);
//! - `recv` long-polls the next response bytes (the server answers when it has some: a
//!   deferred reply), the first time with the response headers ([`HEADERS`]), the last time
//!   with the trailers ([`END`]);
//! - `send` carries more request bytes and is answered once they fit in the window;
//! - `close-send` ends the request; `cancel` drops the call on the server.
//!
//! The client issues `recv` only when the reader polls, and the server's writer waits while
//! [`WINDOW`] bytes are unread, so a slow reader back-pressures the writer in both
//! directions. Internal metadata keys start with `:`, which no HTTP header name can, so
//! they never mix with the call's own metadata.

/// Request metadata: the request body continues in `send` calls.
pub(crate) const MORE: &str = ":netless-more";
/// Reply metadata: the call continues as the stream with this id.
pub(crate) const SESSION: &str = ":netless-session";
/// `recv` reply metadata: this reply carries the response headers.
pub(crate) const HEADERS: &str = ":netless-headers";
/// `recv` reply metadata: the response ended; the trailers are in this reply.
pub(crate) const END: &str = ":netless-end";

/// Long-polls the stream's next response bytes.
pub(crate) const RECV: &str = "netless.stream/recv";
/// Carries request bytes.
pub(crate) const SEND: &str = "netless.stream/send";
/// Ends the request.
pub(crate) const CLOSE_SEND: &str = "netless.stream/close-send";
/// Drops the call on the server.
pub(crate) const CANCEL: &str = "netless.stream/cancel";
/// Prefix of the stream methods.
pub(crate) const STREAM_PREFIX: &str = "netless.stream/";

/// Unread bytes a stream buffers in each direction before its writer waits.
pub(crate) const WINDOW: usize = 256 * 1024;

/// A stream call's payload: the session id, then data.
pub(crate) fn stream_payload(id: u64, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + data.len());
    out.extend_from_slice(&id.to_le_bytes());
    out.extend_from_slice(data);
    out
}

/// Splits a stream call's payload into the session id and data.
pub(crate) fn split_stream_payload(payload: &[u8]) -> Option<(u64, &[u8])> {
    let (id, data) = payload.split_first_chunk::<8>()?;
    Some((u64::from_le_bytes(*id), data))
}

/// The session id in a reply's metadata.
pub(crate) fn session_of(metadata: &netless::Metadata) -> Option<u64> {
    std::str::from_utf8(metadata.get(SESSION)?)
        .ok()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_payloads_round_trip() {
        let p = stream_payload(7, b"abc");
        assert_eq!(split_stream_payload(&p), Some((7, &b"abc"[..])));
        assert_eq!(split_stream_payload(b"short"), None);
        let mut md = netless::Metadata::new();
        md.insert(SESSION, "42");
        assert_eq!(session_of(&md), Some(42));
        assert_eq!(session_of(&netless::Metadata::new()), None);
    }
}
