//! The RPC layer's shared-memory layouts: the replica segment, the connection segment and the
//! message headers (the 64-byte `WireHeader` and its short and compact forms).
//!
//! This is the only module that turns raw pointers into these structs. Every struct here is
//! plain integers (`#[repr(C)]`, any bit pattern is a valid value), read from shared memory as
//! one snapshot and validated before use; nothing here trusts a peer.
//!
//! Replica segment (created by the server, passed to each client at connect):
//!
//! ```text
//! 0        ReplicaHeader    geometry, written once by the server before any client attaches
//! 128      ServerControl    written by the server: SLO depth limit, connection count
//! 192      ClientControl    written by clients: the allocation head, NACK count
//! c_off    queue lines      per queue, two lines: its workers' doorbell (sleep counter +
//!                           futex word) and its consumer position as the server publishes it
//! q_off    ReceiveQueues    nqueues MPSC queues of u32 block indexes (netless-ring), q_stride apart
//! w_off    WorkerStats      one per worker, written only by that worker: counters, histograms
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
pub const LAYOUT_VERSION: u32 = 2;
/// Magic at the start of a replica segment.
pub const REPLICA_MAGIC: u64 = u64::from_le_bytes(*b"NLREPLIC");
/// Magic at the start of a connection segment.
pub const CONN_MAGIC: u64 = u64::from_le_bytes(*b"NLCONNEC");
/// Offset of the doorbell words in both segments.
pub const DOORBELL_OFFSET: usize = 128;

/// Geometry of a replica segment, written by the server.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplicaHeader {
    pub magic: u64,
    pub version: u32,
    pub block_size: u32,
    pub nblocks: u32,
    pub queue_capacity: u32,
    pub max_message: u32,
    pub max_connections: u32,
    pub queue_offset: u64,
    pub table_offset: u64,
    pub blocks_offset: u64,
    pub total_len: u64,
    /// One of [`provisioning`].
    pub provisioning: u32,
    /// Partitions of the buffer (1, workers or max_connections by provisioning).
    pub nparts: u32,
    /// Blocks per partition (`nparts × part_blocks == nblocks`).
    pub part_blocks: u32,
    /// Receive queues (1, or one per worker for partitioned dispatch).
    pub nqueues: u32,
    /// Bytes from one queue to the next.
    pub queue_stride: u64,
    /// Where the per-queue lines start (two lines per queue: doorbell, published head).
    pub qctl_offset: u64,
    /// Where the workers' [`WorkerStats`] start.
    pub stats_offset: u64,
    /// Number of [`WorkerStats`] (one per worker).
    pub stats_count: u32,
    /// Bytes from one [`WorkerStats`] to the next.
    pub stats_stride: u32,
    pub reserved: [u64; 2],
}
const _: () = assert!(std::mem::size_of::<ReplicaHeader>() == 128);

/// How a replica's receive buffer is split ([`ReplicaHeader::provisioning`]).
pub mod provisioning {
    /// One buffer every connection allocates from.
    pub const SHARED: u32 = 0;
    /// One partition per worker; a connection uses partition `conn_index % workers`.
    pub const PER_WORKER: u32 = 1;
    /// One partition per connection slot; a connection uses partition `conn_index`.
    pub const PER_CONNECTION: u32 = 2;
}

/// Offset of the server-written control line.
pub const SERVER_CONTROL_OFFSET: usize = 128;
/// Offset of the client-written control line.
pub const CLIENT_CONTROL_OFFSET: usize = 192;
/// First byte after the fixed lines.
pub const FIXED_END: usize = 256;
/// Bytes of per-queue lines per queue.
pub const QUEUE_LINES: usize = 128;

/// Written by the server, read by clients and tools: the replica's soft registers (set with
/// `netless ctl`, they take effect while it runs) and a few live values. All are hints a
/// client may act on, never trust for memory safety.
#[repr(C, align(64))]
pub struct ServerControl {
    /// Most queued requests a new one may join (its SLO); 0: no limit.
    pub depth_limit: AtomicU32,
    /// Live connections.
    pub connections: AtomicU32,
    /// Workers' spin budget before sleeping (adaptive wait), nanoseconds.
    pub spin_ns: AtomicU64,
    /// Workers' wait mode: one of [`wait_mode`].
    pub wait_mode: AtomicU32,
    /// Clients' request batching: one of [`batch_mode`].
    pub batch_mode: AtomicU32,
    /// Most requests per batch (1: no batching).
    pub batch_max: AtomicU32,
    /// Most connections the server admits (≤ its configured slots).
    pub max_connections: AtomicU32,
    /// The latency objective in nanoseconds (0: none).
    pub slo_ns: AtomicU64,
    /// Bumped by every change of a register.
    pub generation: AtomicU32,
    /// Requests per queue entry lately, in sixteenths (a batch is one entry for several
    /// requests; 0 or 16: one). `depth_limit` counts requests and the queue counts entries,
    /// so a client scales the depth it sees by this before comparing.
    pub requests_per_entry_x16: AtomicU32,
}
const _: () = assert!(std::mem::size_of::<ServerControl>() == 64);

