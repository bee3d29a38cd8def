//! Calls over a software-coherent fabric: what a connection is when the region's caches are
//! not kept coherent by the hardware (`Coherence::Software`).
//!
//! The shared-buffer protocol (a receive queue many clients append to, blocks claimed by
//! compare-and-swap) needs atomics that every host sees at once. Here each connection has
//! two polled rings instead (`netless_ring::polled`), in an extent of the fabric the client
//! makes: a request ring the client alone writes and a response ring the server alone
//! writes, each line flushed by its one writer before the index that publishes it, and
//! invalidated by the reader before it reads; a record carries a sequence number and a
//! checksum, so a stale or torn one is never taken for a message. The server polls its
//! connections' request rings (Dagger's polled rings); the client polls its response ring.
//! Neither side sleeps on a futex: they back off from spinning to short sleeps.
//!
//! This module owns the extent's layout, the views through which it is read and written
//! (the real mapping, or the non-coherent emulator when the member asked for it), and the
//! messages: a request or reply split into records and put back together, validated as
//! peer input.

use std::collections::VecDeque;

use netless_ring::polled::{Consumer, PolledRing, PopError, Producer, PushError};
use netless_shm::coherence::{View, LINE};
use netless_shm::fabric::Fabric;
use netless_shm::Segment;

use crate::status::{Code, Status};
use crate::wire::metadata::Metadata;

/// `NLSOFTX1`: the header of a connection's polled extent.
const MAGIC: u64 = u64::from_le_bytes(*b"NLSOFTX1");
const VERSION: u64 = 1;
/// Where the first ring starts (the header line, then a gap).
const RINGS_AT: usize = 4 * LINE;
/// Longest polled extent a server maps.
pub(crate) const MAX_EXTENT: usize = 2 * (64 << 20) + RINGS_AT;

const FIRST: u8 = 1;
const MORE: u8 = 2;
/// Bytes of a record's framing: kind, padding, call id; a first record adds the length.
const FRAME: usize = 16;
const FIRST_FRAME: usize = FRAME + 8;

/// The two rings of a connection, where they lie in its extent.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rings {
    pub(crate) request: PolledRing,
    pub(crate) response: PolledRing,
}

impl Rings {
    /// Rings of about `ring_bytes` each; the extent's length.
    pub(crate) fn plan(ring_bytes: usize) -> (usize, Rings) {
        let lines = (ring_bytes / LINE).clamp(64, 1 << 20) as u64;
        let len = PolledRing::bytes_needed(lines);
        let request = PolledRing::new(RINGS_AT, len).expect("a planned ring");
        let response = PolledRing::new(RINGS_AT + len, len).expect("a planned ring");
        (RINGS_AT + 2 * len, Rings { request, response })
    }

    /// Writes the header (client side), through `view`.
    pub(crate) fn init_header(&self, view: &mut View<'_>) -> Result<(), Status> {
        let words = [
            MAGIC,
            VERSION,
            self.request.offset() as u64,
            self.request.len() as u64,
            self.response.offset() as u64,
            self.response.len() as u64,
        ];
        let bad = |e: String| Status::internal(format!("cannot lay out polled rings: {e}"));
        for (i, w) in words.iter().enumerate() {
            view.store_u64(8 * i, *w).map_err(|e| bad(e.to_string()))?;
        }
        view.flush(0, LINE).map_err(|e| bad(e.to_string()))?;
        Ok(())
    }

    /// Reads and validates the header a client wrote (server side).
    pub(crate) fn read(view: &mut View<'_>) -> Result<Rings, String> {
        view.invalidate(0, LINE).map_err(|e| e.to_string())?;
        let mut words = [0u64; 6];
        for (i, w) in words.iter_mut().enumerate() {
            *w = view.load_u64(8 * i).map_err(|e| e.to_string())?;
        }
        if words[0] != MAGIC || words[1] != VERSION {
            return Err("its polled rings have a bad magic or version".into());
        }
        let ring = |off: u64, len: u64| -> Result<PolledRing, String> {
            let (off, len) = (
                usize::try_from(off).map_err(|_| "offset")?,
                usize::try_from(len).map_err(|_| "length")?,
            );
            if off < RINGS_AT || off.checked_add(len).is_none_or(|end| end > view.len()) {
                return Err("a polled ring lies outside its extent".into());
            }
            PolledRing::new(off, len).map_err(|e| format!("a polled ring is malformed: {e}"))
        };
        let (request, response) = (ring(words[2], words[3])?, ring(words[4], words[5])?);
        if request.offset() + request.len() > response.offset()
            && response.offset() + response.len() > request.offset()
        {
            return Err("its polled rings overlap".into());
        }
        Ok(Rings { request, response })
    }
}

