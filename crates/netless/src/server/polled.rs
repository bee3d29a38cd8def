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
use crate::segment::layout::{bump, latency_bucket};
use crate::status::{Code, ReplyCode, Status};
use crate::wire::metadata::Metadata;

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
            }),
        }
    }

    /// Serves what is waiting; whether there was anything to do. The rings' lock is not
    /// held while a handler runs: a reply it defers may be sent from any thread, this one
    /// included.
    fn serve(
        &self,
        server: &ServerState,
        pages: &Mutex<Option<netless_pool::PagesView>>,
        stats: &crate::segment::layout::WorkerStats,
    ) -> bool {
        let mut busy = false;
        for _ in 0..16 {
            let (call_id, request) = {
                let mut rings = lock(&self.state);
                let r = &mut *rings;
                match r.outbox.flush(&mut r.rings.replies) {
                    Ok(true) => {}
                    Ok(false) => return busy,
                    Err(status) => {
                        self.conn.close(status);
                        return false;
                    }
                }
                match r
                    .inbox
                    .poll(&mut r.rings.requests, server.config.max_message)
                {
                    Ok(Some(message)) => message,
                    Ok(None) => return busy,
                    Err(status) => {
                        server.violated(&self.conn, status.message());
                        return false;
                    }
                }
            };
            busy = true;
            let mut response = ResponseBuilder::default();
            let defer = |id| server.defer(&self.conn, id);
            response.set_defer_hook(&defer, call_id);
            let mut copy = Vec::new();
            let taken = Instant::now();
            let outcome = self.run(server, pages, &request, &mut copy, &mut response);
            // Counted as a worker counts its calls (`netless stat` reads them).
            let code = match &outcome {
                Ok(()) => Code::Ok,
                Err(status) => status.code(),
            };
            bump(&stats.calls, 1);
            bump(&stats.bytes_in, request.len() as u64);
            bump(&stats.by_code[code as usize % 17], 1);
            bump(
                &stats.latency[latency_bucket(taken.elapsed().as_nanos() as u64)],
                1,
            );
            if response.is_deferred() {
                continue;
            }
            let body = if outcome.is_ok() {
                response.body()
            } else {
                &[]
            };
            bump(&stats.bytes_out, body.len() as u64);
            let mut message = Vec::new();
            encode_reply(
                outcome.as_ref().copied(),
                &response.metadata,
                body,
                &mut message,
            );
            // The client takes messages of at most `client_max` bytes, as encoded.
            if message.len() > self.client_max {
                let status = Status::resource_exhausted(format!(
                    "the reply of {} bytes exceeds the {} the client accepts \
                     (ClientConfig::max_message)",
                    message.len(),
                    self.client_max
                ));
                encode_reply(Err(&status), &Metadata::new(), &[], &mut message);
            }
            if let Err(status) = self.queue(call_id, &message) {
                self.conn.close(status);
                return false;
            }
        }
        busy
    }

    /// Runs the handler on one request (its payload read from the pool first if it came by
    /// reference).
    fn run<'a>(
        &self,
        server: &ServerState,
        pages: &Mutex<Option<netless_pool::PagesView>>,
        request: &'a [u8],
        copy: &'a mut Vec<u8>,
        response: &mut ResponseBuilder<'a>,
    ) -> Result<(), Status> {
        let (remaining, method, metadata, body) = decode_request(request)?;
        let payload: &[u8] = match body {
            Body::Inline(payload) => payload,
            Body::ByRef { r, crc } => {
                self.read_by_ref(server, pages, &r, crc, copy)?;
                copy
            }
        };
        let deadline =
            remaining.and_then(|ns| Instant::now().checked_add(Duration::from_nanos(ns)));
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(Status::deadline_exceeded(
                "the deadline passed before the call ran",
            ));
        }
        let request = Request {
            method,
            metadata,
            payload,
            deadline,
        };
        server.handler.call(&request, response)
    }

    /// Queues a reply and pushes what the ring takes (the rest goes at the next round).
    fn queue(&self, call_id: u64, message: &[u8]) -> Result<(), Status> {
        let mut rings = lock(&self.state);
        let r = &mut *rings;
        let max_record = r.rings.replies.max_record_len();
        r.outbox.queue(call_id, message, max_record);
        r.outbox.flush(&mut r.rings.replies).map(|_| ())
    }

    /// A deferred reply to call `call_id` (see `DeferredReply`).
    pub(super) fn respond(
        &self,
        call_id: u64,
        code: ReplyCode,
        metadata: &Metadata,
        payload: &[u8],
    ) -> Result<(), Status> {
        let mut message = Vec::new();
        if code.code == Code::Ok {
            encode_reply(Ok(()), metadata, payload, &mut message);
        } else {
            let status = Status::new(code.code, String::from_utf8_lossy(payload));
            encode_reply(Err(&status), &Metadata::new(), &[], &mut message);
        }
        self.queue(call_id, &message)
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
        let until = Instant::now() + Duration::from_millis(200);
        loop {
            // The view's lock only while reading: a client whose pages never arrive holds up
            // nobody else's.
            lock(pages)
                .as_mut()
                .ok_or_else(refused)?
                .read_fresh(&buf, out)
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
    pub(super) fn add(&self, conn: Arc<PolledConn>) {
        lock(&self.list).push(conn);
    }

    /// Poller `i` of `n`: serves its share of the connections until the server stops.
    pub(super) fn run(&self, server: &ServerState, i: usize, n: usize) {
        let mut backoff = Backoff::new(server.config.wait.spin, Duration::from_millis(1));
        // Poller `i` counts in worker `i`'s stats (there are as many of each).
        let all = server.control.stats();
        let Some(stats) = all.get(i).or(all.first()) else {
            return;
        };
        let mut mine: Vec<Arc<PolledConn>> = Vec::new();
        let mut refreshed: Option<Instant> = None;
        while !server.is_stopping() {
            if refreshed.is_none_or(|r| r.elapsed() > Duration::from_millis(1)) {
                let mut list = lock(&self.list);
                list.retain(|c| !c.conn.is_dead());
                mine = list
                    .iter()
                    .filter(|c| c.conn.index as usize % n == i)
                    .cloned()
                    .collect();
                refreshed = Some(Instant::now());
            }
            if mine.is_empty() {
                // Nothing of ours to poll: spinning would only take the CPU from a poller
                // that has connections.
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            let mut busy = false;
            for conn in &mine {
                if !conn.conn.is_dead() {
                    busy |= conn.serve(server, &self.pages, stats);
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
