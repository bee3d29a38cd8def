//! The server side of the interop tests: `grpc.testing.TestService` as the interop test
//! descriptions' "Server" part asks (EmptyCall, UnaryCall, CacheableUnaryCall,
//! StreamingOutputCall, StreamingInputCall, FullDuplexCall, HalfDuplexCall, echo status,
//! `interval_us`), and the metadata echo ([`EchoMetadata`]), which wraps the generated
//! server because a tonic service cannot set a unary call's trailers.
//!
//! Compression: this build of tonic has no codec, so a request that asks for a compressed
//! response, or says its own messages were compressed (`expect_compressed`, which every
//! request that reaches a service here contradicts), fails with `INVALID_ARGUMENT`, as the
//! descriptions say a server that lacks the feature must.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http_body::Frame;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::body::Body;
use tonic::codegen::http::{
    HeaderMap, HeaderValue, Request as HttpRequest, Response as HttpResponse,
};
use tonic::codegen::{BoxFuture, Bytes, Service};
use tonic::server::NamedService;
use tonic::{Code, Request, Response, Status, Streaming};

use super::pb::test_service_server::{TestService, TestServiceServer};
use super::pb::{
    BoolValue, EchoStatus, Empty, Payload, PayloadType, ResponseParameters, SimpleRequest,
    SimpleResponse, StreamingInputCallRequest, StreamingInputCallResponse,
    StreamingOutputCallRequest, StreamingOutputCallResponse,
};
use super::{ECHO_INITIAL, ECHO_TRAILING};

/// The largest response payload the server makes (4 MiB, what gRPC clients receive by
/// default); a larger `response_size` is `INVALID_ARGUMENT`.
pub const MAX_RESPONSE_SIZE: usize = 4 << 20;

/// The test service, wrapped in the metadata echo: what `interop_server` serves.
pub fn service() -> EchoMetadata<TestServiceServer<InteropService>> {
    EchoMetadata::new(TestServiceServer::new(InteropService))
}

/// `grpc.testing.TestService`; stateless.
#[derive(Clone, Copy, Debug, Default)]
pub struct InteropService;

type ResponseStream =
    Pin<Box<dyn Stream<Item = Result<StreamingOutputCallResponse, Status>> + Send>>;

/// A payload of `size` zero bytes of type `response_type` (only `COMPRESSABLE` exists).
fn payload(response_type: i32, size: i32) -> Result<Payload, Status> {
    if PayloadType::try_from(response_type) != Ok(PayloadType::Compressable) {
        return Err(Status::invalid_argument(format!(
            "response type {response_type} is not supported: only COMPRESSABLE (0) is"
        )));
    }
    let size = usize::try_from(size)
        .map_err(|_| Status::invalid_argument(format!("a negative response size ({size})")))?;
    if size > MAX_RESPONSE_SIZE {
        return Err(Status::invalid_argument(format!(
            "a response size of {size} bytes is over this server's {MAX_RESPONSE_SIZE}"
        )));
    }
    Ok(Payload {
        r#type: response_type,
        body: vec![0; size],
    })
}

/// The status a request asks the server to end its call with, if any (code 0 is none).
fn echo_status(status: Option<&EchoStatus>) -> Result<(), Status> {
    match status {
        Some(status) if status.code != 0 => Err(Status::new(
            Code::from_i32(status.code),
            status.message.clone(),
        )),
        _ => Ok(()),
    }
}

fn is_set(flag: Option<&BoolValue>) -> bool {
    flag.is_some_and(|flag| flag.value)
}

/// Refuses what needs compression, which this server cannot do.
fn no_compression(expect_compressed: Option<&BoolValue>, compress: bool) -> Result<(), Status> {
    if is_set(expect_compressed) {
        return Err(Status::invalid_argument(
            "expect_compressed: the request was not compressed (this server takes none)",
        ));
    }
    if compress {
        return Err(Status::invalid_argument(
            "a compressed response was asked for: this server does not compress",
        ));
    }
    Ok(())
}

