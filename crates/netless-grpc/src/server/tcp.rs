//! The TCP side of a [`GrpcServer`](super::GrpcServer): the same tonic services served over
//! HTTP/2 by tonic's own server, on the server's tokio runtime, for callers that are not on
//! netless.
//!
//! This module owns the listener's life: bound before anything serves, shut down with the
//! netless side. It never touches the netless servers.

use std::net::SocketAddr;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use netless::Status;
use tonic::service::Routes;
use tonic::transport::server::TcpIncoming;
use tonic::transport::ServerTlsConfig;

/// Where to listen: an address to bind, or a listener the caller bound.
#[derive(Debug)]
pub(super) enum Listen {
    Addr(SocketAddr),
    Listener(std::net::TcpListener),
}

impl Listen {
    /// The bound listener (binding now, so a taken port fails `serve` itself).
    pub(super) fn bind(self) -> Result<std::net::TcpListener, Status> {
        let listener = match self {
            Listen::Addr(addr) => std::net::TcpListener::bind(addr)
                .map_err(|e| Status::unavailable(format!("cannot listen on {addr}: {e}")))?,
            Listen::Listener(listener) => listener,
        };
        listener
            .set_nonblocking(true)
            .map_err(|e| Status::unavailable(format!("cannot use the TCP listener: {e}")))?;
        Ok(listener)
    }
}

/// Serving on TCP; shut down by [`TcpServing::shutdown`] or when the runtime stops.
#[derive(Debug)]
pub(super) struct TcpServing {
    addr: SocketAddr,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    finished: Arc<Finished>,
}

/// Set when the serving task ends, however it ends (even dropped with the runtime).
#[derive(Debug, Default)]
struct Finished {
    done: Mutex<bool>,
    changed: Condvar,
}

struct SetOnDrop(Arc<Finished>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        *self.0.done.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.0.changed.notify_all();
    }
}

impl TcpServing {
    /// Serves `routes` on `listener` from a task of `runtime`.
    pub(super) fn start(
        runtime: &tokio::runtime::Runtime,
        listener: std::net::TcpListener,
        routes: Routes,
        tls: Option<ServerTlsConfig>,
    ) -> Result<TcpServing, Status> {
        let addr = listener
            .local_addr()
            .map_err(|e| Status::unavailable(format!("the TCP listener has no address: {e}")))?;
        let listener = {
            // `from_std` registers the socket with the reactor of the runtime it runs in.
            let _context = runtime.enter();
            tokio::net::TcpListener::from_std(listener)
                .map_err(|e| Status::unavailable(format!("cannot use the TCP listener: {e}")))?
        };
        let mut server = tonic::transport::Server::builder();
        if let Some(tls) = tls {
            server = server.tls_config(tls).map_err(|e| {
                Status::invalid_argument(format!("the TLS configuration is not usable: {e}"))
            })?;
        }
        let router = server.add_routes(routes);
        let (shutdown, stop) = tokio::sync::oneshot::channel::<()>();
        let finished = Arc::new(Finished::default());
        let on_end = SetOnDrop(finished.clone());
        runtime.spawn(async move {
            let _on_end = on_end;
            let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
            let stopped = async {
                let _ = stop.await;
            };
            if let Err(e) = router.serve_with_incoming_shutdown(incoming, stopped).await {
                tracing::warn!("serving gRPC on {addr} stopped: {e}");
            }
        });
        Ok(TcpServing {
            addr,
            shutdown: Some(shutdown),
            finished,
        })
    }

    /// The address it listens on.
    pub(super) fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting and closes its connections gracefully (GOAWAY), waiting at most
    /// `grace` for the calls under way.
    pub(super) fn shutdown(&mut self, grace: Duration) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        let done = self.finished.done.lock().unwrap_or_else(|e| e.into_inner());
        drop(
            self.finished
                .changed
                .wait_timeout_while(done, grace, |done| !*done),
        );
    }

    /// Blocks until serving ends.
    pub(super) fn wait(&self) {
        let done = self.finished.done.lock().unwrap_or_else(|e| e.into_inner());
        drop(self.finished.changed.wait_while(done, |done| !*done));
    }
}
