//! Request batches: consecutive submits written back to back into one run of the replica's
//! receive buffer, the first behind a `WireHeader` or `ShortHeader` and each later one behind
//! an 8-byte `CompactHeader`, then published with one queue entry and one notification.
//!
//! A batch's run is claimed from the buffer or taken from the runs the pipeline keeps
//! (`kept`); all writes go through the run's bounds-checked view.

use netless_ring::prefetch::prefetch_write_range;
use netless_ring::EnqueueError;

use super::kept::KeptRuns;
use crate::client::Connection;
use crate::segment::BlockRun;
use crate::status::Status;
use crate::sync::Ordering;
use crate::wire::header::{
    align8, compact_flags, wire_flags, CompactHeader, ShortHeader, WireHeader, COMPACT_HEADER_LEN,
    HEADER_LEN, SHORT_HEADER_LEN,
};

/// Where a `CompactHeader`'s flags lie in it.
const COMPACT_FLAGS_AT: usize = std::mem::offset_of!(CompactHeader, flags);

/// A batch being written: a claimed run, `used` bytes of it filled. The first request has a
/// `WireHeader` or a `ShortHeader` (with `BATCH_COMPACT`), the others a `CompactHeader`.
pub(super) struct Staged {
    pub(super) start: u32,
    pub(super) blocks: u32,
    pub(super) used: usize,
    pub(super) count: u32,
    /// The first request's header, written to the run when the batch is published (its
    /// block count, flags and stamp are known only then), and the length of its form there.
    pub(super) first: WireHeader,
    pub(super) first_len: usize,
    /// Offset of the last request's header in the run, and its flags without `MORE` (a
    /// compact one's is cleared at publish).
    pub(super) last: usize,
    pub(super) last_flags: u8,
    /// The run's id in `Batcher::kept`, if it is kept.
    pub(super) kept: Option<u32>,
}

impl Staged {
    /// Appends a compact request for `call_id` in the batch's `run`: the header, then the
    /// method's name unless `same_method` (it repeats the request before it), then the
    /// payload. The header says another request follows (`MORE`): whether one does is known
    /// only when the batch is published, which clears the flag of the last one (the server
    /// reads none of it before). The caller checked that the batch holds a request, that
    /// the lengths fit a `CompactHeader`'s fields and that
    /// `used + align8(COMPACT_HEADER_LEN + name + payload)` fits the run; `false` (nothing
    /// written) if the run says otherwise.
    #[inline(always)]
    pub(super) fn write_compact(
        &mut self,
        run: BlockRun<'_>,
        call_id: u64,
        method: &str,
        payload: &[u8],
        same_method: bool,
    ) -> bool {
        let name: &[u8] = if same_method { &[] } else { method.as_bytes() };
        let flags = if same_method {
            compact_flags::SAME_METHOD
        } else {
            0
        };
        let header = CompactHeader {
            call_id: call_id as u32,
            body_len: (name.len() + payload.len()) as u16,
            method_len: name.len() as u8,
            flags: flags | compact_flags::MORE,
        };
        if !run.write_after(self.used, *header.as_bytes(), &[name, payload]) {
            return false;
        }
        self.first.reserved[0] |= wire_flags::BATCH_MORE;
        self.last = self.used;
        self.last_flags = flags;
        self.used += align8(COMPACT_HEADER_LEN + name.len() + payload.len());
        self.count += 1;
        true
    }
}

/// A run the pipeline publishes: its first block, the blocks written, the requests in it
/// and, if the pipeline keeps it, its id.
pub(super) struct Outgoing {
    pub(super) start: u32,
    pub(super) used: u32,
    pub(super) count: u32,
    pub(super) kept: Option<u32>,
}

