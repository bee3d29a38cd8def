//! Serving one queue entry of a connection: validating the run of blocks it names (leased
//! to that connection, inside its partition, a request whose lengths fit), then serving the
//! request in it, the fragment of one, or the batch of requests it holds.
//!
//! Every length here comes from memory a client writes: each is checked before it slices
//! anything, and a request that fails a check closes its connection with the reason.

use std::sync::Arc;

use netless_ring::prefetch::prefetch_read_range;

use super::conn::{Conn, Reassembly, MAX_PARTIALS};
use super::group::Group;
use super::notify::NotifySection;
use super::state::ServerState;
use super::worker::WorkerContext;
use crate::config::Provisioning;
use crate::segment::layout::block_state;
use crate::segment::BlockRun;
use crate::status::Code;
use crate::sync::{AtomicU32, Ordering};
use crate::wire::header::{
    align8, compact_flags, kind, wire_flags, CompactHeader, WireHeader, COMPACT_HEADER_LEN,
};
use crate::wire::metadata::Metadata;

/// The run of `nblocks` blocks at `block` of `group`'s buffer and their block-table words,
/// if the run lies in the buffer (and in `conn`'s partition) and every block of it is leased
/// to `conn`.
#[inline(always)]
pub(super) fn leased_run<'s>(
    server: &ServerState,
    group: &'s Group,
    conn: &Conn,
    block: u32,
    nblocks: u32,
) -> Result<(BlockRun<'s>, &'s [AtomicU32]), &'static str> {
    let replica = &group.replica;
    let run = replica
        .run(block, nblocks)
        .ok_or("block run outside the buffer")?;
    if server.config.provisioning != Provisioning::Shared {
        let part = replica.partition_for(conn.index);
        if block < part.start || u64::from(block) + u64::from(nblocks) > u64::from(part.end) {
            return Err("request blocks outside the connection's partition");
        }
    }
    let owned = block_state::owned(conn.tag);
    // In bounds: `run` checked block + nblocks <= the buffer's blocks.
    let words = &replica.table()[block as usize..(block + nblocks) as usize];
    if words.iter().any(|w| w.load(Ordering::Acquire) != owned) {
        return Err("request blocks not leased to this connection");
    }
    Ok((run, words))
}

/// Gives a request's blocks back to their client: OWNED by `tag` → FREE, by CAS, so a word
/// that changed since it was validated (a faulty member of the group freed it, and someone
/// claimed it again) is left to its new owner. The Release orders the request's reads, and
/// the response before it, ahead of the free: the client sees its blocks FREE by the time
/// it sees the reply.
#[inline(always)]
pub(super) fn free_blocks(words: &[AtomicU32], tag: u32) {
    let owned = block_state::owned(tag);
    for w in words {
        let _ = w.compare_exchange(
            owned,
            block_state::FREE,
            Ordering::Release,
            Ordering::Relaxed,
        );
    }
}

/// A compact request of a batch: its header, its body, and where the body ends in the run.
pub(crate) type Compact<'s> = (CompactHeader, &'s [u8], usize);

/// The compact request after a body that ends at `end` in a batch's run: its header, checked
/// as `validate_shape` would check its expansion, its body, and where that ends.
#[inline(always)]
pub(crate) fn next_compact<'s>(
    run: BlockRun<'s>,
    end: usize,
    max_message: usize,
) -> Result<Compact<'s>, &'static str> {
    let offset = align8(end);
    let c = run
        .compact_header(offset)
        .ok_or("a batch runs past its blocks")?;
    if c.flags & compact_flags::SAME_METHOD != 0 && c.method_len != 0 {
        return Err("a request repeating the method before it names one too");
    }
    let body_at = offset + COMPACT_HEADER_LEN;
    c.validate_shape(max_message, run.len() - body_at)?;
    let body = run
        .bytes(body_at, usize::from(c.body_len))
        .ok_or("a batched request runs past its blocks")?;
    prefetch_read_range(run.as_ptr().wrapping_add(offset), 2 * 64, 2);
    Ok((c, body, body_at + body.len()))
}

