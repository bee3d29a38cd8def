//! The client side: a [`Channel`] that tonic-generated clients accept in place of
//! `tonic::transport::Channel`, sending each call over netless.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderValue};
use netless::{CallOptions, Client, ClientConfig, Metadata, Reply, Status};

use crate::mapping::{
    headers_to_metadata, metadata_to_headers, parse_grpc_timeout, take_ready, ReplyBody,
    GRPC_TIMEOUT,
};
use crate::protocol::{session_of, HEADERS, MORE, WINDOW};
use crate::stream::{ClientStream, StreamBody};

/// A tonic transport over netless: `GreeterClient::new(Channel::connect("helloworld.Greeter")?)`.
///
/// Cheap to clone; clones share one netless connection. Unary and streaming calls, metadata,
/// trailers, `grpc-timeout` deadlines and cancellation (dropping a call or its response
/// stream cancels it on the server) behave as over HTTP/2. A call that cannot reach the
/// service (unknown service, dead server, full queue, expired deadline) completes with the
/// corresponding gRPC status, as tonic reports transport failures.
#[derive(Clone, Debug)]
pub struct Channel {
    client: Client,
}

impl Channel {
    /// Connects to the netless service `service` (by convention the gRPC `pkg.Service`).
    pub fn connect(service: &str) -> Result<Channel, Status> {
        Ok(Channel {
            client: Client::connect(service)?,
        })
    }

    /// Connects with `config`.
    pub fn connect_with(service: &str, config: ClientConfig) -> Result<Channel, Status> {
        Ok(Channel {
            client: Client::connect_with(service, config)?,
        })
    }

    /// Wraps an existing netless client.
    pub fn from_client(client: Client) -> Channel {
        Channel { client }
    }
}

type ResponseFuture =
    Pin<Box<dyn Future<Output = Result<http::Response<tonic::body::Body>, Infallible>> + Send>>;

impl tower_service::Service<http::Request<tonic::body::Body>> for Channel {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> ResponseFuture {
        let client = self.client.clone();
        Box::pin(async move {
            Ok(call(client, request)
                .await
                .unwrap_or_else(|status| status_response(&status)))
        })
    }
}

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
