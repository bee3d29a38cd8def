//! What a service implements, and what it sees of a call: the [`Handler`] trait, the
//! [`Request`] it is given and the [`ResponseBuilder`] it answers into.
//!
//! Plain data and one trait: no shared memory, no I/O (a deferred reply's handle,
//! [`DeferredReply`], sends through the server).

use std::time::Instant;

use super::deferred::DeferredReply;
use crate::segment::WakeSource;
use crate::status::Status;
use crate::wire::metadata::Metadata;

/// Serves one method table. Implemented for closures.
///
/// ```
/// use netless::{Handler, Request, ResponseBuilder, Status};
/// let echo = |req: &Request<'_>, resp: &mut ResponseBuilder| -> Result<(), Status> {
///     resp.payload.extend_from_slice(req.payload);
///     Ok(())
/// };
/// fn is_handler(_: &impl Handler) {}
/// is_handler(&echo);
/// ```
pub trait Handler: Send + Sync + 'static {
    /// Handles one request, writing the response into `response`; an `Err` becomes the call's
    /// status.
    fn call<'a>(
        &self,
        request: &Request<'a>,
        response: &mut ResponseBuilder<'a>,
    ) -> Result<(), Status>;

    /// Runs work of the handler's own on worker `worker`'s thread, such as collecting the
    /// replies of calls it made on a [`Pipeline`](crate::Pipeline) and sending the
    /// [`DeferredReply`]s waiting for them. Returns whether it did anything.
    ///
    /// A worker calls it after every queue entry it serves and whenever its queue is empty
    /// (while it spins, and before it sleeps: a `true` keeps it awake). Replies sent from
    /// here notify each client once, when `poll` returns. The default does nothing.
    fn poll(&self, worker: usize) -> bool {
        let _ = worker;
        false
    }

    /// What else should wake worker `worker` when it sleeps: the doorbells of the
    /// connections whose replies [`Handler::poll`] collects ([`Pipeline::wake_source`],
    /// [`Client::wake_source`]). Asked whenever the worker starts serving a new set of trust
    /// groups; the worker sleeps on one doorbell per group and the first of these, up to
    /// [`WAIT_ANY_MAX`](netless_ring::WAIT_ANY_MAX) in all, and polls at least every 100 ms
    /// anyway. The default is none.
    ///
    /// [`Pipeline::wake_source`]: crate::Pipeline::wake_source
    /// [`Client::wake_source`]: crate::Client::wake_source
    fn wake_sources(&self, worker: usize) -> Vec<WakeSource> {
        let _ = worker;
        Vec::new()
    }

    /// Whether [`Handler::poll`] may do anything: `false` for a closure, which cannot have
    /// a `poll` of its own, so its workers skip the call (and the ring section around it)
    /// after every entry.
    #[doc(hidden)]
    fn polls(&self) -> bool {
        true
    }
}

impl<F> Handler for F
where
    F: for<'a> Fn(&Request<'a>, &mut ResponseBuilder<'a>) -> Result<(), Status>
        + Send
        + Sync
        + 'static,
{
    fn call<'a>(
        &self,
        request: &Request<'a>,
        response: &mut ResponseBuilder<'a>,
    ) -> Result<(), Status> {
        self(request, response)
    }

    fn polls(&self) -> bool {
        false
    }
}

/// A request as a handler sees it. The payload borrows the shared receive buffer (no copy)
/// for the duration of the handler.
#[derive(Debug)]
pub struct Request<'a> {
    /// The method name the client called.
    pub method: &'a str,
    /// Request metadata.
    pub metadata: Metadata,
    /// The request bytes.
    pub payload: &'a [u8],
    /// When the client stops waiting, if it set a deadline.
    pub deadline: Option<Instant>,
}

