//! The smallest netless client: calls `Echo` on `example.Echo` (or the service named by
//! argv[1]) with metadata and a deadline, prints the reply, then shows a failed call's Status.
//!
//! ```text
//! cargo run -p netless --example echo_server           # terminal 1
//! cargo run -p netless --example echo_client           # terminal 2
//! ```

use std::time::Duration;

use netless::{CallOptions, Client, Code, Status};

fn main() -> Result<(), Status> {
    let service = std::env::args().nth(1);
    // UNAVAILABLE here means no server serves the name: start echo_server first.
    let client = Client::connect(service.as_deref().unwrap_or("example.Echo"))?;
    let options = CallOptions::new()
        .timeout(Duration::from_secs(1))
        .metadata("x-request-id", "42");
    let reply = client.call("Echo", b"hello, netless", &options)?;
    let id = reply.metadata.get("x-request-id").unwrap_or_default();
    println!("reply: {}", String::from_utf8_lossy(&reply.payload));
    println!("x-request-id: {}", String::from_utf8_lossy(id));

    // A failed call is a Status: branch on its gRPC code, print it for humans.
    match client.call("Shout", b"hello", &options) {
        Ok(reply) => println!("unexpected reply: {:?}", reply.payload),
        Err(status) if status.code() == Code::Unimplemented => println!("expected: {status}"),
        Err(status) if status.code() == Code::DeadlineExceeded => println!("too slow: {status}"),
        Err(status) => return Err(status),
    }
    Ok(())
}