/// Values of [`ServerControl::wait_mode`].
pub mod wait_mode {
    pub const SPIN: u32 = 0;
    pub const FUTEX: u32 = 1;
    pub const ADAPTIVE: u32 = 2;
    pub const YIELD: u32 = 3;
}

/// Values of [`ServerControl::batch_mode`].
pub mod batch_mode {
    /// Batches of exactly `batch_max` (or what is pending at a flush).
    pub const FIXED: u32 = 0;
    /// Grow the batch to `batch_max` under load, shrink it to 1 when idle.
    pub const ADAPTIVE: u32 = 1;
}

/// Buckets of [`WorkerStats::batch`]: requests per queue entry 1, 2, 3–4, 5–8, …, 129+.
pub const BATCH_BUCKETS: usize = 9;
/// Buckets of [`WorkerStats::latency`]: log-linear, 4 per power of two of nanoseconds.
pub const LATENCY_BUCKETS: usize = 160;

/// One worker's counters, in shared memory so `netless stat` reads them live. Written only by
/// that worker, with plain (load + store) updates, so counting costs no locked instruction;
/// readers never write.
#[repr(C, align(64))]
pub struct WorkerStats {
    /// Requests answered.
    pub calls: AtomicU64,
    /// Requests answered with a status other than OK.
    pub errors: AtomicU64,
    /// Request bytes (method, metadata and payload) received; a compact request repeating
    /// the method before it sends, and counts, no name.
    pub bytes_in: AtomicU64,
    /// Response bytes (metadata and payload) sent.
    pub bytes_out: AtomicU64,
    /// Times the worker went to sleep on its doorbell (each costs a wake-up).
    pub sleeps: AtomicU64,
    /// Queue entries taken (a batch is one entry).
    pub entries: AtomicU64,
    /// Requests answered, by gRPC status code (0..=16).
    pub by_code: [AtomicU64; 17],
    /// Requests per queue entry: [`BATCH_BUCKETS`] log2 buckets.
    pub batch: [AtomicU64; BATCH_BUCKETS],
    /// Time from taking a request to having sent its response, sampled: see
    /// [`latency_bucket`].
    pub latency: [AtomicU64; LATENCY_BUCKETS],
}

/// The [`WorkerStats::latency`] bucket of `ns` nanoseconds: 4 per power of two.
pub fn latency_bucket(ns: u64) -> usize {
    if ns < 4 {
        return ns as usize;
    }
    let octave = 63 - ns.leading_zeros() as usize; // ≥ 2
    let sub = ((ns >> (octave - 2)) & 3) as usize;
    (octave * 4 + sub - 4).min(LATENCY_BUCKETS - 1)
}

/// The smallest value of bucket `b` (inverse of [`latency_bucket`]).
pub fn latency_bucket_floor(b: usize) -> u64 {
    if b < 4 {
        return b as u64;
    }
    let octave = (b + 4) / 4;
    let sub = ((b + 4) % 4) as u64;
    (1u64 << octave) + (sub << (octave - 2))
}

/// The [`WorkerStats::batch`] bucket of a batch of `n` requests.
pub fn batch_bucket(n: u32) -> usize {
    (32 - n.max(1).saturating_sub(1).leading_zeros() as usize).min(BATCH_BUCKETS - 1)
}

/// Adds `n` to a counter only this thread writes: a load and a store, no locked instruction.
pub fn bump(counter: &AtomicU64, n: u64) {
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
pub struct QueueHead {
    pub position: AtomicU64,
}

/// Written by clients (any of them: the server treats every value as untrusted).
#[repr(C, align(64))]
pub struct ClientControl {
    /// Where the next search for a free run starts (NEBULA's head pointer), per buffer.
    pub alloc_head: AtomicU32,
    pub _pad: u32,
    /// Requests refused before sending (buffer full, queue too deep), for stats.
    pub nacks: AtomicU64,
}

/// Geometry of a connection segment, written by the client.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnHeader {
    pub magic: u64,
    pub version: u32,
    pub ring_slots: u32,
    pub ring_offset: u64,
    pub total_len: u64,
}
const _: () = assert!(std::mem::size_of::<ConnHeader>() == 32);

