//! The reply path: from a worker's [`Outbox`] (which gathers a compact batch's replies into
//! one record and counts the calls they answer) into the connection's response ring, in
//! fragments when a reply is longer than a record, and a notification of the client once
//! the replies are in.
//!
//! The ring belongs to the client: its head is read as a hint and a corrupt one closes the
//! connection. A worker never waits for room in it: a reply that finds it full goes to the
//! connection's backlog (`backlog`).

use std::sync::Arc;

use netless_ring::{Producer, PushError};

use super::conn::Conn;
use super::notify::notify_client;
use super::state::ServerState;
use crate::segment::layout::{bump, WorkerStats};
use crate::status::{Code, ReplyCode};
use crate::sync::Ordering;
use crate::wire::header::{kind, ResponseHeader, RESPONSE_HEADER_LEN};
use crate::wire::metadata::Metadata;
use crate::wire::reply::ReplyBatch;

/// Counts of calls answered OK (and not deferred), added to the shared stats before any reply
/// they count can reach the client: a batch's in one go instead of per call.
#[derive(Default)]
struct Tally {
    calls: u64,
    bytes_in: u64,
    bytes_out: u64,
}

/// What a worker has yet to send: while it serves a compact batch, the batch's replies,
/// gathered into one ring record that goes out when the batch ends; and the tally of OK
/// calls not yet added to its stats.
pub(super) struct Outbox<'a> {
    server: &'a ServerState,
    stats: &'a WorkerStats,
    /// A compact batch is being served: its replies are gathered.
    pub(super) collecting: bool,
    replies: ReplyBatch,
    tally: Tally,
}

impl<'a> Outbox<'a> {
    pub(super) fn new(server: &'a ServerState, stats: &'a WorkerStats) -> Outbox<'a> {
        Outbox {
            server,
            stats,
            collecting: false,
            replies: ReplyBatch::default(),
            tally: Tally::default(),
        }
    }

    /// Counts a call answered OK, with `bytes_in` of request and `bytes_out` of reply: into
    /// the stats at once for a lone request, when the replies go out for a batch's.
    #[inline(always)]
    pub(super) fn count_ok(&mut self, bytes_in: u64, bytes_out: u64) {
        let tally = &mut self.tally;
        tally.calls += 1;
        tally.bytes_in += bytes_in;
        tally.bytes_out += bytes_out;
        if !self.collecting {
            self.flush_tally();
        }
    }

    /// Sends the reply to `call_id`: into the compact batch's record being gathered, if one
    /// is and the reply is whole and short-metadata, else as a record of its own (in
    /// fragments if needed). Inline: on a batch's path it is a few comparisons and a copy,
    /// which a call would double.
    #[inline(always)]
    pub(super) fn reply(
        &mut self,
        conn: &Arc<Conn>,
        call_id: u64,
        code: ReplyCode,
        metadata: &Metadata,
        payload: &[u8],
    ) -> Result<(), &'static str> {
        if self.collecting {
            let md_len = metadata.encoded_len();
            if let Some(entry) = ReplyBatch::entry_len(conn.limits, call_id, md_len, payload.len())
            {
                if !self.replies.fits(conn.limits, entry) {
                    self.flush_tally();
                    self.server.send_batch(conn, &mut self.replies)?;
                }
                self.replies.push(call_id, code, metadata, payload);
                return Ok(());
            }
        }
        self.flush_tally();
        self.server.respond(conn, call_id, code, metadata, payload)
    }

    /// [`Outbox::reply`] with an error's message: out of line, so the OK path's copy stays
    /// the only one inlined.
    #[inline(never)]
    pub(super) fn reply_error(
        &mut self,
        conn: &Arc<Conn>,
        call_id: u64,
        code: ReplyCode,
        message: &[u8],
    ) -> Result<(), &'static str> {
        self.reply(conn, call_id, code, &Metadata::new(), message)
    }

    /// At a batch's end: counts its calls, then sends the replies gathered.
    pub(super) fn end_batch(&mut self, conn: &Arc<Conn>) -> Result<(), &'static str> {
        self.flush_tally();
        self.server.send_batch(conn, &mut self.replies)
    }

    /// Adds the calls tallied to the worker's stats; called before any reply they count is
    /// sent, so a client that has its replies finds them counted.
    fn flush_tally(&mut self) {
        if self.tally.calls == 0 {
            return;
        }
        let tally = std::mem::take(&mut self.tally);
        let stats = self.stats;
        bump(&stats.calls, tally.calls);
        bump(&stats.by_code[Code::Ok as usize], tally.calls);
        bump(&stats.bytes_in, tally.bytes_in);
        bump(&stats.bytes_out, tally.bytes_out);
    }
}

