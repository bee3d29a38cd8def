//! Serving software-coherent fabric connections: poller threads that take requests from
//! each connection's request ring, run the handler, and put replies on its response ring
//! (see `crate::polled` for the rings and why).
//!
//! Each connection belongs to one poller (its consumer and producer have one user each),
//! which never blocks on it: a reply the ring cannot take yet waits in the connection's
//! outbox while the poller serves the others. A connection leaves when the acceptor retires
//! it (its client hung up or died).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::conn::{lock, Conn};
use super::handler::{Request, ResponseBuilder};
use super::state::ServerState;
use crate::polled::{decode_request, encode_reply, Backoff, Body, Inbox, Outbox, ServerRings};
use crate::status::Status;

/// One client's rings, as its poller serves them.
pub(super) struct PolledConn {
    pub(super) conn: Arc<Conn>,
    /// The pool member its client proved to be: Refs are taken from it alone.
    peer: Option<netless_pool::PeerMember>,
    /// The longest reply body its client accepts.
    client_max: usize,
    state: Mutex<Rings>,
}

struct Rings {
    rings: ServerRings,
    inbox: Inbox,
    outbox: Outbox,
    message: Vec<u8>,
}

impl PolledConn {
    pub(super) fn new(
        conn: Arc<Conn>,
        client_max: usize,
        rings: ServerRings,
        peer: Option<netless_pool::PeerMember>,
    ) -> PolledConn {
        PolledConn {
            conn,
            peer,
            client_max,
            state: Mutex::new(Rings {
                rings,
                inbox: Inbox::default(),
                outbox: Outbox::default(),
                message: Vec::new(),
            }),
        }
    }

    /// Serves what is waiting; whether there was anything to do.
    fn serve(&self, server: &ServerState, pages: &Mutex<Option<netless_pool::PagesView>>) -> bool {
        let mut rings = lock(&self.state);
        let r = &mut *rings;
        let mut busy = false;
        match r.outbox.flush(&mut r.rings.replies) {
            Ok(true) => {}
            Ok(false) => return false,
            Err(status) => {
                self.conn.close(status);
                return false;
            }
        }
        for _ in 0..16 {
            let (call_id, request) = match r
                .inbox
                .poll(&mut r.rings.requests, server.config.max_message)
            {
                Ok(Some(message)) => message,
                Ok(None) => break,
                Err(status) => {
                    server.violated(&self.conn, status.message());
                    return false;
                }
            };
            busy = true;
            let max_record = r.rings.replies.max_record_len();
            let mut response = ResponseBuilder::default();
            let mut r_copy = Vec::new();
            let outcome = match decode_request(&request).and_then(|(left, m, md, body)| {
                let payload = match body {
                    Body::Inline(payload) => payload,
                    Body::ByRef { r, crc } => {
                        self.read_by_ref(server, pages, &r, crc, &mut r_copy)?;
                        &r_copy[..]
                    }
                };
                Ok((left, m, md, payload))
            }) {
                Ok((remaining, method, metadata, payload)) => {
                    let deadline = remaining
                        .and_then(|ns| Instant::now().checked_add(Duration::from_nanos(ns)));
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        Err(Status::deadline_exceeded(
                            "the deadline passed before the call ran",
                        ))
                    } else {
                        let request = Request {
                            method,
                            metadata,
                            payload,
                            deadline,
                        };
                        let result = server.handler.call(&request, &mut response);
                        if response.is_deferred() {
                            Err(Status::unimplemented(
                                "deferred replies are not served over software-coherent rings",
                            ))
                        } else {
                            result
                        }
                    }
                }
                Err(status) => Err(status),
            };
            let body = if outcome.is_ok() {
                response.body()
            } else {
                &[]
            };
            if body.len() > self.client_max {
                encode_reply(
                    Err(&Status::resource_exhausted(format!(
                        "the reply of {} bytes exceeds the {} the client accepts",
                        body.len(),
                        self.client_max
                    ))),
                    &crate::Metadata::new(),
                    &[],
                    &mut r.message,
                );
            } else {
                encode_reply(
                    outcome.as_ref().copied(),
                    &response.metadata,
                    body,
                    &mut r.message,
                );
            }
            r.outbox.queue(call_id, &r.message, max_record);
            match r.outbox.flush(&mut r.rings.replies) {
                Ok(true) => {}
                Ok(false) => break,
                Err(status) => {
                    self.conn.close(status);
                    break;
                }
            }
        }
        busy
    }
}

impl PolledConn {
    /// The bytes of a payload sent by reference: the Ref mapped (only if its client's own),
    /// its pages invalidated and read, and their checksum checked, again for a while if it
    /// does not match (a page not yet written back), never delivered if it never does.
    fn read_by_ref(
        &self,
        server: &ServerState,
        pages: &Mutex<Option<netless_pool::PagesView>>,
        r: &[u8],
        crc: u32,
        out: &mut Vec<u8>,
    ) -> Result<(), Status> {
        let refused = || Status::invalid_argument("a payload by reference from a non-member");
        let (Some(domain), Some(peer)) = (&server.config.domain, &self.peer) else {
            return Err(refused());
        };
        let r = netless_pool::Ref::from_bytes(r)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let buf = domain
            .map_from_member(&r, peer)
            .map_err(|e| Status::invalid_argument(format!("its Ref: {e}")))?;
        let mut pages = lock(pages);
        let view = pages.as_mut().ok_or_else(refused)?;
        let until = Instant::now() + Duration::from_millis(200);
        loop {
            view.read_fresh(&buf, out)
                .map_err(|e| Status::internal(e.to_string()))?;
            if netless_ring::polled::crc32c(out) == crc {
                return Ok(());
            }
            if Instant::now() >= until {
                out.clear();
                return Err(Status::new(
                    crate::Code::DataLoss,
                    "the request's pages did not arrive whole (their checksum does not \
                     match): the client did not write them back",
                ));
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }
}

/// The software-coherent connections of a server.
#[derive(Default)]
pub(super) struct PolledConns {
    list: Mutex<Vec<Arc<PolledConn>>>,
    /// The server's view of its pool's pages, for payloads sent by reference.
    pub(super) pages: Mutex<Option<netless_pool::PagesView>>,
}

impl PolledConns {
    pub(super) fn add(&self, conn: PolledConn) {
        lock(&self.list).push(Arc::new(conn));
    }

    /// Poller `i` of `n`: serves its share of the connections until the server stops.
    pub(super) fn run(&self, server: &ServerState, i: usize, n: usize) {
        let mut backoff = Backoff::new(Duration::from_millis(1));
        let mut mine: Vec<Arc<PolledConn>> = Vec::new();
        let mut refreshed = Instant::now() - Duration::from_secs(1);
        while !server.is_stopping() {
            if refreshed.elapsed() > Duration::from_millis(1) {
                let mut list = lock(&self.list);
                list.retain(|c| !c.conn.is_dead());
                mine = list
                    .iter()
                    .filter(|c| c.conn.index as usize % n == i)
                    .cloned()
                    .collect();
                refreshed = Instant::now();
            }
            let mut busy = false;
            for conn in &mine {
                if !conn.conn.is_dead() {
                    busy |= conn.serve(server, &self.pages);
                }
            }
            if busy {
                backoff.reset();
            } else {
                backoff.wait();
            }
        }
    }
}
