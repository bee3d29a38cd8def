//! Dispatching one whole request to the handler: the method name (a private, validated
//! copy), metadata, deadline and payload (mapped from the page pool when it came as a Ref)
//! make the [`Request`]; the handler's answer, its error, a refusal under the SLO or the
//! runtime's own control methods make the reply, which goes to the worker's outbox.
//!
//! The handler runs behind `catch_unwind`: its panic fails the call, not the worker.

use std::sync::Arc;

use super::conn::Conn;
use super::handler::{Request, ResponseBuilder};
use super::worker::WorkerContext;
use crate::segment::layout::bump;
use crate::status::{Code, ReplyCode, Status};
use crate::sync::Ordering;
use crate::wire::bytes::same_bytes;
use crate::wire::header::{wire_flags, WireHeader};
use crate::wire::metadata::Metadata;

impl WorkerContext<'_> {
    /// Runs the handler on a whole request body, calls `done_with_body` once nothing reads
    /// the body any more, and sends the response. `same_method`: the body names no method,
    /// the request calls the one this worker served last (the previous request of its
    /// batch).
    pub(super) fn dispatch(
        &mut self,
        conn: &Arc<Conn>,
        h: &WireHeader,
        body: &[u8],
        same_method: bool,
        done_with_body: impl FnOnce(),
    ) -> Result<(), &'static str> {
        let server = self.server;
        let method_end = h.method_len as usize;
        let md_end = method_end + h.metadata_len as usize;
        // The handler sees a private copy of the method name, validated, so the `&str` cannot
        // change under it. Calls mostly repeat the last method: then the copy we hold is
        // already the one (compared against the shared bytes, never taken from them).
        let mut method = std::mem::take(&mut self.method);
        if !same_method && !same_bytes(method.as_bytes(), &body[..method_end]) {
            let mut bytes = method.into_bytes();
            bytes.clear();
            bytes.extend_from_slice(&body[..method_end]);
            method = match String::from_utf8(bytes) {
                Ok(method) => method,
                Err(_) => {
                    // The cached name is gone (empty now): so is what it was.
                    self.method_is_control = false;
                    done_with_body();
                    return Err("method name is not UTF-8");
                }
            };
            self.method_is_control = method.starts_with(crate::control::PREFIX);
        }
        let is_control = self.method_is_control;
        let metadata = if md_end == method_end {
            Metadata::new()
        } else {
            let Ok(metadata) = Metadata::decode(&body[method_end..md_end]) else {
                self.method = method;
                done_with_body();
                return Err("malformed request metadata");
            };
            metadata
        };
        // The clock is read only for calls that carry a deadline.
        let (deadline, expired) = if h.deadline_ns == 0 {
            (None, false)
        } else {
            let now_ns = netless_shm::monotonic_ns();
            let deadline = netless_shm::monotonic_ns_to_instant(h.deadline_ns);
            (Some(deadline), h.deadline_ns <= now_ns)
        };
        let mut builder = ResponseBuilder::recycle(
            std::mem::take(&mut self.metadata),
            std::mem::take(&mut self.payload),
        );
        // A payload passed by reference: map the client's pages (declared before the builder,
        // so a reply borrowing them with `reply_with` is sent before they are released).
        let mapped;
        let copied;
        let mut payload = &body[md_end..];
        let mut pool_error = None;
        // A request about to be refused for its wait maps nothing (control calls, never
        // refused, carry no Ref).
        let refused = self.refused.filter(|_| !is_control);
        if h.reserved[0] & wire_flags::PAYLOAD_REF != 0 && refused.is_none() {
            match server.map_payload(conn, payload) {
                Ok(buf) => {
                    mapped = buf;
                    payload = match mapped.as_slice() {
                        Some(slice) => slice,
                        None => {
                            copied = mapped.to_vec();
                            &copied
                        }
                    };
                }
                Err(status) => pool_error = Some(status),
            }
        }
        // Built only if the handler asks for it, so a plain call clones no `Arc`.
        let defer = |call_id| server.defer(conn, call_id);
        builder.set_defer_hook(&defer, h.call_id);
        let result = if let Some(status) = pool_error {
            Err(status)
        } else if expired {
            Err(Status::deadline_exceeded(
                "deadline expired before the server started the call",
            ))
        } else if let Some(op) = is_control
            .then(|| method.strip_prefix(crate::control::PREFIX))
            .flatten()
        {
            server.control_call(conn.uid, op, payload, &mut builder)
        } else if let Some(waited) = refused {
            server.shed.fetch_add(1, Ordering::Relaxed);
            Err(Status::nack(format!(
                "service `{}` refused the request without running it: it waited {waited} µs \
                 in the queue, too long to finish within the SLO of {} µs; retry later or on \
                 another replica",
                server.service,
                self.shed.slo_us()
            )))
        } else {
            // Take the response ring's next lines while the handler runs (a guess: a reply
            // about as long as the request). Not for a batch's requests: their replies are
            // gathered privately and go into the ring when the batch ends.
            if !self.outbox.collecting {
                conn.prefetch_reply(body.len());
            }
            let request = Request {
                method: &method,
                metadata,
                payload,
                deadline,
            };
            self.call_handler(&request, &mut builder)
        };
        let refused = refused.is_some();
        let sent = self.finish_call(conn, h.call_id, h.body_len, result, &builder, refused);
        // The blocks go back to the client only now: a reply may borrow them, and the store
        // into the block table (whose line the client writes too) must not hold up the
        // reply's stores, which the CPU commits in order. The client claims its next call's
        // blocks while it waits for this reply, so it is not waiting for these.
        done_with_body();
        // While idle, start owning the lines a reply like this one will use next time.
        if !self.outbox.collecting {
            conn.prefetch_next_reply(builder.body().len());
        }
        let (metadata, payload) = builder.into_parts();
        self.metadata = metadata;
        self.payload = payload;
        self.method = method;
        sent
    }

    /// Runs `f` with one handler builder and one `Request` (the method served last, no
    /// metadata or deadline, its payload for `f` to set) for a run of calls on `conn`, made
    /// from this worker's recycled parts and given back to it afterwards.
    #[inline(always)]
    pub(super) fn with_builder<R>(
        &mut self,
        conn: &Arc<Conn>,
        f: impl for<'r> FnOnce(&mut Request<'r>, &mut ResponseBuilder<'r>, &'r mut Self) -> R,
    ) -> R {
        let server = self.server;
        let method = std::mem::take(&mut self.method);
        let mut builder = ResponseBuilder::recycle(
            std::mem::take(&mut self.metadata),
            std::mem::take(&mut self.payload),
        );
        let defer = |call_id| server.defer(conn, call_id);
        builder.set_defer_hook(&defer, 0);
        let mut request = Request {
            method: &method,
            metadata: Metadata::new(),
            payload: &[],
            deadline: None,
        };
        let outcome = f(&mut request, &mut builder, self);
        drop(request);
        let (metadata, payload) = builder.into_parts();
        self.metadata = metadata;
        self.payload = payload;
        self.method = method;
        outcome
    }

    /// After the handler: counts the call (an OK one in the tally, the rest at once) and
    /// sends its reply, unless the handler deferred it (the handle sends it then).
    /// `refused`: the call was refused without running, which its status code says.
    #[inline(always)]
    pub(super) fn finish_call(
        &mut self,
        conn: &Arc<Conn>,
        call_id: u64,
        body_len: u32,
        result: Result<(), Status>,
        builder: &ResponseBuilder<'_>,
        refused: bool,
    ) -> Result<(), &'static str> {
        let stats = self.stats;
        let deferred = builder.is_deferred();
        let body = builder.body();
        if result.is_ok() && !deferred {
            // Tallied, and added to the stats before the reply can go out: at once for a
            // lone request, when the batch's replies go out for a batched one.
            self.outbox.count_ok(u64::from(body_len), body.len() as u64);
        } else {
            // An error, or a deferred reply (sent by whoever holds it): counted now.
            bump(&stats.calls, 1);
            bump(&stats.bytes_in, u64::from(body_len));
            let code = match &result {
                Ok(()) => Code::Ok,
                Err(status) => status.code(),
            };
            bump(&stats.by_code[code as usize % 17], 1);
        }
        let sent = match result {
            // The handle sends the reply (or its drop sends an error).
            _ if deferred => Ok(()),
            Ok(()) => self
                .outbox
                .reply(conn, call_id, Code::Ok.into(), &builder.metadata, body),
            Err(status) => {
                bump(&stats.errors, 1);
                let message = status.message().as_bytes();
                // Only a refusal says "not run": a handler's error (even a NACK it got from
                // a call of its own) comes from a call that ran.
                let code = if refused {
                    ReplyCode::of(&status)
                } else {
                    status.code().into()
                };
                self.outbox.reply_error(conn, call_id, code, message)
            }
        };
        sent.inspect_err(|why| {
            tracing::debug!("dropping connection {}: {why}", conn.index);
        })
    }

    /// Runs the handler; a panic fails the call, not the worker (which would otherwise die
    /// holding its connection's `serving` mark).
    #[inline(always)]
    pub(super) fn call_handler<'a>(
        &self,
        request: &Request<'a>,
        builder: &mut ResponseBuilder<'a>,
    ) -> Result<(), Status> {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.server.handler.call(request, builder)
        }))
        .unwrap_or_else(|_| {
            Err(Status::internal(format!(
                "the handler of `{}` panicked; see the server's log",
                request.method
            )))
        })
    }
}