/// Message kinds in [`WireHeader::kind`].
pub mod kind {
    /// A request (or a fragment of one), client → server.
    pub const REQUEST: u16 = 1;
    /// A response (or a fragment of one), server → client.
    pub const RESPONSE: u16 = 2;
    /// A ring record holding several whole responses, each behind a [`CompactReply`]
    /// (super::CompactReply): the replies to a compact request batch.
    pub const RESPONSE_BATCH: u16 = 3;
    /// A whole request behind a 32-byte [`ShortHeader`](super::ShortHeader) instead of a
    /// `WireHeader` (protocol 9 and later). Only at the start of a block run.
    pub const REQUEST_SHORT: u16 = 4;
}

/// Bits of [`WireHeader::reserved`]`[0]` (request flags).
pub mod wire_flags {
    /// The payload is a 32-byte `netless_pool::Ref` to the real payload in the domain's page
    /// pool (pass by reference); only on connections whose two sides share a domain.
    pub const PAYLOAD_REF: u32 = 1;
    /// Another whole request of the same connection follows in the same run (a batch: one
    /// queue entry for several requests), behind a [`CompactHeader`](super::CompactHeader):
    /// only with [`BATCH_COMPACT`]. (Batches of full headers, each at the 64-byte boundary
    /// after the previous body, are refused since protocol 9; no client sent them since
    /// compact batches came in protocol 4.)
    pub const BATCH_MORE: u32 = 2;
    /// Set on the first request of a batch whose other requests each carry an 8-byte
    /// [`CompactHeader`](super::CompactHeader) instead of a `WireHeader`, at the first 8-byte
    /// boundary after the previous request's body (see there).
    pub const BATCH_COMPACT: u32 = 4;
    /// Set on the first request of a run the client keeps: the server leaves the run's
    /// blocks OWNED by the client when it has read it, and the client writes its next batch
    /// there once every request in it is answered (a `Pipeline`'s runs, so a steady stream
    /// of batches claims and frees no blocks: no CAS per block, and the block table's lines
    /// stay put). The server reads the run only before it sends the last of its replies.
    pub const KEEP_BLOCKS: u32 = 8;
}

/// The header of each request after the first in a compact batch
/// ([`wire_flags::BATCH_COMPACT`]): what differs from call to call, 8 bytes where a
/// `WireHeader` takes 64, so a batch of small requests moves about half as many cache lines
/// and claims half as many blocks. Everything else is the batch's first request's:
/// connection, token and kind. A compact request carries no metadata, no deadline and no
/// Ref, and is never a fragment; its body (`method ++ payload`, `body_len` bytes) follows the
/// header, and the next header starts at the first 8-byte boundary after it. Requests that do
/// not fit its fields (a call id of 2^32 or more, a body of 64 KiB or more, a method name of
/// 256 bytes or more) take a batch's first place, with a full header.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CompactHeader {
    /// Chosen by the client; the response echoes it (as a `u64`, these bits zero-extended).
    pub call_id: u32,
    /// Length of the whole body.
    pub body_len: u16,
    /// Length of the method name at the start of the body.
    pub method_len: u8,
    /// [`compact_flags`].
    pub flags: u8,
}
/// Size of [`CompactHeader`].
pub const COMPACT_HEADER_LEN: usize = 8;
const _: () = assert!(std::mem::size_of::<CompactHeader>() == COMPACT_HEADER_LEN);

/// Bits of [`CompactHeader::flags`].
pub mod compact_flags {
    /// Another compact request follows this one in the batch.
    pub const MORE: u8 = 1;
    /// This request calls the same method as the one before it in the batch, and its body
    /// holds no method name (`method_len` is 0): most batches repeat one method, so the name
    /// need not move again (as HTTP/2 indexes a repeated `:path`). Protocol 7 and later.
    pub const SAME_METHOD: u8 = 2;
}

impl CompactHeader {
    /// The header as bytes, to copy into shared memory.
    pub fn as_bytes(&self) -> &[u8; COMPACT_HEADER_LEN] {
        // SAFETY: CompactHeader is repr(C), 8 bytes of plain integers with no padding
        // (checked by the const assert), so viewing it as bytes is sound.
        unsafe { &*(self as *const CompactHeader as *const [u8; COMPACT_HEADER_LEN]) }
    }

