//! The client side of the interop tests: each case of [`CASES`] as the interop test
//! descriptions' "Client" part says, by tonic's generated client over any channel.
//!
//! Where grpc's clients cancel a call (`cancel_after_begin`, `cancel_after_first_response`)
//! and assert `CANCELLED`, which their own library reports, a tonic client cancels by
//! dropping the call: the case checks that the call was still under way when dropped, and
//! that the channel then carries the next call.

use std::time::Duration;

use anyhow::{bail, ensure, Context as _};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;
use tonic::body::Body;
use tonic::client::GrpcService;
use tonic::codegen::{Body as HttpBody, Bytes, StdError};
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Code, Request, Status};

use super::pb::test_service_client::TestServiceClient;
use super::pb::unimplemented_service_client::UnimplementedServiceClient;
use super::pb::{
    EchoStatus, Empty, Payload, ResponseParameters, SimpleRequest, StreamingInputCallRequest,
    StreamingOutputCallRequest,
};
use super::{ECHO_INITIAL, ECHO_TRAILING};

/// The test cases, by their names in the interop test descriptions.
pub const CASES: [&str; 14] = [
    "empty_unary",
    "large_unary",
    "client_streaming",
    "server_streaming",
    "ping_pong",
    "empty_stream",
    "custom_metadata",
    "status_code_and_message",
    "special_status_message",
    "unimplemented_method",
    "unimplemented_service",
    "cancel_after_begin",
    "cancel_after_first_response",
    "timeout_on_sleeping_server",
];

const REQUEST_SIZES: [usize; 4] = [27182, 8, 1828, 45904];
const RESPONSE_SIZES: [i32; 4] = [31415, 9, 2653, 58979];
const LARGE_REQUEST: usize = 271828;
const LARGE_RESPONSE: i32 = 314159;
const INITIAL_VALUE: &str = "test_initial_metadata_value";
const TRAILING_VALUE: [u8; 3] = [0xab, 0xab, 0xab];
const SPECIAL_MESSAGE: &str = "\t\ntest with whitespace\r\nand Unicode BMP ☺ and non-BMP 😈\t\n";

/// How long any one step of a case may take before the case fails.
const STEP: Duration = Duration::from_secs(20);

/// What tonic's generated clients need of a channel: a netless `Channel`, a tonic
/// `transport::Channel`, ...
pub trait Transport:
    GrpcService<
    Body,
    Error: Into<StdError>,
    ResponseBody: HttpBody<Data = Bytes, Error: Into<StdError> + Send> + Send + 'static,
>
{
}

impl<T> Transport for T where
    T: GrpcService<
        Body,
        Error: Into<StdError>,
        ResponseBody: HttpBody<Data = Bytes, Error: Into<StdError> + Send> + Send + 'static,
    >
{
}

/// Runs the case named `case` over `channel`.
pub async fn run<T: Transport + Clone>(case: &str, channel: T) -> anyhow::Result<()> {
    let mut client = TestServiceClient::new(channel.clone());
    let run = async {
        match case {
            "empty_unary" => {
                client.empty_call(Empty {}).await?;
            }
            "large_unary" => large_unary(&mut client).await?,
            "client_streaming" => client_streaming(&mut client).await?,
            "server_streaming" => server_streaming(&mut client).await?,
            "ping_pong" => ping_pong(&mut client).await?,
            "empty_stream" => {
                let mut responses = client
                    .full_duplex_call(tokio_stream::empty())
                    .await?
                    .into_inner();
                ensure!(responses.message().await?.is_none(), "a response came");
            }
            "custom_metadata" => custom_metadata(&mut client).await?,
            "status_code_and_message" => {
                echo_status(&mut client, "test status message").await?;
            }
            "special_status_message" => echo_status(&mut client, SPECIAL_MESSAGE).await?,
            "unimplemented_method" => {
                let outcome = client.unimplemented_call(Empty {}).await;
                expect_code(outcome.map(drop), Code::Unimplemented)?;
            }
            "unimplemented_service" => {
                let mut other = UnimplementedServiceClient::new(channel.clone());
                let outcome = other.unimplemented_call(Empty {}).await;
                expect_code(outcome.map(drop), Code::Unimplemented)?;
            }
            "cancel_after_begin" => cancel_after_begin(&mut client).await?,
            "cancel_after_first_response" => cancel_after_first_response(&mut client).await?,
            "timeout_on_sleeping_server" => timeout_on_sleeping_server(&mut client).await?,
            other => bail!("no test case `{other}` (the cases: {})", CASES.join(", ")),
        }
        anyhow::Ok(())
    };
    tokio::time::timeout(STEP * 3, run)
        .await
        .with_context(|| format!("not done within {:?}", STEP * 3))?
}

fn zeros(size: usize) -> Option<Payload> {
    Some(Payload {
        r#type: 0,
        body: vec![0; size],
    })
}

