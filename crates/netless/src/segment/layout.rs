//! The layouts of a connection's segments: the replica segment a server creates for each
//! trust group (geometry, client control line, queue lines, block table, blocks), the
//! server's control segment (registers, worker stats: see `control.rs`, which lays it out)
//! and the connection segment a client creates (geometry, doorbell, response ring).
//!
//! This module declares the structs; `replica.rs`, `control.rs` and `conn.rs` are the only
//! ones that turn raw pointers into them. Every struct here is plain integers or atomics
//! (`#[repr(C)]`, any bit pattern is a valid value), read from shared memory as one snapshot
//! and validated before use; nothing here trusts a peer.
//!
//! Replica segment (created by the server for one trust group, passed to each client of the
//! group at connect):
//!
//! ```text
//! 0        ReplicaHeader    geometry, written once by the server before any client attaches
//! 128      (reserved)
//! 192      ClientControl    written by clients: the allocation head, NACK count
//! c_off    queue lines      per queue, two lines: its workers' doorbell (sleep counter +
//!                           futex word) and its consumer position as the server publishes it
//! q_off    ReceiveQueues    nqueues MPSC queues of u32 block indexes (netless-ring), q_stride apart
//! t_off    block table      one AtomicU32 per 64-byte slot (block): FREE or OWNED(tag)
//! s_off    blocks           nblocks × block_size bytes, nparts partitions of part_blocks;
//!                           a request occupies a run of blocks inside its partition
//! ```
//! Connection segment (created by the client, passed to the server at connect):
//!
//! ```text
//! 0        ConnHeader       geometry
//! 128      DoorbellWords    the client's sleep counter + futex word
//! r_off    ResponseRing     SPSC ring of response records (netless-ring)
//! ```

use crate::sync::{AtomicU32, AtomicU64};

/// Version of every layout in this file; checked at attach.
pub(crate) const LAYOUT_VERSION: u32 = 3;
/// Magic at the start of a replica segment.
pub(crate) const REPLICA_MAGIC: u64 = u64::from_le_bytes(*b"NLREPLIC");
/// Magic at the start of a connection segment.
pub(crate) const CONN_MAGIC: u64 = u64::from_le_bytes(*b"NLCONNEC");
/// Offset of the doorbell words in both segments.
pub(crate) const DOORBELL_OFFSET: usize = 128;

/// Geometry of a replica segment, written by the server.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ReplicaHeader {
    pub(crate) magic: u64,
    pub(crate) version: u32,
    pub(crate) block_size: u32,
    pub(crate) nblocks: u32,
    pub(crate) queue_capacity: u32,
    pub(crate) max_message: u32,
    pub(crate) max_connections: u32,
    pub(crate) queue_offset: u64,
    pub(crate) table_offset: u64,
    pub(crate) blocks_offset: u64,
    pub(crate) total_len: u64,
    /// One of [`provisioning`].
    pub(crate) provisioning: u32,
    /// Partitions of the buffer (1, workers or max_connections by provisioning).
    pub(crate) nparts: u32,
    /// Blocks per partition (`nparts × part_blocks == nblocks`).
    pub(crate) part_blocks: u32,
    /// Receive queues (1, or one per worker for partitioned dispatch).
    pub(crate) nqueues: u32,
    /// Bytes from one queue to the next.
    pub(crate) queue_stride: u64,
    /// Where the per-queue lines start (two lines per queue: doorbell, published head).
    pub(crate) qctl_offset: u64,
    /// Most blocks one connection may hold at once (`1..=part_blocks`).
    pub(crate) quota_blocks: u32,
    pub(crate) pad: u32,
    pub(crate) reserved: [u64; 3],
}
const _: () = assert!(std::mem::size_of::<ReplicaHeader>() == 128);

/// How a replica's receive buffer is split ([`ReplicaHeader::provisioning`]).
pub(crate) mod provisioning {
    /// One buffer every connection allocates from.
    pub(crate) const SHARED: u32 = 0;
    /// One partition per worker; a connection uses partition `conn_index % workers`.
    pub(crate) const PER_WORKER: u32 = 1;
    /// One partition per connection slot; a connection uses partition `conn_index`.
    pub(crate) const PER_CONNECTION: u32 = 2;
}

/// Offset of the client-written control line.
pub(crate) const CLIENT_CONTROL_OFFSET: usize = 192;
/// First byte after the fixed lines.
pub(crate) const FIXED_END: usize = 256;
/// Bytes of per-queue lines per queue.
pub(crate) const QUEUE_LINES: usize = 128;

