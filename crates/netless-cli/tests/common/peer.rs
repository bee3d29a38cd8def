//! A gRPC client on one HTTP/2 connection of its own, from a chosen loopback address, that
//! tells when the server has closed it: for tests that play several clients at the
//! gateway. (tonic's `Channel` reconnects by itself, which hides a closed connection, and
//! connects from one address.)

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use netless_examples::helloworld::greeter_client::GreeterClient;
use netless_examples::helloworld::HelloRequest;
use tokio::net::TcpSocket;
use tokio::task::JoinHandle;
use tonic::body::Body;
use tonic::codegen::http::{self, uri};

/// One HTTP/2 connection to a gateway.
pub(crate) struct PeerConnection {
    calls: Calls,
    /// Runs the connection; finished once it is closed.
    served: JoinHandle<()>,
}

impl PeerConnection {
    /// Connects from `from` (an address of this machine: the whole of 127.0.0.0/8 is) to
    /// `to` and writes the HTTP/2 preface; an error if the connection failed meanwhile.
    pub(crate) async fn open(from: IpAddr, to: SocketAddr) -> std::io::Result<PeerConnection> {
        let socket = TcpSocket::new_v4()?;
        socket.bind(SocketAddr::new(from, 0))?;
        let stream = socket.connect(to).await?;
        stream.set_nodelay(true)?;
        let (sender, connection) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await
                .map_err(std::io::Error::other)?;
        let served = tokio::spawn(async move {
            let _ = connection.await;
        });
        let authority = to.to_string().parse().expect("an address is an authority");
        Ok(PeerConnection {
            calls: Calls { sender, authority },
            served,
        })
    }

    /// `SayHello(name)` on this connection, with `authorization: Bearer <token>` if given.
    pub(crate) async fn say_hello(
        &self,
        name: &str,
        token: Option<&str>,
    ) -> Result<String, tonic::Status> {
        let mut request = tonic::Request::new(HelloRequest { name: name.into() });
        request.set_timeout(Duration::from_secs(20));
        if let Some(token) = token {
            let value = format!("Bearer {token}").parse().unwrap();
            request.metadata_mut().insert("authorization", value);
        }
        let mut greeter = GreeterClient::new(self.calls.clone());
        Ok(greeter.say_hello(request).await?.into_inner().message)
    }

    /// Whether the connection is closed.
    pub(crate) fn is_closed(&self) -> bool {
        self.served.is_finished()
    }

    /// Waits for the connection to close, at most `limit`; whether it did.
    pub(crate) async fn closes_within(&mut self, limit: Duration) -> bool {
        tokio::time::timeout(limit, &mut self.served).await.is_ok()
    }
}

impl Drop for PeerConnection {
    fn drop(&mut self) {
        self.served.abort();
    }
}

/// The connection as the service a tonic client calls through.
#[derive(Clone)]
struct Calls {
    sender: SendRequest<Body>,
    authority: uri::Authority,
}

impl tower_service::Service<http::Request<Body>> for Calls {
    type Response = http::Response<hyper::body::Incoming>;
    type Error = hyper::Error;
    type Future =
        Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send + 'static>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.sender.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<Body>) -> Self::Future {
        // tonic's clients send the path alone (its `Channel` adds the rest); HTTP/2 needs
        // the scheme and authority too.
        let mut parts = request.uri().clone().into_parts();
        parts.scheme = Some(uri::Scheme::HTTP);
        parts.authority = Some(self.authority.clone());
        *request.uri_mut() = http::Uri::from_parts(parts).expect("a path and an authority");
        Box::pin(self.sender.send_request(request))
    }
}
