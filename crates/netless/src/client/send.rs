//! Sending a request: into pool pages first when it travels by reference, then into runs of
//! the replica's receive buffer (in fragments when it is larger than one run), each
//! published with one queue entry and a notification of the workers. A request the buffer
//! or the queue has no room for now, or that would queue deeper than the server's SLO
//! allows, is refused before anything is written (a NACK).

use std::thread;
use std::time::{Duration, Instant};

use netless_ring::prefetch::{prefetch_write, prefetch_write_range};
use netless_ring::EnqueueError;

use super::connection::Connection;
use super::slots::{generation_of, lock, pack, WAITING};
use crate::status::Status;
use crate::sync::{AtomicU32, Ordering};
use crate::wire::header::{
    kind, wire_flags, ShortHeader, WireHeader, HEADER_LEN, SHORT_HEADER_LEN,
};
use crate::wire::metadata::Metadata;

/// How long sending the later fragments of a large request may wait for buffer space.
const FRAGMENT_SPACE_WAIT: Duration = Duration::from_secs(2);

/// A Ref made for a request that may not be sent: revoked on drop unless disarmed.
struct RevokeUnsent<'a>(Option<(&'a netless_pool::Domain, netless_pool::Ref)>);

impl Drop for RevokeUnsent<'_> {
    fn drop(&mut self) {
        if let Some((pool, r)) = self.0.take() {
            let _ = pool.revoke(&r);
        }
    }
}

/// A by-reference payload larger than this is written in two parts, the server's worker woken
/// in between: with this much left to write (about 35 µs when the pool pages must come back
/// from the server's core, 9 µs when they are cached) it is awake and polling, not still
/// waking, when the Ref arrives.
const PREWAKE_BYTES: usize = 256 << 10;

/// Writes `payload` into new pool pages and shares them. Writing a large payload takes longer
/// than the server's worker polls before it sleeps, so its `doorbell` is rung before the last
/// [`PREWAKE_BYTES`]: the worker wakes (a spurious wake-up, after which it polls for its spin
/// budget again) while the rest is written, instead of after.
fn write_to_pool(
    pool: &netless_pool::Domain,
    payload: &[u8],
    doorbell: &netless_ring::DoorbellWords,
) -> Result<netless_pool::Ref, netless_pool::PoolError> {
    let mut buf = pool.alloc(payload.len())?;
    let head = payload.len().saturating_sub(PREWAKE_BYTES);
    if head > 0 {
        buf.write(0, &payload[..head])?;
        netless_ring::notify(doorbell);
    }
    buf.write(head, &payload[head..])?;
    buf.share()
}

impl Connection {
    /// Sends a request; returns its slot index and call id.
    pub(super) fn submit(
        &self,
        method: &str,
        metadata: &Metadata,
        payload: &[u8],
        deadline: Option<Instant>,
        is_async: bool,
    ) -> Result<(usize, u64), Status> {
        if self.is_dead() {
            return Err(self.death_status());
        }
        let md_len = metadata.encoded_len();
        let body_len = method.len() + md_len + payload.len();
        if body_len > self.server_max_message {
            return Err(Status::resource_exhausted(format!(
                "request of {body_len} bytes exceeds service `{}`'s maximum message size of {} bytes",
                self.service, self.server_max_message
            )));
        }
        // A large payload is written once into pool pages and travels as a 32-byte Ref; the
        // server maps it and its handler reads the pages in place.
        let ref_bytes;
        // Revokes the Ref if the request is not sent (its pages go back at once).
        let mut unsent = RevokeUnsent(None);
        let (payload, flags) = match &self.pool {
            Some(pool) if self.by_ref(payload.len()) => {
                let doorbell = self.replica.queue_for(self.conn_index).doorbell();
                let r = write_to_pool(pool, payload, doorbell).map_err(crate::status::from_pool)?;
                ref_bytes = r.to_bytes();
                unsent.0 = Some((pool, r));
                (&ref_bytes[..], wire_flags::PAYLOAD_REF)
            }
            _ => (payload, 0),
        };
        let body_len = method.len() + md_len + payload.len();
        if let Some(d) = deadline {
            if d <= Instant::now() {
                return Err(Status::deadline_exceeded(
                    "deadline expired before the call was sent",
                ));
            }
        }
        let index = self.slots.alloc().ok_or_else(|| {
            Status::resource_exhausted(format!(
                "{} calls already in flight on this connection to `{}`: raise ClientConfig::max_in_flight or use more connections",
                self.slots.len(),
                self.service
            ))
        })?;
        let slot = self.slots.get(index);
        // The slot is ours alone until it is freed, so a plain load and store suffice.
        let generation = generation_of(slot.state.load(Ordering::Relaxed)).wrapping_add(1);
        let call_id = (u64::from(generation) << 32) | index as u64;
        slot.is_async.store(is_async, Ordering::Relaxed);
        if is_async {
            // Only the reaper reads deadlines (blocking callers keep theirs on the stack).
            *lock(&slot.deadline) = deadline;
        }
        slot.state
            .store(pack(generation, WAITING), Ordering::Release);

        let md_bytes;
        let md_slice: &[u8] = if md_len == 0 {
            &[]
        } else {
            let mut v = Vec::with_capacity(md_len);
            metadata.encode_into(&mut v);
            md_bytes = v;
            &md_bytes
        };
        let pieces = [method.as_bytes(), md_slice, payload];
        let deadline_ns = deadline.map_or(0, |d| netless_shm::instant_to_monotonic_ns(d).max(1));
        let header = WireHeader {
            token: self.token,
            call_id,
            deadline_ns,
            conn_index: self.conn_index,
            kind: kind::REQUEST,
            status: 0,
            body_len: body_len as u32,
            method_len: method.len() as u32,
            metadata_len: md_len as u32,
            reserved: [flags, 0],
            ..WireHeader::default()
        };
        let mut send = RequestSend {
            conn: self,
            header,
            pieces,
            deadline,
            space_deadline: None,
            spins: 0,
        };
        let mut offset = 0usize;
        let mut first = true;
        loop {
            let frag_len = (body_len - offset).min(self.fragment_body);
            if let Err(status) = send.fragment(offset, frag_len, first) {
                // Nothing was sent for a NACKed first fragment, so the slot can be reused; a
                // partly sent request is abandoned (the server discards its fragments).
                self.slots.free(index);
                return Err(status);
            }
            first = false;
            offset += frag_len;
            if offset >= body_len {
                unsent.0 = None;
                return Ok((index, call_id));
            }
        }
    }
}