    /// Reads a header from bytes another process may be writing: one copy, then only the copy
    /// is used. Any bit pattern is a valid `CompactHeader`; validation is the caller's.
    ///
    /// # Safety
    /// `src` must be valid for reads of [`COMPACT_HEADER_LEN`] bytes.
    pub unsafe fn read_from(src: *const u8) -> CompactHeader {
        // SAFETY: the caller guarantees 8 readable bytes; read_unaligned copies them without
        // assuming alignment, and every bit pattern is a valid CompactHeader.
        unsafe { std::ptr::read_unaligned(src as *const CompactHeader) }
    }

    /// Checks the body's length against `max_message` and `room` (the bytes left in the run
    /// after this header), and the method's against the body: what `validate_shape` checks
    /// of the header `expand` makes (whole, no metadata), in the same order and words,
    /// without making it.
    #[inline]
    pub fn validate_shape(&self, max_message: usize, room: usize) -> Result<(), &'static str> {
        let body = usize::from(self.body_len);
        if body > max_message {
            return Err("body longer than the maximum message size");
        }
        if body > room {
            return Err("fragment longer than its container");
        }
        if usize::from(self.method_len) > body {
            return Err("method and metadata longer than the body");
        }
        Ok(())
    }

    /// The full header this compact one stands for, in the batch that `first` opens: the
    /// connection's fields from `first`, the call's from here; no metadata, no deadline,
    /// no flags, one whole fragment. Its shape still needs `validate_shape`.
    pub fn expand(&self, first: &WireHeader) -> WireHeader {
        WireHeader {
            token: first.token,
            call_id: u64::from(self.call_id),
            deadline_ns: 0,
            conn_index: first.conn_index,
            kind: first.kind,
            status: 0,
            body_len: u32::from(self.body_len),
            frag_offset: 0,
            frag_len: u32::from(self.body_len),
            method_len: u32::from(self.method_len),
            metadata_len: 0,
            nblocks: 0,
            reserved: [0, 0],
        }
    }
}

/// The 32-byte header of a request that needs none of a `WireHeader`'s other fields: whole,
/// no metadata, no deadline, no enqueue stamp (so no SLO), a method name under 64 KiB and a
/// run under 65 536 blocks. It replaces the `WireHeader` at the start of a run
/// ([`kind::REQUEST_SHORT`]), so a 64-byte echo with its 4-byte method name takes two
/// 64-byte blocks (cache lines) instead of three: every lone request and the first of every
/// batch. The body follows at byte 32.
///
/// `token`, `call_id`, `conn_index` and `kind` lie where a `WireHeader` has them, so the
/// server reads 64 bytes at a run's start as before and tells the forms apart by `kind`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShortHeader {
    /// The connection's secret token.
    pub token: u64,
    /// Chosen by the client; the response echoes it.
    pub call_id: u64,
    /// Length of the whole body (`method ++ payload`).
    pub body_len: u32,
    /// Length of the method name at the start of the body.
    pub method_len: u16,
    /// [`wire_flags`], as in `WireHeader::reserved[0]`.
    pub flags: u16,
    /// The connection's index in the server's table.
    pub conn_index: u32,
    /// [`kind::REQUEST_SHORT`].
    pub kind: u16,
    /// Number of blocks in the run holding the request.
    pub nblocks: u16,
}
/// Size of [`ShortHeader`].
pub const SHORT_HEADER_LEN: usize = 32;
const _: () = assert!(std::mem::size_of::<ShortHeader>() == SHORT_HEADER_LEN);
const _: () = {
    use std::mem::offset_of;
    assert!(offset_of!(ShortHeader, token) == offset_of!(WireHeader, token));
    assert!(offset_of!(ShortHeader, call_id) == offset_of!(WireHeader, call_id));
    assert!(offset_of!(ShortHeader, conn_index) == offset_of!(WireHeader, conn_index));
    assert!(offset_of!(ShortHeader, kind) == offset_of!(WireHeader, kind));
};

impl ShortHeader {
    /// The short form of request header `h`, if it has one (see the type's docs).
    pub fn of(h: &WireHeader) -> Option<ShortHeader> {
        let plain = h.kind == kind::REQUEST
            && h.deadline_ns == 0
            && h.status == 0
            && h.metadata_len == 0
            && h.frag_offset == 0
            && h.frag_len == h.body_len
            && h.reserved[1] == 0;
        if !plain {
            return None;
        }
        Some(ShortHeader {
            token: h.token,
            call_id: h.call_id,
            body_len: h.body_len,
            method_len: u16::try_from(h.method_len).ok()?,
            flags: u16::try_from(h.reserved[0]).ok()?,
            conn_index: h.conn_index,
            kind: kind::REQUEST_SHORT,
            nblocks: u16::try_from(h.nblocks).ok()?,
        })
    }

