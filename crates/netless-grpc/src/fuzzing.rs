//! Entry points for the fuzz targets in the repository's `fuzz/` directory (feature
//! `fuzzing`, never in a user's build). The target here takes the fuzzer's bytes as what a
//! gRPC peer sends the gateway (a request path, a `grpc-timeout` value, an `authorization`
//! header), what a backend sends back through it (an error message), or what the other
//! netless side sends (call metadata, a stream call's payload), maps them as the gateway and
//! the tonic bridge do, and asserts what those rely on. A refusal is fine; a panic is a
//! finding. Nothing here is used by the library itself.

use std::path::Path;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use http::header::AUTHORIZATION;
use http::{HeaderMap, HeaderValue};
use netless::{Code, Metadata, Status};

use crate::gateway::allow::{is_internal, AllowList};
use crate::gateway::auth::BearerToken;
use crate::gateway::public::{not_a_method_path, unknown_service, Scrubber};
use crate::gateway::service_of;
use crate::mapping::{
    append_headers, format_grpc_timeout, headers_to_metadata, metadata_to_headers,
    parse_grpc_timeout, trailers_to_metadata,
};
use crate::protocol::{session_of, split_stream_payload, stream_payload, SESSION};

/// The socket directory the gateway resolves services in, here (it is never touched).
const DIR: &str = "/nonexistent/netless-fuzz";

/// The token `authorization` checks against.
const TOKEN: &[u8] = b"s3cret-token";

/// Target `grpc_mapping`: `mode: u8`, then the bytes as, by `mode % 6`:
///
/// - 0: a request path (`/pkg.Service/Method`) the gateway forwards: the service it names,
///   which no allow-list lets through if it is one of netless's own, and that service's
///   socket path, which is a file of its own in the socket directory; what the gateway
///   answers a caller it refuses, which repeats a bounded part of the path; and a socket file
///   name read as a replica's;
/// - 1: a `grpc-timeout` value, whose deadline lies ahead and formats to a value that parses
///   back to no later a deadline;
/// - 2: call metadata from the other side (`Metadata::decode`), mapped to HTTP headers and
///   trailers and back: the round trip keeps every pair but the transport headers;
/// - 3: a stream call's payload and a reply's session id;
/// - 4: an `authorization` header value, which passes the gateway's bearer-token check
///   exactly when it is `Bearer <the token>`, and whose refusal never repeats the token;
/// - 5: `code: u8`, then a backend's error message (`grpc-message`, percent-encoded) or a
///   netless client's own, which leaves the gateway with its code, without the socket
///   directory, and with nothing the gateway's rule would still take out (scrubbing it again
///   changes nothing).
pub fn grpc_mapping(data: &[u8]) {
    let Some((&mode, bytes)) = data.split_first() else {
        return;
    };
    match mode % 6 {
        0 => path(bytes),
        1 => timeout(bytes),
        2 => metadata(bytes),
        3 => stream(bytes),
        4 => authorization(bytes),
        _ => error_message(bytes),
    }
}

/// Allow-lists as `--allow` makes them: everything, a package, one service.
fn allow_lists() -> &'static [AllowList; 3] {
    static LISTS: OnceLock<[AllowList; 3]> = OnceLock::new();
    LISTS.get_or_init(|| {
        ["*", "helloworld.*", "kv.Store"].map(|pattern| {
            let mut list = AllowList::default();
            list.add(pattern).expect("a valid pattern");
            list
        })
    })
}

/// What the gateway decides of a call to `service`, and tells a caller it refuses.
fn admission(service: &str) {
    let lower = service.to_ascii_lowercase();
    let internal =
        lower == "netless" || lower.starts_with("netless.") || lower.starts_with("netless-");
    assert_eq!(is_internal(service), internal, "{service:?}");
    let [every, package, exact] = allow_lists();
    assert_eq!(every.allows(service), !internal, "`*` and {service:?}");
    assert_eq!(
        package.allows(service),
        service.starts_with("helloworld."),
        "`helloworld.*` and {service:?}"
    );
    assert_eq!(exact.allows(service), service == "kv.Store");
    let refusal = unknown_service(service);
    assert_eq!(refusal.code(), Code::Unimplemented);
    assert!(refusal.message().chars().count() <= 200, "{refusal}");
}

