//! Calling over a software-coherent fabric: a request goes out as records on the
//! connection's request ring, and the reply is polled from its response ring (see
//! `crate::polled`). Calls share the connection: each sends its request whole under the
//! rings' lock, then waits for its reply without holding it, taking turns at the response
//! ring; a reply for another waiting call is kept for it, one for a call that gave up is
//! dropped.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::connection::Connection;
use super::slots::lock;
use crate::polled::{decode_reply, encode_request, Backoff, Body, ClientRings, Inbox, Outbox};
use crate::status::Status;
use crate::wire::metadata::Metadata;

/// A connection's rings, for its calls.
pub(crate) struct PolledClient {
    state: Mutex<State>,
    /// The pool's pages as this member sees them, when payloads may go by reference.
    pages: Option<Mutex<netless_pool::PagesView>>,
}

struct State {
    rings: ClientRings,
    inbox: Inbox,
    outbox: Outbox,
    next_id: u64,
    /// Calls waiting for their replies.
    waiting: HashSet<u64>,
    /// Replies that arrived for a waiting call while another call read the ring.
    arrived: HashMap<u64, Vec<u8>>,
}

impl PolledClient {
    pub(crate) fn new(rings: ClientRings, pages: Option<netless_pool::PagesView>) -> PolledClient {
        PolledClient {
            pages: pages.map(Mutex::new),
            state: Mutex::new(State {
                rings,
                inbox: Inbox::default(),
                outbox: Outbox::default(),
                next_id: 1,
                waiting: HashSet::new(),
                arrived: HashMap::new(),
            }),
        }
    }

    /// Calls `method` and writes the reply payload into `out`; the reply metadata.
    pub(crate) fn call(
        &self,
        conn: &Connection,
        method: &str,
        metadata: &Metadata,
        payload: &[u8],
        deadline: Option<Instant>,
        out: &mut Vec<u8>,
    ) -> Result<Metadata, Status> {
        out.clear();
        // A large payload goes into pool pages, written back before the Ref leaves: the
        // buffer is held until the reply, by which time the server has mapped it.
        let by_ref = match (&conn.pool, &self.pages) {
            (Some(pool), Some(pages)) if payload.len() >= conn.config.ref_threshold => {
                let pool_error = |e: netless_pool::PoolError| {
                    Status::resource_exhausted(format!("pass by reference: {e}"))
                };
                let buf = pool.alloc(payload.len()).map_err(pool_error)?;
                lock(pages).write_back(&buf, payload).map_err(pool_error)?;
                let r = buf.share().map_err(pool_error)?;
                Some((buf, r.to_bytes()))
            }
            _ => None,
        };
        let body = match &by_ref {
            Some((_, r)) => Body::ByRef {
                r: *r,
                crc: netless_ring::polled::crc32c(payload),
            },
            None => Body::Inline(payload),
        };
        let remaining = deadline.map(|d| {
            u64::try_from(d.saturating_duration_since(Instant::now()).as_nanos())
                .unwrap_or(u64::MAX - 1)
        });
        let mut message = Vec::new();
        encode_request(remaining, method, metadata, body, &mut message);
        if message.len() > conn.server_max_message {
            return Err(Status::resource_exhausted(format!(
                "the request of {} bytes exceeds the {} service `{}` accepts",
                message.len(),
                conn.server_max_message,
                conn.service
            )));
        }
        let call_id = self.send(conn, &message, deadline)?;
        let result = self.wait(conn, call_id, deadline, out);
        lock(&self.state).waiting.remove(&call_id);
        result
    }

    /// Queues a request whole and pushes it out (a request another call left half sent
    /// goes first: the server reads one stream); its call id.
    fn send(
        &self,
        conn: &Connection,
        message: &[u8],
        deadline: Option<Instant>,
    ) -> Result<u64, Status> {
        let mut backoff = Backoff::new(
            conn.config.wait.spin,
            conn.max_sleep.min(Duration::from_millis(1)),
        );
        let mut st = lock(&self.state);
        // Requests that could not go out pile up only so far: a server that stopped reading
        // them fails the connection rather than this process's memory.
        if st.outbox.pending() > 2 * st.rings.requests.max_record_len() + message.len() {
            return Err(fail(
                conn,
                Status::unavailable(format!(
                    "service `{}` stopped reading its requests; the connection is closed",
                    conn.service
                )),
            ));
        }
        let call_id = st.next_id;
        st.next_id += 1;
        let max_record = st.rings.requests.max_record_len();
        st.outbox.queue(call_id, message, max_record);
        st.waiting.insert(call_id);
        loop {
            let s = &mut *st;
            match s.outbox.flush(&mut s.rings.requests) {
                Ok(true) => return Ok(call_id),
                Ok(false) => {}
                Err(status) => {
                    s.waiting.remove(&call_id);
                    return Err(fail(conn, status));
                }
            }
            if let Err(status) = check(conn, deadline) {
                // Its records stay queued: the server reads one stream, and a request cut
                // short would garble the next. It answers late, to nobody.
                s.waiting.remove(&call_id);
                return Err(status);
            }
            drop(st);
            backoff.wait();
            st = lock(&self.state);
        }
    }

    /// Waits for call `call_id`'s reply.
    fn wait(
        &self,
        conn: &Connection,
        call_id: u64,
        deadline: Option<Instant>,
        out: &mut Vec<u8>,
    ) -> Result<Metadata, Status> {
        let mut backoff = Backoff::new(
            conn.config.wait.spin,
            conn.max_sleep.min(Duration::from_millis(1)),
        );
        loop {
            let reply = {
                let mut st = lock(&self.state);
                let s = &mut *st;
                // Requests other calls left in the outbox go on while we wait.
                s.outbox
                    .flush(&mut s.rings.requests)
                    .map_err(|e| fail(conn, e))?;
                let mut mine = s.arrived.remove(&call_id);
                while mine.is_none() {
                    let polled = s.inbox.poll(&mut s.rings.replies, conn.config.max_message);
                    match polled.map_err(|e| fail(conn, e))? {
                        Some((id, reply)) if id == call_id => mine = Some(reply),
                        Some((id, reply)) if s.waiting.contains(&id) => {
                            s.arrived.insert(id, reply);
                        }
                        // The late reply of a call that gave up.
                        Some(_) => {}
                        None => break,
                    }
                }
                mine
            };
            if let Some(reply) = reply {
                let (status, metadata, at) = decode_reply(&reply)?;
                status?;
                out.extend_from_slice(&reply[at..]);
                return Ok(metadata);
            }
            check(conn, deadline)?;
            backoff.wait();
        }
    }
}

/// Fails the connection with `status` (its rings cannot be trusted or used any more); the
/// status, for the call that found out.
fn fail(conn: &Connection, status: Status) -> Status {
    conn.fail(status.clone());
    status
}

/// Fails a call whose connection died or whose deadline passed.
fn check(conn: &Connection, deadline: Option<Instant>) -> Result<(), Status> {
    if conn.is_dead() {
        return Err(conn.death_status());
    }
    if deadline.is_some_and(|d| Instant::now() >= d) {
        return Err(Status::deadline_exceeded(format!(
            "no reply from service `{}` before the deadline",
            conn.service
        )));
    }
    Ok(())
}
