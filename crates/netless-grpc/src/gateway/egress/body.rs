//! The bodies of a forwarded call.
//!
//! [`TryBody`]: the request body as one try sends it. Whether the try may have reached the
//! remote is told by the body itself: hyper looks at it (`is_end_stream`, then
//! `poll_frame`) only once the request is on an HTTP/2 connection, about to send its
//! headers. So a try that failed with its body untouched sent nothing, and the body,
//! taken back whole, goes with the next try; one touched is never sent again. Looks before
//! the try is [armed](Attempt::arm) do not count: `tonic::body::Body::new`, which wraps
//! it, asks `is_end_stream` at once (and is told no, so that it keeps the wrapper).
//!
//! [`RemoteBody`]: the remote's response body as the caller gets it: ended with
//! `DEADLINE_EXCEEDED` when the call's deadline passes (the remote's stream is reset), and
//! with a status when the connection breaks, rather than with an error the netless server
//! would report as its own. It holds the try's share of its endpoint's load.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};

use super::endpoints::Load;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[derive(Default)]
struct Slot {
    body: Option<tonic::body::Body>,
    /// Whether the try is under way: looks at the body count from now on.
    armed: bool,
    /// Whether hyper looked at the body, or it was taken back.
    touched: bool,
}

/// The request body of one try (see the module's documentation).
pub(super) struct TryBody {
    slot: Arc<Mutex<Slot>>,
    /// The body, once taken from the slot.
    body: Option<tonic::body::Body>,
}

/// Takes back the body of a try that did not touch it.
pub(super) struct Attempt {
    slot: Arc<Mutex<Slot>>,
}

impl Attempt {
    pub(super) fn new(body: tonic::body::Body) -> (Attempt, TryBody) {
        let slot = Arc::new(Mutex::new(Slot {
            body: Some(body),
            armed: false,
            touched: false,
        }));
        let body = TryBody {
            slot: slot.clone(),
            body: None,
        };
        (Attempt { slot }, body)
    }

    /// From now on, a look at the body means the request may have left.
    pub(super) fn arm(&self) {
        lock(&self.slot).armed = true;
    }

    /// The body, if the try never touched it; after this the try finds it ended.
    pub(super) fn take_back(&self) -> Option<tonic::body::Body> {
        let mut slot = lock(&self.slot);
        if slot.touched {
            return None;
        }
        // Whatever the old try asks from now on, its body has ended.
        slot.armed = true;
        slot.touched = true;
        slot.body.take()
    }
}

impl Body for TryBody {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        let this = &mut *self;
        if this.body.is_none() {
            let mut slot = lock(&this.slot);
            slot.touched = true;
            this.body = slot.body.take();
        }
        match &mut this.body {
            Some(body) => Pin::new(body).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        if let Some(body) = &self.body {
            return body.is_end_stream();
        }
        let mut slot = lock(&self.slot);
        if !slot.armed {
            return false;
        }
        slot.touched = true;
        slot.body.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        match &self.body {
            Some(body) => body.size_hint(),
            None => lock(&self.slot)
                .body
                .as_ref()
                .map_or(SizeHint::with_exact(0), Body::size_hint),
        }
    }
}

/// The remote's response body as the caller gets it (see the module's documentation).
pub(super) struct RemoteBody {
    /// `None` once ended.
    inner: Option<tonic::body::Body>,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    service: Arc<str>,
    _load: Load,
}

impl RemoteBody {
    /// Must be made in a tokio runtime's context if there is a `deadline`.
    pub(super) fn new(
        inner: tonic::body::Body,
        deadline: Option<Instant>,
        service: Arc<str>,
        load: Load,
    ) -> RemoteBody {
        RemoteBody {
            inner: Some(inner),
            deadline: deadline.map(|d| Box::pin(tokio::time::sleep_until(d.into()))),
            service,
            _load: load,
        }
    }

    /// Ends the body with `status` in its trailers.
    fn end(&mut self, status: tonic::Status) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        // Dropping the remote's body resets its stream: the remote sees the call cancelled.
        self.inner = None;
        self.deadline = None;
        let mut trailers = HeaderMap::new();
        let _ = status.add_header(&mut trailers);
        Poll::Ready(Some(Ok(Frame::trailers(trailers))))
    }
}

