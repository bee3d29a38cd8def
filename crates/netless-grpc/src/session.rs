//! Server-side streams: the state of a call that outlives one netless exchange, shared by
//! the task running the tonic service and the `netless.stream/*` handlers.
//!
//! Outbound, a pump task moves the service's response body into a buffer of at most
//! [`WINDOW`] unread bytes, and a waiting `recv` (a deferred reply) takes what is there.
//! Inbound, `send` appends to a buffer the service's request body reads; past [`WINDOW`]
//! unread bytes the `send` is answered only once the service caught up. Every session is
//! tied to its client's connection: a call from another connection cannot touch it, and it is
//! cancelled when that connection closes.

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use http_body::Frame;
use http_body_util::BodyExt;
use netless::{Code, ConnectionWatch, DeferredReply, Metadata, Status};

use crate::mapping::{headers_to_metadata, trailers_to_metadata, GRPC_STATUS};
use crate::protocol::{END, HEADERS, WINDOW};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Default for the most streams one [`crate::GrpcServer`] keeps open: each holds a task and
/// up to two windows of buffered bytes, so a client opening streams without end meets
/// `RESOURCE_EXHAUSTED`.
pub(crate) const MAX_SESSIONS: usize = 16_384;

/// The live streams of one [`crate::GrpcServer`].
pub(crate) struct Sessions {
    map: Mutex<HashMap<u64, Arc<Session>>>,
    next: AtomicU64,
    max: usize,
}

impl Sessions {
    /// No sessions yet; at most `max` at once.
    pub(crate) fn new(max: usize) -> Sessions {
        Sessions {
            map: Mutex::default(),
            next: AtomicU64::new(0),
            max,
        }
    }

    /// A new session for the client behind `watch`, registered under a fresh id.
    pub(crate) fn open(self: &Arc<Self>, watch: ConnectionWatch) -> Result<Arc<Session>, Status> {
        if self.len() >= self.max {
            return Err(Status::resource_exhausted(format!(
                "this server already has {} streams open: retry later, or finish or cancel streams",
                self.max
            )));
        }
        // Ids need not be secret (a session only answers its own connection), only unique.
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let session = Arc::new(Session {
            id,
            watch,
            sessions: Arc::downgrade(self),
            out: Mutex::default(),
            inbound: Mutex::default(),
            task: Mutex::default(),
        });
        lock(&self.map).insert(id, session.clone());
        Ok(session)
    }

    /// The session `id`, if it is live and belongs to `reply`'s connection.
    pub(crate) fn get(&self, id: u64, reply: &DeferredReply) -> Result<Arc<Session>, Status> {
        lock(&self.map)
            .get(&id)
            .filter(|s| s.watch.same_connection(reply))
            .cloned()
            .ok_or_else(|| {
                Status::new(
                    Code::NotFound,
                    format!("stream {id} is gone: it finished, was cancelled, or is not yours"),
                )
            })
    }

    fn remove(&self, id: u64) -> Option<Arc<Session>> {
        lock(&self.map).remove(&id)
    }

    /// How many streams are open.
    pub(crate) fn len(&self) -> usize {
        lock(&self.map).len()
    }

    /// Cancels the streams whose client is gone; runs until the sessions are dropped.
    pub(crate) async fn sweep(sessions: Weak<Sessions>) {
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let Some(sessions) = sessions.upgrade() else {
                return;
            };
            let orphans: Vec<Arc<Session>> = lock(&sessions.map)
                .values()
                .filter(|s| s.watch.is_closed())
                .cloned()
                .collect();
            for session in orphans {
                session.cancel("the client's connection closed");
            }
        }
    }
}

/// One stream.
pub(crate) struct Session {
    pub(crate) id: u64,
    watch: ConnectionWatch,
    sessions: Weak<Sessions>,
    out: Mutex<Outbound>,
    inbound: Mutex<Inbound>,
    task: Mutex<Option<tokio::task::AbortHandle>>,
}

/// Most response bytes one `recv` reply carries (well under the default 4 MiB limit).
pub(crate) const MAX_DELIVERY: usize = 1 << 20;

#[derive(Default)]
struct Outbound {
    /// Response headers not yet delivered.
    headers: Option<Metadata>,
    /// Response bytes not yet delivered.
    data: Vec<u8>,
    /// Set once the response ended: its trailers (as metadata), not yet delivered.
    trailers: Option<Metadata>,
    /// A `recv` waiting for something to deliver.
    waiting: Option<DeferredReply>,
    /// The pump, waiting for the buffer to drain below the window.
    space: Option<Waker>,
}