    /// The header as bytes, to copy into shared memory.
    pub fn as_bytes(&self) -> &[u8; SHORT_HEADER_LEN] {
        // SAFETY: ShortHeader is repr(C), 32 bytes of plain integers with no padding (checked
        // by the const assert), so viewing it as bytes is sound.
        unsafe { &*(self as *const ShortHeader as *const [u8; SHORT_HEADER_LEN]) }
    }

    /// Reads a header from bytes another process may be writing: one copy, then only the copy
    /// is used. Any bit pattern is a valid `ShortHeader`; validation is the caller's.
    ///
    /// # Safety
    /// `src` must be valid for reads of [`SHORT_HEADER_LEN`] bytes.
    #[inline(always)]
    pub unsafe fn read_from(src: *const u8) -> ShortHeader {
        // read_unaligned copies the bytes without assuming alignment, and every bit pattern is
        // a valid ShortHeader.
        // SAFETY: the caller guarantees 32 readable bytes, as just said.
        unsafe { std::ptr::read_unaligned(src as *const ShortHeader) }
    }

    /// The full header this short one stands for: a whole request, no metadata, no deadline,
    /// no stamp. Its shape still needs `validate_shape`.
    pub fn expand(&self) -> WireHeader {
        WireHeader {
            token: self.token,
            call_id: self.call_id,
            deadline_ns: 0,
            conn_index: self.conn_index,
            kind: kind::REQUEST,
            status: 0,
            body_len: self.body_len,
            frag_offset: 0,
            frag_len: self.body_len,
            method_len: u32::from(self.method_len),
            metadata_len: 0,
            nblocks: u32::from(self.nblocks),
            reserved: [u32::from(self.flags), 0],
        }
    }
}

/// Reads the request header at the start of a block run, in either form, as a `WireHeader`,
/// with the length of the form found (where the body starts). One copy of the bytes, then
/// only the copy is used; validation is the caller's.
///
/// # Safety
/// `src` must be valid for reads of [`HEADER_LEN`] bytes.
pub unsafe fn read_request_header(src: *const u8) -> (WireHeader, usize) {
    // SAFETY: the caller guarantees HEADER_LEN readable bytes.
    let h = unsafe { WireHeader::read_from(src) };
    if h.kind != kind::REQUEST_SHORT {
        return (h, HEADER_LEN);
    }
    // SAFETY: the first SHORT_HEADER_LEN of those bytes, already copied in `h`, viewed as the
    // short form: both are plain integers, and any bit pattern is a valid ShortHeader.
    let short: ShortHeader = unsafe { std::ptr::read_unaligned((&h as *const WireHeader).cast()) };
    (short.expand(), SHORT_HEADER_LEN)
}

/// The 64-byte header in front of every message.
///
/// A message body is `method bytes ++ metadata encoding ++ payload`, `body_len` bytes in all.
/// Bodies too large for one block run (requests) or one ring record (responses) travel as
/// fragments: each carries `frag_len` bytes of the body starting at `frag_offset`. For an error
/// response the payload is the UTF-8 status message.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WireHeader {
    /// Request: the connection's secret token. Response: zero.
    pub token: u64,
    /// Chosen by the client; the response echoes it.
    pub call_id: u64,
    /// CLOCK_MONOTONIC nanoseconds after which the client no longer waits; 0 for none.
    pub deadline_ns: u64,
    /// Request: the connection's index in the server's table.
    pub conn_index: u32,
    /// One of [`kind`].
    pub kind: u16,
    /// Response: the gRPC status code.
    pub status: u16,
    /// Length of the whole body.
    pub body_len: u32,
    /// Where this fragment's bytes start in the body.
    pub frag_offset: u32,
    /// Bytes of body in this fragment (they follow the header).
    pub frag_len: u32,
    /// Length of the method name at the start of the body.
    pub method_len: u32,
    /// Length of the metadata encoding after the method.
    pub metadata_len: u32,
    /// Request: number of blocks in the run holding this message.
    pub nblocks: u32,
    /// `[flags (wire_flags), enqueue stamp]`. The stamp, under an SLO only: the low 32 bits
    /// of CLOCK_MONOTONIC in µs when the client enqueued the request (0: none), from which
    /// workers tell a request that waited too long to finish within the SLO
    /// (`crate::admission`).
    pub reserved: [u32; 2],
}
/// Size of [`WireHeader`].
pub const HEADER_LEN: usize = 64;
const _: () = assert!(std::mem::size_of::<WireHeader>() == HEADER_LEN);

