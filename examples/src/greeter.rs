//! `helloworld.Greeter`: answers `SayHello` with a greeting.
//!
//! Beyond the canonical example, a few names exercise the parts of gRPC a transport must
//! carry: `nobody` fails with `NOT_FOUND`, `slow` takes 1.5 s (for deadlines), and an `x-id`
//! request header comes back as a response header.

use std::time::Duration;

use tonic::{Request, Response, Status};

use crate::helloworld::greeter_server::Greeter;
use crate::helloworld::{HelloReply, HelloRequest};

/// The Greeter service.
#[derive(Clone, Copy, Debug, Default)]
pub struct MyGreeter;

#[tonic::async_trait]
impl Greeter for MyGreeter {
    async fn say_hello(
        &self,
        request: Request<HelloRequest>,
    ) -> Result<Response<HelloReply>, Status> {
        let id = request.metadata().get("x-id").cloned();
        let name = request.into_inner().name;
        match name.as_str() {
            "nobody" => return Err(Status::not_found("no such person: nobody")),
            "slow" => tokio::time::sleep(Duration::from_millis(1500)).await,
            _ => {}
        }
        let mut response = Response::new(HelloReply {
            message: format!("Hello {name}!"),
        });
        if let Some(id) = id {
            response.metadata_mut().insert("x-id", id);
        }
        Ok(response)
    }
}
