//! Admission of forwarded calls, per remote connection: its bound on calls at the backends
//! (a semaphore; calls past it wait their turn, up to their deadline), the share of a
//! service's links each call takes, the activity its idle timeout watches (authenticated
//! calls only), and the count of calls in a row that failed authentication, which closes it.
//!
//! Shares: every connection may have [`RESERVED_PER_SERVICE`] calls at each service from
//! capacity set aside for it (the gateway is built only if the links can carry
//! `max_connections` × that), and more only from what the reserves leave. So clients that
//! hold the rest of a service's links with idle streams cannot keep another connection's
//! next call out. [`CallBody`] holds it all for a call's life: until hyper drops the
//! response body (the call ended, or the client reset its stream). This module never
//! touches a backend's connections.

use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use super::auth::MAX_FAILED_AUTHENTICATIONS;
use super::backends::{Backend, LinkGuard};
use super::public::Scrubber;

/// Calls each connection may have at each service from capacity reserved for it.
pub(crate) const RESERVED_PER_SERVICE: usize = 2;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One remote (HTTP/2) connection's calls.
pub(crate) struct RemoteConnection {
    /// Calls at the backends, at most `max_calls_per_connection`.
    calls: Arc<Semaphore>,
    /// Calls from reserves, per service.
    reserves: Mutex<Vec<(Arc<Backend>, usize)>>,
    /// Calls under way (waiting or forwarded), and when the last one ended.
    active: AtomicUsize,
    last_active: Mutex<Instant>,
    /// Notified when the last call under way ends.
    quiet: Notify,
    /// Calls in a row that failed authentication. Relaxed: a count that orders nothing.
    failed_authentications: AtomicU32,
    /// Notified (once, its permit kept) when the connection is to close.
    close: Notify,
}

impl RemoteConnection {
    pub(crate) fn new(max_calls: usize) -> Arc<RemoteConnection> {
        Arc::new(RemoteConnection {
            calls: Arc::new(Semaphore::new(max_calls)),
            reserves: Mutex::default(),
            active: AtomicUsize::new(0),
            last_active: Mutex::new(Instant::now()),
            quiet: Notify::new(),
            failed_authentications: AtomicU32::new(0),
            close: Notify::new(),
        })
    }

    /// A call presented the gateway's token: the failures before it are forgiven.
    pub(crate) fn authenticated(&self) {
        self.failed_authentications.store(0, Ordering::Relaxed);
    }

    /// A call failed authentication; `true` if that makes
    /// [`MAX_FAILED_AUTHENTICATIONS`] in a row, and the connection is to close.
    pub(crate) fn failed_authentication(&self) -> bool {
        let failed = self.failed_authentications.fetch_add(1, Ordering::Relaxed) + 1;
        if failed < MAX_FAILED_AUTHENTICATIONS {
            return false;
        }
        self.close.notify_one();
        true
    }

    /// Completes once the connection is to close (see [`Self::failed_authentication`]).
    pub(crate) async fn closing(&self) {
        self.close.notified().await;
    }

    /// A call begins: the connection is not idle until it ends.
    pub(crate) fn begin(self: &Arc<Self>) -> Activity {
        self.active.fetch_add(1, Ordering::AcqRel);
        Activity(self.clone())
    }

    /// One of the connection's call permits, waiting for one until `deadline`; `None` if it
    /// passed first.
    pub(crate) async fn permit(&self, deadline: Option<Instant>) -> Option<OwnedSemaphorePermit> {
        let acquire = self.calls.clone().acquire_owned();
        let permit = match deadline {
            Some(deadline) => tokio::time::timeout_at(deadline.into(), acquire)
                .await
                .ok()?,
            None => acquire.await,
        };
        permit.ok()
    }

    /// This connection's share of `backend` for one call: from its reserve there, else from
    /// the service's shared capacity (at most `shared_cap` calls); `None` if both are used up.
    pub(crate) fn share(
        self: &Arc<Self>,
        backend: &Arc<Backend>,
        shared_cap: usize,
    ) -> Option<Share> {
        let reserved = {
            let mut reserves = lock(&self.reserves);
            let at = reserves.iter().position(|(b, _)| Arc::ptr_eq(b, backend));
            match at {
                Some(at) if reserves[at].1 >= RESERVED_PER_SERVICE => false,
                Some(at) => {
                    reserves[at].1 += 1;
                    true
                }
                None => {
                    reserves.push((backend.clone(), 1));
                    true
                }
            }
        };
        if reserved {
            backend.reserved.fetch_add(1, Ordering::Relaxed);
        } else {
            // Relaxed: a counter bounded by its own compare-and-swap; it orders nothing else.
            backend
                .shared
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                    (n < shared_cap).then_some(n + 1)
                })
                .ok()?;
        }
        Some(Share {
            connection: self.clone(),
            backend: backend.clone(),
            reserved,
        })
    }

    /// Completes once no call has been under way for `timeout`.
    pub(crate) async fn idle(&self, timeout: Duration) {
        loop {
            // Made before the check, so the last call's end cannot slip between them.
            let quiet = self.quiet.notified();
            if self.active.load(Ordering::Acquire) != 0 {
                quiet.await;
                continue;
            }
            let since = lock(&self.last_active).elapsed();
            if since >= timeout {
                return;
            }
            tokio::time::sleep(timeout - since).await;
        }
    }
}