impl<'s> WorkerContext<'s> {
    /// Serves the request (or batch) in the run at `block`, whose header `h` takes
    /// `header_len` bytes (a `WireHeader` or a `ShortHeader`).
    pub(super) fn serve_conn(
        &mut self,
        conn: &Arc<Conn>,
        block: u32,
        h: &WireHeader,
        header_len: usize,
    ) -> Result<(), &'static str> {
        let server = self.server;
        if h.kind != kind::REQUEST {
            return Err("queue entry is not a request");
        }
        let (run, words) = leased_run(server, self.group, conn, block, h.nblocks)?;
        // nblocks >= 1 (a run is never empty) and a block holds either header.
        h.validate_shape(server.config.max_message, run.len() - header_len)?;
        let fragment = run
            .bytes(header_len, h.frag_len as usize)
            .ok_or("fragment outside its run")?;
        prefetch_read_range(fragment.as_ptr(), fragment.len(), 64);
        // A run the client keeps (`KEEP_BLOCKS`, whole requests only) stays OWNED by it.
        let keep = h.reserved[0] & wire_flags::KEEP_BLOCKS != 0 && h.frag_len == h.body_len;
        let release = || {
            if !keep {
                free_blocks(words, conn.tag);
            }
        };
        if h.reserved[0] & wire_flags::BATCH_MORE != 0 {
            let served = self.serve_batch(conn, run, h, header_len);
            release();
            return served;
        }
        if h.frag_len == h.body_len {
            return self.dispatch(conn, h, fragment, false, release);
        }
        // A fragment: copy it out, free its blocks at once, dispatch when complete.
        let reassembled = conn.reassemble(h, fragment);
        release();
        match reassembled? {
            Reassembly::Incomplete => Ok(()),
            Reassembly::Complete(body) => self.dispatch(conn, h, &body, false, || {}),
            Reassembly::TooMany => server.respond(
                conn,
                h.call_id,
                Code::ResourceExhausted.into(),
                &Metadata::new(),
                format!(
                    "more than {MAX_PARTIALS} large requests in progress on this connection: retry, or use more connections"
                )
                .as_bytes(),
            ),
        }
    }

    /// Serves a batch: requests back to back in one run, the first with `BATCH_MORE` and
    /// `BATCH_COMPACT`, each after it behind a `CompactHeader` at the 8-byte boundary after
    /// the previous body (`compact_flags::MORE` on all but the last), each whole and from
    /// this connection. The caller frees the run afterwards.
    #[inline(never)]
    fn serve_batch(
        &mut self,
        conn: &Arc<Conn>,
        run: BlockRun<'s>,
        first: &WireHeader,
        first_len: usize,
    ) -> Result<(), &'static str> {
        if first.reserved[0] & wire_flags::BATCH_COMPACT == 0 {
            // A batch of full headers: the server refuses them since protocol 9.
            return Err("a batch without compact headers");
        }
        // A compact batch's replies go out together in one record (or a few, if they do not
        // fit one), sent when the batch ends, whether it ended well or not.
        conn.pipelined.store(true, Ordering::Relaxed);
        self.outbox.collecting = true;
        let served = self.serve_requests(conn, run, first, first_len);
        self.outbox.collecting = false;
        let flushed = self.outbox.end_batch(conn);
        served.and(flushed)
    }

    /// The requests of a batch, each dispatched in turn (see `serve_batch`); the first
    /// one's header takes `first_len` bytes.
    fn serve_requests(
        &mut self,
        conn: &Arc<Conn>,
        run: BlockRun<'s>,
        first: &WireHeader,
        first_len: usize,
    ) -> Result<(), &'static str> {
        let max_message = self.server.config.max_message;
        let mut h = *first;
        // Where the current request's body starts (the requests after the first carry a
        // CompactHeader).
        let mut body_at = first_len;
        let mut more = first.reserved[0] & wire_flags::BATCH_MORE != 0;
        // The current request calls the method of the one before it (only a compact
        // request after the first may say so: the first always names its method).
        let mut same_method = false;
        let mut count = 0u32;
        // Replies inside the batch do not notify the client; this notifies once after the
        // last (or on an early return).
        let _notify = NotifySection::enter();
        // Checked once: every later request's header is expanded from this one
        // (`CompactHeader::expand`), so it has its connection and kind, and is whole.
        if first.kind != kind::REQUEST
            || first.token != conn.token
            || first.conn_index != conn.index
        {
            return Err("a batched request is not this connection's");
        }
        if first.frag_len != first.body_len || first.frag_offset != 0 {
            return Err("a batched request is a fragment");
        }
        h.validate_shape(max_message, run.len() - body_at)?;
        // body_at + frag_len <= the run's length (validate_shape, against the room left).
        let mut body = run
            .bytes(body_at, h.frag_len as usize)
            .ok_or("a batched request runs past its blocks")?;
        loop {
            self.dispatch(conn, &h, body, same_method, || {})?;
            count += 1;
            if !more {
                break;
            }
            let mut next = next_compact(run, body_at + body.len(), max_message)?;
            // The method just served, called again: the lean path, unless these requests
            // are refused unrun or go to the runtime's own methods.
            if next.0.flags & compact_flags::SAME_METHOD != 0
                && self.refused.is_none()
                && !self.method_is_control
            {
                match self.serve_same_method(conn, run, next, &mut count)? {
                    Some(other) => next = other,
                    None => break,
                }
            }
            let (c, next_body, end) = next;
            more = c.flags & compact_flags::MORE != 0;
            same_method = c.flags & compact_flags::SAME_METHOD != 0;
            body_at = end - next_body.len();
            body = next_body;
            h = c.expand(first);
        }
        self.batch = count;
        Ok(())
    }

    /// Serves the batch's requests from `next` on while each calls the method of the one
    /// before it, which the worker just served: one builder and one `Request` for all of
    /// them, and none of `dispatch`'s checks that a compact request cannot need (it carries
    /// no method name, metadata, deadline or payload by reference). The caller has ruled
    /// out refusals and control methods. Returns the first request that names its method,
    /// for `dispatch`, or `None` at the batch's end; `count` counts the requests served.
    fn serve_same_method(
        &mut self,
        conn: &Arc<Conn>,
        run: BlockRun<'s>,
        next: Compact<'s>,
        count: &mut u32,
    ) -> Result<Option<Compact<'s>>, &'static str> {
        let (mut c, mut body, mut end) = next;
        let max_message = self.server.config.max_message;
        self.with_builder(conn, |request, builder, cx| loop {
            let call_id = u64::from(c.call_id);
            builder.reset(call_id);
            request.payload = body;
            let result = cx.call_handler(request, builder);
            let sent = cx.finish_call(conn, call_id, c.body_len.into(), result, builder, false);
            if let Err(why) = sent {
                break Err(why);
            }
            *count += 1;
            if c.flags & compact_flags::MORE == 0 {
                break Ok(None);
            }
            match next_compact(run, end, max_message) {
                Ok(n) if n.0.flags & compact_flags::SAME_METHOD != 0 => (c, body, end) = n,
                Ok(other) => break Ok(Some(other)),
                Err(why) => break Err(why),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freeing_leaves_a_word_someone_else_claimed_since() {
        let (mine, theirs) = (block_state::owned(7), block_state::owned(9));
        let words: Vec<AtomicU32> = [mine, theirs, mine]
            .into_iter()
            .map(AtomicU32::new)
            .collect();
        // The middle word was freed behind our back and claimed by another connection.
        free_blocks(&words, 7);
        let after: Vec<u32> = words.iter().map(|w| w.load(Ordering::Relaxed)).collect();
        assert_eq!(after, [block_state::FREE, theirs, block_state::FREE]);
    }
}
