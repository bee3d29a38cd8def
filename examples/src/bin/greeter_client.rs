//! Calls `helloworld.Greeter/SayHello` with the same client code over TCP or over netless:
//! `cargo run -p netless-examples --bin greeter_client -- --transport netless --name you`,
//! or wherever a target says: `--target helloworld.Greeter` (a table in `NETLESS_TARGETS`
//! may send that name elsewhere), `--target http://127.0.0.1:50051`.

use clap::Parser;
use netless_examples::helloworld::greeter_client::GreeterClient;
use netless_examples::helloworld::HelloRequest;
use netless_examples::serve::{ClientArgs, Transport};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    client: ClientArgs,
    /// Who to greet.
    #[arg(long, default_value = "world")]
    name: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let request = HelloRequest { name: cli.name };
    // The only line that differs between the transports is the channel.
    let reply = match (cli.client.target, cli.client.transport) {
        (Some(target), _) => {
            let channel = netless_grpc::Channel::target(&target)?;
            eprintln!("calling {}", channel.location());
            GreeterClient::new(channel).say_hello(request).await?
        }
        (None, Transport::Netless | Transport::Both) => {
            let channel = netless_grpc::Channel::connect("helloworld.Greeter")?;
            GreeterClient::new(channel).say_hello(request).await?
        }
        (None, Transport::Tcp) => {
            let channel = tonic::transport::Endpoint::from_shared(cli.client.addr)?
                .connect()
                .await?;
            GreeterClient::new(channel).say_hello(request).await?
        }
    };
    println!("{}", reply.into_inner().message);
    Ok(())
}