/// A call under way on its connection.
pub(crate) struct Activity(Arc<RemoteConnection>);

impl Drop for Activity {
    fn drop(&mut self) {
        *lock(&self.0.last_active) = Instant::now();
        if self.0.active.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.quiet.notify_waiters();
        }
    }
}

/// A call's share of a service's links.
pub(crate) struct Share {
    connection: Arc<RemoteConnection>,
    backend: Arc<Backend>,
    reserved: bool,
}

impl Drop for Share {
    fn drop(&mut self) {
        if !self.reserved {
            self.backend.shared.fetch_sub(1, Ordering::Relaxed);
            return;
        }
        self.backend.reserved.fetch_sub(1, Ordering::Relaxed);
        let mut reserves = lock(&self.connection.reserves);
        if let Some(at) = reserves
            .iter()
            .position(|(b, _)| Arc::ptr_eq(b, &self.backend))
        {
            reserves[at].1 -= 1;
            if reserves[at].1 == 0 {
                reserves.swap_remove(at);
            }
        }
    }
}

/// What a forwarded call holds until it ends.
#[derive(Default)]
pub(crate) struct Held {
    /// Held for its drop: the connection is busy until the call ends.
    pub(crate) _activity: Option<Activity>,
    pub(crate) permit: Option<OwnedSemaphorePermit>,
    pub(crate) share: Option<Share>,
    pub(crate) link: Option<LinkGuard>,
}

/// A forwarded call's response body: the backend's, holding the call's admission until hyper
/// drops it, with local detail taken out of the error message in its trailers.
pub(crate) struct CallBody {
    inner: tonic::body::Body,
    _held: Held,
    scrubber: Arc<Scrubber>,
}

impl CallBody {
    pub(crate) fn new(inner: tonic::body::Body, held: Held, scrubber: Arc<Scrubber>) -> CallBody {
        CallBody {
            inner,
            _held: held,
            scrubber,
        }
    }
}

impl Body for CallBody {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => match frame.into_trailers() {
                Ok(mut trailers) => {
                    this.scrubber.trailers(&mut trailers);
                    Poll::Ready(Some(Ok(Frame::trailers(trailers))))
                }
                Err(frame) => Poll::Ready(Some(Ok(frame))),
            },
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_is_idle_only_a_timeout_after_its_last_call() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        runtime.block_on(async {
            let connection = RemoteConnection::new(4);
            let call = connection.begin();
            let started = Instant::now();
            let timeout = Duration::from_millis(100);
            let ends = async {
                tokio::time::sleep(Duration::from_millis(300)).await;
                drop(call);
            };
            let ((), ()) = tokio::join!(connection.idle(timeout), ends);
            let took = started.elapsed();
            assert!(took >= Duration::from_millis(400), "idle after {took:?}");
            assert!(took < Duration::from_secs(2), "idle after {took:?}");
        });
    }

    #[test]
    fn failures_to_authenticate_in_a_row_close_a_connection() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let connection = RemoteConnection::new(4);
        for _ in 1..MAX_FAILED_AUTHENTICATIONS {
            assert!(!connection.failed_authentication());
        }
        connection.authenticated();
        for _ in 1..MAX_FAILED_AUTHENTICATIONS {
            assert!(!connection.failed_authentication());
        }
        let closes = || {
            runtime.block_on(async {
                tokio::time::timeout(Duration::from_millis(50), connection.closing())
                    .await
                    .is_ok()
            })
        };
        assert!(!closes(), "closing before the limit");
        assert!(connection.failed_authentication());
        assert!(closes(), "not closing at the limit");
        // Failed calls are no activity: the connection goes idle as if they never came.
        assert_eq!(connection.active.load(Ordering::Relaxed), 0);
    }
}
