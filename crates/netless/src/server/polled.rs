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
use crate::polled::{decode_request, encode_reply, Backoff, Inbox, Outbox, ServerRings};
use crate::status::Status;

/// One client's rings, as its poller serves them.
pub(super) struct PolledConn {
    pub(super) conn: Arc<Conn>,
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
    pub(super) fn new(conn: Arc<Conn>, client_max: usize, rings: ServerRings) -> PolledConn {
        PolledConn {
            conn,
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
    fn serve(&self, server: &ServerState) -> bool {
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
            let outcome = match decode_request(&request) {
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

/// The software-coherent connections of a server.
#[derive(Default)]
pub(super) struct PolledConns {
    list: Mutex<Vec<Arc<PolledConn>>>,
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
                    busy |= conn.serve(server);
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
