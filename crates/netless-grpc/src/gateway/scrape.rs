//! The gateway's `/metrics`: a plain HTTP/1.1 listener of its own (hyper), apart from the
//! gRPC port, answering `GET /metrics` with the Prometheus text format (see `metrics` and
//! [`crate::prometheus`]). One request per connection, [`MAX_SCRAPERS`] connections at
//! once, [`SCRAPE_TIMEOUT`] each: a scraper cannot hold it, nor the gateway's calls.
//!
//! What it shows: the gateway's own calls and connections (`metrics`), and the counters
//! of the netless servers it forwards to, read from the shared memory of its connections
//! to them (`netless_server_*`, labelled `netless_service`), as `netless stat` reads them.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Response, StatusCode};
use http_body_util::Full;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use super::Gateway;
use crate::prometheus::{write_replicas, Exposition, Replica, CONTENT_TYPE};

/// Scrape connections served at once; more are closed as soon as they are accepted.
const MAX_SCRAPERS: usize = 16;
/// The longest a scrape connection is served.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(10);

impl Gateway {
    /// The gateway's metrics in the Prometheus text format, as `/metrics` serves them.
    ///
    /// ```
    /// let gateway = netless_grpc::Gateway::new(netless::ClientConfig::default());
    /// assert!(gateway.metrics_text().contains("# TYPE grpc_server_call_started_total counter"));
    /// ```
    pub fn metrics_text(&self) -> String {
        let inner = &*self.inner;
        let mut out = Exposition::new();
        inner.metrics.write(&mut out, self.refused_connections());
        let backends = inner.backends.replica_stats();
        let replicas: Vec<Replica<'_>> = backends
            .iter()
            .map(|(service, stats)| Replica {
                labels: vec![("netless_service", service.as_str())],
                stats,
                own_connections: 0,
            })
            .collect();
        write_replicas(&mut out, &replicas, false);
        out.finish()
    }

    /// Serves `GET /metrics` (plain HTTP/1.1) on `listener` until `shutdown` completes.
    pub async fn serve_metrics(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()>,
    ) -> std::io::Result<()> {
        serve(self, listener, shutdown).await
    }
}

/// [`Gateway::serve_metrics`].
async fn serve(
    gateway: Gateway,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let slots = Arc::new(Semaphore::new(MAX_SCRAPERS));
    tokio::pin!(shutdown);
    loop {
        let socket = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((socket, _)) => socket,
                Err(e) => {
                    tracing::warn!("metrics accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => return Ok(()),
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            continue;
        };
        let gateway = gateway.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let gateway = gateway.clone();
                async move { Ok::<_, Infallible>(scrape(&gateway, &request)) }
            });
            let mut http1 = hyper::server::conn::http1::Builder::new();
            http1
                .timer(TokioTimer::new())
                .keep_alive(false)
                .header_read_timeout(SCRAPE_TIMEOUT);
            let served = http1.serve_connection(TokioIo::new(socket), service);
            let _ = tokio::time::timeout(SCRAPE_TIMEOUT, served).await;
            drop(slot);
        });
    }
}

/// The answer to one request of the metrics listener.
fn scrape<B>(gateway: &Gateway, request: &http::Request<B>) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, body: String| {
        let mut response = Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        response
    };
    if request.uri().path() != "/metrics" {
        return reply(StatusCode::NOT_FOUND, "see /metrics\n".into());
    }
    if !matches!(*request.method(), Method::GET | Method::HEAD) {
        return reply(StatusCode::METHOD_NOT_ALLOWED, "GET /metrics\n".into());
    }
    let mut response = reply(StatusCode::OK, gateway.metrics_text());
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(CONTENT_TYPE),
    );
    response
}