/// A pipeline's batching state: the open batch, the runs it keeps, and its counts.
pub(super) struct Batcher {
    pub(super) staged: Option<Staged>,
    /// Largest request a batch slot takes (one run of the buffer).
    pub(super) max_run_bytes: usize,
    /// Whether every run fits a `ShortHeader`'s 16-bit block count.
    pub(super) short_runs: bool,
    /// Batches published, and requests in them.
    pub(super) batches: u64,
    pub(super) batched: u64,
    /// Requests in the last batch published (an adaptive batch claims room for twice that).
    pub(super) last_batch: u32,
    /// The call ids of the open batch, in order (kept here, not read back from the run).
    pub(super) staged_ids: Vec<u64>,
    /// The method of the last request written: a compact request calling it again carries
    /// `SAME_METHOD` instead of the name.
    pub(super) last_method: String,
    /// Runs kept between batches.
    pub(super) kept: KeptRuns,
}

impl Batcher {
    /// Claims a run for a new batch: room for `room` requests like this one (the first
    /// taking `first_need` bytes, the rest `compact_need`) if the buffer has it, else for
    /// this one alone; a NACK if not even that. (An adaptive batch that outgrows its run is
    /// published and the next request opens a new one.) `in_flight`: the pipeline's calls
    /// outstanding.
    pub(super) fn open(
        &mut self,
        conn: &Connection,
        first_need: usize,
        compact_need: usize,
        room: u32,
        in_flight: u32,
    ) -> Result<(), Status> {
        conn.check_depth(0)?;
        let block = conn.replica.block_size();
        let one = first_need.div_ceil(block) as u32;
        let want = (first_need + compact_need * (room as usize - 1))
            .min(self.max_run_bytes)
            .div_ceil(block) as u32;
        let table = conn.replica.table();
        let (start, blocks, kept) = match self.kept.take_idle_whole(conn, want.max(one)) {
            Some((id, run)) => (run.start, run.blocks, Some(id)),
            None => {
                let head = conn.replica.shared_head();
                let claimed = conn
                    .lease
                    .claim_fresh(table, head, want.max(one))
                    .map(|s| (s, want.max(one)))
                    .or_else(|| conn.lease.claim_fresh(table, head, one).map(|s| (s, one)));
                let Some((start, blocks)) = claimed else {
                    return Err(conn.nack(format!(
                        "receive buffer of service `{}` is full: retry after polling, or run more replicas",
                        conn.service
                    )));
                };
                // Kept for the batches after this one, within a share of the partition
                // that leaves most of it to the connections sharing it. None under an SLO:
                // the buffer is then sized for the requests the SLO admits, and a run held
                // idle would take from that.
                let slo = conn.replica.server_control().slo_ns.load(Ordering::Relaxed);
                let budget = if slo == 0 {
                    conn.lease.partition_len() / conn.replica.sharers().saturating_mul(4)
                } else {
                    0
                };
                let kept =
                    (self.kept.blocks + blocks <= budget).then(|| self.kept.add(start, blocks));
                (start, blocks, kept)
            }
        };
        // Take the run's lines exclusive now (the server read them last): the requests'
        // stores then find them here instead of each waiting for its own transfer. With
        // nothing of ours at the server (low load), only what this request needs: a kept run
        // may be far larger, and a lone request would pay for all its lines.
        let ahead = if in_flight == 0 {
            want.max(one)
        } else {
            blocks
        };
        if let Some(run) = conn.replica.run(start, blocks) {
            prefetch_write_range(run.as_ptr(), ahead.min(blocks) as usize * block, 64);
        }
        self.staged = Some(Staged {
            start,
            blocks,
            used: 0,
            count: 0,
            first: WireHeader::default(),
            first_len: HEADER_LEN,
            last: 0,
            last_flags: 0,
            kept,
        });
        Ok(())
    }