/// A view of `segment` for this member: the emulator's if the fabric asked for it, else the
/// real mapping with the fabric's coherence.
///
/// # Safety
/// `segment` must outlive the view (the caller keeps both in one struct, the view declared
/// first so it drops first).
pub(crate) unsafe fn view_of(fabric: &Fabric, segment: &Segment) -> Result<View<'static>, Status> {
    let (base, len) = (segment.as_ptr(), segment.len());
    // SAFETY: the mapping is valid while `segment` lives (caller's contract); other hosts
    // touch it only atomically (their emulated views) or through views.
    unsafe { View::from_raw(base, len, fabric.coherence(), fabric.emulation()) }
        .map_err(|e| Status::internal(format!("polled extent: {e}")))
}

/// A server's ends of a client's rings: it consumes requests and produces replies.
pub(crate) struct ServerRings {
    pub(crate) requests: Consumer<'static>,
    pub(crate) replies: Producer<'static>,
    // Declared last: the views above point into its mapping.
    _segment: Segment,
}

impl ServerRings {
    /// Attaches to the rings a client laid out in `segment` (validated as peer input).
    pub(crate) fn attach(fabric: &Fabric, segment: Segment) -> Result<ServerRings, String> {
        // SAFETY: every view made here is stored in the `ServerRings` beside `segment`,
        // declared before it, so it drops first.
        let view = || unsafe { view_of(fabric, &segment) }.map_err(|e| e.message().to_owned());
        let rings = Rings::read(&mut view()?)?;
        let requests = rings
            .request
            .consumer(view()?)
            .map_err(|e| format!("its request ring is malformed: {e}"))?;
        let replies = rings
            .response
            .producer(view()?)
            .map_err(|e| format!("its response ring is malformed: {e}"))?;
        Ok(ServerRings {
            requests,
            replies,
            _segment: segment,
        })
    }
}

/// A client's ends of its rings: it produces requests and consumes replies.
pub(crate) struct ClientRings {
    pub(crate) requests: Producer<'static>,
    pub(crate) replies: Consumer<'static>,
    /// Where they are in the fabric.
    pub(crate) extent: netless_shm::fabric::Extent,
    // Declared last: the views above point into its mapping.
    _segment: Segment,
}

impl ClientRings {
    /// Makes rings of about `ring_bytes` each in `fabric`.
    pub(crate) fn create(fabric: &Fabric, ring_bytes: usize) -> Result<ClientRings, Status> {
        let (len, rings) = Rings::plan(ring_bytes);
        let (segment, extent) = crate::segment::Place::Fabric(fabric)
            .segment("netless-polled", len)
            .map_err(|e| Status::resource_exhausted(format!("cannot make polled rings: {e}")))?;
        let extent = extent.ok_or_else(|| Status::internal("a fabric segment without extent"))?;
        let made = (|| {
            // SAFETY: every view made here is stored in the `ClientRings` beside `segment`,
            // declared before it, so it drops first; the header view drops at once.
            let view = || unsafe { view_of(fabric, &segment) };
            let bad = |e: netless_ring::polled::AttachError| {
                Status::internal(format!("cannot lay out polled rings: {e}"))
            };
            // Each ring is laid out through the view that then uses it: a host sees its own
            // writes whether or not it has written them back yet.
            let mut requests = view()?;
            rings.init_header(&mut requests)?;
            rings.request.init(&mut requests).map_err(bad)?;
            let mut replies = view()?;
            rings.response.init(&mut replies).map_err(bad)?;
            Ok::<_, Status>((
                rings.request.producer(requests).map_err(bad)?,
                rings.response.consumer(replies).map_err(bad)?,
            ))
        })();
        match made {
            Ok((requests, replies)) => Ok(ClientRings {
                requests,
                replies,
                extent,
                _segment: segment,
            }),
            Err(e) => {
                fabric.free(extent);
                Err(e)
            }
        }
    }
}

/// Messages waiting to go out as records, pushed as the ring makes room.
#[derive(Debug, Default)]
pub(crate) struct Outbox {
    records: VecDeque<Vec<u8>>,
}

