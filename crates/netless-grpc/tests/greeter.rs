//! The canonical `helloworld.Greeter`, one implementation, served in another process either
//! by plain tonic over TCP or by `GrpcServer` over netless, and called by the same
//! tonic-generated client code through either channel: both must pass the same checks.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use netless_grpc::{Channel, GrpcServer};
use tonic::{Request, Response, Status};

pub mod pb {
    tonic::include_proto!("helloworld");
}
use pb::greeter_client::GreeterClient;
use pb::greeter_server::{Greeter, GreeterServer};
use pb::{HelloReply, HelloRequest};

#[derive(Default)]
struct MyGreeter;

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

/// The checks every transport must pass.
async fn greeter_suite<T>(mut client: GreeterClient<T>, transport: &str)
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

    // Still healthy after an error and a timeout.
    let reply = client
        .say_hello(HelloRequest {
            name: "again".into(),
        })
        .await
        .unwrap();
    assert_eq!(reply.get_ref().message, "Hello again!", "{transport}");
}

/// Entry point of the spawned server processes (run only by them, via `--ignored`).
#[test]
#[ignore = "entry point of the server processes the other test spawns"]
fn child_process_entry() {
    let Ok(role) = std::env::var("NETLESS_GRPC_TEST_ROLE") else {
        return;
    };
    let dir = std::env::var("NETLESS_DIR").unwrap();
    match role.as_str() {
        "netless" => {
            let config = netless::ServerConfig {
                workers: 2,
                dir: Some(dir.into()),
                ..Default::default()
            };
            let _servers = GrpcServer::new()
                .config(config)
                .add_service(GreeterServer::new(MyGreeter))
                .serve()
                .unwrap();
            println!("\nLISTENING netless");
            std::io::stdout().flush().unwrap();
            let _ = std::io::stdin().read_to_end(&mut Vec::new());
        }
        _ => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                println!("\nLISTENING {}", listener.local_addr().unwrap());
                std::io::stdout().flush().unwrap();
                let incoming = tonic::transport::server::TcpIncoming::from(listener);
                let stdin_closed = tokio::task::spawn_blocking(|| {
                    let _ = std::io::stdin().read_to_end(&mut Vec::new());
                });
                tonic::transport::Server::builder()
                    .add_service(GreeterServer::new(MyGreeter))
                    .serve_with_incoming_shutdown(incoming, async {
                        let _ = stdin_closed.await;
                    })
                    .await
                    .unwrap();
            });
        }
    }
}

struct ServerProcess {
    child: Child,
    address: String,
    dir: std::path::PathBuf,
}

impl ServerProcess {
    fn start(role: &str) -> ServerProcess {
        let dir =
            std::env::temp_dir().join(format!("netless-grpc-test-{}-{role}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "child_process_entry",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("NETLESS_GRPC_TEST_ROLE", role)
            .env("NETLESS_DIR", &dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        let address = loop {
            line.clear();
            assert!(
                out.read_line(&mut line).unwrap() > 0,
                "server exited before listening"
            );
            if let Some(rest) = line.trim().strip_prefix("LISTENING ") {
                break rest.to_string();
            }
        };
        std::mem::forget(out);
        ServerProcess {
            child,
            address,
            dir,
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        for _ in 0..200 {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn greeter_passes_the_same_suite_on_tcp_and_on_netless() {
    let tcp = ServerProcess::start("tcp");
    let shm = ServerProcess::start("netless");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", tcp.address))
            .unwrap()
            .connect()
            .await
            .unwrap();
        greeter_suite(GreeterClient::new(channel), "tcp").await;

        let config = netless::ClientConfig {
            dir: Some(shm.dir.clone()),
            ..Default::default()
        };
        let channel = Channel::connect_with("helloworld.Greeter", config).unwrap();
        greeter_suite(GreeterClient::new(channel), "netless").await;
    });
}
