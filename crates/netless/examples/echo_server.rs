//! The smallest netless server: serves `example.Echo` (or the service named by argv[1]),
//! answers method `Echo` with the request's payload and metadata, and stops on Ctrl-C.
//!
//! ```text
//! cargo run -p netless --example echo_server           # terminal 1
//! cargo run -p netless --example echo_client           # terminal 2
//! ```

use netless::{Request, ResponseBuilder, Server, ServerConfig, Status};

fn echo(request: &Request<'_>, response: &mut ResponseBuilder) -> Result<(), Status> {
    if request.method != "Echo" {
        let message = format!("no method `{}`", request.method);
        return Err(Status::unimplemented(message));
    }
    for (key, value) in request.metadata.iter() {
        response.metadata.insert(key, value);
    }
    response.payload.extend_from_slice(request.payload);
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let service = std::env::args().nth(1);
    let service = service.as_deref().unwrap_or("example.Echo");
    let server = Server::bind(service, ServerConfig::default(), echo)?;
    println!("serving `{service}` at {}", server.socket_path().display());
    // Wait for Ctrl-C (tokio is a dev-dependency already); dropping the server then closes
    // every connection (their calls fail with UNAVAILABLE) and removes the socket.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(tokio::signal::ctrl_c())?;
    drop(server);
    Ok(())
}
