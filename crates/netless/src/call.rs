//! What a caller passes with a call and gets back: options, the reply, and the server-side
//! view of a request with the builder for its response.
//!
//! Plain data; no shared memory, no I/O (a deferred reply's handle lives in the server).

use std::time::{Duration, Instant};

use crate::metadata::Metadata;
use crate::server::DeferredReply;
use crate::status::Status;

/// Per-call options: deadline and request metadata.
///
/// ```
/// use std::time::Duration;
/// let opts = netless::CallOptions::new().timeout(Duration::from_millis(50)).metadata("x-id", "1");
/// assert!(opts.deadline().is_some());
/// ```
#[derive(Clone, Debug, Default)]
pub struct CallOptions {
    deadline: Option<Instant>,
    metadata: Metadata,
}

impl CallOptions {
    /// No deadline (the client's default timeout applies), no metadata.
    pub fn new() -> CallOptions {
        CallOptions::default()
    }

    /// Fail with `DEADLINE_EXCEEDED` if no reply arrived within `timeout` from now.
    pub fn timeout(mut self, timeout: Duration) -> CallOptions {
        self.deadline = Instant::now().checked_add(timeout);
        self
    }

    /// Fail with `DEADLINE_EXCEEDED` if no reply arrived by `deadline`.
    pub fn deadline_at(mut self, deadline: Instant) -> CallOptions {
        self.deadline = Some(deadline);
        self
    }

    /// Adds a request metadata pair.
    pub fn metadata(mut self, key: &str, value: impl AsRef<[u8]>) -> CallOptions {
        self.metadata.insert(key, value);
        self
    }

    /// Replaces the request metadata.
    pub fn with_metadata(mut self, metadata: Metadata) -> CallOptions {
        self.metadata = metadata;
        self
    }

    /// The deadline, if any.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// The request metadata.
    pub fn request_metadata(&self) -> &Metadata {
        &self.metadata
    }
}

/// A successful reply: response metadata and payload.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reply {
    /// Metadata the server attached.
    pub metadata: Metadata,
    /// The response bytes.
    pub payload: Vec<u8>,
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
