//! The gateway's listener and its connections: accepting (at most `max_connections` at
//! once, and `max_connections_per_peer` from one peer; the next are closed at once), the
//! TLS handshake (with a deadline), HTTP/2 with its
//! limits (concurrent streams, keepalive pings), and closing a connection that has had no
//! authenticated call for the idle timeout, or too many calls in a row without the token.
//! Each call goes to [`Gateway::forward`]; this module never looks inside one.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
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
        let limits = &self.inner.limits;
        let slots = Arc::new(Semaphore::new(limits.max_connections));
        let peers = Arc::new(Peers::new(limits.max_connections_per_peer));
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
            let place = Peers::take(&peers, peer.ip());
            let slot = slots.clone().try_acquire_owned().ok();
            let (Some(place), Some(slot)) = (place, slot) else {
                // Closed at once: the client sees its connection reset, not a hang.
                drop(socket);
                self.inner
                    .refused_connections
                    .fetch_add(1, Ordering::Relaxed);
                if warned.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                    warned = Some(Instant::now());
                    tracing::warn!(
                        "gateway: {} connections already, or {} from {}; closing new ones",
                        limits.max_connections,
                        limits.max_connections_per_peer,
                        peer.ip()
                    );
                }
                continue;
            };
            let _ = socket.set_nodelay(true);
            let held = (slot, place);
            tokio::spawn(self.clone().connection(socket, peer, tls.clone(), held));
        }
    }

    /// Serves one accepted connection; `_held` is its place under `max_connections` and
    /// under its peer's `max_connections_per_peer`.
    async fn connection(
        self,
        socket: TcpStream,
        peer: SocketAddr,
        tls: Option<TlsAcceptor>,
        _held: (OwnedSemaphorePermit, PeerPlace),
    ) {
        let limits = &self.inner.limits;
        let _open = self.inner.metrics.connection();
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

/// Connections served per peer, at most `limit` each.
struct Peers {
    limit: usize,
    counts: Mutex<HashMap<IpAddr, usize>>,
}

impl Peers {
    fn new(limit: usize) -> Peers {
        Peers {
            limit,
            counts: Mutex::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<IpAddr, usize>> {
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A place for a connection from `ip`; `None` if its peer has `limit` already.
    fn take(peers: &Arc<Peers>, ip: IpAddr) -> Option<PeerPlace> {
        let peer = peer_of(ip);
        let mut counts = peers.lock();
        let count = counts.entry(peer).or_insert(0);
        if *count >= peers.limit {
            return None;
        }
        *count += 1;
        Some(PeerPlace {
            peers: peers.clone(),
            peer,
        })
    }
}

/// A connection's place under its peer's limit, given back when dropped.
struct PeerPlace {
    peers: Arc<Peers>,
    peer: IpAddr,
}

impl Drop for PeerPlace {
    fn drop(&mut self) {
        let mut counts = self.peers.lock();
        if let Some(count) = counts.get_mut(&self.peer) {
            *count -= 1;
            if *count == 0 {
                // Peers come and go: the map holds only those with connections.
                counts.remove(&self.peer);
            }
        }
    }
}

/// The peer connections from `ip` are counted under: an IPv4 address (IPv4-mapped IPv6
/// ones included) as it is, an IPv6 address by its /64 network, since a host commonly has
/// a whole /64 to pick addresses from.
fn peer_of(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let network = u128::from(v6) & !((1u128 << 64) - 1);
                IpAddr::V6(Ipv6Addr::from(network))
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_gets_its_limit_and_places_come_back() {
        let peers = Arc::new(Peers::new(2));
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        let first = Peers::take(&peers, a).unwrap();
        let second = Peers::take(&peers, a).unwrap();
        assert!(Peers::take(&peers, a).is_none());
        // The same address mapped into IPv6 is the same peer.
        assert!(Peers::take(&peers, "::ffff:192.0.2.1".parse().unwrap()).is_none());
        let other = Peers::take(&peers, b).unwrap();
        drop(first);
        let again = Peers::take(&peers, a).unwrap();
        drop((second, again, other));
        assert!(peers.lock().is_empty());
    }

    #[test]
    fn ipv6_peers_are_their_64_networks() {
        let one = |text: &str| peer_of(text.parse().unwrap());
        assert_eq!(one("2001:db8:1:2::1"), one("2001:db8:1:2:ffff::9"));
        assert_ne!(one("2001:db8:1:2::1"), one("2001:db8:1:3::1"));
        assert_eq!(one("::ffff:10.0.0.1"), one("10.0.0.1"));
    }
}