/// Sends one response per parameter, each after its `interval_us`; false once the call is
/// over (the client went away, or a parameter was refused and its status sent).
async fn respond(
    tx: &mpsc::Sender<Result<StreamingOutputCallResponse, Status>>,
    response_type: i32,
    parameters: &[ResponseParameters],
) -> bool {
    for parameter in parameters {
        if let Ok(interval) = u64::try_from(parameter.interval_us) {
            tokio::select! {
                () = tokio::time::sleep(Duration::from_micros(interval)) => {}
                () = tx.closed() => return false,
            }
        }
        let response = no_compression(None, is_set(parameter.compressed.as_ref()))
            .and_then(|()| payload(response_type, parameter.size))
            .map(|payload| StreamingOutputCallResponse {
                payload: Some(payload),
                ..Default::default()
            });
        let failed = response.is_err();
        if tx.send(response).await.is_err() || failed {
            return false;
        }
    }
    true
}

/// The next request of `inbound`, or `None` when the call is over: the client half-closed
/// (then `Ok`), failed, or stopped reading the responses.
async fn next_request<T>(
    inbound: &mut Streaming<T>,
    tx: &mpsc::Sender<Result<StreamingOutputCallResponse, Status>>,
) -> Option<Result<T, Status>> {
    tokio::select! {
        next = inbound.next() => next,
        () = tx.closed() => None,
    }
}

/// Ends a response stream with `status`.
async fn fail(tx: &mpsc::Sender<Result<StreamingOutputCallResponse, Status>>, status: Status) {
    // A client that is gone needs no status.
    let _ = tx.send(Err(status)).await;
}

/// A response stream fed by `task`, which gets the sending half; the task ends when the
/// client stops reading (the receiver is dropped).
fn response_stream<F>(
    task: impl FnOnce(mpsc::Sender<Result<StreamingOutputCallResponse, Status>>) -> F,
) -> ResponseStream
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = mpsc::channel(4);
    tokio::spawn(task(tx));
    Box::pin(ReceiverStream::new(rx))
}

#[tonic::async_trait]
impl TestService for InteropService {
    async fn empty_call(&self, _request: Request<Empty>) -> Result<Response<Empty>, Status> {
        Ok(Response::new(Empty {}))
    }

    async fn unary_call(
        &self,
        request: Request<SimpleRequest>,
    ) -> Result<Response<SimpleResponse>, Status> {
        let request = request.into_inner();
        echo_status(request.response_status.as_ref())?;
        no_compression(
            request.expect_compressed.as_ref(),
            is_set(request.response_compressed.as_ref()),
        )?;
        Ok(Response::new(SimpleResponse {
            payload: Some(payload(request.response_type, request.response_size)?),
            ..Default::default()
        }))
    }

    /// The time in nanoseconds as the payload, marked cacheable for a minute.
    async fn cacheable_unary_call(
        &self,
        _request: Request<SimpleRequest>,
    ) -> Result<Response<SimpleResponse>, Status> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let mut response = Response::new(SimpleResponse {
            payload: Some(Payload {
                r#type: PayloadType::Compressable.into(),
                body: now.to_string().into_bytes(),
            }),
            ..Default::default()
        });
        response
            .metadata_mut()
            .insert("cache-control", "max-age=60".parse().expect("ASCII"));
        Ok(response)
    }

    type StreamingOutputCallStream = ResponseStream;

    async fn streaming_output_call(
        &self,
        request: Request<StreamingOutputCallRequest>,
    ) -> Result<Response<Self::StreamingOutputCallStream>, Status> {
        let request = request.into_inner();
        echo_status(request.response_status.as_ref())?;
        Ok(Response::new(response_stream(|tx| async move {
            respond(&tx, request.response_type, &request.response_parameters).await;
        })))
    }

    async fn streaming_input_call(
        &self,
        request: Request<Streaming<StreamingInputCallRequest>>,
    ) -> Result<Response<StreamingInputCallResponse>, Status> {
        let mut inbound = request.into_inner();
        let mut total: i32 = 0;
        while let Some(request) = inbound.next().await {
            let request = request?;
            no_compression(request.expect_compressed.as_ref(), false)?;
            let size = request.payload.map_or(0, |payload| payload.body.len());
            total = i32::try_from(size)
                .ok()
                .and_then(|size| total.checked_add(size))
                .ok_or_else(|| Status::invalid_argument("the payloads add up to over 2 GiB"))?;
        }
        Ok(Response::new(StreamingInputCallResponse {
            aggregated_payload_size: total,
        }))
    }

    type FullDuplexCallStream = ResponseStream;

    /// Answers each request as it comes, and ends when the client half-closes.
    async fn full_duplex_call(
        &self,
        request: Request<Streaming<StreamingOutputCallRequest>>,
    ) -> Result<Response<Self::FullDuplexCallStream>, Status> {
        let mut inbound = request.into_inner();
        Ok(Response::new(response_stream(|tx| async move {
            while let Some(request) = next_request(&mut inbound, &tx).await {
                let request = match request {
                    Ok(request) => request,
                    Err(status) => return fail(&tx, status).await,
                };
                if let Err(status) = echo_status(request.response_status.as_ref()) {
                    return fail(&tx, status).await;
                }
                if !respond(&tx, request.response_type, &request.response_parameters).await {
                    return;
                }
            }
        })))
    }

    type HalfDuplexCallStream = ResponseStream;

    /// Takes every request, then answers them all.
    async fn half_duplex_call(
        &self,
        request: Request<Streaming<StreamingOutputCallRequest>>,
    ) -> Result<Response<Self::HalfDuplexCallStream>, Status> {
        let mut inbound = request.into_inner();
        Ok(Response::new(response_stream(|tx| async move {
            let mut requests = Vec::new();
            while let Some(request) = next_request(&mut inbound, &tx).await {
                match request {
                    Ok(request) => requests.push(request),
                    Err(status) => return fail(&tx, status).await,
                }
            }
            for request in requests {
                if let Err(status) = echo_status(request.response_status.as_ref()) {
                    return fail(&tx, status).await;
                }
                if !respond(&tx, request.response_type, &request.response_parameters).await {
                    return;
                }
            }
        })))
    }

    async fn unimplemented_call(
        &self,
        _request: Request<Empty>,
    ) -> Result<Response<Empty>, Status> {
        Err(Status::unimplemented(
            "grpc.testing.TestService/UnimplementedCall is not implemented, by design",
        ))
    }
}