fn response_parameters(size: i32) -> Vec<ResponseParameters> {
    vec![ResponseParameters {
        size,
        ..Default::default()
    }]
}

/// Checks a payload's size and that it is all zeros.
fn check_payload(payload: Option<&Payload>, size: i32) -> anyhow::Result<()> {
    let body = payload.map_or(&[][..], |payload| &payload.body[..]);
    ensure!(
        body.len() == usize::try_from(size)?,
        "a payload of {} bytes, not {size}",
        body.len()
    );
    ensure!(body.iter().all(|&b| b == 0), "a payload not all zeros");
    Ok(())
}

/// `Err` unless `outcome` is a status with `code`.
fn expect_code(outcome: Result<(), Status>, code: Code) -> anyhow::Result<Status> {
    match outcome {
        Ok(()) => bail!("the call succeeded; expected {code:?}"),
        Err(status) if status.code() == code => Ok(status),
        Err(status) => bail!("expected {code:?}, got {status:?}"),
    }
}

async fn large_unary<T: Transport>(client: &mut TestServiceClient<T>) -> anyhow::Result<()> {
    let response = client
        .unary_call(SimpleRequest {
            response_size: LARGE_RESPONSE,
            payload: zeros(LARGE_REQUEST),
            ..Default::default()
        })
        .await?
        .into_inner();
    check_payload(response.payload.as_ref(), LARGE_RESPONSE)
}

async fn client_streaming<T: Transport>(client: &mut TestServiceClient<T>) -> anyhow::Result<()> {
    let requests = REQUEST_SIZES.map(|size| StreamingInputCallRequest {
        payload: zeros(size),
        ..Default::default()
    });
    let response = client
        .streaming_input_call(tokio_stream::iter(requests))
        .await?
        .into_inner();
    ensure!(
        response.aggregated_payload_size == 74922,
        "aggregated_payload_size {}, not 74922",
        response.aggregated_payload_size
    );
    Ok(())
}

async fn server_streaming<T: Transport>(client: &mut TestServiceClient<T>) -> anyhow::Result<()> {
    let request = StreamingOutputCallRequest {
        response_parameters: RESPONSE_SIZES
            .iter()
            .flat_map(|&size| response_parameters(size))
            .collect(),
        ..Default::default()
    };
    let mut responses = client.streaming_output_call(request).await?.into_inner();
    for size in RESPONSE_SIZES {
        let response = responses
            .message()
            .await?
            .context("fewer than 4 responses")?;
        check_payload(response.payload.as_ref(), size)?;
    }
    ensure!(
        responses.message().await?.is_none(),
        "more than 4 responses"
    );
    Ok(())
}

async fn ping_pong<T: Transport>(client: &mut TestServiceClient<T>) -> anyhow::Result<()> {
    let (tx, rx) = mpsc::channel(1);
    let mut pings = REQUEST_SIZES
        .into_iter()
        .zip(RESPONSE_SIZES)
        .map(|(request, response)| StreamingOutputCallRequest {
            response_parameters: response_parameters(response),
            payload: zeros(request),
            ..Default::default()
        });
    // The first request goes before the call is awaited: a server may answer the headers
    // only once it has one.
    tx.send(pings.next().context("4 pings")?).await?;
    let mut responses = client
        .full_duplex_call(ReceiverStream::new(rx))
        .await?
        .into_inner();
    for (i, size) in RESPONSE_SIZES.into_iter().enumerate() {
        if i > 0 {
            tx.send(pings.next().context("4 pings")?).await?;
        }
        let response = responses.message().await?.context("too few responses")?;
        check_payload(response.payload.as_ref(), size)?;
    }
    drop(tx);
    ensure!(
        responses.message().await?.is_none(),
        "more than 4 responses"
    );
    Ok(())
}

/// Checks that `headers` and `trailers` echo the custom metadata.
fn check_echo(headers: &MetadataMap, trailers: &MetadataMap) -> anyhow::Result<()> {
    let initial = headers.get(ECHO_INITIAL).map(|v| v.to_str());
    ensure!(
        matches!(initial, Some(Ok(INITIAL_VALUE))),
        "{ECHO_INITIAL} in the headers: {initial:?}"
    );
    let trailing = trailers.get_bin(ECHO_TRAILING).map(|v| v.to_bytes());
    ensure!(
        matches!(&trailing, Some(Ok(bytes)) if bytes[..] == TRAILING_VALUE),
        "{ECHO_TRAILING} in the trailers: {trailing:?}"
    );
    Ok(())
}

fn with_echo<M>(message: M) -> Request<M> {
    let mut request = Request::new(message);
    request
        .metadata_mut()
        .insert(ECHO_INITIAL, MetadataValue::from_static(INITIAL_VALUE));
    request
        .metadata_mut()
        .insert_bin(ECHO_TRAILING, MetadataValue::from_bytes(&TRAILING_VALUE));
    request
}

