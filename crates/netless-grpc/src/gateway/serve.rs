//! The gateway's listener and its connections: accepting (at most `max_connections` at
//! once; the next are closed at once), the TLS handshake (with a deadline), HTTP/2 with its
//! limits (concurrent streams, keepalive pings), and closing a connection that has had no
//! authenticated call for the idle timeout, or too many calls in a row without the token.
//! Each call goes to [`Gateway::forward`]; this module never looks inside one.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_rustls::TlsAcceptor;

use super::admission::RemoteConnection;
use super::coalesce::{coalesce, Coalesced};
use super::Gateway;

/// HTTP/2 PINGs on a connection quiet for this long, so a peer that vanished is noticed
/// even while it has streams open.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// A PING unanswered this long closes the connection.
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);
/// After GOAWAY to an idle connection, how long its peer has to close it.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

impl Gateway {
    /// Accepts connections on `listener` (TLS-wrapped if `tls` is given) until `shutdown`
    /// completes, serving each on its own task within the gateway's limits.
    pub async fn serve(
        self,
        listener: TcpListener,
        tls: Option<TlsAcceptor>,
        shutdown: impl Future<Output = ()>,
    ) -> std::io::Result<()> {
        let slots = Arc::new(Semaphore::new(self.inner.limits.max_connections));
        let mut warned: Option<Instant> = None;
        tokio::pin!(shutdown);
        loop {
            let (socket, peer) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    // Out of fds and the like: keep serving the connections we have.
                    Err(e) => {
                        tracing::warn!("gateway accept: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                () = &mut shutdown => return Ok(()),
            };
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                // Closed at once: the client sees its connection reset, not a hang.
                drop(socket);
                self.inner
                    .refused_connections
                    .fetch_add(1, Ordering::Relaxed);
                if warned.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                    warned = Some(Instant::now());
                    tracing::warn!(
                        "gateway: {} connections already; closing new ones",
                        self.inner.limits.max_connections
                    );
                }
                continue;
            };
            let _ = socket.set_nodelay(true);
            tokio::spawn(self.clone().connection(socket, peer, tls.clone(), slot));
        }
    }

    /// Serves one accepted connection; `_slot` is its place under `max_connections`.
    async fn connection(
        self,
        socket: TcpStream,
        peer: SocketAddr,
        tls: Option<TlsAcceptor>,
        _slot: OwnedSemaphorePermit,
    ) {
        let limits = &self.inner.limits;
        let remote = RemoteConnection::new(limits.max_calls_per_connection);
        let served = match tls {
            None => self.http2(socket, remote).await,
            Some(tls) => {
                match tokio::time::timeout(limits.tls_handshake_timeout, tls.accept(socket)).await {
                    Ok(Ok(stream)) => self.http2(stream, remote).await,
                    Ok(Err(e)) => {
                        tracing::debug!("TLS handshake with {peer} failed: {e}");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!("TLS handshake with {peer} timed out");
                        return;
                    }
                }
            }
        };
        if let Err(e) = served {
            tracing::debug!("connection from {peer}: {e}");
        }
    }

    /// Runs HTTP/2 on `io` until the peer closes, or the connection has been idle for the
    /// idle timeout or failed authentication too often (then GOAWAY, and a moment for the
    /// calls under way to end and the peer to close).
    async fn http2<T>(&self, io: T, remote: Arc<RemoteConnection>) -> Result<(), hyper::Error>
    where
        T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let limits = &self.inner.limits;
        let gateway = self.clone();
        let calls = remote.clone();
        let service = hyper::service::service_fn(move |request| {
            let gateway = gateway.clone();
            let remote = calls.clone();
            async move { Ok::<_, Infallible>(gateway.forward(request, &remote).await) }
        });
        let mut http2 = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
        http2
            .timer(TokioTimer::new())
            .max_concurrent_streams(limits.max_streams)
            .keep_alive_interval(KEEPALIVE_INTERVAL)
            .keep_alive_timeout(KEEPALIVE_TIMEOUT);
        // Each poll's frames leave in one write (see `coalesce`).
        let (io, handle) = coalesce(io);
        let mut connection =
            Coalesced::new(http2.serve_connection(TokioIo::new(io), service), handle);
        tokio::select! {
            served = &mut connection => return served,
            () = remote.idle(limits.idle_timeout) => {}
            () = remote.closing() => {}
        }
        connection.inner().graceful_shutdown();
        tokio::time::timeout(CLOSE_GRACE, connection)
            .await
            .unwrap_or(Ok(()))
    }
}
