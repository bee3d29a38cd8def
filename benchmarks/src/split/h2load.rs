//! A lean closed-loop gRPC load generator on the `h2` crate: one HTTP/2 connection, unary
//! calls of one pre-encoded message, many streams in flight from one thread.
//!
//! `split_offload` stands in with it for the paper's separate client machine. On a 2-core host
//! the generator has to share a core with the system under test, so it should cost as little
//! as it can: no tonic codec, no tower buffer task, no per-call encoding; the request's gRPC
//! frame is built once and every reply is checked by its length and its `grpc-status`.

use bytes::Bytes;
use http::{HeaderValue, Request};
use tokio::net::TcpStream;

/// A connection to a gRPC server, cheap to clone (clones share the connection).
#[derive(Clone)]
pub(super) struct H2Client {
    send: h2::client::SendRequest<Bytes>,
    authority: String,
}

/// One unary call's request: path, extra headers, and the length-prefixed message.
#[derive(Clone, Debug)]
pub(super) struct UnaryCall {
    pub path: &'static str,
    pub headers: Vec<(&'static str, HeaderValue)>,
    /// The gRPC frame: flag byte, 4-byte big-endian length, message.
    pub frame: Bytes,
    /// The reply's message length (of its one frame), checked on every reply.
    pub reply_len: usize,
}

impl UnaryCall {
    /// A call of `path` carrying `message` (its protobuf encoding) whose reply message is
    /// `reply_len` bytes long.
    pub(super) fn new(path: &'static str, message: &[u8], reply_len: usize) -> UnaryCall {
        let mut frame = Vec::with_capacity(5 + message.len());
        frame.push(0);
        frame.extend_from_slice(&(message.len() as u32).to_be_bytes());
        frame.extend_from_slice(message);
        UnaryCall {
            path,
            headers: Vec::new(),
            frame: Bytes::from(frame),
            reply_len,
        }
    }

    /// Adds a request header (gRPC metadata).
    pub(super) fn header(mut self, name: &'static str, value: HeaderValue) -> UnaryCall {
        self.headers.push((name, value));
        self
    }
}

impl H2Client {
    /// Connects to `addr` (`host:port`, plain-text HTTP/2). The connection's task is spawned
    /// on the current runtime.
    pub(super) async fn connect(addr: &str) -> anyhow::Result<H2Client> {
        let tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        let (send, connection) = h2::client::Builder::new()
            .initial_window_size(1 << 20)
            .initial_connection_window_size(16 << 20)
            .handshake::<_, Bytes>(tcp)
            .await?;
        // Its errors surface in the calls, which fail when the connection does.
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(H2Client {
            send,
            authority: addr.to_string(),
        })
    }

    /// Makes one unary call; fails on anything but an OK reply of the expected length.
    pub(super) async fn unary(&self, call: &UnaryCall) -> anyhow::Result<()> {
        let mut send = self.send.clone().ready().await?;
        let mut request = Request::post(format!("http://{}{}", self.authority, call.path))
            .header("content-type", "application/grpc")
            .header("te", "trailers");
        for (name, value) in &call.headers {
            request = request.header(*name, value.clone());
        }
        let (response, mut stream) = send.send_request(request.body(())?, false)?;
        stream.send_data(call.frame.clone(), true)?;
        let response = response.await?;
        anyhow::ensure!(
            response.status() == http::StatusCode::OK,
            "HTTP status {}",
            response.status()
        );
        if let Some(status) = response.headers().get("grpc-status") {
            // Trailers-only: an error.
            anyhow::bail!("grpc-status {status:?} (trailers-only reply)");
        }
        let mut body = response.into_body();
        let mut received = 0;
        while let Some(chunk) = body.data().await {
            let chunk = chunk?;
            received += chunk.len();
            body.flow_control().release_capacity(chunk.len())?;
        }
        let trailers = body.trailers().await?;
        let status = trailers.as_ref().and_then(|t| t.get("grpc-status"));
        anyhow::ensure!(
            status.is_some_and(|s| s == "0"),
            "grpc-status {status:?}, expected 0"
        );
        anyhow::ensure!(
            received == 5 + call.reply_len,
            "reply of {received} bytes, expected {}",
            5 + call.reply_len
        );
        Ok(())
    }
}
