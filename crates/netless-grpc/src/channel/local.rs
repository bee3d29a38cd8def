//! The local path: one gRPC call as netless calls on a [`Client`], the request's headers
//! as metadata, its messages as payload, and a stream as a session (see `protocol`).
//!
//! This module owns the client's half of that mapping; where a channel goes is decided in
//! `channel/mod.rs`.

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderValue};
use netless::{CallOptions, Client, Metadata, Reply, Status};

use crate::mapping::{
    headers_to_metadata, metadata_to_headers, parse_grpc_timeout, take_ready, ReplyBody,
    GRPC_TIMEOUT,
};
use crate::protocol::{session_of, HEADERS, MORE, WINDOW};
use crate::stream::{ClientStream, StreamBody};

/// One call on `client`: `Err` for a failure of the netless call itself (the service's
/// own errors come as responses).
pub(crate) async fn call(
    client: Client,
    request: http::Request<tonic::body::Body>,
) -> Result<http::Response<tonic::body::Body>, Status> {
    let (parts, mut body) = request.into_parts();
    let path = parts.uri.path();
    let mut metadata = Metadata::new();
    headers_to_metadata(&parts.headers, &mut metadata);
    let deadline = parts
        .headers
        .get(GRPC_TIMEOUT)
        .and_then(|v| parse_grpc_timeout(v.as_bytes()));
    // What of the request is ready now: all of it for a unary call.
    let mut bytes = Vec::new();
    let ended = take_ready(&mut body, WINDOW, &mut bytes)
        .await
        .map_err(|e| {
            Status::new(
                netless::Code::Cancelled,
                format!("the request stream failed: {e}"),
            )
        })?;
    if !ended {
        metadata.insert(MORE, "1");
    }
    let mut options = CallOptions::new().with_metadata(metadata);
    if let Some(deadline) = deadline {
        options = options.deadline_at(deadline);
    }
    let reply = client.call_async(path, &bytes, &options).await?;
    let Some(id) = session_of(&reply.metadata) else {
        return Ok(unary_response(reply));
    };
    // From here, dropping `stream` (this future, or later the response body) cancels the
    // call on the server.
    let stream = ClientStream::new(client, id, deadline);
    let head = if ended {
        reply
    } else {
        stream.send_request(body);
        // The response headers come with the first `recv` that has any.
        loop {
            let reply = stream.recv().await?;
            if reply.metadata.get(HEADERS).is_some() {
                break reply;
            }
        }
    };
    let (mut headers, _) = metadata_to_headers(&head.metadata);
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    let mut response = http::Response::new(tonic::body::Body::new(StreamBody::new(stream, head)));
    *response.headers_mut() = headers;
    Ok(response)
}

/// The response to a call that completed in one exchange.
fn unary_response(reply: Reply) -> http::Response<tonic::body::Body> {
    let (mut headers, trailers) = metadata_to_headers(&reply.metadata);
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    let mut response = http::Response::new(tonic::body::Body::new(ReplyBody::new(
        Bytes::from(reply.payload),
        trailers,
    )));
    *response.headers_mut() = headers;
    response
}

/// A trailers-only gRPC response carrying `status`.
pub(crate) fn status_response(status: &Status) -> http::Response<tonic::body::Body> {
    let code = tonic::Code::from_i32(i32::from(status.code() as u16));
    let grpc = tonic::Status::new(code, status.message());
    let mut headers = HeaderMap::new();
    let _ = grpc.add_header(&mut headers);
    let mut response = http::Response::new(tonic::body::Body::empty());
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    *response.headers_mut() = headers;
    response
}
