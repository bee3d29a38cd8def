//! The checks a transport must pass to carry the example services, shared by this crate's
//! tests (TCP and netless channels) and the gateway's interop tests (TCP through the
//! gateway). Each panics on the first check that fails, naming the transport.

use std::time::Duration;

use tokio_stream::StreamExt;
use tonic::Request;

use crate::helloworld::greeter_client::GreeterClient;
use crate::helloworld::HelloRequest;
use crate::routeguide::grid_point;
use crate::routeguide_pb::route_guide_client::RouteGuideClient;
use crate::routeguide_pb::{Point, Rectangle, RouteNote};

/// The Greeter checks every transport must pass; panics on the first that fails.
pub async fn greeter<T>(mut client: GreeterClient<T>, transport: &str)
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<tonic::codegen::StdError>,
    T::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <T::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    let reply = client
        .say_hello(HelloRequest {
            name: "netless".into(),
        })
        .await
        .unwrap();
    assert_eq!(reply.get_ref().message, "Hello netless!", "{transport}");

    let mut request = Request::new(HelloRequest {
        name: "meta".into(),
    });
    request.metadata_mut().insert("x-id", "42".parse().unwrap());
    let reply = client.say_hello(request).await.unwrap();
    assert_eq!(reply.metadata().get("x-id").unwrap(), "42", "{transport}");

    let err = client
        .say_hello(HelloRequest {
            name: "nobody".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound, "{transport}: {err:?}");
    assert_eq!(err.message(), "no such person: nobody", "{transport}");

    let mut request = Request::new(HelloRequest {
        name: "slow".into(),
    });
    request.set_timeout(Duration::from_millis(200));
    let err = client.say_hello(request).await.unwrap_err();
    // tonic's own TCP channel reports its client-side timer as CANCELLED ("Timeout
    // expired"); a deadline enforced anywhere else is DEADLINE_EXCEEDED.
    assert!(
        matches!(
            err.code(),
            tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
        ),
        "{transport}: {err:?}"
    );

    // A message of 3 MiB each way (under tonic's 4 MiB default limit): on netless it travels
    // in fragments and, past the stream window, as a stream of capped replies.
    let big = "x".repeat(3 << 20);
    let reply = client
        .say_hello(HelloRequest { name: big.clone() })
        .await
        .unwrap();
    assert_eq!(reply.get_ref().message.len(), big.len() + 7, "{transport}");

    // Still healthy after an error and a timeout.
    let reply = client
        .say_hello(HelloRequest {
            name: "again".into(),
        })
        .await
        .unwrap();
    assert_eq!(reply.get_ref().message, "Hello again!", "{transport}");
}

/// The RouteGuide checks every transport must pass: all four kinds of call, metadata,
/// trailers, errors before and after messages, deadlines on a stream; panics on the first
/// that fails.
pub async fn routeguide<T>(mut client: RouteGuideClient<T>, transport: &str)
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<tonic::codegen::StdError>,
    T::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <T::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    // Unary.
    let feature = client
        .get_feature(grid_point(7))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(feature.name, "feature 7", "{transport}");
    let nothing = client
        .get_feature(Point {
            latitude: 1,
            longitude: 1,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(nothing.name, "", "{transport}");

    // Server streaming, with response metadata.
    let rect = Rectangle {
        lo: Some(grid_point(0)),
        hi: Some(grid_point(909)),
    };
    let mut request = Request::new(rect);
    request
        .metadata_mut()
        .insert("x-request-id", "r-1".parse().unwrap());
    let response = client.list_features(request).await.unwrap();
    assert_eq!(
        response.metadata().get("x-request-id").unwrap(),
        "r-1",
        "{transport}"
    );
    let mut stream = response.into_inner();
    let mut names = Vec::new();
    while let Some(feature) = stream.next().await {
        names.push(feature.unwrap().name);
    }
    // Rows 0..=9, columns 0..=9.
    assert_eq!(names.len(), 100, "{transport}");
    assert_eq!(names[0], "feature 0", "{transport}");
    assert_eq!(names[99], "feature 909", "{transport}");

    // A status after some messages arrives in the trailers, with its metadata.
    let mut request = Request::new(rect);
    request
        .metadata_mut()
        .insert("x-limit", "5".parse().unwrap());
    let mut stream = client.list_features(request).await.unwrap().into_inner();
    let mut got = 0;
    let status = loop {
        match stream.next().await {
            Some(Ok(_)) => got += 1,
            Some(Err(status)) => break status,
            None => panic!("{transport}: stream ended without the status"),
        }
    };
    assert_eq!(got, 5, "{transport}");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{transport}");
    assert_eq!(status.message(), "limit of 5 reached", "{transport}");
    assert_eq!(status.metadata().get("x-sent").unwrap(), "5", "{transport}");

    // An error before any message.
    let err = client
        .list_features(Rectangle { lo: None, hi: None })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{transport}");

    // Client streaming, from a stream that is not ready all at once.
    let route = tokio_stream::iter((0..20).map(grid_point)).throttle(Duration::from_millis(2));
    let summary = client.record_route(route).await.unwrap().into_inner();
    assert_eq!(summary.point_count, 20, "{transport}");
    assert_eq!(summary.feature_count, 20, "{transport}");
    assert!(summary.distance > 0, "{transport}");

    // A large client stream (past the flow-control window).
    let many = tokio_stream::iter((0..50_000).map(|i| grid_point(i % 1000)));
    let summary = client.record_route(many).await.unwrap().into_inner();
    assert_eq!(summary.point_count, 50_000, "{transport}");

    // Bidirectional: a reply arrives before the request stream ends.
    // The guide remembers notes across calls: each transport uses its own locations.
    let base = match transport {
        "tcp" => 7_000,
        "netless" => 8_000,
        "target-local" => 10_000,
        "target-remote" => 11_000,
        _ => 9_000,
    };
    let at = |i: i32, message: &str| RouteNote {
        location: Some(Point {
            latitude: base + i,
            longitude: 7_000,
        }),
        message: format!("{transport}-{message}"),
    };
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let mut replies = client
        .route_chat(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    tx.send(at(1, "a")).await.unwrap();
    tx.send(at(2, "b")).await.unwrap();
    tx.send(at(1, "c")).await.unwrap();
    let first = tokio::time::timeout(Duration::from_secs(10), replies.next())
        .await
        .expect("a reply while the request stream is open")
        .unwrap()
        .unwrap();
    assert_eq!(first.message, format!("{transport}-a"));
    tx.send(at(2, "d")).await.unwrap();
    drop(tx);
    let rest: Vec<String> = replies.map(|n| n.unwrap().message).collect().await;
    assert_eq!(rest, vec![format!("{transport}-b")]);

    // A deadline on a call whose request stream never ends. (tonic enforces `grpc-timeout`
    // until the response headers, so the deadline is checked on a client-streaming call.)
    let (tx, rx) = tokio::sync::mpsc::channel::<Point>(1);
    let mut request = Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    request.set_timeout(Duration::from_millis(300));
    let err = client.record_route(request).await.unwrap_err();
    drop(tx);
    assert!(
        matches!(
            err.code(),
            tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
        ),
        "{transport}: {err:?}"
    );
}
