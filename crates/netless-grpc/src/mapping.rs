//! How a gRPC call's HTTP/2 parts map onto a netless message and back: the path to the
//! netless method (`/pkg.Service/Method`, a method name as the IDL makes it), headers to
//! metadata, `grpc-timeout` to the netless deadline, trailers to metadata under a prefix no
//! header name can contain, and a body type that yields the message bytes and then the
//! trailers.
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

/// Metadata key of a message whose trailers are due but empty (see [`trailers_to_metadata`]).
pub(crate) const NO_TRAILERS: &str = ":netless-no-trailers";

/// The header that carries a call's timeout.
pub(crate) const GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");

/// The trailer of every successful call.
pub(crate) const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_STATUS_OK: HeaderValue = HeaderValue::from_static("0");

/// Trailers → netless metadata, under [`TRAILER_PREFIX`].
///
/// The trailers of nearly every call are `grpc-status: 0` alone: they travel as no metadata
/// at all (and [`metadata_to_headers`] puts them back), which spares both ends a key, a value
/// and their header parsing on every call. Trailers that are due but empty, which no gRPC
/// service sends, travel as [`NO_TRAILERS`] so that they stay empty.
pub(crate) fn trailers_to_metadata(trailers: &HeaderMap, metadata: &mut Metadata) {
    if trailers.is_empty() {
        metadata.insert(NO_TRAILERS, b"");
        return;
    }
    if trailers.len() == 1 && trailers.get(GRPC_STATUS) == Some(&GRPC_STATUS_OK) {
        return;
    }
    let mut key = String::with_capacity(TRAILER_PREFIX.len() + 32);
    for (name, value) in trailers {
        key.clear();
        key.push_str(TRAILER_PREFIX);
        key.push_str(name.as_str());
        metadata.insert(&key, value.as_bytes());
    }
}

/// Appends the header pairs of netless metadata (not its trailers or internal keys) to
/// `headers`. Pairs that are not valid HTTP are dropped.
pub(crate) fn append_headers(metadata: &Metadata, headers: &mut HeaderMap) {
    for (key, value) in metadata.iter() {
        if key.starts_with(TRAILER_PREFIX) {
            continue;
        }
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(key.as_bytes()),
            HeaderValue::from_bytes(value),
        ) {
            headers.append(name, value);
        }
    }
}

/// netless metadata → (headers, trailers). Pairs that are not valid HTTP are dropped. A
/// message without trailer keys (or [`NO_TRAILERS`]) carries the trailers `grpc-status: 0`
/// (see [`trailers_to_metadata`]).
pub(crate) fn metadata_to_headers(metadata: &Metadata) -> (HeaderMap, HeaderMap) {
    let mut headers = HeaderMap::new();
    let mut trailers = HeaderMap::new();
    let mut trailers_sent = false;
    for (key, value) in metadata.iter() {
        if key == NO_TRAILERS {
            trailers_sent = true;
            continue;
        }
        let (map, name) = match key.strip_prefix(TRAILER_PREFIX) {
            Some(name) => {
                trailers_sent = true;
                (&mut trailers, name)
            }
            None => (&mut headers, key),
        };
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(value),
        ) {
            map.append(name, value);
        }
    }
    if !trailers_sent {
        trailers.insert(GRPC_STATUS, GRPC_STATUS_OK);
    }
    (headers, trailers)
}

/// The method of `path` if `path` is `/{service}/{method}` (exactly: nothing before, no
/// query or fragment after) and `method` is a gRPC method name ([`is_method_name`]).
pub(crate) fn method_of<'a>(path: &'a str, service: &str) -> Option<&'a str> {
    let method = path
        .strip_prefix('/')?
        .strip_prefix(service)?
        .strip_prefix('/')?;
    is_method_name(method).then_some(method)
}