impl Body for RemoteBody {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        let this = &mut *self;
        let Some(inner) = &mut this.inner else {
            return Poll::Ready(None);
        };
        match Pin::new(inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => Poll::Ready(Some(Ok(frame))),
            Poll::Ready(None) => {
                this.inner = None;
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(status))) => {
                let message = format!(
                    "the connection to the remote service `{}` broke during the call: {}",
                    this.service,
                    status.message()
                );
                this.end(tonic::Status::new(status.code(), message))
            }
            Poll::Pending => {
                let passed = match &mut this.deadline {
                    Some(deadline) => deadline.as_mut().poll(cx).is_ready(),
                    None => false,
                };
                if !passed {
                    return Poll::Pending;
                }
                let message = format!(
                    "the deadline passed while the remote service `{}` was answering",
                    this.service
                );
                this.end(tonic::Status::deadline_exceeded(message))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Some(inner) => inner.size_hint(),
            None => SizeHint::with_exact(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt as _;

    fn full(bytes: &'static [u8]) -> tonic::body::Body {
        tonic::body::Body::new(http_body_util::Full::new(Bytes::from_static(bytes)))
    }

    #[test]
    fn an_untouched_body_comes_back_whole() {
        let (attempt, body) = Attempt::new(full(b"abc"));
        // Wrapping asks whether the body ended, before the try is armed: no look.
        let body = tonic::body::Body::new(body);
        attempt.arm();
        // A size hint is no look at the body: hyper may ask before it has a connection.
        assert_eq!(body.size_hint().exact(), Some(3));
        drop(body);
        let back = attempt.take_back().unwrap();
        assert_eq!(back.size_hint().exact(), Some(3));
        assert!(attempt.take_back().is_none());
    }

    #[test]
    fn a_touched_body_never_goes_again() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let (attempt, body) = Attempt::new(full(b"abc"));
        attempt.arm();
        assert!(!body.is_end_stream());
        assert!(attempt.take_back().is_none());

        // Even an empty body: hyper sends the headers at once then.
        let (attempt, body) = Attempt::new(tonic::body::Body::empty());
        let body = tonic::body::Body::new(body);
        attempt.arm();
        assert!(body.is_end_stream());
        assert!(attempt.take_back().is_none());

        let (attempt, body) = Attempt::new(full(b"abc"));
        let bytes = runtime.block_on(body.collect()).unwrap().to_bytes();
        assert_eq!(&bytes[..], b"abc");
        assert!(attempt.take_back().is_none());

        // Taken back first: the old try finds its body ended.
        let (attempt, body) = Attempt::new(full(b"abc"));
        assert!(attempt.take_back().is_some());
        assert!(body.is_end_stream());
        let bytes = runtime.block_on(body.collect()).unwrap().to_bytes();
        assert!(bytes.is_empty());
    }

    #[test]
    fn the_deadline_ends_a_response_with_its_status() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        runtime.block_on(async {
            let load = Arc::new(std::sync::atomic::AtomicUsize::new(1));
            let silent = tonic::body::Body::new(Silent);
            let deadline = Instant::now() + std::time::Duration::from_millis(50);
            let body = RemoteBody::new(silent, Some(deadline), "a.B".into(), Load(load.clone()));
            let collected = body.collect().await.unwrap();
            let trailers = collected.trailers().unwrap();
            let status = tonic::Status::from_header_map(trailers).unwrap();
            assert_eq!(status.code(), tonic::Code::DeadlineExceeded);
            assert!(status.message().contains("`a.B`"), "{status:?}");
            assert_eq!(load.load(std::sync::atomic::Ordering::Relaxed), 0);
        });
    }

    /// A body that never has anything.
    struct Silent;

    impl Body for Silent {
        type Data = Bytes;
        type Error = tonic::Status;

        fn poll_frame(
            self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
            Poll::Pending
        }
    }
}