/// The interop tests' metadata echo around a gRPC service: the request's
/// `x-grpc-test-echo-initial` comes back in the response headers, its
/// `x-grpc-test-echo-trailing-bin` in the trailers (in the headers of a trailers-only
/// response, which are its trailers), whatever the call's outcome.
#[derive(Clone, Debug)]
pub struct EchoMetadata<S> {
    inner: S,
}

impl<S> EchoMetadata<S> {
    /// `inner` with the echo.
    pub fn new(inner: S) -> EchoMetadata<S> {
        EchoMetadata { inner }
    }
}

impl<S: NamedService> NamedService for EchoMetadata<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> Service<HttpRequest<Body>> for EchoMetadata<S>
where
    S: Service<HttpRequest<Body>, Response = HttpResponse<Body>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = HttpResponse<Body>;
    type Error = Infallible;
    type Future = BoxFuture<HttpResponse<Body>, Infallible>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: HttpRequest<Body>) -> Self::Future {
        let initial = request.headers().get(ECHO_INITIAL).cloned();
        let trailing = request.headers().get(ECHO_TRAILING).cloned();
        let response = self.inner.call(request);
        Box::pin(async move {
            let mut response = response.await?;
            if let Some(value) = initial {
                response.headers_mut().insert(ECHO_INITIAL, value);
            }
            if let Some(value) = trailing {
                if response.headers().contains_key("grpc-status") {
                    response.headers_mut().insert(ECHO_TRAILING, value);
                } else {
                    response = response.map(|body| {
                        Body::new(WithTrailer {
                            body,
                            trailer: Some(value),
                        })
                    });
                }
            }
            Ok(response)
        })
    }
}

/// A response body with one more trailer.
struct WithTrailer {
    body: Body,
    trailer: Option<HeaderValue>,
}

impl WithTrailer {
    fn trailers(&mut self, mut trailers: HeaderMap) -> Frame<Bytes> {
        if let Some(value) = self.trailer.take() {
            trailers.insert(ECHO_TRAILING, value);
        }
        Frame::trailers(trailers)
    }
}

impl http_body::Body for WithTrailer {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        Poll::Ready(match ready!(Pin::new(&mut this.body).poll_frame(cx)) {
            Some(Ok(frame)) => Some(Ok(match frame.into_trailers() {
                Ok(trailers) => this.trailers(trailers),
                Err(frame) => frame,
            })),
            // A body that ended without trailers (tonic's always have some) gets them.
            None if this.trailer.is_some() => Some(Ok(this.trailers(HeaderMap::new()))),
            other => other,
        })
    }

    fn is_end_stream(&self) -> bool {
        self.trailer.is_none() && self.body.is_end_stream()
    }
}
