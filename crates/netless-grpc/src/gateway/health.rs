//! `grpc.health.v1.Health`, answered by the gateway: `""` (the gateway itself) and its own
//! services are `SERVING` while it serves; a service the allow-list lets in is `SERVING`
//! when the gateway has, or can make, a netless connection to its server (the link a call
//! would use), else `NOT_SERVING`. Any other name is unknown (`Check`: `NOT_FOUND`;
//! `Watch`: `SERVICE_UNKNOWN`), exactly as a service that does not exist, so the answer
//! tells nothing of what runs behind the allow-list; a name a pattern (`pkg.*`, `*`)
//! matches and no server serves is unknown too, and one named exactly is `NOT_SERVING`.
//!
//! `Watch` sends the status, then each change, looking every [`WATCH_INTERVAL`], until the
//! client cancels or the call's deadline (the gateway's `default_timeout`/`max_timeout`
//! apply, as to any call) passes: it ends then with `DEADLINE_EXCEEDED`.

use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_server::Health;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

use super::backends::NoLink;
use super::own::is_own;
use super::Gateway;

/// How often a `Watch` looks at its service's status.
pub(crate) const WATCH_INTERVAL: Duration = Duration::from_secs(1);

/// The status of `service` as `Check` tells it; `None`: unknown.
pub(super) async fn serving_status(gateway: &Gateway, service: &str) -> Option<ServingStatus> {
    let inner = &*gateway.inner;
    if service.is_empty() || is_own(service) {
        return Some(ServingStatus::Serving);
    }
    // A name no netless service can have is unknown before anything keeps it: the name
    // comes in the message body (megabytes allowed), not in a header-sized path.
    if !plausible(service) || !inner.allow.allows(service) {
        return None;
    }
    let deadline = Instant::now() + inner.limits.backend_connect_timeout;
    let link = inner
        .backends
        .get(service)
        .link(inner.backends.spec(), Some(deadline))
        .await;
    match link {
        Ok(_) | Err(NoLink::Busy) => Some(ServingStatus::Serving),
        Err(NoLink::Unknown) if !inner.allow.names(service) => None,
        Err(_) => Some(ServingStatus::NotServing),
    }
}

/// Whether `service` could name a netless service: at most 100 bytes of `A-Z a-z 0-9 . _
/// -`, not starting with `.` (the socket directory's rules).
fn plausible(service: &str) -> bool {
    service.len() <= 100
        && !service.starts_with('.')
        && service
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// The health service of one call.
pub(super) struct GatewayHealth {
    gateway: Gateway,
    deadline: Option<Instant>,
}

impl GatewayHealth {
    pub(super) fn new(gateway: Gateway, deadline: Option<Instant>) -> GatewayHealth {
        GatewayHealth { gateway, deadline }
    }
}

fn response(status: ServingStatus) -> HealthCheckResponse {
    HealthCheckResponse {
        status: status.into(),
    }
}

#[tonic::async_trait]
impl Health for GatewayHealth {
    async fn check(
        &self,
        request: tonic::Request<HealthCheckRequest>,
    ) -> Result<tonic::Response<HealthCheckResponse>, tonic::Status> {
        let service = &request.get_ref().service;
        match serving_status(&self.gateway, service).await {
            Some(status) => Ok(tonic::Response::new(response(status))),
            None => Err(tonic::Status::not_found("unknown service")),
        }
    }

    type WatchStream = ReceiverStream<Result<HealthCheckResponse, tonic::Status>>;

    async fn watch(
        &self,
        request: tonic::Request<HealthCheckRequest>,
    ) -> Result<tonic::Response<Self::WatchStream>, tonic::Status> {
        let mut service = request.into_inner().service;
        if !service.is_empty() && !plausible(&service) {
            // Unknown for as long as the watch lasts: keep a short stand-in, not the name.
            service = ".".to_string();
        }
        let gateway = self.gateway.clone();
        let deadline = self.deadline;
        let (tx, rx) = mpsc::channel(1);
        tokio::spawn(async move {
            let ends = async {
                match deadline {
                    Some(deadline) => tokio::time::sleep_until(deadline.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::pin!(ends);
            let mut told = None;
            loop {
                let status = serving_status(&gateway, &service)
                    .await
                    .unwrap_or(ServingStatus::ServiceUnknown);
                if told != Some(status) {
                    if tx.send(Ok(response(status))).await.is_err() {
                        return;
                    }
                    told = Some(status);
                }
                tokio::select! {
                    () = tx.closed() => return,
                    () = &mut ends => {
                        let passed = tonic::Status::deadline_exceeded("the call's deadline passed");
                        let _ = tx.send(Err(passed)).await;
                        return;
                    }
                    () = tokio::time::sleep(WATCH_INTERVAL) => {}
                }
            }
        });
        Ok(tonic::Response::new(ReceiverStream::new(rx)))
    }
}

#[cfg(test)]
mod tests {
    use super::plausible;

    #[test]
    fn only_names_a_netless_service_can_have_are_plausible() {
        assert!(plausible("helloworld.Greeter"));
        assert!(plausible("shop-v2.Orders_1"));
        assert!(plausible(&"a".repeat(100)));
        for name in [".hidden", "a/b", "a b", "é"] {
            assert!(!plausible(name), "{name}");
        }
        assert!(!plausible(&format!("shop.{}", "x".repeat(4 << 20))));
    }
}