impl WireHeader {
    /// The header as bytes, to copy into shared memory.
    pub fn as_bytes(&self) -> &[u8; HEADER_LEN] {
        // SAFETY: WireHeader is repr(C), 64 bytes of plain integers with no padding (checked by
        // the const assert), so viewing it as bytes is sound.
        unsafe { &*(self as *const WireHeader as *const [u8; HEADER_LEN]) }
    }

    /// Reads a header from bytes another process may be writing: one copy, then only the copy
    /// is used. Any bit pattern is a valid `WireHeader`; validation is the caller's.
    ///
    /// # Safety
    /// `src` must be valid for reads of [`HEADER_LEN`] bytes.
    pub unsafe fn read_from(src: *const u8) -> WireHeader {
        // SAFETY: the caller guarantees 64 readable bytes; read_unaligned copies them without
        // assuming alignment, and every bit pattern is a valid WireHeader.
        unsafe { std::ptr::read_unaligned(src as *const WireHeader) }
    }

    /// Checks the body-shape fields against `max_message` and `frag_capacity` (bytes of body
    /// that fit in the container this fragment came in).
    pub fn validate_shape(
        &self,
        max_message: usize,
        frag_capacity: usize,
    ) -> Result<(), &'static str> {
        let prefix = (self.method_len as usize).checked_add(self.metadata_len as usize);
        check_body_shape(
            self.body_len,
            self.frag_offset,
            self.frag_len,
            prefix,
            max_message,
            frag_capacity,
        )
    }
}

/// The 32-byte header in front of every response record (responses need no token, deadline
/// or block run, and a small header keeps a 64-byte reply within two cache lines).
///
/// The body is `metadata encoding ++ payload` (or the UTF-8 status message when `status` is
/// not OK), `body_len` bytes in all, sent in fragments as [`WireHeader`] describes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ResponseHeader {
    /// The call this answers (0 in a [`kind::RESPONSE_BATCH`] record).
    pub call_id: u64,
    /// [`kind::RESPONSE`], or [`kind::RESPONSE_BATCH`] for a record of compact replies.
    pub kind: u16,
    /// The gRPC status code.
    pub status: u16,
    /// Length of the whole body.
    pub body_len: u32,
    /// Where this fragment's bytes start in the body.
    pub frag_offset: u32,
    /// Bytes of body in this fragment.
    pub frag_len: u32,
    /// Length of the metadata encoding at the start of the body.
    pub metadata_len: u32,
    /// In a [`kind::RESPONSE_BATCH`] record: the number of replies it holds.
    pub reserved: u32,
}
/// Size of [`ResponseHeader`].
pub const RESPONSE_HEADER_LEN: usize = 32;
const _: () = assert!(std::mem::size_of::<ResponseHeader>() == RESPONSE_HEADER_LEN);

impl ResponseHeader {
    /// The header as bytes, to copy into shared memory.
    pub fn as_bytes(&self) -> &[u8; RESPONSE_HEADER_LEN] {
        // SAFETY: repr(C), 32 bytes of plain integers without padding (const-asserted).
        unsafe { &*(self as *const ResponseHeader as *const [u8; RESPONSE_HEADER_LEN]) }
    }

    /// Reads a header from bytes another process may be writing; validation is the caller's.
    ///
    /// # Safety
    /// `src` must be valid for reads of [`RESPONSE_HEADER_LEN`] bytes.
    pub unsafe fn read_from(src: *const u8) -> ResponseHeader {
        // SAFETY: the caller guarantees the bytes; any bit pattern is a valid value.
        unsafe { std::ptr::read_unaligned(src as *const ResponseHeader) }
    }

    /// Checks the lengths against `max_message` and the fragment's container.
    pub fn validate_shape(
        &self,
        max_message: usize,
        frag_capacity: usize,
    ) -> Result<(), &'static str> {
        check_body_shape(
            self.body_len,
            self.frag_offset,
            self.frag_len,
            Some(self.metadata_len as usize),
            max_message,
            frag_capacity,
        )
    }
}

