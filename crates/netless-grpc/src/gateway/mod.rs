//! The gateway: the infrastructure process of the split architecture. It terminates gRPC
//! over HTTP/2 (and TLS) from the network and forwards each call by its path,
//! `/pkg.Service/Method` → netless service `pkg.Service`, as raw bytes: no `.proto`, no
//! decoding. Streams, metadata, trailers and deadlines pass through as they are, because the
//! forwarding is the netless [`Channel`] itself.
//!
//! ```no_run
//! # async fn run() -> std::io::Result<()> {
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:50051").await?;
//! let gateway = netless_grpc::Gateway::new(netless::ClientConfig::default());
//! gateway.serve(listener, None, std::future::pending()).await
//! # }
//! ```

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use http::HeaderValue;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use netless::{ClientConfig, Code, Status};
use tokio::net::TcpListener;
use tokio_rustls::rustls;
use tokio_rustls::TlsAcceptor;
use tower_service::Service;

use crate::channel::status_response;
use crate::Channel;
use coalesce::{coalesce, Coalesced};

mod coalesce;

/// Forwards gRPC calls from HTTP/2 to netless services. Cheap to clone.
#[derive(Clone)]
pub struct Gateway {
    inner: Arc<Inner>,
}

struct Inner {
    config: ClientConfig,
    /// One connection per backend service, made on its first call.
    channels: Mutex<HashMap<String, Channel>>,
    calls: AtomicU64,
    refused: AtomicU64,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("calls", &self.inner.calls.load(Ordering::Relaxed))
            .finish()
    }
}

impl Gateway {
    /// A gateway that reaches backends with `config` (socket directory, wait policy).
    pub fn new(config: ClientConfig) -> Gateway {
        Gateway {
            inner: Arc::new(Inner {
                config,
                channels: Mutex::default(),
                calls: AtomicU64::new(0),
                refused: AtomicU64::new(0),
            }),
        }
    }

    /// Calls forwarded so far, and how many of them were refused before reaching a backend
    /// (unknown service, no backend).
    pub fn counts(&self) -> (u64, u64) {
        (
            self.inner.calls.load(Ordering::Relaxed),
            self.inner.refused.load(Ordering::Relaxed),
        )
    }

    /// Accepts connections on `listener` (TLS-wrapped if `tls` is given) until `shutdown`
    /// completes, serving each on its own task.
    pub async fn serve(
        self,
        listener: TcpListener,
        tls: Option<TlsAcceptor>,
        shutdown: impl Future<Output = ()>,
    ) -> std::io::Result<()> {
        tokio::pin!(shutdown);
        loop {
            let (socket, peer) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    // Out of fds and the like: keep serving the connections we have.
                    Err(e) => {
                        tracing::warn!("gateway accept: {e}");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                },
                () = &mut shutdown => return Ok(()),
            };
            let _ = socket.set_nodelay(true);
            let gateway = self.clone();
            let tls = tls.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request| {
                    let gateway = gateway.clone();
                    async move { Ok::<_, Infallible>(gateway.forward(request).await) }
                });
                let http2 = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
                // Each poll's frames leave in one write (see `coalesce`).
                let served = match tls {
                    None => {
                        let (io, handle) = coalesce(socket);
                        Coalesced::new(http2.serve_connection(TokioIo::new(io), service), handle)
                            .await
                    }
                    Some(tls) => match tls.accept(socket).await {
                        Ok(stream) => {
                            let (io, handle) = coalesce(stream);
                            let connection = http2.serve_connection(TokioIo::new(io), service);
                            Coalesced::new(connection, handle).await
                        }
                        Err(e) => {
                            tracing::debug!("TLS handshake with {peer} failed: {e}");
                            return;
                        }
                    },
                };
                if let Err(e) = served {
                    tracing::debug!("connection from {peer}: {e}");
                }
            });
        }
    }

    /// Forwards one call to the netless service its path names.
    pub async fn forward(
        &self,
        request: http::Request<Incoming>,
    ) -> http::Response<tonic::body::Body> {
        self.inner.calls.fetch_add(1, Ordering::Relaxed);
        let service = match service_of(request.uri().path()) {
            Some(service) => service.to_string(),
            None => {
                self.inner.refused.fetch_add(1, Ordering::Relaxed);
                return status_response(&Status::new(
                    Code::Unimplemented,
                    format!(
                        "`{}` is not a gRPC method path (/package.Service/Method)",
                        request.uri().path()
                    ),
                ));
            }
        };
        let mut channel = match self.channel(&service) {
            Ok(channel) => channel,
            Err(status) => {
                self.inner.refused.fetch_add(1, Ordering::Relaxed);
                return status_response(&status);
            }
        };
        let (parts, body) = request.into_parts();
        let request = http::Request::from_parts(parts, tonic::body::Body::new(body));
        let Ok(response) = channel.call(request).await;
        if response.headers().get("grpc-status") == Some(&HeaderValue::from_static("14")) {
            // The backend is gone: reconnect on the next call (it may have restarted).
            self.forget(&service);
        }
        response
    }

    /// The channel to `service`, connecting on first use.
    fn channel(&self, service: &str) -> Result<Channel, Status> {
        let mut channels = self
            .inner
            .channels
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(channel) = channels.get(service) {
            return Ok(channel.clone());
        }
        let socket = self.inner.config.socket_path(service)?;
        if !socket.exists() {
            return Err(Status::new(
                Code::Unimplemented,
                format!(
                    "unknown service `{service}`: no netless service of that name at {}",
                    socket.display()
                ),
            ));
        }
        let channel = Channel::connect_with(service, self.inner.config.clone())?;
        channels.insert(service.to_string(), channel.clone());
        Ok(channel)
    }

    fn forget(&self, service: &str) {
        self.inner
            .channels
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(service);
    }
}

/// `pkg.Service` of `/pkg.Service/Method`.
fn service_of(path: &str) -> Option<&str> {
    let (service, method) = path.strip_prefix('/')?.split_once('/')?;
    (!service.is_empty() && !method.is_empty() && !method.contains('/')).then_some(service)
}

/// A TLS acceptor (HTTP/2 by ALPN) from a PEM certificate chain and a PEM private key.
pub fn tls_acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("reading the certificate chain {}: {e}", cert.display()))?;
    if certs.is_empty() {
        return Err(format!("no certificate in {}", cert.display()));
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| format!("reading the private key {}: {e}", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("TLS certificate and key: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

#[cfg(test)]
mod tests {
    use super::service_of;

    #[test]
    fn paths_name_their_service() {
        assert_eq!(
            service_of("/helloworld.Greeter/SayHello"),
            Some("helloworld.Greeter")
        );
        assert_eq!(service_of("/x/"), None);
        assert_eq!(service_of("//M"), None);
        assert_eq!(service_of("/a/b/c"), None);
        assert_eq!(service_of("nope"), None);
    }
}