/// Written by the server, read by clients and tools (in the control segment, which clients
/// map read-only): the replica's soft registers (set with `netless ctl`, they take effect
/// while it runs) and a few live values. All are hints a client may act on, never trust for
/// memory safety.
#[repr(C, align(64))]
pub(crate) struct ServerControl {
    /// Most queued requests a new one may join (its SLO); 0: no limit.
    pub(crate) depth_limit: AtomicU32,
    /// Live connections.
    pub(crate) connections: AtomicU32,
    /// Workers' spin budget before sleeping (adaptive wait), nanoseconds.
    pub(crate) spin_ns: AtomicU64,
    /// Workers' wait mode: one of [`wait_mode`].
    pub(crate) wait_mode: AtomicU32,
    /// Clients' request batching: one of [`batch_mode`].
    pub(crate) batch_mode: AtomicU32,
    /// Most requests per batch (1: no batching).
    pub(crate) batch_max: AtomicU32,
    /// Most connections the server admits (≤ its configured slots).
    pub(crate) max_connections: AtomicU32,
    /// The latency objective in nanoseconds (0: none).
    pub(crate) slo_ns: AtomicU64,
    /// Bumped by every change of a register.
    pub(crate) generation: AtomicU32,
    /// Requests per queue entry lately, in sixteenths (a batch is one entry for several
    /// requests; 0 or 16: one). `depth_limit` counts requests and the queue counts entries,
    /// so a client scales the depth it sees by this before comparing.
    pub(crate) requests_per_entry_x16: AtomicU32,
}
const _: () = assert!(std::mem::size_of::<ServerControl>() == 64);

/// Values of [`ServerControl::wait_mode`].
pub(crate) mod wait_mode {
    pub(crate) const SPIN: u32 = 0;
    pub(crate) const FUTEX: u32 = 1;
    pub(crate) const ADAPTIVE: u32 = 2;
    pub(crate) const YIELD: u32 = 3;
}

/// Values of [`ServerControl::batch_mode`].
pub(crate) mod batch_mode {
    /// Batches of exactly `batch_max` (or what is pending at a flush).
    pub(crate) const FIXED: u32 = 0;
    /// Grow the batch to `batch_max` under load, shrink it to 1 when idle.
    pub(crate) const ADAPTIVE: u32 = 1;
}

/// Buckets of [`WorkerStats::batch`]: requests per queue entry 1, 2, 3–4, 5–8, …, 129+.
pub(crate) const BATCH_BUCKETS: usize = 9;
/// Buckets of [`WorkerStats::latency`]: log-linear, 4 per power of two of nanoseconds.
pub(crate) const LATENCY_BUCKETS: usize = 160;

/// One worker's counters, in the control segment so `netless stat` reads them live. Written
/// only by that worker, with plain (load + store) updates, so counting costs no locked
/// instruction; readers (who map them read-only) never write.
#[repr(C, align(64))]
pub(crate) struct WorkerStats {
    /// Requests answered.
    pub(crate) calls: AtomicU64,
    /// Requests answered with a status other than OK.
    pub(crate) errors: AtomicU64,
    /// Request bytes (method, metadata and payload) received; a compact request repeating
    /// the method before it sends, and counts, no name.
    pub(crate) bytes_in: AtomicU64,
    /// Response bytes (metadata and payload) sent.
    pub(crate) bytes_out: AtomicU64,
    /// Times the worker went to sleep on its doorbell (each costs a wake-up).
    pub(crate) sleeps: AtomicU64,
    /// Queue entries taken (a batch is one entry).
    pub(crate) entries: AtomicU64,
    /// Requests answered, by gRPC status code (0..=16).
    pub(crate) by_code: [AtomicU64; 17],
    /// Requests per queue entry: [`BATCH_BUCKETS`] log2 buckets.
    pub(crate) batch: [AtomicU64; BATCH_BUCKETS],
    /// Time from taking a request to having sent its response, sampled: see
    /// [`latency_bucket`].
    pub(crate) latency: [AtomicU64; LATENCY_BUCKETS],
}

