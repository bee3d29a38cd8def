//! One channel type, any location; one server, both transports.
//!
//! ```sh
//! cargo run -p netless-examples --bin any_location
//! ```
//!
//! Starts `helloworld.Greeter` in a process of its own, served on netless and on TCP from
//! one `GrpcServer`, then calls it with the same generated client on the same
//! `netless_grpc::Channel` type three ways: by name (the local service, over netless), by
//! an `http://` target (over HTTP/2), and by name again through a resolver table that maps
//! the name to that address, as `NETLESS_TARGETS` does for a binary left unchanged.

use netless::{ClientConfig, ServerConfig};
use netless_examples::greeter::MyGreeter;
use netless_examples::helloworld::greeter_client::GreeterClient;
use netless_examples::helloworld::greeter_server::GreeterServer;
use netless_examples::helloworld::HelloRequest;
use netless_examples::peer::{self, Peer, RunDir};
use netless_grpc::{Channel, ChannelOptions, GrpcServer, Resolver};

/// Where the server process leaves its TCP address, in the run's directory.
const ADDRESS_FILE: &str = "greeter.tcp";

/// The server: one builder, the service on netless and on a free TCP port.
fn serve(dir: &std::path::Path) -> anyhow::Result<()> {
    let config = ServerConfig {
        dir: Some(dir.to_path_buf()),
        ..Default::default()
    };
    let serving = GrpcServer::new()
        .config(config)
        .add_service(GreeterServer::new(MyGreeter))
        .tcp("127.0.0.1:0".parse()?)
        .serve()?;
    let addr = serving.tcp_addr().expect("a TCP listener");
    std::fs::write(dir.join(ADDRESS_FILE), addr.to_string())?;
    peer::serve_until_released();
    serving.stop();
    Ok(())
}

fn main() -> anyhow::Result<()> {
    if let Some((_, dir)) = peer::role() {
        return serve(&dir);
    }
    let run = RunDir::new("any-location")?;
    let _server = Peer::start("greeter", run.path())?;
    let addr = std::fs::read_to_string(run.path().join(ADDRESS_FILE))?;

    // The run's private socket directory, and no table from the environment.
    let options = ChannelOptions::new()
        .client_config(ClientConfig {
            dir: Some(run.path().to_path_buf()),
            ..Default::default()
        })
        .resolver(Resolver::new());
    let table: Resolver = format!("helloworld.* http://{addr}").parse()?;
    tokio::runtime::Runtime::new()?.block_on(async {
        let channels = [
            (
                "by name",
                Channel::target_with("helloworld.Greeter", &options)?,
            ),
            ("by address", Channel::target(&format!("http://{addr}"))?),
            (
                "by name, through a table",
                Channel::target_with("helloworld.Greeter", &options.clone().resolver(table))?,
            ),
        ];
        for (how, channel) in channels {
            let location = channel.location().to_string();
            let reply = GreeterClient::new(channel)
                .say_hello(HelloRequest { name: how.into() })
                .await?;
            println!("{how:<25} -> {location:<28} {}", reply.into_inner().message);
        }
        Ok(())
    })
}