/// Whether `name` can be the method of a gRPC path: an identifier, ASCII letters, digits
/// and `_`, not starting with a digit.
///
/// The gRPC HTTP/2 protocol leaves method names to the IDL (`"/" Service-Name "/"
/// {method name}`); protobuf's is an identifier, `letter { letter | decimalDigit | "_" }`,
/// and protoc takes `_` for a letter. So a name with `/`, `?`, `#`, `%`, `.`, `-`, a
/// space or anything beyond ASCII names no method any generated service has, and must
/// not reach a service that routes by path (the gateway's egress forwards whatever path
/// it is given): such a call is an unknown method. So is a name longer than
/// [`MAX_METHOD_NAME`] bytes, which no real service has and which would otherwise become a
/// metrics label of that length.
pub(crate) fn is_method_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    name.len() <= MAX_METHOD_NAME
        && bytes
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// The longest method name a call may name.
pub(crate) const MAX_METHOD_NAME: usize = 128;

/// `UNIMPLEMENTED` for a call to `method`, which is not a method of `service`
/// (`/service/Method`, see [`method_of`]); at most 100 characters of `method` are repeated.
pub(crate) fn unknown_method(method: &str, service: &str) -> netless::Status {
    let shown = match method.char_indices().nth(100) {
        Some((end, _)) => format!("{}…", &method[..end]),
        None => method.to_string(),
    };
    netless::Status::new(
        netless::Code::Unimplemented,
        format!("unknown method `{shown}` (service `{service}` has methods `/{service}/Name`)"),
    )
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
    fn only_plain_method_names_of_the_service_are_methods() {
        let service = "shop.Orders";
        assert_eq!(method_of("/shop.Orders/Get", service), Some("Get"));
        assert_eq!(method_of("/shop.Orders/get_2", service), Some("get_2"));
        assert_eq!(method_of("/shop.Orders/_Get", service), Some("_Get"));
        let longest = format!("/shop.Orders/{}", "G".repeat(MAX_METHOD_NAME));
        assert!(method_of(&longest, service).is_some());
        let longer = format!("/shop.Orders/{}", "G".repeat(MAX_METHOD_NAME + 1));
        assert_eq!(method_of(&longer, service), None);
        for path in [
            "/admin.Admin/DropAllTables",
            "/shop.Orders/",
            "/shop.Orders",
            "shop.Orders/Get",
            "//shop.Orders/Get",
            "/shop.Orders/Get/More",
            "/shop.Orders/Get?x=1",
            "/shop.Orders/Get#x",
            "/shop.Orders/Get%2F..",
            "/shop.Orders/a.b",
            "/shop.Orders/a-b",
            "/shop.Orders/a b",
            "/shop.Orders/2Get",
            "/shop.Orders/Gét",
            "/shop.OrdersX/Get",
            "/shop.Orders/../admin.Admin/DropAllTables",
            "http://evil.example:9/shop.Orders/Get",
        ] {
            assert_eq!(method_of(path, service), None, "{path}");
        }
        let status = unknown_method(&"x".repeat(500), service);
        assert_eq!(status.code(), netless::Code::Unimplemented);
        assert!(status.message().len() < 200, "{status}");
    }

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

    #[test]
    fn ok_trailers_travel_as_nothing_and_empty_ones_stay_empty() {
        let mut ok = HeaderMap::new();
        ok.insert("grpc-status", HeaderValue::from_static("0"));
        let mut md = Metadata::new();
        trailers_to_metadata(&ok, &mut md);
        assert!(md.is_empty());
        assert_eq!(metadata_to_headers(&md).1, ok);

        let mut md = Metadata::new();
        trailers_to_metadata(&HeaderMap::new(), &mut md);
        assert_eq!(md.len(), 1);
        assert!(metadata_to_headers(&md).1.is_empty());

        let mut failed = HeaderMap::new();
        failed.insert("grpc-status", HeaderValue::from_static("5"));
        failed.insert("grpc-message", HeaderValue::from_static("no such thing"));
        let mut md = Metadata::new();
        trailers_to_metadata(&failed, &mut md);
        assert_eq!(metadata_to_headers(&md).1, failed);

        let mut ok_with_more = ok.clone();
        ok_with_more.insert("x-t", HeaderValue::from_static("1"));
        let mut md = Metadata::new();
        trailers_to_metadata(&ok_with_more, &mut md);
        assert_eq!(metadata_to_headers(&md).1, ok_with_more);
    }
}