/// One request being sent, fragment by fragment: its header, the pieces of its body, and
/// how long it may wait for room in the buffer.
struct RequestSend<'c> {
    conn: &'c Connection,
    header: WireHeader,
    /// Method, metadata encoding and payload: the body, in order.
    pieces: [&'c [u8]; 3],
    deadline: Option<Instant>,
    /// Until when the later fragments may wait for room, once one had to.
    space_deadline: Option<Instant>,
    spins: u32,
}

impl RequestSend<'_> {
    /// Sends bytes `offset..offset + frag_len` of the body behind the header; for the
    /// `first` fragment, a NACK instead of waiting when the buffer or queue has no room.
    fn fragment(&mut self, offset: usize, frag_len: usize, first: bool) -> Result<(), Status> {
        let conn = self.conn;
        let replica = &conn.replica;
        let block = replica.block_size();
        self.spins = 0;
        let header = &mut self.header;
        header.frag_offset = offset as u32;
        header.frag_len = frag_len as u32;
        // Every fragment carries the time it is enqueued: a worker judges the wait of the one
        // that completes the request, not the time the sender spent on the whole body.
        header.reserved[1] = crate::slo::admission::stamp_for(replica.server_control());
        // A request that needs no more takes the 32-byte header, and perhaps a block less.
        header.nblocks = (SHORT_HEADER_LEN + frag_len).div_ceil(block) as u32;
        let short = ShortHeader::of(header);
        let header_len = if short.is_some() {
            SHORT_HEADER_LEN
        } else {
            HEADER_LEN
        };
        let count = (header_len + frag_len).div_ceil(block) as u32;
        header.nblocks = count;
        let header = *header;
        let table = replica.table();
        // Start moving every line this send will write to our core at once (block-table word,
        // the message's first lines, the queue cell), instead of one after another.
        if let Some(start) = conn.lease.likely_next(count) {
            if let (Some(dst), Some(word)) = (replica.run(start, count), table.get(start as usize))
            {
                prefetch_write((word as *const AtomicU32).cast());
                prefetch_write_range(dst.as_ptr(), header_len + frag_len, 4);
            }
        }
        let queue = replica.queue_for(conn.conn_index);
        if first {
            conn.check_depth(0)?;
        }
        loop {
            if conn.is_dead() {
                return Err(conn.death_status());
            }
            let start = match conn.lease.claim(table, replica.shared_head(), count) {
                Some(start) => start,
                None if first => {
                    let part = replica.geometry().part_blocks;
                    return Err(conn.nack(format!(
                        "receive buffer of service `{}` is full (a run of {count} free blocks of {block} bytes needed, none among the {part} this connection may use): retry with backoff, or run more replicas",
                        conn.service,
                    )));
                }
                None => {
                    self.backoff_for_space()?;
                    continue;
                }
            };
            // `count` blocks we just claimed (OWNED by us) hold header_len + frag_len bytes;
            // no one else writes them while we own them.
            let written = replica.run(start, count).is_some_and(|run| {
                let header = match &short {
                    Some(short) => run.write_after(0, *short.as_bytes(), &[]),
                    None => run.write_after(0, *header.as_bytes(), &[]),
                };
                header && run.write_range(header_len, &self.pieces, offset, frag_len)
            });
            if !written {
                conn.lease.unclaim(table, start, count);
                return Err(Status::internal("a request's blocks do not hold it"));
            }
            match queue.queue().try_enqueue(start) {
                Ok(()) => {
                    netless_ring::notify(queue.doorbell());
                    return Ok(());
                }
                Err(e) => {
                    conn.lease.unclaim(table, start, count);
                    if first {
                        let why = match e {
                            EnqueueError::Full => "receive queue is full",
                            _ => "receive queue is contended or damaged",
                        };
                        return Err(conn.nack(format!(
                            "service `{}`: {why}; retry with backoff",
                            conn.service
                        )));
                    }
                    self.backoff_for_space()?;
                }
            }
        }
    }

    /// Waits a little for room in the buffer for a later fragment: `Err` once the call's
    /// deadline or [`FRAGMENT_SPACE_WAIT`] has passed.
    fn backoff_for_space(&mut self) -> Result<(), Status> {
        let now = Instant::now();
        let space_deadline = *self.space_deadline.get_or_insert(now + FRAGMENT_SPACE_WAIT);
        if self.deadline.is_some_and(|d| now >= d) {
            return Err(Status::deadline_exceeded(
                "deadline expired while sending a large request",
            ));
        }
        if now >= space_deadline {
            return Err(Status::resource_exhausted(format!(
                "receive buffer of service `{}` stayed full for {:?} while sending a large request",
                self.conn.service, FRAGMENT_SPACE_WAIT
            )));
        }
        self.spins += 1;
        if self.spins < 64 {
            thread::yield_now();
        } else {
            thread::sleep(Duration::from_micros(50));
        }
        Ok(())
    }
}
