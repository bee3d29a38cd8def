//! Runs of lone requests, the steady state at B = 1: a worker that takes a whole plain
//! request (a `ShortHeader`, no batch, no Ref) from a connection, calling the method it
//! served last, serves it and the next such entries in one go, with one handler builder and
//! one `Request` for all of them and none of the general path's checks that such a request
//! cannot need. Anything else goes back to the general path (`Worker::serve`).

use std::time::Instant;

use super::group::Group;
use super::serve::{free_blocks, leased_run};
use super::worker::Worker;
use crate::segment::layout::{bump, latency_bucket};
use crate::sync::Ordering;
use crate::wire::bytes::same_bytes;
use crate::wire::header::{kind, wire_flags, ShortHeader, SHORT_HEADER_LEN};

/// Most queue entries a worker serves in one [`Worker::serve_lone_run`]: between runs it goes
/// idle for a moment, which is when retired connections' blocks can be reclaimed.
pub(super) const LONE_RUN: u32 = 64;

/// A lone request at `block` that [`Worker::serve_lone_run`] may serve: a whole
/// `ShortHeader` request, its blocks kept or not, from a pipeline (`BATCH_COMPACT`, which
/// alone means a batch of one) or not, and no other flag (not a batch of several, no
/// payload by reference). The rest of its checks come later; `None` sends it the general
/// way.
#[inline(always)]
pub(super) fn lone_header(group: &Group, block: u32) -> Option<ShortHeader> {
    const LONE_FLAGS: u16 = (wire_flags::KEEP_BLOCKS | wire_flags::BATCH_COMPACT) as u16;
    let h = group.replica.run(block, 1)?.short_header();
    (h.kind == kind::REQUEST_SHORT && h.flags & !LONE_FLAGS == 0).then_some(h)
}

impl Worker<'_> {
    /// Serves lone requests from the queue entry `block` on while each is a
    /// [`lone_header`] from `first`'s connection, passes every check `serve` would
    /// make, and calls the method this worker served last, as `serve_same_method` does
    /// within a batch. Takes each next entry itself (`take`), up to [`LONE_RUN`] of them, and
    /// polls the handler after each as the worker's loop does. Returns the first entry it
    /// took and did not serve, for `serve` (which serves, refuses or reports it), and the
    /// number it served (counted in the stats' entries; the caller adds them to the batch
    /// sizes).
    pub(super) fn serve_lone_run(
        &mut self,
        block: u32,
        first: ShortHeader,
        take: &dyn Fn() -> Option<u32>,
        poll: &dyn Fn() -> bool,
    ) -> (Option<u32>, u32) {
        let (server, group) = (self.cx.server, self.cx.group);
        let Some(conn) = self.conns.lookup(&server.conns, first.conn_index) else {
            return (Some(block), 0);
        };
        if conn.group != group.index {
            return (Some(block), 0);
        }
        let Some(slot_tag) = server.conns.tag_word(conn.index) else {
            return (Some(block), 0);
        };
        let stats = self.cx.stats;
        let block_size = group.replica.block_size();
        self.cx.refused = None;
        self.cx.with_builder(conn, |request, builder, cx| {
            let (mut block, mut h, mut count) = (block, first, 0u32);
            let rest = loop {
                cx.serving(conn);
                // What `serve` and `serve_conn` check, in their order: anything off goes to them.
                if h.token != conn.token || conn.is_dead() {
                    break Some(block);
                }
                let Ok((run, words)) = leased_run(server, group, conn, block, u32::from(h.nblocks))
                else {
                    break Some(block);
                };
                // nblocks >= 1 (a run is never empty) and a block holds the header.
                let capacity = usize::from(h.nblocks) * block_size - SHORT_HEADER_LEN;
                if h.expand()
                    .validate_shape(server.config.max_message, capacity)
                    .is_err()
                {
                    break Some(block);
                }
                let Some(body) = run.bytes(SHORT_HEADER_LEN, h.body_len as usize) else {
                    break Some(block);
                };
                let method_len = usize::from(h.method_len);
                if cx.method_is_control
                    || !same_bytes(request.method.as_bytes(), &body[..method_len])
                {
                    break Some(block);
                }
                cx.served += 1;
                if cx.served.is_multiple_of(1024) {
                    cx.shed.renew();
                }
                let started = cx.served.is_multiple_of(16).then(Instant::now);
                // The response ring's next lines while the handler runs.
                conn.prefetch_reply(body.len());
                // Counted before its reply can go out, as the worker's loop counts an entry.
                bump(&stats.entries, 1);
                builder.reset(h.call_id);
                request.payload = &body[method_len..];
                let result = cx.call_handler(request, builder);
                let sent = cx.finish_call(conn, h.call_id, h.body_len, result, builder, false);
                // Only now, as in `dispatch`: the reply may have borrowed the blocks.
                if h.flags & wire_flags::KEEP_BLOCKS as u16 == 0 {
                    free_blocks(words, conn.tag);
                }
                conn.prefetch_next_reply(builder.body().len());
                if let Some(t) = started {
                    bump(
                        &stats.latency[latency_bucket(t.elapsed().as_nanos() as u64)],
                        1,
                    );
                }
                count += 1;
                if let Err(why) = sent {
                    server.violated(conn, why);
                    break None;
                }
                poll();
                if count == LONE_RUN {
                    break None;
                }
                let Some(next) = take() else { break None };
                block = next;
                match lone_header(group, block) {
                    Some(next)
                        if next.conn_index == conn.index
                            && slot_tag.load(Ordering::Acquire) == conn.tag =>
                    {
                        h = next
                    }
                    _ => break Some(block),
                }
            };
            (rest, count)
        })
    }
}
