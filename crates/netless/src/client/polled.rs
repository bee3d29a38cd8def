//! Calling over a software-coherent fabric: a request goes out as records on the
//! connection's request ring, and the reply is polled from its response ring (see
//! `crate::polled`). One call at a time per connection: the rings carry one message stream
//! each way, in order.

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
    message: Vec<u8>,
    next_id: u64,
}

impl PolledClient {
    pub(crate) fn new(rings: ClientRings, pages: Option<netless_pool::PagesView>) -> PolledClient {
        PolledClient {
            pages: pages.map(Mutex::new),
            state: Mutex::new(State {
                rings,
                inbox: Inbox::default(),
                outbox: Outbox::default(),
                message: Vec::new(),
                next_id: 1,
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
        let mut guard = lock(&self.state);
        let st = &mut *guard;
        let call_id = st.next_id;
        st.next_id += 1;
        let remaining = deadline.map(|d| {
            u64::try_from(d.saturating_duration_since(Instant::now()).as_nanos())
                .unwrap_or(u64::MAX - 1)
        });
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
        encode_request(remaining, method, metadata, body, &mut st.message);
        if st.message.len() > conn.server_max_message {
            return Err(Status::resource_exhausted(format!(
                "the request of {} bytes exceeds the {} service `{}` accepts",
                st.message.len(),
                conn.server_max_message,
                conn.service
            )));
        }
        let max_record = st.rings.requests.max_record_len();
        st.outbox.queue(call_id, &st.message, max_record);
        let spin_until = Instant::now() + conn.config.wait.spin;
        let mut backoff = Backoff::new(conn.max_sleep.min(Duration::from_millis(1)));
        // A request left half sent by a call that gave up goes first: the server reads one
        // stream.
        while !st.outbox.flush(&mut st.rings.requests)? {
            check(conn, deadline)?;
            backoff.wait();
        }
        backoff.reset();
        loop {
            match st
                .inbox
                .poll(&mut st.rings.replies, conn.config.max_message)?
            {
                Some((id, reply)) if id == call_id => {
                    let (status, metadata, at) = decode_reply(&reply)?;
                    status?;
                    out.extend_from_slice(&reply[at..]);
                    return Ok(metadata);
                }
                // The late reply of a call that gave up.
                Some(_) => continue,
                None => {}
            }
            check(conn, deadline)?;
            if Instant::now() >= spin_until {
                backoff.wait();
            } else {
                std::hint::spin_loop();
            }
        }
    }
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