impl Outbound {
    /// What a `recv` gets now, if anything: (metadata, bytes, whether the stream ended).
    fn take_delivery(&mut self) -> Option<(Metadata, Vec<u8>, bool)> {
        if self.headers.is_none() && self.data.is_empty() && self.trailers.is_none() {
            return None;
        }
        let mut metadata = Metadata::new();
        if let Some(headers) = self.headers.take() {
            metadata.insert(HEADERS, "1");
            for (k, v) in headers.iter() {
                metadata.insert(k, v);
            }
        }
        // At most MAX_DELIVERY bytes a reply, so a reply always fits the client's limit on
        // message size; the trailers go with the last bytes.
        let data = if self.data.len() > MAX_DELIVERY {
            let rest = self.data.split_off(MAX_DELIVERY);
            std::mem::replace(&mut self.data, rest)
        } else {
            std::mem::take(&mut self.data)
        };
        let ended = match self.trailers.take_if(|_| self.data.is_empty()) {
            Some(trailers) => {
                for (k, v) in trailers.iter() {
                    metadata.insert(k, v);
                }
                metadata.insert(END, "1");
                true
            }
            None => false,
        };
        if let Some(waker) = self.space.take() {
            waker.wake();
        }
        Some((metadata, data, ended))
    }
}

#[derive(Default)]
struct Inbound {
    chunks: VecDeque<Bytes>,
    bytes: usize,
    /// The client sent `close-send`.
    closed: bool,
    /// The service dropped its request body: later bytes are discarded.
    discarding: bool,
    /// The service's request body, waiting for bytes.
    waker: Option<Waker>,
    /// A `send` answered once the buffer drains below the window.
    waiting: Option<DeferredReply>,
}

impl Session {
    /// Records the task running this stream, so a cancel can stop it.
    pub(crate) fn set_task(&self, task: tokio::task::AbortHandle) {
        *lock(&self.task) = Some(task);
    }

    /// Sets the response head: headers, or for a trailers-only response, the end.
    pub(crate) fn set_head(&self, headers: &HeaderMap) {
        let (headers, trailers) = response_head(headers);
        let mut out = lock(&self.out);
        out.headers = Some(headers);
        out.trailers = trailers;
        self.deliver(out);
    }

    /// Response bytes produced before the stream began that did not fit its first reply.
    pub(crate) fn preload(&self, data: &[u8]) {
        lock(&self.out).data.extend_from_slice(data);
    }

    /// Answers a `recv`: now if there is something to deliver, else when there is.
    pub(crate) fn recv(&self, reply: DeferredReply) {
        let mut out = lock(&self.out);
        if out.waiting.is_some() {
            drop(out);
            let _ = reply.fail(&Status::new(
                Code::FailedPrecondition,
                "a recv is already waiting on this stream",
            ));
            return;
        }
        out.waiting = Some(reply);
        self.deliver(out);
    }

    /// Sends what there is to the waiting `recv`, if both exist.
    fn deliver(&self, mut out: MutexGuard<'_, Outbound>) {
        if out.waiting.is_none() {
            return;
        }
        let Some((metadata, data, ended)) = out.take_delivery() else {
            return;
        };
        let reply = out.waiting.take();
        drop(out);
        if ended {
            self.forget();
        }
        if let Some(reply) = reply {
            if reply.send(&metadata, &data).is_err() {
                self.cancel("the client's connection closed");
            }
        }
    }

    /// Moves the service's response body to the client, at most [`WINDOW`] bytes ahead of
    /// what it has read.
    pub(crate) async fn pump(self: Arc<Self>, mut body: tonic::body::Body) {
        loop {
            std::future::poll_fn(|cx| {
                let mut out = lock(&self.out);
                if out.data.len() < WINDOW {
                    Poll::Ready(())
                } else {
                    out.space = Some(cx.waker().clone());
                    Poll::Pending
                }
            })
            .await;
            let trailers = match body.frame().await {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        let mut out = lock(&self.out);
                        out.data.extend_from_slice(&data);
                        self.deliver(out);
                        continue;
                    }
                    Err(frame) => frame.into_trailers().unwrap_or_default(),
                },
                Some(Err(e)) => status_trailers(&Status::internal(format!(
                    "the service's response stream failed: {e}"
                ))),
                None => HeaderMap::new(),
            };
            let mut md = Metadata::new();
            trailers_to_metadata(&trailers, &mut md);
            let mut out = lock(&self.out);
            out.trailers = Some(md);
            self.deliver(out);
            return;
        }
    }

    /// Appends request bytes; answers `reply` now, or once the service has read enough.
    pub(crate) fn send(&self, data: &[u8], reply: DeferredReply) {
        let mut inbound = lock(&self.inbound);
        if inbound.closed {
            drop(inbound);
            let _ = reply.fail(&Status::new(
                Code::FailedPrecondition,
                "send after close-send on this stream",
            ));
            return;
        }
        if inbound.discarding {
            drop(inbound);
            let _ = reply.send(&Metadata::new(), b"");
            return;
        }
        if inbound.waiting.is_some() {
            drop(inbound);
            let _ = reply.fail(&Status::new(
                Code::FailedPrecondition,
                "a send is already waiting on this stream",
            ));
            return;
        }
        if !data.is_empty() {
            inbound.bytes += data.len();
            inbound.chunks.push_back(Bytes::copy_from_slice(data));
        }
        if let Some(waker) = inbound.waker.take() {
            waker.wake();
        }
        if inbound.bytes > WINDOW {
            inbound.waiting = Some(reply);
        } else {
            drop(inbound);
            let _ = reply.send(&Metadata::new(), b"");
        }
    }

    /// Ends the request.
    pub(crate) fn close_send(&self) {
        let mut inbound = lock(&self.inbound);
        inbound.closed = true;
        if let Some(waker) = inbound.waker.take() {
            waker.wake();
        }
    }

    /// Drops the call: stops the service's task (so it sees the cancellation as its streams
    /// closing) and fails anything still waiting.
    pub(crate) fn cancel(&self, why: &str) {
        self.forget();
        if let Some(task) = lock(&self.task).take() {
            task.abort();
        }
        let status = Status::new(Code::Cancelled, format!("stream cancelled: {why}"));
        let waiting = lock(&self.out).waiting.take();
        if let Some(reply) = waiting {
            let _ = reply.fail(&status);
        }
        let mut inbound = lock(&self.inbound);
        inbound.discarding = true;
        inbound.chunks.clear();
        let waiting = inbound.waiting.take();
        drop(inbound);
        if let Some(reply) = waiting {
            let _ = reply.fail(&status);
        }
    }

    fn forget(&self) {
        if let Some(sessions) = self.sessions.upgrade() {
            sessions.remove(self.id);
        }
    }

    /// The request body the service reads: what `send` delivers, ending at `close-send`.
    pub(crate) fn request_body(self: &Arc<Self>, first: Bytes) -> InboundBody {
        if !first.is_empty() {
            let mut inbound = lock(&self.inbound);
            inbound.bytes += first.len();
            inbound.chunks.push_back(first);
        }
        InboundBody {
            session: self.clone(),
        }
    }
}

