//! Entry points for the fuzz targets in the repository's `fuzz/` directory (feature
//! `fuzzing`, never in a user's build). The target here takes the fuzzer's bytes as what a
//! gRPC peer sends the gateway (a request path, a `grpc-timeout` value) or what the other
//! netless side sends (call metadata, a stream call's payload), maps them as the gateway and
//! the tonic bridge do, and asserts what those rely on. A refusal is fine; a panic is a
//! finding. Nothing here is used by the library itself.

use std::path::Path;
use std::time::{Duration, Instant};

use http::HeaderMap;
use netless::Metadata;

use crate::gateway::service_of;
use crate::mapping::{
    append_headers, format_grpc_timeout, headers_to_metadata, metadata_to_headers,
    parse_grpc_timeout, trailers_to_metadata,
};
use crate::protocol::{session_of, split_stream_payload, stream_payload, SESSION};

/// The socket directory the gateway resolves services in, here (it is never touched).
const DIR: &str = "/nonexistent/netless-fuzz";

/// Target `grpc_mapping`: `mode: u8`, then the bytes as, by `mode % 4`:
///
/// - 0: a request path (`/pkg.Service/Method`) the gateway forwards: the service it names and
///   that service's socket path, which is a file of its own in the socket directory; and a
///   socket file name read as a replica's;
/// - 1: a `grpc-timeout` value, whose deadline lies ahead and formats to a value that parses
///   back to no later a deadline;
/// - 2: call metadata from the other side (`Metadata::decode`), mapped to HTTP headers and
///   trailers and back: the round trip keeps every pair but the transport headers;
/// - 3: a stream call's payload and a reply's session id.
pub fn grpc_mapping(data: &[u8]) {
    let Some((&mode, bytes)) = data.split_first() else {
        return;
    };
    match mode % 4 {
        0 => path(bytes),
        1 => timeout(bytes),
        2 => metadata(bytes),
        _ => stream(bytes),
    }
}

fn path(bytes: &[u8]) {
    let Ok(path) = std::str::from_utf8(bytes) else {
        return;
    };
    if let Some(service) = service_of(path) {
        let method = &path[1 + service.len() + 1..];
        assert_eq!(path, format!("/{service}/{method}"));
        assert!(!service.is_empty() && !service.contains('/') && !method.is_empty());
        if let Some(socket) = netless::fuzzing::socket_path_in(Path::new(DIR), service) {
            // No service name reaches outside the directory, or names it or a subdirectory.
            assert_eq!(socket.parent(), Some(Path::new(DIR)), "{socket:?}");
            let name = socket.file_name().and_then(|n| n.to_str());
            assert_eq!(name, Some(format!("{service}.sock").as_str()));
        }
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