/// The [`WorkerStats::latency`] bucket of `ns` nanoseconds: 4 per power of two.
pub(crate) fn latency_bucket(ns: u64) -> usize {
    if ns < 4 {
        return ns as usize;
    }
    let octave = 63 - ns.leading_zeros() as usize; // ≥ 2
    let sub = ((ns >> (octave - 2)) & 3) as usize;
    (octave * 4 + sub - 4).min(LATENCY_BUCKETS - 1)
}

/// The smallest value of bucket `b` (inverse of [`latency_bucket`]).
pub(crate) fn latency_bucket_floor(b: usize) -> u64 {
    if b < 4 {
        return b as u64;
    }
    let octave = (b + 4) / 4;
    let sub = ((b + 4) % 4) as u64;
    (1u64 << octave) + (sub << (octave - 2))
}

/// The [`WorkerStats::batch`] bucket of a batch of `n` requests.
pub(crate) fn batch_bucket(n: u32) -> usize {
    (32 - n.max(1).saturating_sub(1).leading_zeros() as usize).min(BATCH_BUCKETS - 1)
}

/// Adds `n` to a counter only this thread writes: a load and a store, no locked instruction.
pub(crate) fn bump(counter: &AtomicU64, n: u64) {
    counter.store(
        counter
            .load(std::sync::atomic::Ordering::Relaxed)
            .wrapping_add(n),
        std::sync::atomic::Ordering::Relaxed,
    );
}

/// A queue's consumer position as the server publishes it after each dequeue, on its own
/// line: a client reads the queue's depth as the tail minus this.
#[repr(C, align(64))]
pub(crate) struct QueueHead {
    pub(crate) position: AtomicU64,
}

/// Written by the clients of one trust group (any of them: the server treats every value as
/// untrusted).
#[repr(C, align(64))]
pub(crate) struct ClientControl {
    /// Where the next search for a free run starts (NEBULA's head pointer), per buffer.
    pub(crate) alloc_head: AtomicU32,
    pub(crate) _pad: u32,
    /// Requests refused before sending (buffer full, queue too deep), for stats.
    pub(crate) nacks: AtomicU64,
}

/// Geometry of a connection segment, written by the client.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ConnHeader {
    pub(crate) magic: u64,
    pub(crate) version: u32,
    pub(crate) ring_slots: u32,
    pub(crate) ring_offset: u64,
    pub(crate) total_len: u64,
}
const _: () = assert!(std::mem::size_of::<ConnHeader>() == 32);

/// Block-table word encoding: `0` is FREE; otherwise the owning connection's tag (OWNED: the
/// block holds a message being sent or served).
pub(crate) mod block_state {
    /// A free block.
    pub(crate) const FREE: u32 = 0;

    /// OWNED by `tag`.
    pub(crate) const fn owned(tag: u32) -> u32 {
        tag
    }
}

/// A connection's tag: its table index plus one, and a generation so a reused index gets a new
/// tag. Never zero.
pub(crate) fn conn_tag(index: u32, generation: u32) -> u32 {
    ((generation & 0x7fff) << 16) | ((index & 0xffff) + 1)
}

/// Views `count` atomics at `ptr`.
///
/// # Safety
/// `ptr` must be 4-byte aligned and valid for `count` u32s for `'a`, and that memory must only
/// ever be accessed atomically (it is shared with other processes).
pub(crate) unsafe fn atomic_u32_slice<'a>(ptr: *mut u8, count: usize) -> &'a [AtomicU32] {
    // SAFETY: guaranteed by the caller; AtomicU32 has the same layout as u32.
    unsafe { std::slice::from_raw_parts(ptr as *const AtomicU32, count) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets() {
        for ns in [0u64, 1, 3, 4, 5, 7, 8, 100, 1000, 12345, 1 << 30] {
            let b = latency_bucket(ns);
            assert!(latency_bucket_floor(b) <= ns, "{ns} -> {b}");
            assert!(
                b + 1 == LATENCY_BUCKETS || latency_bucket_floor(b + 1) > ns,
                "{ns}"
            );
        }
        assert_eq!(latency_bucket(u64::MAX), LATENCY_BUCKETS - 1);
        assert_eq!(
            [1, 2, 3, 4, 5, 8, 9, 16, 17, 1000].map(batch_bucket),
            [0, 1, 2, 2, 3, 3, 4, 4, 5, 8]
        );
    }

    #[test]
    fn tags() {
        let t = conn_tag(0, 0);
        assert_ne!(t, 0);
        assert_ne!(conn_tag(5, 1), conn_tag(5, 2));
    }
}
