//! The services the gateway answers itself and never forwards, whatever the allow-list
//! says: `grpc.health.v1.Health` (`health`) and server reflection, `grpc.reflection.v1`
//! and `v1alpha` (`reflection`), so that `grpc_health_probe`, `grpcurl` and load
//! balancers' health checks work against it. A call to them is authenticated as any other
//! (the bearer token first) and keeps its connection from the idle timeout while it runs,
//! but takes no share of any backend. Neither says anything of a service the allow-list
//! does not let in.

use std::time::Instant;

use hyper::body::Incoming;
use tonic_health::pb::health_server::HealthServer;
use tonic_reflection::pb::v1::server_reflection_server::ServerReflectionServer as V1Server;
use tonic_reflection::pb::v1alpha::server_reflection_server::ServerReflectionServer as V1AlphaServer;
use tower::ServiceExt as _;

use super::health::GatewayHealth;
use super::reflection::{Reflection, V1Alpha};
use super::Gateway;

/// The health service.
pub(crate) const HEALTH: &str = "grpc.health.v1.Health";
/// Server reflection, as grpcurl asks first.
pub(crate) const REFLECTION_V1: &str = "grpc.reflection.v1.ServerReflection";
/// Server reflection, as older clients (grpcio-reflection) ask.
pub(crate) const REFLECTION_V1ALPHA: &str = "grpc.reflection.v1alpha.ServerReflection";

/// The gateway's own services.
pub(crate) const OWN: [&str; 3] = [HEALTH, REFLECTION_V1, REFLECTION_V1ALPHA];

/// Whether `service` is one of the gateway's own.
pub(crate) fn is_own(service: &str) -> bool {
    OWN.contains(&service)
}

/// Whether `method` is a method of own service `service` (the others are labelled `other`
/// in the metrics, and answered `UNIMPLEMENTED`).
pub(crate) fn is_own_method(service: &str, method: &str) -> bool {
    match service {
        HEALTH => matches!(method, "Check" | "Watch"),
        _ => method == "ServerReflectionInfo",
    }
}

/// Answers a call of `gateway` to own service `service` (`is_own`); `deadline` ends a
/// `Watch` or a reflection stream.
pub(super) async fn answer(
    gateway: &Gateway,
    service: &str,
    request: http::Request<Incoming>,
    deadline: Option<Instant>,
) -> http::Response<tonic::body::Body> {
    let answered = match service {
        HEALTH => {
            let health = GatewayHealth::new(gateway.clone(), deadline);
            HealthServer::new(health).oneshot(request).await
        }
        REFLECTION_V1 => {
            V1Server::new(Reflection::new(gateway.clone(), deadline))
                .oneshot(request)
                .await
        }
        _ => {
            let reflection = V1Alpha(Reflection::new(gateway.clone(), deadline));
            V1AlphaServer::new(reflection).oneshot(request).await
        }
    };
    match answered {
        Ok(response) => response,
        Err(never) => match never {},
    }
}