impl ServerState {
    /// Sends `batch` (if it holds anything) as one `RESPONSE_BATCH` record and empties it.
    pub(super) fn send_batch(
        &self,
        conn: &Arc<Conn>,
        batch: &mut ReplyBatch,
    ) -> Result<(), &'static str> {
        if batch.is_empty() {
            return Ok(());
        }
        let (header, bytes) = batch.record();
        let pushed = self.push_record(conn, &[header.as_bytes(), bytes]);
        batch.clear();
        if pushed.is_ok() {
            notify_client(conn);
        }
        pushed.map(|_| ())
    }

    /// [`ServerState::send_batch`] for deferred replies: a failure closes the connection,
    /// as a failed `DeferredReply::send` does.
    pub(super) fn send_deferred_batch(&self, conn: &Arc<Conn>, batch: &mut ReplyBatch) {
        if let Err(why) = self.send_batch(conn, batch) {
            self.violated(conn, why);
        }
    }

    /// Sends a reply to `call_id` (in fragments if it is longer than a record) and notifies
    /// the client (at the end of the `NotifySection`, inside one). The common reply, without
    /// metadata and in one record, inline; the rest out of line.
    #[inline(always)]
    pub(super) fn respond(
        &self,
        conn: &Arc<Conn>,
        call_id: u64,
        code: ReplyCode,
        metadata: &Metadata,
        payload: &[u8],
    ) -> Result<(), &'static str> {
        #[cfg(feature = "fault-injection")]
        let faulty = self.corrupt_responses.load(Ordering::Relaxed) != 0;
        #[cfg(not(feature = "fault-injection"))]
        let faulty = false;
        // The common reply: no metadata, one record.
        let limits = conn.limits;
        if metadata.is_empty()
            && payload.len() <= limits.client_max
            && payload.len() <= limits.record_limit.saturating_sub(RESPONSE_HEADER_LEN)
            && !faulty
        {
            let header = ResponseHeader {
                call_id,
                kind: kind::RESPONSE,
                status: code.wire(),
                body_len: payload.len() as u32,
                frag_len: payload.len() as u32,
                ..ResponseHeader::default()
            };
            let parts = [&header.as_bytes()[..], payload];
            self.push_with(conn, &parts, |p| {
                p.try_push_header(header.as_bytes(), payload)
            })?;
            notify_client(conn);
            return Ok(());
        }
        self.respond_any(conn, call_id, code, metadata, payload)
    }

    /// `respond` for any reply: with metadata, in fragments, or a fault injected.
    #[inline(never)]
    fn respond_any(
        &self,
        conn: &Arc<Conn>,
        call_id: u64,
        code: ReplyCode,
        metadata: &Metadata,
        payload: &[u8],
    ) -> Result<(), &'static str> {
        let md_len = metadata.encoded_len();
        let client_max = conn.limits.client_max;
        if md_len + payload.len() > client_max {
            // The client would refuse it as malformed (and drop the connection): fail this
            // call instead, saying why.
            let mut message = format!(
                "the reply of {} bytes exceeds this client's limit of {} bytes: raise ClientConfig::max_message",
                md_len + payload.len(),
                client_max
            );
            // ASCII, so any cut is at a character boundary; short enough not to recurse.
            message.truncate(client_max);
            return self.respond_any(
                conn,
                call_id,
                Code::ResourceExhausted.into(),
                &Metadata::new(),
                message.as_bytes(),
            );
        }
        let md_bytes;
        let md_slice: &[u8] = if md_len == 0 {
            &[]
        } else {
            let mut v = Vec::with_capacity(md_len);
            metadata.encode_into(&mut v);
            md_bytes = v;
            &md_bytes
        };
        let body_len = md_len + payload.len();
        #[cfg(feature = "fault-injection")]
        if self.inject_response_fault(conn, call_id) {
            return Ok(());
        }
        let max_fragment = conn
            .limits
            .record_limit
            .saturating_sub(RESPONSE_HEADER_LEN)
            .max(1);
        let mut header = ResponseHeader {
            call_id,
            kind: kind::RESPONSE,
            status: code.wire(),
            body_len: body_len as u32,
            metadata_len: md_len as u32,
            ..ResponseHeader::default()
        };
        let mut offset = 0;
        // Once a fragment waits in the backlog, the rest follow it there: a client reads a
        // reply's fragments in order.
        let mut backlogged = false;
        loop {
            let frag_len = (body_len - offset).min(max_fragment);
            header.frag_offset = offset as u32;
            header.frag_len = frag_len as u32;
            let (a, b) = split_range(md_slice, payload, offset, frag_len);
            // Mostly there is no metadata: two parts, one copy fewer.
            let three;
            let parts: &[&[u8]] = if a.is_empty() {
                &[header.as_bytes(), b][..]
            } else {
                three = [&header.as_bytes()[..], a, b];
                &three
            };
            if backlogged {
                self.backlogs.push(self, conn, parts)?;
            } else {
                backlogged = self.push_record(conn, parts)?;
            }
            offset += frag_len;
            if offset >= body_len {
                // Inside a batch (or a handler's poll), once at its end.
                notify_client(conn);
                return Ok(());
            }
            netless_ring::notify(conn.segment.doorbell());
        }
    }

    /// Test-only: instead of a reply, garbage (`Server::fault_corrupt_responses`): 1, a
    /// malformed response header; 2, the whole response ring scribbled over. Whether it did.
    #[cfg(feature = "fault-injection")]
    fn inject_response_fault(&self, conn: &Arc<Conn>, call_id: u64) -> bool {
        match self.corrupt_responses.load(Ordering::Relaxed) {
            1 => {
                let garbage = ResponseHeader {
                    call_id,
                    kind: kind::RESPONSE,
                    body_len: 10,
                    frag_len: 5000,
                    ..ResponseHeader::default()
                };
                self.with_producer(conn, |p| p.try_push(&[garbage.as_bytes()]).ok());
            }
            2 => conn.segment.fault_scribble(),
            _ => return false,
        }
        netless_ring::notify(conn.segment.doorbell());
        true
    }

    /// The connection's response-ring producer: unlocked when only this (single) worker can
    /// reply, else under its lock.
    #[inline(always)]
    #[allow(unsafe_code)]
    fn with_producer<T>(&self, conn: &Conn, f: impl FnOnce(&mut Producer<'static>) -> T) -> T {
        let mut guard = None;
        let producer = if self.workers.len() == 1 && !self.deferring.load(Ordering::Relaxed) {
            // No lock, so no locked instruction stalling on this core's pending stores. The
            // worker itself sets `deferring` before the first DeferredReply exists, so once
            // another thread may reply, this worker sees the flag and locks too.
            // One worker and no deferred replies: no other thread ever touches a
            // connection's producer (the acceptor and shutdown never do).
            // SAFETY: so this access is exclusive, as just said.
            unsafe { conn.producer.get_unsynchronized() }
        } else {
            &mut **guard.insert(conn.producer.lock())
        };
        // One call site, so `f` is inlined here.
        f(producer)
    }

    /// Pushes one record made of `parts` into the connection's response ring, or into its
    /// backlog when the ring is full; whether it went to the backlog.
    fn push_record(&self, conn: &Conn, parts: &[&[u8]]) -> Result<bool, &'static str> {
        self.push_with(conn, parts, |producer| producer.try_push(parts))
    }

    /// [`ServerState::push_record`] of `parts` by `push` (which pushes those same parts).
    #[inline(always)]
    fn push_with(
        &self,
        conn: &Conn,
        parts: &[&[u8]],
        push: impl Fn(&mut Producer<'static>) -> Result<(), PushError>,
    ) -> Result<bool, &'static str> {
        match self.push_once(conn, &push) {
            Ok(()) => Ok(false),
            Err(PushError::Full) => self.backlogs.push(self, conn, parts).map(|()| true),
            Err(PushError::TooLarge) => Err("response fragment larger than the ring"),
            Err(_) => Err("the response ring's head is corrupt"),
        }
    }

    /// One try of `push`; after a record went in, notes where the next one will go (for
    /// the prefetches that take its lines ahead).
    #[inline(always)]
    pub(super) fn push_once(
        &self,
        conn: &Conn,
        push: &impl Fn(&mut Producer<'static>) -> Result<(), PushError>,
    ) -> Result<(), PushError> {
        self.with_producer(conn, |producer| {
            let pushed = push(producer);
            if pushed.is_ok() {
                conn.next_record
                    .store(producer.next_record_ptr() as usize, Ordering::Relaxed);
            }
            pushed
        })
    }
}

/// Splits `[offset, offset + len)` of `a ++ b` into the parts from each.
fn split_range<'a>(a: &'a [u8], b: &'a [u8], offset: usize, len: usize) -> (&'a [u8], &'a [u8]) {
    let end = offset + len;
    let a_part = &a[offset.min(a.len())..end.min(a.len())];
    let b_part = &b[offset.saturating_sub(a.len())..end.saturating_sub(a.len())];
    (a_part, b_part)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_range_parts() {
        let (a, b) = split_range(b"abc", b"defg", 1, 4);
        assert_eq!((a, b), (&b"bc"[..], &b"de"[..]));
        let (a, b) = split_range(b"abc", b"defg", 4, 3);
        assert_eq!((a, b), (&b""[..], &b"efg"[..]));
    }
}
