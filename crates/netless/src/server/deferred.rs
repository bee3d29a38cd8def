//! Replies sent later: the [`DeferredReply`] a handler gets from
//! [`ResponseBuilder::defer`](super::ResponseBuilder::defer), which any thread may send (or
//! drop, which fails the call), and the [`ConnectionWatch`] that tells whether the caller is
//! still there.
//!
//! A deferred reply sent on a worker inside a [`NotifySection`] to a pipelined client joins
//! that client's reply batch for the section; any other goes straight into the ring.

use std::sync::Arc;

use super::conn::Conn;
use super::notify::{NotifySection, PendingReplies, ANY_PENDING, PENDING};
use super::state::ServerState;
use crate::status::{Code, ReplyCode, Status};
use crate::sync::Ordering;
use crate::wire::metadata::Metadata;
use crate::wire::reply::ReplyBatch;

/// The reply to a call, sent later and from any thread: what
/// [`ResponseBuilder::defer`](crate::ResponseBuilder::defer) returns.
///
/// The handler returns at once and the worker serves other calls; whoever holds the handle
/// replies when the answer is ready (long polls, replies that wait for another event).
/// Dropping it unsent fails the call with `INTERNAL`, so a client never waits for a reply
/// nobody will send.
///
/// ```no_run
/// use netless::{Request, ResponseBuilder, Server, ServerConfig, Status, Metadata};
/// let server = Server::bind("demo.Later", ServerConfig::default(),
///     |_req: &Request<'_>, resp: &mut ResponseBuilder<'_>| -> Result<(), Status> {
///         let reply = resp.defer()?;
///         std::thread::spawn(move || {
///             std::thread::sleep(std::time::Duration::from_millis(10));
///             let _ = reply.send(&Metadata::new(), b"later");
///         });
///         Ok(())
///     })?;
/// # Ok::<(), netless::Status>(())
/// ```
pub struct DeferredReply {
    server: Arc<ServerState>,
    conn: Arc<Conn>,
    call_id: u64,
    sent: bool,
}

impl DeferredReply {
    /// Sends a successful reply. Fails with `UNAVAILABLE` if the client is gone (nothing
    /// was sent) or broke the protocol while the reply was written (its connection is closed).
    pub fn send(mut self, metadata: &Metadata, payload: &[u8]) -> Result<(), Status> {
        self.sent = true;
        self.write(Code::Ok.into(), metadata, payload)
    }

    /// Fails the call with `status`.
    pub fn fail(mut self, status: &Status) -> Result<(), Status> {
        self.sent = true;
        // The handler ran this call: its error never says "not run".
        self.write(
            status.code().into(),
            &Metadata::new(),
            status.message().as_bytes(),
        )
    }

    /// Whether the client's connection is gone (or the server is stopping): a reply would
    /// reach no one, and work for it can stop.
    pub fn is_closed(&self) -> bool {
        self.conn.is_dead() || self.server.is_stopping()
    }

    /// A handle that tells, later, whether this call's client is still connected (for work
    /// that outlives the reply, such as a stream the client keeps polling).
    pub fn watch(&self) -> ConnectionWatch {
        ConnectionWatch {
            server: self.server.clone(),
            conn: self.conn.clone(),
        }
    }

    fn write(&self, code: ReplyCode, metadata: &Metadata, payload: &[u8]) -> Result<(), Status> {
        if self.is_closed() {
            return Err(Status::unavailable(
                "the client's connection is closed; the reply was not sent",
            ));
        }
        if let Some(polled) = self.conn.polled.get().and_then(std::sync::Weak::upgrade) {
            return polled.respond(self.call_id, code, metadata, payload);
        }
        if NotifySection::active() && self.conn.pipelined.load(Ordering::Relaxed) {
            // On a worker, inside a batch or its handler's poll: gathered per connection and
            // sent as reply batches when the section ends.
            let md_len = metadata.encoded_len();
            let entry =
                ReplyBatch::entry_len(self.conn.limits, self.call_id, md_len, payload.len());
            if let Some(entry) = entry {
                self.gather(entry, code, metadata, payload);
                return Ok(());
            }
        }
        self.server
            .respond(&self.conn, self.call_id, code, metadata, payload)
            .map_err(|why| {
                self.server.violated(&self.conn, why);
                Status::unavailable(format!("the client's connection was closed: {why}"))
            })
    }
}

impl DeferredReply {
    /// Adds this reply to the thread's pending batch for its connection (sending that batch
    /// first if the reply would not fit it).
    fn gather(&self, entry: usize, code: ReplyCode, metadata: &Metadata, payload: &[u8]) {
        PENDING.with_borrow_mut(|pending| {
            let at = match pending
                .iter()
                .position(|p| Arc::ptr_eq(&p.conn, &self.conn))
            {
                Some(at) => at,
                None => {
                    pending.push(PendingReplies {
                        server: self.server.clone(),
                        conn: self.conn.clone(),
                        batch: ReplyBatch::default(),
                    });
                    pending.len() - 1
                }
            };
            let p = &mut pending[at];
            if !p.batch.fits(p.conn.limits, entry) {
                p.server.send_deferred_batch(&p.conn, &mut p.batch);
            }
            p.batch.push(self.call_id, code, metadata, payload);
        });
        ANY_PENDING.set(true);
    }
}

/// Whether a client is still connected: see [`DeferredReply::watch`].
#[derive(Clone)]
pub struct ConnectionWatch {
    server: Arc<ServerState>,
    conn: Arc<Conn>,
}

impl ConnectionWatch {
    /// Whether the client's connection is gone (it hung up, died or was closed for breaking
    /// the protocol) or the server is stopping.
    pub fn is_closed(&self) -> bool {
        self.conn.is_dead() || self.server.is_stopping()
    }

    /// Whether `reply` answers a call from the same connection as this watch.
    pub fn same_connection(&self, reply: &DeferredReply) -> bool {
        Arc::ptr_eq(&self.conn, &reply.conn)
    }
}

impl std::fmt::Debug for ConnectionWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionWatch")
            .field("closed", &self.is_closed())
            .finish()
    }
}

impl Drop for DeferredReply {
    fn drop(&mut self) {
        if !self.sent {
            let _ = self.write(
                Code::Internal.into(),
                &Metadata::new(),
                b"the server dropped this call without replying",
            );
        }
    }
}

impl std::fmt::Debug for DeferredReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeferredReply")
            .field("service", &self.server.service)
            .field("call_id", &self.call_id)
            .field("closed", &self.is_closed())
            .finish()
    }
}

impl ServerState {
    /// A handle to reply later to call `call_id` on `conn`.
    pub(super) fn defer(&self, conn: &Arc<Conn>, call_id: u64) -> Result<DeferredReply, Status> {
        let server = self
            .this
            .upgrade()
            .ok_or_else(|| Status::unavailable("the server is shutting down"))?;
        if conn.is_dead() {
            return Err(Status::unavailable("the client's connection is closed"));
        }
        let conn = conn.clone();
        self.deferring.store(true, Ordering::Relaxed);
        Ok(DeferredReply {
            server,
            conn,
            call_id,
            sent: false,
        })
    }
}
