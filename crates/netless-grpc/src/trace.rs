//! `tracing` spans for calls, carrying the W3C trace context (`traceparent`).
//!
//! A `traceparent` is metadata like any other: the gateway passes it to the backend as it
//! came, and a netless call carries it from a [`Channel`](crate::Channel) to the
//! [`GrpcServer`](crate::GrpcServer) unchanged. What is added here is a span per call (the
//! gateway's, the channel's, the server's), at `DEBUG` level, whose `trace_id` and
//! `parent_span_id` fields are taken from the call's `traceparent` when it has a valid
//! one; so a subscriber (any: this crate exports nothing) can join the logs of one call
//! across processes. The value is read only when a subscriber wants the span, so calls
//! pay nothing for it otherwise. A service that calls others passes the context on by
//! copying the header into its own requests, as with any gRPC transport.

use tracing::field::Empty;
use tracing::Span;

/// The header of the W3C trace context.
pub(crate) const TRACEPARENT: &str = "traceparent";

/// Where a call's span is made.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Side {
    /// A call coming into the gateway.
    Gateway,
    /// A call a [`Channel`](crate::Channel) makes.
    Client,
    /// A call a [`GrpcServer`](crate::GrpcServer) serves over netless.
    Server,
}

/// The span of a call to `method` (its path); `traceparent` gives the call's header, read
/// only if a subscriber wants the span.
pub(crate) fn call_span<'a>(
    side: Side,
    method: &str,
    traceparent: impl FnOnce() -> Option<&'a [u8]>,
) -> Span {
    let span = match side {
        Side::Gateway => tracing::debug_span!(
            "gateway.call",
            grpc.method = method,
            trace_id = Empty,
            parent_span_id = Empty
        ),
        Side::Client => tracing::debug_span!(
            "netless.client.call",
            grpc.method = method,
            trace_id = Empty,
            parent_span_id = Empty
        ),
        Side::Server => tracing::debug_span!(
            "netless.server.call",
            grpc.method = method,
            trace_id = Empty,
            parent_span_id = Empty
        ),
    };
    if !span.is_disabled() {
        if let Some((trace_id, parent)) = traceparent().and_then(parse) {
            span.record("trace_id", trace_id);
            span.record("parent_span_id", parent);
        }
    }
    span
}

/// The trace id and parent span id of a `traceparent` value, if it is valid: `VV-TRACE-
/// PARENT-FF`, lowercase hex of 2, 32, 16 and 2 digits, the ids not all zero, the version
/// not `ff`; a version after `00` may append `-` and more, which is ignored.
pub(crate) fn parse(value: &[u8]) -> Option<(&str, &str)> {
    let text = std::str::from_utf8(value).ok()?;
    let head = text.get(..55)?;
    let hex = |s: &str| {
        s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let mut fields = head.split('-');
    let (version, trace, parent, flags) = (
        fields.next()?,
        fields.next()?,
        fields.next()?,
        fields.next()?,
    );
    let shaped = [(version, 2), (trace, 32), (parent, 16), (flags, 2)]
        .iter()
        .all(|(f, n)| f.len() == *n && hex(f));
    let nonzero = |s: &str| s.bytes().any(|b| b != b'0');
    let rest_ok = match &text[55..] {
        "" => true,
        rest => version != "00" && rest.starts_with('-'),
    };
    (shaped && version != "ff" && nonzero(trace) && nonzero(parent) && rest_ok)
        .then_some((trace, parent))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparents_parse_as_the_w3c_says() {
        let good = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(
            parse(good),
            Some(("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"))
        );
        let later = b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes";
        assert!(parse(later).is_some());
        for bad in [
            &b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x"[..],
            b"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            b"00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            b"",
            b"\xff\xfe",
        ] {
            assert_eq!(parse(bad), None, "{}", String::from_utf8_lossy(bad));
        }
    }
}