impl Outbox {
    /// Queues `message` of call `call_id`, split into records of at most `max_record`
    /// bytes.
    pub(crate) fn queue(&mut self, call_id: u64, message: &[u8], max_record: usize) {
        let first = (max_record - FIRST_FRAME).min(message.len());
        let mut record = Vec::with_capacity(FIRST_FRAME + first);
        record.extend_from_slice(&[FIRST, 0, 0, 0, 0, 0, 0, 0]);
        record.extend_from_slice(&call_id.to_le_bytes());
        record.extend_from_slice(&(message.len() as u64).to_le_bytes());
        record.extend_from_slice(&message[..first]);
        self.records.push_back(record);
        for chunk in message[first..].chunks(max_record - FRAME) {
            let mut record = Vec::with_capacity(FRAME + chunk.len());
            record.extend_from_slice(&[MORE, 0, 0, 0, 0, 0, 0, 0]);
            record.extend_from_slice(&call_id.to_le_bytes());
            record.extend_from_slice(chunk);
            self.records.push_back(record);
        }
    }

    /// Pushes what the ring takes; whether everything went.
    /// Bytes waiting to be pushed.
    pub(crate) fn pending(&self) -> usize {
        self.records.iter().map(Vec::len).sum()
    }

    pub(crate) fn flush(&mut self, producer: &mut Producer<'_>) -> Result<bool, Status> {
        while let Some(record) = self.records.front() {
            match producer.try_push(record) {
                Ok(()) => {
                    self.records.pop_front();
                }
                Err(PushError::Full) => return Ok(false),
                Err(e) => {
                    return Err(Status::unavailable(format!(
                        "the connection's ring cannot take a record: {e}"
                    )))
                }
            }
        }
        Ok(true)
    }
}

/// Records coming in, put back together into messages.
#[derive(Debug, Default)]
pub(crate) struct Inbox {
    record: Vec<u8>,
    partial: Option<(u64, usize, Vec<u8>)>,
}

impl Inbox {
    /// The next whole message and its call id, if one has arrived; messages longer than
    /// `max_message` are refused.
    /// Any error leaves the stream unusable (the caller closes the connection); nothing
    /// half-assembled is kept.
    pub(crate) fn poll(
        &mut self,
        consumer: &mut Consumer<'_>,
        max_message: usize,
    ) -> Result<Option<(u64, Vec<u8>)>, Status> {
        let result = self.poll_inner(consumer, max_message);
        if result.is_err() {
            self.partial = None;
        }
        result
    }

    fn poll_inner(
        &mut self,
        consumer: &mut Consumer<'_>,
        max_message: usize,
    ) -> Result<Option<(u64, Vec<u8>)>, Status> {
        loop {
            match consumer.try_pop(&mut self.record) {
                Ok(None) => return Ok(None),
                Ok(Some(_)) => {}
                // Not yet readable as written (a line not yet written back): next poll.
                Err(PopError::Stale { .. } | PopError::Torn { .. }) => return Ok(None),
                // The producer restarted: whatever it had half sent will not be finished.
                Err(PopError::Restarted { .. }) => {
                    self.partial = None;
                    continue;
                }
                Err(e) => {
                    return Err(Status::unavailable(format!(
                        "the connection's ring is corrupt: {e}"
                    )))
                }
            }
            let r = &self.record;
            let malformed = |why: &str| Err(Status::internal(format!("malformed record: {why}")));
            if r.len() < FRAME {
                return malformed("too short");
            }
            let call_id = u64::from_le_bytes(r[8..16].try_into().expect("8 bytes"));
            match (r[0], &mut self.partial) {
                (FIRST, None) => {
                    if r.len() < FIRST_FRAME {
                        return malformed("too short");
                    }
                    let total = u64::from_le_bytes(r[16..24].try_into().expect("8 bytes"));
                    let total = usize::try_from(total).unwrap_or(usize::MAX);
                    if total > max_message {
                        return Err(Status::resource_exhausted(format!(
                            "a message of {total} bytes exceeds the {max_message} accepted"
                        )));
                    }
                    let body = &r[FIRST_FRAME..];
                    if body.len() > total {
                        return malformed("longer than it says");
                    }
                    let mut message = Vec::with_capacity(total);
                    message.extend_from_slice(body);
                    self.partial = Some((call_id, total, message));
                }
                (MORE, Some((id, total, message))) if *id == call_id => {
                    let body = &r[FRAME..];
                    if message.len() + body.len() > *total {
                        return malformed("longer than it says");
                    }
                    message.extend_from_slice(body);
                }
                _ => return malformed("out of order"),
            }
            if let Some((_, total, message)) = &self.partial {
                if message.len() == *total {
                    let (id, _, message) = self.partial.take().expect("checked");
                    return Ok(Some((id, message)));
                }
            }
        }
    }
}

