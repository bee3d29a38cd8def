//! Client-side streams: the response body that long-polls `recv`, the task that feeds the
//! request body to `send`, and the cancel sent when the caller drops the call.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http::HeaderMap;
use http_body::Frame;
use http_body_util::BodyExt;
use netless::{CallOptions, Client, Reply, Status};

use crate::mapping::{metadata_to_headers, take_ready};
use crate::protocol::{stream_payload, CANCEL, CLOSE_SEND, END, RECV, SEND, WINDOW};
use crate::session::status_trailers;

type ReplyFuture = Pin<Box<dyn Future<Output = Result<Reply, Status>> + Send>>;

/// One stream of this client; cancels the call on the server when dropped before it ended.
pub(crate) struct ClientStream {
    client: Client,
    id: u64,
    deadline: Option<Instant>,
    /// The server ended the stream (no cancel needed).
    finished: AtomicBool,
    /// The task sending the request body.
    request_task: Mutex<Option<tokio::task::AbortHandle>>,
}

impl ClientStream {
    pub(crate) fn new(client: Client, id: u64, deadline: Option<Instant>) -> Arc<ClientStream> {
        Arc::new(ClientStream {
            client,
            id,
            deadline,
            finished: AtomicBool::new(false),
            request_task: Mutex::new(None),
        })
    }

    fn options(&self) -> CallOptions {
        match self.deadline {
            Some(deadline) => CallOptions::new().deadline_at(deadline),
            None => CallOptions::new(),
        }
    }

    /// The next `recv` call.
    pub(crate) fn recv(&self) -> ReplyFuture {
        Box::pin(
            self.client
                .call_async(RECV, &stream_payload(self.id, &[]), &self.options()),
        )
    }

    /// Starts sending `body` (the rest of the request), one `send` at a time: each waits for
    /// the server to take the previous bytes, so a slow server back-pressures the caller.
    pub(crate) fn send_request(&self, mut body: tonic::body::Body) {
        let (client, id, options) = (self.client.clone(), self.id, self.options());
        let task = tokio::spawn(async move {
            loop {
                let mut chunk = Vec::new();
                let ended = match body.frame().await {
                    Some(Ok(frame)) => {
                        if let Ok(data) = frame.into_data() {
                            chunk.extend_from_slice(&data);
                        }
                        // Whatever else is ready travels in the same call.
                        match take_ready(&mut body, WINDOW / 4, &mut chunk).await {
                            Ok(ended) => ended,
                            // The caller's stream failed: tonic cancels the call.
                            Err(_) => return cancel(&client, id),
                        }
                    }
                    Some(Err(_)) => return cancel(&client, id),
                    None => true,
                };
                if !chunk.is_empty()
                    && client
                        .call_async(SEND, &stream_payload(id, &chunk), &options)
                        .await
                        .is_err()
                {
                    return;
                }
                if ended {
                    let _ = client
                        .call_async(CLOSE_SEND, &stream_payload(id, &[]), &options)
                        .await;
                    return;
                }
            }
        });
        *self.request_task.lock().unwrap_or_else(|e| e.into_inner()) = Some(task.abort_handle());
    }
}

impl Drop for ClientStream {
    fn drop(&mut self) {
        if let Some(task) = self
            .request_task
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            task.abort();
        }
        if !self.finished.load(Ordering::Acquire) {
            cancel(&self.client, self.id);
        }
    }
}

/// Tells the server to drop stream `id`, without waiting for the answer.
fn cancel(client: &Client, id: u64) {
    let call = client.call_async(CANCEL, &stream_payload(id, &[]), &CallOptions::new());
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            runtime.spawn(call);
        }
        Err(_) => {
            let _ = std::thread::Builder::new()
                .name("netless-grpc-cancel".into())
                .spawn(move || block_on_here(call));
        }
    }
}

/// Runs `future` to completion on this thread (for a cancel issued outside any runtime).
fn block_on_here<F: Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .map(|rt| rt.block_on(future))
        .expect("a current-thread runtime without drivers always builds")
}

/// A streamed response body: bytes already received, then `recv` after `recv` until the
/// trailers arrive. Polling it is what asks the server for more.
pub(crate) struct StreamBody {
    stream: Arc<ClientStream>,
    data: Option<Bytes>,
    trailers: Option<HeaderMap>,
    ended: bool,
    recv: Option<ReplyFuture>,
}

impl StreamBody {
    /// The body after a reply that carried `data` (and maybe the end).
    pub(crate) fn new(stream: Arc<ClientStream>, first: Reply) -> StreamBody {
        let mut body = StreamBody {
            stream,
            data: None,
            trailers: None,
            ended: false,
            recv: None,
        };
        body.absorb(Ok(first));
        body
    }

    fn absorb(&mut self, reply: Result<Reply, Status>) {
        match reply {
            Ok(reply) => {
                if !reply.payload.is_empty() {
                    self.data = Some(Bytes::from(reply.payload));
                }
                if reply.metadata.get(END).is_some() {
                    self.stream.finished.store(true, Ordering::Release);
                    self.trailers = Some(metadata_to_headers(&reply.metadata).1);
                    self.ended = true;
                }
            }
            Err(status) => {
                // The call failed mid-stream (deadline, dead server): end the body with the
                // status, which tonic reports to the caller. Dropping cancels it server-side.
                self.trailers = Some(status_trailers(&status));
                self.ended = true;
            }
        }
    }
}

impl http_body::Body for StreamBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        loop {
            if let Some(data) = self.data.take() {
                return Poll::Ready(Some(Ok(Frame::data(data))));
            }
            if let Some(trailers) = self.trailers.take() {
                return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
            }
            if self.ended {
                return Poll::Ready(None);
            }
            let stream = self.stream.clone();
            let recv = self.recv.get_or_insert_with(|| stream.recv());
            let reply = std::task::ready!(recv.as_mut().poll(cx));
            self.recv = None;
            self.absorb(reply);
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended && self.data.is_none() && self.trailers.is_none()
    }
}
