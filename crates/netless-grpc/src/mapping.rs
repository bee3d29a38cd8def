//! How a gRPC call's HTTP/2 parts map onto a netless message and back: headers to metadata,
//! `grpc-timeout` to the netless deadline, trailers to metadata under a prefix no header name
//! can contain, and a body type that yields the message bytes and then the trailers.
//!
//! Header values travel as their raw bytes (binary `-bin` metadata stays base64, as on the
//! wire), so both ends see exactly what the other sent.

use std::future::poll_fn;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};
use http_body::Frame;
use netless::Metadata;

/// Prefix of trailer keys in netless metadata (`/` cannot appear in a header name).
pub(crate) const TRAILER_PREFIX: &str = "trailer/";

/// Headers that belong to HTTP/2 transport, not to the call.
fn is_transport_header(name: &str) -> bool {
    matches!(
        name,
        "te" | "content-type" | "content-length" | "grpc-timeout" | "host"
    )
}

/// Request or response headers → netless metadata.
pub(crate) fn headers_to_metadata(headers: &HeaderMap, metadata: &mut Metadata) {
    for (name, value) in headers {
        if !is_transport_header(name.as_str()) {
            metadata.insert(name.as_str(), value.as_bytes());
        }
    }
}

/// Trailers → netless metadata, under [`TRAILER_PREFIX`].
pub(crate) fn trailers_to_metadata(trailers: &HeaderMap, metadata: &mut Metadata) {
    for (name, value) in trailers {
        metadata.insert(
            &format!("{TRAILER_PREFIX}{}", name.as_str()),
            value.as_bytes(),
        );
    }
}

/// netless metadata → (headers, trailers). Pairs that are not valid HTTP are dropped.
pub(crate) fn metadata_to_headers(metadata: &Metadata) -> (HeaderMap, HeaderMap) {
    let mut headers = HeaderMap::new();
    let mut trailers = HeaderMap::new();
    for (key, value) in metadata.iter() {
        let (map, name) = match key.strip_prefix(TRAILER_PREFIX) {
            Some(name) => (&mut trailers, name),
            None => (&mut headers, key),
        };
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(value),
        ) {
            map.append(name, value);
        }
    }
    (headers, trailers)
}

/// Parses a `grpc-timeout` value (e.g. `100m`, `5S`) into a deadline from now.
pub(crate) fn parse_grpc_timeout(value: &[u8]) -> Option<Instant> {
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    let amount: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    let timeout = match unit {
        b"H" => Duration::from_secs(amount.checked_mul(3600)?),
        b"M" => Duration::from_secs(amount.checked_mul(60)?),
        b"S" => Duration::from_secs(amount),
        b"m" => Duration::from_millis(amount),
        b"u" => Duration::from_micros(amount),
        b"n" => Duration::from_nanos(amount),
        _ => return None,
    };
    Instant::now().checked_add(timeout)
}

/// Formats time left until `deadline` as a `grpc-timeout` value (microseconds, at most the
/// 8 digits the spec allows).
pub(crate) fn format_grpc_timeout(deadline: Instant) -> HeaderValue {
    let micros = deadline
        .saturating_duration_since(Instant::now())
        .as_micros();
    let value = if micros < 100_000_000 {
        format!("{micros}u")
    } else {
        format!("{}S", (micros / 1_000_000).min(99_999_999))
    };
    HeaderValue::from_str(&value).unwrap_or(HeaderValue::from_static("99999999S"))
}

/// Polls `body` once: `None` if it has nothing ready.
pub(crate) async fn frame_now<B>(
    body: &mut B,
) -> Option<Option<Result<http_body::Frame<B::Data>, B::Error>>>
where
    B: http_body::Body + Unpin,
{
    poll_fn(|cx| match Pin::new(&mut *body).poll_frame(cx) {
        Poll::Ready(frame) => Poll::Ready(Some(frame)),
        Poll::Pending => Poll::Ready(None),
    })
    .await
}

/// Appends the data `body` has ready now to `out`, until `out` holds `limit` bytes: returns
/// whether the body ended (`Ok(true)`), has more to come (`Ok(false)`), or failed.
pub(crate) async fn take_ready<B>(
    body: &mut B,
    limit: usize,
    out: &mut Vec<u8>,
) -> Result<bool, B::Error>
where
    B: http_body::Body + Unpin,
    B::Data: bytes::Buf,
{
    while out.len() < limit {
        match frame_now(body).await {
            Some(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    out.extend_from_slice(bytes::Buf::chunk(&data));
                }
            }
            Some(Some(Err(e))) => return Err(e),
            Some(None) => return Ok(true),
            None => return Ok(false),
        }
    }
    Ok(false)
}

/// A response body: the message bytes, then the trailers.
pub(crate) struct ReplyBody {
    data: Option<Bytes>,
    trailers: Option<HeaderMap>,
}

impl ReplyBody {
    pub(crate) fn new(data: Bytes, trailers: HeaderMap) -> ReplyBody {
        ReplyBody {
            data: (!data.is_empty()).then_some(data),
            trailers: Some(trailers),
        }
    }
}

impl http_body::Body for ReplyBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if let Some(data) = self.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && self.trailers.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_parse_and_format() {
        assert!(parse_grpc_timeout(b"100m").is_some());
        assert!(parse_grpc_timeout(b"5S").is_some());
        assert!(parse_grpc_timeout(b"x").is_none());
        assert!(parse_grpc_timeout(b"").is_none());
        assert!(parse_grpc_timeout(b"99999999999999999999H").is_none());
        let v = format_grpc_timeout(Instant::now() + Duration::from_millis(50));
        assert!(v.to_str().unwrap().ends_with('u'));
    }

    #[test]
    fn metadata_round_trips_headers_and_trailers() {
        let mut headers = HeaderMap::new();
        headers.insert("x-a", HeaderValue::from_static("1"));
        headers.insert("content-type", HeaderValue::from_static("application/grpc"));
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        let mut md = Metadata::new();
        headers_to_metadata(&headers, &mut md);
        trailers_to_metadata(&trailers, &mut md);
        let (h, t) = metadata_to_headers(&md);
        assert_eq!(h.get("x-a").unwrap(), "1");
        assert!(h.get("content-type").is_none());
        assert_eq!(t.get("grpc-status").unwrap(), "0");
    }
}