/// A request's payload: in the record, or in pool pages named by a Ref, with the length and
/// checksum of its bytes (pages carry no proof of their own of having been written back).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Body<'a> {
    Inline(&'a [u8]),
    ByRef {
        r: [u8; netless_pool::Ref::LEN],
        crc: u32,
    },
}

const INLINE: u8 = 0;
const BY_REF: u8 = 1;

/// A request as it travels: time left (not an instant: hosts' clocks differ), method,
/// metadata, and its payload or the Ref to it.
pub(crate) fn encode_request(
    remaining_ns: Option<u64>,
    method: &str,
    metadata: &Metadata,
    body: Body<'_>,
    out: &mut Vec<u8>,
) {
    out.clear();
    out.extend_from_slice(&remaining_ns.unwrap_or(u64::MAX).to_le_bytes());
    out.extend_from_slice(&(method.len() as u16).to_le_bytes());
    out.extend_from_slice(&(metadata.encoded_len() as u32).to_le_bytes());
    out.push(match body {
        Body::Inline(_) => INLINE,
        Body::ByRef { .. } => BY_REF,
    });
    out.extend_from_slice(method.as_bytes());
    metadata.encode_into(out);
    match body {
        Body::Inline(payload) => out.extend_from_slice(payload),
        Body::ByRef { r, crc } => {
            out.extend_from_slice(&r);
            out.extend_from_slice(&crc.to_le_bytes());
        }
    }
}

/// A request taken apart: nanoseconds left, method, metadata, body.
pub(crate) type DecodedRequest<'a> = (Option<u64>, &'a str, Metadata, Body<'a>);

/// A request taken apart (validated as peer input).
pub(crate) fn decode_request(bytes: &[u8]) -> Result<DecodedRequest<'_>, Status> {
    let bad = || Status::invalid_argument("malformed request record");
    let remaining = u64::from_le_bytes(bytes.get(..8).ok_or_else(bad)?.try_into().expect("8"));
    let method_len =
        u16::from_le_bytes(bytes.get(8..10).ok_or_else(bad)?.try_into().expect("2")) as usize;
    let md_len =
        u32::from_le_bytes(bytes.get(10..14).ok_or_else(bad)?.try_into().expect("4")) as usize;
    let kind = *bytes.get(14).ok_or_else(bad)?;
    let method = bytes.get(15..15 + method_len).ok_or_else(bad)?;
    let method = std::str::from_utf8(method).map_err(|_| bad())?;
    let md_end = (15 + method_len).checked_add(md_len).ok_or_else(bad)?;
    let metadata = Metadata::decode(bytes.get(15 + method_len..md_end).ok_or_else(bad)?)?;
    let rest = bytes.get(md_end..).ok_or_else(bad)?;
    let body = match kind {
        INLINE => Body::Inline(rest),
        BY_REF if rest.len() == netless_pool::Ref::LEN + 4 => {
            let (r, crc) = rest.split_at(netless_pool::Ref::LEN);
            Body::ByRef {
                r: r.try_into().expect("a Ref's length"),
                crc: u32::from_le_bytes(crc.try_into().expect("4")),
            }
        }
        _ => return Err(bad()),
    };
    Ok((
        (remaining != u64::MAX).then_some(remaining),
        method,
        metadata,
        body,
    ))
}

/// A reply as it travels: status code and message, metadata, payload.
pub(crate) fn encode_reply(
    status: Result<(), &Status>,
    metadata: &Metadata,
    payload: &[u8],
    out: &mut Vec<u8>,
) {
    out.clear();
    let (code, message) = match status {
        Ok(()) => (Code::Ok as u16, ""),
        Err(s) => (s.code() as u16, s.message()),
    };
    out.extend_from_slice(&code.to_le_bytes());
    out.extend_from_slice(&(message.len() as u32).to_le_bytes());
    out.extend_from_slice(&(metadata.encoded_len() as u32).to_le_bytes());
    out.extend_from_slice(message.as_bytes());
    metadata.encode_into(out);
    out.extend_from_slice(payload);
}

