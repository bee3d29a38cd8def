//! Runs all four kinds of call against `routeguide.RouteGuide`, over TCP or over netless:
//! `cargo run -p netless-examples --bin routeguide_client -- --transport netless`, or
//! wherever a target says: `--target routeguide.RouteGuide` (a table in `NETLESS_TARGETS`
//! may send that name elsewhere), `--target http://127.0.0.1:50051`.

use std::time::Duration;

use clap::Parser;
use netless_examples::routeguide::grid_point;
use netless_examples::routeguide_pb::route_guide_client::RouteGuideClient;
use netless_examples::routeguide_pb::{Rectangle, RouteNote};
use netless_examples::serve::{ClientArgs, Transport};
use tokio_stream::StreamExt;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    client: ClientArgs,
}

async fn tour<T>(mut client: RouteGuideClient<T>) -> anyhow::Result<()>
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<tonic::codegen::StdError>,
    T::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <T::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    let feature = client.get_feature(grid_point(7)).await?.into_inner();
    println!("GetFeature: {feature:?}");

    let rect = Rectangle {
        lo: Some(grid_point(0)),
        hi: Some(grid_point(203)),
    };
    let mut features = client.list_features(rect).await?.into_inner();
    let mut count = 0;
    while let Some(feature) = features.next().await {
        feature?;
        count += 1;
    }
    println!("ListFeatures: {count} features");

    let route = tokio_stream::iter((0..10).map(grid_point)).throttle(Duration::from_millis(10));
    let summary = client.record_route(route).await?.into_inner();
    println!("RecordRoute: {summary:?}");

    let notes = (0..4).map(|i| RouteNote {
        location: Some(grid_point(i % 2)),
        message: format!("note {i}"),
    });
    let mut replies = client
        .route_chat(tokio_stream::iter(notes))
        .await?
        .into_inner();
    while let Some(note) = replies.next().await {
        println!("RouteChat: got {:?}", note?.message);
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if let Some(target) = &cli.client.target {
        let channel = netless_grpc::Channel::target(target)?;
        eprintln!("calling {}", channel.location());
        return tour(RouteGuideClient::new(channel)).await;
    }
    match cli.client.transport {
        Transport::Netless | Transport::Both => {
            let channel = netless_grpc::Channel::connect("routeguide.RouteGuide")?;
            tour(RouteGuideClient::new(channel)).await
        }
        Transport::Tcp => {
            let channel = tonic::transport::Endpoint::from_shared(cli.client.addr)?
                .connect()
                .await?;
            tour(RouteGuideClient::new(channel)).await
        }
    }
}