fn path(bytes: &[u8]) {
    let Ok(path) = std::str::from_utf8(bytes) else {
        return;
    };
    if let Some(service) = service_of(path) {
        let method = &path[1 + service.len() + 1..];
        assert_eq!(path, format!("/{service}/{method}"));
        assert!(!service.is_empty() && !service.contains('/') && !method.is_empty());
        admission(service);
        if let Some(socket) = netless::fuzzing::socket_path_in(Path::new(DIR), service) {
            // No service name reaches outside the directory, or names it or a subdirectory.
            assert_eq!(socket.parent(), Some(Path::new(DIR)), "{socket:?}");
            let name = socket.file_name().and_then(|n| n.to_str());
            assert_eq!(name, Some(format!("{service}.sock").as_str()));
        }
    } else {
        let refusal = not_a_method_path(path);
        assert_eq!(refusal.code(), Code::Unimplemented);
        assert!(refusal.message().chars().count() <= 200, "{refusal}");
    }
    match netless::replica_of(path, "kv.Store") {
        Some(None) => assert_eq!(path, "kv.Store.sock"),
        Some(Some(n)) => {
            let canonical = format!("kv.Store#{n}.sock");
            assert_eq!(netless::replica_of(&canonical, "kv.Store"), Some(Some(n)));
        }
        None => {}
    }
}

fn timeout(bytes: &[u8]) {
    let before = Instant::now();
    let Some(deadline) = parse_grpc_timeout(bytes) else {
        return;
    };
    assert!(deadline >= before, "a timeout ending in the past");
    let value = format_grpc_timeout(deadline);
    let again = parse_grpc_timeout(value.as_bytes()).expect("a formatted timeout parses");
    // Formatting rounds down to µs (or s, past 100 s), and time passes between the two.
    assert!(
        again <= deadline + Duration::from_secs(1),
        "{value:?} later than {bytes:?}"
    );
}

fn metadata(bytes: &[u8]) {
    let Ok(md) = Metadata::decode(bytes) else {
        return;
    };
    let (headers, trailers) = metadata_to_headers(&md);
    let mut appended = HeaderMap::new();
    append_headers(&md, &mut appended);
    assert_eq!(appended, headers, "the server's headers are the client's");
    let mut back = Metadata::new();
    headers_to_metadata(&headers, &mut back);
    trailers_to_metadata(&trailers, &mut back);
    let (headers_again, trailers_again) = metadata_to_headers(&back);
    let mut expected = headers.clone();
    for name in [
        "te",
        "content-type",
        "content-length",
        "grpc-timeout",
        "host",
    ] {
        expected.remove(name);
    }
    assert_eq!(headers_again, expected, "headers → metadata → headers");
    assert_eq!(trailers_again, trailers, "trailers → metadata → trailers");
    if let Some(id) = session_of(&md) {
        let value = md.get(SESSION).expect("a session id has its key");
        assert!(id.to_string().len() <= value.len());
    }
}

fn stream(bytes: &[u8]) {
    if let Some((id, data)) = split_stream_payload(bytes) {
        assert_eq!(
            stream_payload(id, data),
            bytes,
            "a stream payload re-encodes"
        );
    } else {
        assert!(bytes.len() < 8);
    }
}

fn authorization(bytes: &[u8]) {
    let Ok(value) = HeaderValue::from_bytes(bytes) else {
        return;
    };
    static CHECK: OnceLock<BearerToken> = OnceLock::new();
    let check = CHECK.get_or_init(|| BearerToken::new(TOKEN).expect("a valid token"));
    let expected = bytes.len() >= 7
        && bytes[..7].eq_ignore_ascii_case(b"bearer ")
        && bytes[7..].trim_ascii() == TOKEN;
    let mut headers = HeaderMap::new();
    headers.insert(AUTHORIZATION, value.clone());
    match check.check(&headers) {
        Ok(()) => assert!(expected, "{value:?} passed"),
        Err(status) => {
            assert!(!expected, "{value:?} refused: {status}");
            assert_eq!(status.code(), Code::Unauthenticated);
            assert!(!status.message().contains("s3cret"), "{status}");
        }
    }
    // Two of them never pass, whatever they hold.
    headers.append(AUTHORIZATION, value);
    assert!(check.check(&headers).is_err());
}

fn error_message(bytes: &[u8]) {
    let Some((&code, message)) = bytes.split_first() else {
        return;
    };
    static SCRUBBER: OnceLock<Scrubber> = OnceLock::new();
    let scrubber = SCRUBBER.get_or_init(|| Scrubber::new(Some(Path::new(DIR))));
    // A backend's trailers, as they pass through the gateway.
    if let Ok(value) = HeaderValue::from_bytes(message) {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from(u16::from(code % 17)));
        trailers.insert("grpc-message", value);
        scrubber.trailers(&mut trailers);
        if let Some(seen) = tonic::Status::from_header_map(&trailers) {
            assert!(!seen.message().contains(DIR), "{seen}");
            assert_eq!(scrubber.message(seen.message()), seen.message());
        }
    }
    // A netless client's own error, as the gateway answers it.
    if let (Some(code), Ok(text)) = (Code::from_u16(code.into()), std::str::from_utf8(message)) {
        let seen = scrubber.status(&Status::new(code, text));
        assert_eq!(seen.code(), code);
        assert!(!seen.message().contains(DIR), "{seen}");
        assert_eq!(scrubber.message(seen.message()), seen.message(), "{text:?}");
    }
}