    /// Publishes the open batch, if any: trims its run to what it holds, writes the first
    /// request's header, enqueues it and notifies the workers. The calls of a batch the
    /// queue refuses fail as NACKs into `failed`.
    pub(super) fn publish(&mut self, conn: &Connection, failed: &mut Vec<(u64, Status)>) {
        let Some(staged) = self.staged.take() else {
            return;
        };
        let table = conn.replica.table();
        if staged.count == 0 {
            match staged.kept {
                Some(id) => self.kept.idle.push_back(id),
                None => conn.lease.unclaim(table, staged.start, staged.blocks),
            }
            return;
        }
        let block = conn.replica.block_size();
        let used = staged.used.div_ceil(block) as u32;
        // A kept run stays whole, for batches as large as the one it was claimed for.
        if used < staged.blocks && staged.kept.is_none() {
            conn.lease
                .unclaim(table, staged.start + used, staged.blocks - used);
        }
        let mut h = staged.first;
        h.nblocks = used;
        if staged.kept.is_some() {
            h.reserved[0] |= wire_flags::KEEP_BLOCKS;
        }
        // The run's first `first_len` bytes are the first request's header room, and a batch
        // of several ends with a compact request, whose `MORE` goes; all ours, unpublished.
        let written = conn.replica.run(staged.start, used).is_some_and(|run| {
            let header = if staged.first_len == SHORT_HEADER_LEN {
                // No stamp: an SLO set since the batch opened finds it unstamped (admitted
                // however long it waits) rather than moving its body.
                let short =
                    ShortHeader::of(&h).expect("the short form was chosen for fields that fit");
                run.write_after(0, *short.as_bytes(), &[])
            } else {
                // Under an SLO the batch carries its enqueue time (`crate::slo::admission`).
                h.reserved[1] = crate::slo::admission::stamp_for(conn.replica.server_control());
                run.write_after(0, *h.as_bytes(), &[])
            };
            header
                && (staged.count == 1
                    || run.write_after(staged.last + COMPACT_FLAGS_AT, [staged.last_flags], &[]))
        });
        assert!(written, "a staged run holds its first header");
        let out = Outgoing {
            start: staged.start,
            used,
            count: staged.count,
            kept: staged.kept,
        };
        self.enqueue(conn, out, failed);
    }

    /// Enqueues `out` (which holds the requests of `staged_ids`) and notifies the workers;
    /// the calls fail as NACKs into `failed` if the queue refuses it.
    #[inline(always)]
    pub(super) fn enqueue(
        &mut self,
        conn: &Connection,
        out: Outgoing,
        failed: &mut Vec<(u64, Status)>,
    ) {
        let table = conn.replica.table();
        let block = conn.replica.block_size();
        let q = conn.replica.queue_for(conn.conn_index);
        match q.queue().try_enqueue(out.start) {
            Ok(()) => {
                netless_ring::notify(q.doorbell());
                self.batches += 1;
                self.batched += u64::from(out.count);
                self.last_batch = out.count;
                if let Some(id) = out.kept {
                    self.kept.published(id, &self.staged_ids);
                }
                // Start owning what the next batch will write: the kept run it will most
                // likely take (the server read it a while ago) and the queue's cells a line
                // ahead. Those transfers then overlap this batch's wait, instead of stalling
                // the next enqueue's CAS, which waits for every store before it.
                if let Some(run) = self.kept.idle.front().and_then(|&id| self.kept.get(id)) {
                    // After a lone request (low load), only as much as it filled.
                    let ahead = if out.count == 1 { out.used } else { run.blocks };
                    if let Some(dst) = conn.replica.run(run.start, run.blocks) {
                        prefetch_write_range(
                            dst.as_ptr(),
                            ahead.min(run.blocks) as usize * block,
                            64,
                        );
                    }
                }
                q.queue().prefetch_cell_ahead(8);
            }
            Err(e) => {
                match out.kept {
                    Some(id) => self.kept.idle.push_back(id),
                    None => conn.lease.unclaim(table, out.start, out.used),
                }
                let why = match e {
                    EnqueueError::Full => "receive queue is full",
                    _ => "receive queue is contended or damaged",
                };
                // The batch's calls fail as NACKs, reported at the next poll.
                for &call_id in &self.staged_ids {
                    failed.push((
                        call_id,
                        conn.nack(format!(
                            "service `{}`: {why}; retry with backoff",
                            conn.service
                        )),
                    ));
                }
            }
        }
        self.staged_ids.clear();
    }
}