/// Where a handler writes its response: metadata and payload, or (with
/// [`ResponseBuilder::reply_with`]) bytes it borrows from the request, which the server copies
/// straight into the response ring without an intermediate buffer.
///
/// ```
/// use netless::{Request, ResponseBuilder, Status};
/// // Echo without copying the payload into a buffer first.
/// fn echo<'a>(req: &Request<'a>, resp: &mut ResponseBuilder<'a>) -> Result<(), Status> {
///     resp.reply_with(req.payload);
///     Ok(())
/// }
/// ```
#[derive(Debug, Default)]
pub struct ResponseBuilder<'a> {
    /// Response metadata.
    pub metadata: Metadata,
    /// Response bytes (ignored once [`ResponseBuilder::reply_with`] was called).
    pub payload: Vec<u8>,
    borrowed: Option<&'a [u8]>,
    defer_hook: Option<DeferHook<'a>>,
    deferred: bool,
}

/// Makes the [`DeferredReply`] for a call, given its id.
type DeferFn<'a> = dyn Fn(u64) -> Result<DeferredReply, Status> + 'a;

/// How to defer the call being handled: one hook serves every call of a batch, each
/// setting its own id.
#[derive(Clone, Copy)]
struct DeferHook<'a> {
    make: &'a DeferFn<'a>,
    call_id: u64,
}

impl std::fmt::Debug for DeferHook<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DeferHook")
    }
}

impl<'a> ResponseBuilder<'a> {
    /// Replies with `bytes`, typically borrowed from the request (forwarding, echo), without
    /// copying them into [`ResponseBuilder::payload`].
    pub fn reply_with(&mut self, bytes: &'a [u8]) {
        self.borrowed = Some(bytes);
    }

    /// Replies later instead of now: returns a handle that sends the reply from any
    /// thread, and the worker moves on to other calls as soon as the handler returns. Once
    /// deferred, what the handler writes here or returns is not sent; only the handle
    /// replies (see [`DeferredReply`]).
    ///
    /// Fails with `UNAVAILABLE` if the client's connection is already closed, and with
    /// `FAILED_PRECONDITION` on a builder not made by a server.
    pub fn defer(&mut self) -> Result<DeferredReply, Status> {
        let hook = self.defer_hook.ok_or_else(|| {
            Status::new(
                crate::Code::FailedPrecondition,
                "only a call being served by a netless Server can defer",
            )
        })?;
        let reply = (hook.make)(hook.call_id)?;
        self.deferred = true;
        Ok(reply)
    }

    /// A builder that reuses `metadata` and `payload`'s allocations.
    pub(crate) fn recycle(mut metadata: Metadata, mut payload: Vec<u8>) -> ResponseBuilder<'a> {
        metadata.clear();
        payload.clear();
        ResponseBuilder {
            metadata,
            payload,
            borrowed: None,
            defer_hook: None,
            deferred: false,
        }
    }

    pub(crate) fn set_defer_hook(&mut self, make: &'a DeferFn<'a>, call_id: u64) {
        self.defer_hook = Some(DeferHook { make, call_id });
    }

    /// Ready for the next call, `call_id`, of a batch served with this builder: what the
    /// last call wrote is gone (allocations kept), the defer hook names the new call.
    #[inline(always)]
    pub(crate) fn reset(&mut self, call_id: u64) {
        self.metadata.clear();
        self.payload.clear();
        self.borrowed = None;
        self.deferred = false;
        if let Some(hook) = &mut self.defer_hook {
            hook.call_id = call_id;
        }
    }

    pub(crate) fn is_deferred(&self) -> bool {
        self.deferred
    }

    pub(crate) fn into_parts(self) -> (Metadata, Vec<u8>) {
        (self.metadata, self.payload)
    }

    /// The response bytes to send.
    pub(crate) fn body(&self) -> &[u8] {
        self.borrowed.unwrap_or(&self.payload)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_handlers_with_a_poll_of_their_own_are_polled() {
        fn echo<'a>(req: &Request<'a>, resp: &mut ResponseBuilder<'a>) -> Result<(), Status> {
            resp.payload.extend_from_slice(req.payload);
            Ok(())
        }
        struct Polling;
        impl Handler for Polling {
            fn call<'a>(&self, _: &Request<'a>, _: &mut ResponseBuilder<'a>) -> Result<(), Status> {
                Ok(())
            }
            fn poll(&self, _: usize) -> bool {
                true
            }
        }
        assert!(!echo.polls());
        assert!(Polling.polls());
    }
}