/// The header of one reply in a [`kind::RESPONSE_BATCH`] record (whose `ResponseHeader`
/// gives the record's `body_len` and, in `reserved`, the number of replies): 8 bytes, then
/// the reply's body (`metadata encoding ++ payload`, or the status message), the next reply
/// at the first 8-byte boundary after it. A server sends one such record for the replies
/// to a compact request batch, instead of a record per reply, so the client reads fewer
/// lines and record words; only whole replies that fit the fields go this way (call id
/// under 2^32, body under 64 KiB, metadata under 256 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CompactReply {
    /// The call this answers (as a `u64`, these bits zero-extended).
    pub call_id: u32,
    /// Length of the reply's body.
    pub body_len: u16,
    /// Length of the metadata encoding at the start of the body.
    pub metadata_len: u8,
    /// The gRPC status code, and in bit 7 whether the call was refused without running
    /// (the [`ResponseHeader::status`] encoding in one byte).
    pub status: u8,
}
/// Size of [`CompactReply`].
pub const COMPACT_REPLY_LEN: usize = 8;
const _: () = assert!(std::mem::size_of::<CompactReply>() == COMPACT_REPLY_LEN);

impl CompactReply {
    /// The header as bytes, to copy into shared memory.
    pub fn as_bytes(&self) -> &[u8; COMPACT_REPLY_LEN] {
        // SAFETY: repr(C), 8 bytes of plain integers without padding (const-asserted).
        unsafe { &*(self as *const CompactReply as *const [u8; COMPACT_REPLY_LEN]) }
    }

    /// Reads a header from bytes another process may be writing; validation is the caller's.
    ///
    /// # Safety
    /// `src` must be valid for reads of [`COMPACT_REPLY_LEN`] bytes.
    pub unsafe fn read_from(src: *const u8) -> CompactReply {
        // SAFETY: the caller guarantees the bytes; any bit pattern is a valid value.
        unsafe { std::ptr::read_unaligned(src as *const CompactReply) }
    }
}

/// The checks both headers need before their lengths are used to slice: the body fits the
/// maximum, the fragment fits its container and lies inside the body, and the `prefix`
/// (method and metadata before the payload; `None` if its length overflowed) fits the body.
fn check_body_shape(
    body_len: u32,
    frag_offset: u32,
    frag_len: u32,
    prefix: Option<usize>,
    max_message: usize,
    frag_capacity: usize,
) -> Result<(), &'static str> {
    let (body, frag) = (body_len as usize, frag_len as usize);
    if body > max_message {
        return Err("body longer than the maximum message size");
    }
    if frag > frag_capacity {
        return Err("fragment longer than its container");
    }
    if (frag_offset as usize)
        .checked_add(frag)
        .is_none_or(|end| end > body)
    {
        return Err("fragment outside the body");
    }
    if frag == 0 && body != 0 {
        return Err("empty fragment of a non-empty body");
    }
    if prefix.is_none_or(|n| n > body) {
        return Err("method and metadata longer than the body");
    }
    Ok(())
}

/// Block-table word encoding: `0` is FREE; otherwise the owning connection's tag (OWNED: the
/// block holds a message being sent or served).
pub mod block_state {
    /// A free block.
    pub const FREE: u32 = 0;

    /// OWNED by `tag`.
    pub const fn owned(tag: u32) -> u32 {
        tag
    }
}

/// A connection's tag: its table index plus one, and a generation so a reused index gets a new
/// tag. Never zero.
pub fn conn_tag(index: u32, generation: u32) -> u32 {
    ((generation & 0x7fff) << 16) | ((index & 0xffff) + 1)
}

/// Rounds `n` up to a multiple of 64.
pub const fn align64(n: usize) -> usize {
    (n + 63) & !63
}

/// `n` rounded up to a multiple of 8 (where a compact batch's next header starts).
pub const fn align8(n: usize) -> usize {
    (n + 7) & !7
}