/// A reply taken apart: its status (an error status carries no payload), metadata, and
/// where the payload starts.
pub(crate) fn decode_reply(bytes: &[u8]) -> Result<(Result<(), Status>, Metadata, usize), Status> {
    let bad = || Status::internal("malformed reply record");
    let code = u16::from_le_bytes(bytes.get(..2).ok_or_else(bad)?.try_into().expect("2"));
    let msg_len =
        u32::from_le_bytes(bytes.get(2..6).ok_or_else(bad)?.try_into().expect("4")) as usize;
    let md_len =
        u32::from_le_bytes(bytes.get(6..10).ok_or_else(bad)?.try_into().expect("4")) as usize;
    let msg_end = 10usize.checked_add(msg_len).ok_or_else(bad)?;
    let message =
        std::str::from_utf8(bytes.get(10..msg_end).ok_or_else(bad)?).map_err(|_| bad())?;
    let md_end = msg_end.checked_add(md_len).ok_or_else(bad)?;
    let metadata = Metadata::decode(bytes.get(msg_end..md_end).ok_or_else(bad)?)?;
    let status = match Code::from_u16(code).ok_or_else(bad)? {
        Code::Ok => Ok(()),
        code => Err(Status::new(code, message)),
    };
    Ok((status, metadata, md_end))
}

/// Waiting without a futex: spin for the wait policy's budget since the last thing done
/// (giving the CPU away instead while another thread is queued for it, see
/// `netless_ring::contention`), then yield a while, then sleep longer and longer (at most
/// `max_sleep`).
#[derive(Debug)]
pub(crate) struct Backoff {
    round: u32,
    spin: std::time::Duration,
    since: Option<std::time::Instant>,
    /// When the last spin checkpoint ended: a long gap to the next means this thread was
    /// preempted.
    last: Option<std::time::Instant>,
    max_sleep: std::time::Duration,
}

impl Backoff {
    pub(crate) fn new(spin: std::time::Duration, max_sleep: std::time::Duration) -> Backoff {
        Backoff {
            round: 0,
            spin,
            since: None,
            last: None,
            max_sleep,
        }
    }

    pub(crate) fn reset(&mut self) {
        self.round = 0;
        self.since = None;
        self.last = None;
    }

    pub(crate) fn wait(&mut self) {
        use netless_ring::contention;
        let now = std::time::Instant::now();
        let since = *self.since.get_or_insert(now);
        if now.duration_since(since) < self.spin {
            // A spin would hold a CPU another thread is queued for: give it away instead.
            // Only spins are checkpoints: a gap after a yield or a sleep says nothing.
            let last = self.last.unwrap_or(now);
            self.last = Some(contention::checkpoint(last, now));
            std::hint::spin_loop();
            return;
        }
        self.round = self.round.saturating_add(1);
        match self.round {
            0..=64 => std::thread::yield_now(),
            n => {
                let us = 10u64 << (n - 64).min(10);
                std::thread::sleep(std::time::Duration::from_micros(us).min(self.max_sleep));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_replies_round_trip_and_junk_is_refused() {
        let mut md = Metadata::new();
        md.insert("k", b"v");
        let mut out = Vec::new();
        encode_request(Some(5), "Echo", &md, Body::Inline(b"payload"), &mut out);
        let (left, method, got, body) = decode_request(&out).unwrap();
        assert_eq!(
            (left, method, body),
            (Some(5), "Echo", Body::Inline(b"payload"))
        );
        let by_ref = Body::ByRef {
            r: [3; netless_pool::Ref::LEN],
            crc: 9,
        };
        encode_request(None, "E", &md, by_ref, &mut out);
        assert_eq!(decode_request(&out).unwrap().3, by_ref);
        for cut in 0..out.len() {
            let _ = decode_request(&out[..cut]);
        }
        assert_eq!(got.get("k"), Some(&b"v"[..]));
        encode_reply(
            Err(&Status::new(Code::NotFound, "nope")),
            &md,
            b"",
            &mut out,
        );
        let (status, _, at) = decode_reply(&out).unwrap();
        assert_eq!(status.unwrap_err().code(), Code::NotFound);
        assert_eq!(at, out.len());
        for cut in 0..out.len() {
            let _ = decode_reply(&out[..cut]);
        }
        for n in 0..64 {
            let junk: Vec<u8> = (0..n).map(|i| (i * 37 + n) as u8).collect();
            let _ = decode_request(&junk);
            let _ = decode_reply(&junk);
        }
    }
}