async fn custom_metadata<T: Transport>(client: &mut TestServiceClient<T>) -> anyhow::Result<()> {
    // Unary: tonic merges the trailers into the response's metadata.
    let response = client
        .unary_call(with_echo(SimpleRequest {
            response_size: LARGE_RESPONSE,
            payload: zeros(LARGE_REQUEST),
            ..Default::default()
        }))
        .await?;
    check_echo(response.metadata(), response.metadata()).context("UnaryCall")?;
    check_payload(response.get_ref().payload.as_ref(), LARGE_RESPONSE)?;

    let request = StreamingOutputCallRequest {
        response_parameters: response_parameters(LARGE_RESPONSE),
        payload: zeros(LARGE_REQUEST),
        ..Default::default()
    };
    let response = client
        .full_duplex_call(with_echo(tokio_stream::iter([request])))
        .await?;
    let headers = response.metadata().clone();
    let mut responses = response.into_inner();
    let first = responses.message().await?.context("no response")?;
    check_payload(first.payload.as_ref(), LARGE_RESPONSE)?;
    ensure!(responses.message().await?.is_none(), "more than 1 response");
    let trailers = responses.trailers().await?.unwrap_or_default();
    check_echo(&headers, &trailers).context("FullDuplexCall")
}

/// `status_code_and_message` and `special_status_message`: the server ends a unary and
/// (but for the special message) a bidirectional call with the code and message asked for.
async fn echo_status<T: Transport>(
    client: &mut TestServiceClient<T>,
    message: &str,
) -> anyhow::Result<()> {
    let response_status = Some(EchoStatus {
        code: 2,
        message: message.to_string(),
    });
    let outcome = client
        .unary_call(SimpleRequest {
            response_status: response_status.clone(),
            ..Default::default()
        })
        .await;
    let status = expect_code(outcome.map(drop), Code::Unknown).context("UnaryCall")?;
    ensure!(
        status.message() == message,
        "UnaryCall's message: {:?}",
        status.message()
    );
    if message == SPECIAL_MESSAGE {
        return Ok(());
    }
    let request = StreamingOutputCallRequest {
        response_status,
        ..Default::default()
    };
    let outcome = match client.full_duplex_call(tokio_stream::iter([request])).await {
        Ok(response) => response.into_inner().message().await.map(drop),
        Err(status) => Err(status),
    };
    let status = expect_code(outcome, Code::Unknown).context("FullDuplexCall")?;
    ensure!(
        status.message() == message,
        "FullDuplexCall's message: {:?}",
        status.message()
    );
    Ok(())
}

async fn cancel_after_begin<T: Transport>(client: &mut TestServiceClient<T>) -> anyhow::Result<()> {
    {
        // No request ever, and no half-close: only the cancel ends the call.
        let call = client.streaming_input_call(tokio_stream::pending());
        if let Ok(outcome) = tokio::time::timeout(Duration::from_millis(200), call).await {
            bail!("the call ended before it was cancelled: {outcome:?}");
        }
    }
    client
        .empty_call(Empty {})
        .await
        .context("the call after the cancelled one")?;
    Ok(())
}

async fn cancel_after_first_response<T: Transport>(
    client: &mut TestServiceClient<T>,
) -> anyhow::Result<()> {
    {
        let (tx, rx) = mpsc::channel(1);
        tx.send(StreamingOutputCallRequest {
            response_parameters: response_parameters(31415),
            payload: zeros(27182),
            ..Default::default()
        })
        .await?;
        let mut responses = client
            .full_duplex_call(ReceiverStream::new(rx))
            .await?
            .into_inner();
        let first = responses.message().await?.context("no first response")?;
        check_payload(first.payload.as_ref(), 31415)?;
        // The call is open (no half-close); dropping both halves cancels it.
    }
    client
        .empty_call(Empty {})
        .await
        .context("the call after the cancelled one")?;
    Ok(())
}

async fn timeout_on_sleeping_server<T: Transport>(
    client: &mut TestServiceClient<T>,
) -> anyhow::Result<()> {
    let first = StreamingOutputCallRequest {
        payload: zeros(27182),
        ..Default::default()
    };
    // One request and no half-close: the server waits for more until the deadline.
    let mut request = Request::new(tokio_stream::iter([first]).chain(tokio_stream::pending()));
    request.set_timeout(Duration::from_millis(1));
    let call = async {
        match client.full_duplex_call(request).await {
            Ok(response) => response.into_inner().message().await.map(drop),
            Err(status) => Err(status),
        }
    };
    let outcome = tokio::time::timeout(STEP, call)
        .await
        .with_context(|| format!("no end within {STEP:?} of a 1 ms deadline"))?;
    match outcome {
        // tonic's HTTP/2 channel holds the deadline until the response headers itself, and
        // reports it so.
        Err(status)
            if status.code() == Code::Cancelled && status.message() == "Timeout expired" =>
        {
            Ok(())
        }
        outcome => expect_code(outcome, Code::DeadlineExceeded).map(drop),
    }
}
