//! gRPC's interop test cases against `grpc.testing.TestService`, over netless (by default)
//! or TCP: `cargo run -p netless-examples --bin interop_client -- --test_case all`.
//! Prints `PASS case` or `FAIL case: why` a line, and fails if any case failed.

use clap::Parser;
use netless_examples::interop::client::{run, Transport as ClientTransport, CASES};
use netless_examples::serve::{ClientArgs, Transport};

#[derive(Parser)]
struct Cli {
    /// A case of the interop test descriptions (`empty_unary`, `large_unary`, ...), a
    /// comma-separated list of them, or `all`.
    #[arg(long = "test_case", default_value = "all")]
    test_case: String,
    #[command(flatten)]
    client: ClientArgs,
}

async fn run_all<T: ClientTransport + Clone>(cases: &[&str], channel: T) -> usize {
    let mut failed = 0;
    for case in cases {
        match run(case, channel.clone()).await {
            Ok(()) => println!("PASS {case}"),
            Err(e) => {
                println!("FAIL {case}: {e:#}");
                failed += 1;
            }
        }
    }
    failed
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let cases: Vec<&str> = match cli.test_case.as_str() {
        "all" => CASES.to_vec(),
        list => list.split(',').collect(),
    };
    let failed = if let Some(target) = &cli.client.target {
        run_all(&cases, netless_grpc::Channel::target(target)?).await
    } else if cli.client.transport == Transport::Tcp {
        let endpoint = tonic::transport::Endpoint::from_shared(cli.client.addr)?;
        run_all(&cases, endpoint.connect().await?).await
    } else {
        run_all(
            &cases,
            netless_grpc::Channel::connect("grpc.testing.TestService")?,
        )
        .await
    };
    println!("{} passed, {failed} failed", cases.len() - failed);
    anyhow::ensure!(failed == 0, "{failed} of {} cases failed", cases.len());
    Ok(())
}
