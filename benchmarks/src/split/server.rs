//! The two servers `split_offload` compares, as peer roles: the whole echo service in one
//! tonic process (`split-baseline`), and its business logic alone on netless behind the
//! gateway (`split-logic`). The logic is a busy loop of the request's `x-work-ns`
//! nanoseconds; neither server measures anything.

use std::time::{Duration, Instant};

use tonic::{Request, Response, Status};

use super::SERVICE;
use crate::harness::peer;
use crate::proto::{Echo, EchoReply, EchoRequest, EchoServer};

/// Echo whose business logic spins for `x-work-ns` nanoseconds.
#[derive(Clone, Copy, Debug, Default)]
struct WorkEcho;

#[tonic::async_trait]
impl Echo for WorkEcho {
    async fn echo(&self, request: Request<EchoRequest>) -> Result<Response<EchoReply>, Status> {
        let work_ns: u64 = request
            .metadata()
            .get("x-work-ns")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(0);
        let until = Instant::now() + Duration::from_nanos(work_ns);
        while Instant::now() < until {
            std::hint::spin_loop();
        }
        Ok(Response::new(EchoReply {
            payload: request.into_inner().payload,
        }))
    }
}

/// The `split-baseline` peer role: the whole service in one tonic process, on the one core
/// the business logic gets in the split setup.
pub(super) fn serve_baseline(pin_cpu: Option<usize>) -> anyhow::Result<()> {
    if let Some(cpu) = pin_cpu {
        netless_shm::pin_current_thread(cpu)?;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        peer::listening(listener.local_addr()?)?;
        let stdin_closed = tokio::task::spawn_blocking(peer::until_stdin_closes);
        tonic::transport::Server::builder()
            .add_service(
                EchoServer::new(WorkEcho)
                    .max_decoding_message_size(usize::MAX)
                    .max_encoding_message_size(usize::MAX),
            )
            .serve_with_incoming_shutdown(
                tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
                async {
                    let _ = stdin_closed.await;
                },
            )
            .await?;
        Ok(())
    })
}

/// The `split-logic` peer role: the business logic behind the gateway, on netless.
pub(super) fn serve_logic(pin_cpu: Option<usize>) -> anyhow::Result<()> {
    if let Some(cpu) = pin_cpu {
        netless_shm::pin_current_thread(cpu)?;
    }
    // 32 calls of 48 KiB in flight need more than the default 1 MiB receive buffer (with
    // less, the excess is refused with RESOURCE_EXHAUSTED, by design).
    let config = netless::ServerConfig {
        buffer_bytes: Some(8 << 20),
        ..Default::default()
    };
    let _serving = netless_grpc::GrpcServer::new()
        .config(config)
        .runtime_threads(1)
        .add_service(
            EchoServer::new(WorkEcho)
                .max_decoding_message_size(usize::MAX)
                .max_encoding_message_size(usize::MAX),
        )
        .serve()?;
    peer::listening(SERVICE)?;
    peer::until_stdin_closes();
    Ok(())
}
