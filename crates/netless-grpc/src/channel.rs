//! The client side: a [`Channel`] that tonic-generated clients accept in place of
//! `tonic::transport::Channel`, sending each call over netless.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue};
use http_body_util::BodyExt;
use netless::{CallOptions, Client, ClientConfig, Metadata, Status};

use crate::mapping::{headers_to_metadata, metadata_to_headers, parse_grpc_timeout, ReplyBody};

/// A tonic transport over netless: `GreeterClient::new(Channel::connect("helloworld.Greeter")?)`.
///
/// Cheap to clone; clones share one netless connection. A call that cannot reach the
/// service (unknown service, dead server, full queue, expired deadline) completes with the
/// corresponding gRPC status, exactly as tonic reports transport failures.
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
            let (parts, body) = request.into_parts();
            let path = parts.uri.path().to_string();
            let bytes = match body.collect().await {
                Ok(collected) => collected.to_bytes(),
                Err(e) => {
                    return Ok(status_response(&Status::internal(format!(
                        "reading the request body: {e}"
                    ))))
                }
            };
            let mut metadata = Metadata::new();
            headers_to_metadata(&parts.headers, &mut metadata);
            let mut options = CallOptions::new().with_metadata(metadata);
            if let Some(deadline) = parts
                .headers
                .get("grpc-timeout")
                .and_then(|v| parse_grpc_timeout(v.as_bytes()))
            {
                options = options.deadline_at(deadline);
            }
            Ok(match client.call_async(&path, &bytes, &options).await {
                Ok(reply) => {
                    let (mut headers, trailers) = metadata_to_headers(&reply.metadata);
                    headers.insert("content-type", HeaderValue::from_static("application/grpc"));
                    let mut response = http::Response::new(tonic::body::Body::new(ReplyBody::new(
                        Bytes::from(reply.payload),
                        trailers,
                    )));
                    *response.headers_mut() = headers;
                    response
                }
                Err(status) => status_response(&status),
            })
        })
    }
}

/// A trailers-only gRPC response carrying `status`.
fn status_response(status: &Status) -> http::Response<tonic::body::Body> {
    let code = tonic::Code::from_i32(i32::from(status.code() as u16));
    let grpc = tonic::Status::new(code, status.message());
    let mut headers = HeaderMap::new();
    let _ = grpc.add_header(&mut headers);
    let mut response = http::Response::new(tonic::body::Body::empty());
    headers.insert("content-type", HeaderValue::from_static("application/grpc"));
    *response.headers_mut() = headers;
    response
}