/// A stream's request body, fed by `send`.
pub(crate) struct InboundBody {
    session: Arc<Session>,
}

impl http_body::Body for InboundBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let mut inbound = lock(&self.session.inbound);
        if let Some(chunk) = inbound.chunks.pop_front() {
            inbound.bytes -= chunk.len();
            let release = (inbound.bytes <= WINDOW)
                .then(|| inbound.waiting.take())
                .flatten();
            drop(inbound);
            if let Some(reply) = release {
                let _ = reply.send(&Metadata::new(), b"");
            }
            return Poll::Ready(Some(Ok(Frame::data(chunk))));
        }
        if inbound.closed || inbound.discarding {
            return Poll::Ready(None);
        }
        inbound.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

impl Drop for InboundBody {
    fn drop(&mut self) {
        // The service stopped reading (it may already have answered): later sends succeed
        // and are dropped, as HTTP/2 discards data for a finished stream.
        let mut inbound = lock(&self.session.inbound);
        inbound.discarding = true;
        inbound.chunks.clear();
        inbound.bytes = 0;
        let waiting = inbound.waiting.take();
        drop(inbound);
        if let Some(reply) = waiting {
            let _ = reply.send(&Metadata::new(), b"");
        }
    }
}

/// Response headers → (headers, trailers if it is a trailers-only response).
pub(crate) fn response_head(headers: &HeaderMap) -> (Metadata, Option<Metadata>) {
    let mut md = Metadata::new();
    headers_to_metadata(headers, &mut md);
    if !headers.contains_key(GRPC_STATUS) {
        return (md, None);
    }
    // A trailers-only response carries grpc-status in its headers; pass them as trailers.
    let mut trailers = HeaderMap::new();
    for key in ["grpc-status", "grpc-message", "grpc-status-details-bin"] {
        if let Some(value) = headers.get(key) {
            trailers.insert(key, value.clone());
        }
    }
    let mut tmd = Metadata::new();
    trailers_to_metadata(&trailers, &mut tmd);
    (md, Some(tmd))
}

/// Trailers carrying `status`.
pub(crate) fn status_trailers(status: &Status) -> HeaderMap {
    let code = tonic::Code::from_i32(i32::from(status.code() as u16));
    let mut trailers = HeaderMap::new();
    let _ = tonic::Status::new(code, status.message()).add_header(&mut trailers);
    trailers
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deliveries_are_capped_and_the_trailers_come_with_the_last_bytes() {
        let mut out = Outbound {
            headers: Some(Metadata::new()),
            data: vec![7; 2 * MAX_DELIVERY + 100],
            ..Outbound::default()
        };
        let mut trailers = Metadata::new();
        trailers.insert("trailer/grpc-status", "0");
        out.trailers = Some(trailers);
        let (md, data, ended) = out.take_delivery().unwrap();
        assert!(md.get(HEADERS).is_some());
        assert_eq!((data.len(), ended), (MAX_DELIVERY, false));
        let (md, data, ended) = out.take_delivery().unwrap();
        assert!(md.get(HEADERS).is_none() && md.get(END).is_none());
        assert_eq!((data.len(), ended), (MAX_DELIVERY, false));
        let (md, data, ended) = out.take_delivery().unwrap();
        assert_eq!((data.len(), ended), (100, true));
        assert_eq!(md.get("trailer/grpc-status"), Some(&b"0"[..]));
        assert!(out.take_delivery().is_none());
    }
}