/// Views `count` atomics at `ptr`.
///
/// # Safety
/// `ptr` must be 4-byte aligned and valid for `count` u32s for `'a`, and that memory must only
/// ever be accessed atomically (it is shared with other processes).
pub unsafe fn atomic_u32_slice<'a>(ptr: *mut u8, count: usize) -> &'a [AtomicU32] {
    // SAFETY: guaranteed by the caller; AtomicU32 has the same layout as u32.
    unsafe { std::slice::from_raw_parts(ptr as *const AtomicU32, count) }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// The server checks a batch's compact headers without expanding them first: the
        /// check must agree with the full header's, error for error.
        #[test]
        fn a_compact_header_validates_as_its_expansion(
            call_id: u32,
            // Small ranges, so the boundaries (equal lengths) come up often.
            body_len in 0u16..300,
            method_len: u8,
            max_message in 0usize..300,
            room in 0usize..300,
        ) {
            let c = CompactHeader { call_id, body_len, method_len, flags: 0 };
            let first = WireHeader { kind: kind::REQUEST, ..WireHeader::default() };
            proptest::prop_assert_eq!(
                c.validate_shape(max_message, room),
                c.expand(&first).validate_shape(max_message, room)
            );
        }
    }

    #[test]
    fn header_bytes_round_trip() {
        let h = WireHeader {
            token: 7,
            call_id: 9,
            body_len: 100,
            frag_len: 100,
            method_len: 4,
            ..Default::default()
        };
        // SAFETY: the buffer is 64 bytes.
        let back = unsafe { WireHeader::read_from(h.as_bytes().as_ptr()) };
        assert_eq!(h, back);
        assert!(back.validate_shape(1000, 1000).is_ok());
    }

    #[test]
    fn a_compact_header_expands_to_its_batch_first_header() {
        let first = WireHeader {
            token: 7,
            call_id: 1,
            conn_index: 3,
            kind: kind::REQUEST,
            body_len: 100,
            frag_len: 100,
            method_len: 4,
            metadata_len: 9,
            reserved: [wire_flags::BATCH_COMPACT | wire_flags::BATCH_MORE, 5],
            ..Default::default()
        };
        let c = CompactHeader {
            call_id: 0xffff_fffe,
            body_len: 65_535,
            method_len: 255,
            flags: compact_flags::MORE,
        };
        // SAFETY: the buffer is COMPACT_HEADER_LEN bytes.
        let back = unsafe { CompactHeader::read_from(c.as_bytes().as_ptr()) };
        assert_eq!(back, c);
        let h = back.expand(&first);
        assert_eq!((h.token, h.conn_index, h.kind), (7, 3, kind::REQUEST));
        assert_eq!(h.call_id, 0xffff_fffe);
        assert_eq!((h.body_len, h.frag_len, h.frag_offset), (65_535, 65_535, 0));
        assert_eq!((h.method_len, h.metadata_len, h.deadline_ns), (255, 0, 0));
        assert_eq!(h.reserved, [0, 0]);
        assert!(h.validate_shape(1 << 20, 65_535).is_ok());
        assert!(h.validate_shape(1 << 20, 65_534).is_err());
    }

    #[test]
    fn a_short_header_reads_back_as_the_request_it_stands_for() {
        let h = WireHeader {
            token: 7,
            call_id: u64::MAX - 1,
            conn_index: 3,
            kind: kind::REQUEST,
            body_len: 100,
            frag_len: 100,
            method_len: 65_535,
            nblocks: 65_534,
            reserved: [wire_flags::BATCH_COMPACT | wire_flags::KEEP_BLOCKS, 0],
            ..Default::default()
        };
        let short = ShortHeader::of(&h).expect("fits the short form");
        // The body follows the short header: the server reads 64 bytes and keeps 32.
        let mut bytes = [0xa5u8; HEADER_LEN];
        bytes[..SHORT_HEADER_LEN].copy_from_slice(short.as_bytes());
        // SAFETY: `bytes` holds HEADER_LEN bytes.
        let (back, len) = unsafe { read_request_header(bytes.as_ptr()) };
        assert_eq!((back, len), (h, SHORT_HEADER_LEN));
        // SAFETY: a WireHeader's bytes are HEADER_LEN long.
        let (back, len) = unsafe { read_request_header(h.as_bytes().as_ptr()) };
        assert_eq!((back, len), (h, HEADER_LEN));
        // Whatever the short form cannot say, it refuses.
        let lacking: [fn(&mut WireHeader); 10] = [
            |h| h.deadline_ns = 1,
            |h| h.metadata_len = 1,
            |h| h.frag_offset = 1,
            |h| h.frag_len = 99,
            |h| h.reserved[1] = 1,
            |h| h.method_len = 65_536,
            |h| h.nblocks = 65_536,
            |h| h.reserved[0] = 1 << 16,
            |h| h.kind = kind::RESPONSE,
            |h| h.status = 1,
        ];
        for (i, change) in lacking.iter().enumerate() {
            let mut g = h;
            change(&mut g);
            assert_eq!(ShortHeader::of(&g), None, "change {i}");
        }
    }

    #[test]
    fn shape_validation_refuses_overflow() {
        let h = WireHeader {
            body_len: 10,
            frag_offset: u32::MAX,
            frag_len: 5,
            ..Default::default()
        };
        assert!(h.validate_shape(100, 100).is_err());
        let h = WireHeader {
            body_len: 10,
            frag_len: 10,
            method_len: u32::MAX,
            metadata_len: 2,
            ..Default::default()
        };
        assert!(h.validate_shape(100, 100).is_err());
    }

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
