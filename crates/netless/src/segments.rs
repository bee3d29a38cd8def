//! The two shared segments of a connection, mapped and validated: the server's replica segment
//! (receive queue, block table, request blocks) and the client's connection segment (response
//! ring).
//!
//! Creating writes the geometry; attaching reads it once from the peer's memory, validates
//! every offset and size against the segment's real length, and from then on only the
//! validated private copy is used. Nothing outside this module computes a pointer into a
//! segment from a value stored in it.

use std::os::fd::OwnedFd;
use std::ptr::NonNull;

use netless_ring::{Consumer, DoorbellWords, Producer, ReceiveQueue, ResponseRing};
use netless_shm::Segment;

use crate::layout::{
    align64, atomic_u32_slice, ConnHeader, ReplicaHeader, CONN_MAGIC, DOORBELL_OFFSET,
    LAYOUT_VERSION, REPLICA_MAGIC,
};
use crate::status::Status;
use crate::sync::AtomicU32;

/// Largest replica segment a client agrees to map.
const MAX_REPLICA_LEN: usize = 1 << 30;
/// Largest connection segment a server agrees to map.
const MAX_CONN_LEN: usize = (1 << 30) + 4096;
/// First byte after the doorbell line.
const AFTER_DOORBELL: usize = DOORBELL_OFFSET + 64;
/// Where a connection segment's response ring starts.
const RING_OFFSET: usize = 256;

/// A mapped replica segment.
pub(crate) struct ReplicaSegment {
    geometry: ReplicaHeader,
    queue: ReceiveQueue<'static>,
    doorbell: &'static DoorbellWords,
    table: &'static [AtomicU32],
    blocks: NonNull<u8>,
    // Declared last: the views above borrow its mapping, which must outlive them.
    segment: Segment,
}

// SAFETY: the raw `blocks` pointer refers to the shared mapping owned by `segment`, which is
// Send + Sync; all access through it is by copies into and out of shared memory.
unsafe impl Send for ReplicaSegment {}
// SAFETY: as above.
unsafe impl Sync for ReplicaSegment {}

impl ReplicaSegment {
    /// Creates and lays out a replica segment (server side).
    pub(crate) fn create(
        service: &str,
        block_size: u32,
        nblocks: u32,
        max_message: u32,
        max_connections: u32,
    ) -> Result<ReplicaSegment, Status> {
        let queue_capacity = nblocks.next_power_of_two().max(2);
        let queue_offset = AFTER_DOORBELL;
        let table_offset = align64(queue_offset + ReceiveQueue::bytes_needed(queue_capacity));
        let blocks_offset =
            (table_offset + nblocks as usize * 4).next_multiple_of(block_size.min(4096) as usize);
        let total_len = blocks_offset + nblocks as usize * block_size as usize;
        let geometry = ReplicaHeader {
            magic: REPLICA_MAGIC,
            version: LAYOUT_VERSION,
            block_size,
            nblocks,
            queue_capacity,
            max_message,
            max_connections,
            queue_offset: queue_offset as u64,
            table_offset: table_offset as u64,
            blocks_offset: blocks_offset as u64,
            total_len: total_len as u64,
        };
        let segment =
            Segment::create(&format!("netless-replica-{service}"), total_len).map_err(|e| {
                Status::resource_exhausted(format!("cannot create replica segment: {e}"))
            })?;
        let base = segment.as_ptr();
        // SAFETY: the segment is at least 64 bytes, page aligned, and nobody else maps it yet.
        unsafe { std::ptr::write(base as *mut ReplicaHeader, geometry) };
        // SAFETY: the queue region lies inside the segment (total_len covers it), is 64-byte
        // aligned, and is only accessed through the queue's atomics from now on.
        let queue = unsafe {
            ReceiveQueue::init(
                NonNull::new_unchecked(base.add(queue_offset)),
                table_offset - queue_offset,
                queue_capacity,
            )
        }
        .map_err(|e| Status::internal(format!("receive queue layout: {e}")))?;
        // SAFETY: geometry was computed above, so the views lie within the segment.
        unsafe { Self::assemble(segment, geometry, queue) }
    }

    /// Maps a replica segment received from a server and validates its geometry (client side).
    pub(crate) fn attach(fd: OwnedFd) -> Result<ReplicaSegment, Status> {
        let segment = Segment::attach(fd, MAX_REPLICA_LEN)
            .map_err(|e| Status::unavailable(format!("cannot map the server's segment: {e}")))?;
        let bad = |what: &str| {
            Err(Status::unavailable(format!(
                "the server's replica segment is malformed ({what}); is it a netless server of the same version?"
            )))
        };
        if segment.len() < AFTER_DOORBELL {
            return bad("too short");
        }
        let header = segment.as_ptr() as *const ReplicaHeader;
        // SAFETY: the segment is page aligned and at least 64 bytes; ReplicaHeader is plain
        // integers (any bytes are a valid value). This is the one read of the header.
        let g: ReplicaHeader = unsafe { std::ptr::read_volatile(header) };
        if g.magic != REPLICA_MAGIC {
            return bad("bad magic");
        }
        if g.version != LAYOUT_VERSION {
            return bad("layout version mismatch");
        }
        if !g.block_size.is_power_of_two() || !(256..=65536).contains(&g.block_size) {
            return bad("block size");
        }
        if g.nblocks < 1
            || g.nblocks > 1 << 20
            || g.max_connections == 0
            || g.max_connections > 0xffff
        {
            return bad("counts");
        }
        if g.total_len != segment.len() as u64 {
            return bad("length");
        }
        let len = segment.len() as u64;
        let q_end = g
            .queue_offset
            .checked_add(ReceiveQueue::bytes_needed(g.queue_capacity.min(1 << 24)) as u64);
        let t_end = g.table_offset.checked_add(u64::from(g.nblocks) * 4);
        let b_end = g
            .blocks_offset
            .checked_add(u64::from(g.nblocks) * u64::from(g.block_size));
        let ordered = g.queue_offset >= AFTER_DOORBELL as u64
            && g.queue_offset.is_multiple_of(64)
            && g.table_offset.is_multiple_of(64)
            && g.blocks_offset.is_multiple_of(64)
            && q_end.is_some_and(|e| e <= g.table_offset)
            && t_end.is_some_and(|e| e <= g.blocks_offset)
            && b_end.is_some_and(|e| e <= len);
        if !ordered {
            return bad("region offsets");
        }
        // SAFETY: the queue region [queue_offset, table_offset) lies inside the mapping and is
        // 64-byte aligned (checked above); attach re-validates the capacity it reads.
        let queue = unsafe {
            ReceiveQueue::attach(
                NonNull::new_unchecked(segment.as_ptr().add(g.queue_offset as usize)),
                (g.table_offset - g.queue_offset) as usize,
            )
        }
        .map_err(|e| {
            Status::unavailable(format!("the server's receive queue is malformed: {e}"))
        })?;
        // SAFETY: every region was bounds-checked against the mapping above.
        unsafe { Self::assemble(segment, g, queue) }
    }

    /// # Safety
    /// `geometry` must describe regions inside `segment`, 64-byte aligned.
    unsafe fn assemble(
        segment: Segment,
        geometry: ReplicaHeader,
        queue: ReceiveQueue<'static>,
    ) -> Result<ReplicaSegment, Status> {
        let base = segment.as_ptr();
        // SAFETY: DOORBELL_OFFSET + 64 <= queue_offset, inside the mapping and 64-byte aligned;
        // DoorbellWords is two AtomicU32s only ever accessed atomically.
        let doorbell = unsafe { &*(base.add(DOORBELL_OFFSET) as *const DoorbellWords) };
        // SAFETY: the table region holds nblocks u32s inside the mapping (caller's contract).
        let table = unsafe {
            atomic_u32_slice(
                base.add(geometry.table_offset as usize),
                geometry.nblocks as usize,
            )
        };
        // SAFETY: blocks_offset is inside the mapping (caller's contract), so non-null.
        let blocks = unsafe { NonNull::new_unchecked(base.add(geometry.blocks_offset as usize)) };
        Ok(ReplicaSegment {
            geometry,
            queue,
            doorbell,
            table,
            blocks,
            segment,
        })
    }

    pub(crate) fn geometry(&self) -> &ReplicaHeader {
        &self.geometry
    }
    pub(crate) fn queue(&self) -> &ReceiveQueue<'static> {
        &self.queue
    }
    pub(crate) fn doorbell(&self) -> &DoorbellWords {
        self.doorbell
    }
    pub(crate) fn table(&self) -> &[AtomicU32] {
        self.table
    }
    pub(crate) fn segment(&self) -> &Segment {
        &self.segment
    }
    /// Bytes per block.
    pub(crate) fn block_size(&self) -> usize {
        self.geometry.block_size as usize
    }
    /// Pointer to the first byte of block `index`, or `None` if the run `index..index+count`
    /// does not lie inside the buffer.
    pub(crate) fn block_run(&self, index: u32, count: u32) -> Option<*mut u8> {
        let end = u64::from(index) + u64::from(count);
        if count == 0 || end > u64::from(self.geometry.nblocks) {
            return None;
        }
        // SAFETY: index < nblocks, so the offset lies inside the blocks region of the mapping.
        Some(unsafe { self.blocks.as_ptr().add(index as usize * self.block_size()) })
    }
}

/// A mapped connection segment.
pub(crate) struct ConnSegment {
    doorbell: &'static DoorbellWords,
    // Declared last: the views above borrow its mapping, which must outlive them.
    segment: Segment,
}

impl ConnSegment {
    /// Creates a connection segment whose ring holds about `ring_bytes` (client side), and
    /// the consumer end of its ring.
    pub(crate) fn create(ring_bytes: usize) -> Result<(ConnSegment, Consumer<'static>), Status> {
        let ring_slots = (ring_bytes / 64).next_power_of_two().max(64) as u32;
        // 256: the ring's slots then start 128-byte aligned, so a record's first two lines are an
        // aligned pair the adjacent-line prefetcher fetches together.
        let ring_offset = RING_OFFSET;
        let total_len = ring_offset + ResponseRing::bytes_needed(ring_slots);
        let segment = Segment::create("netless-conn", total_len).map_err(|e| {
            Status::resource_exhausted(format!("cannot create connection segment: {e}"))
        })?;
        let header = ConnHeader {
            magic: CONN_MAGIC,
            version: LAYOUT_VERSION,
            ring_slots,
            ring_offset: ring_offset as u64,
            total_len: total_len as u64,
        };
        // SAFETY: the segment is page aligned and at least AFTER_DOORBELL bytes long.
        unsafe { std::ptr::write(segment.as_ptr() as *mut ConnHeader, header) };
        // SAFETY: the ring region lies inside the segment and is 64-byte aligned.
        let consumer = unsafe {
            ResponseRing::init(
                NonNull::new_unchecked(segment.as_ptr().add(ring_offset)),
                total_len - ring_offset,
                ring_slots,
            )
        }
        .map_err(|e| Status::internal(format!("response ring layout: {e}")))?;
        // SAFETY: the doorbell line lies inside the segment.
        let doorbell = unsafe { &*(segment.as_ptr().add(DOORBELL_OFFSET) as *const DoorbellWords) };
        Ok((ConnSegment { doorbell, segment }, consumer))
    }

    /// Maps a connection segment received from a client and validates it (server side).
    pub(crate) fn attach(fd: OwnedFd) -> Result<(ConnSegment, Producer<'static>), String> {
        let segment = Segment::attach(fd, MAX_CONN_LEN)
            .map_err(|e| format!("cannot map connection segment: {e}"))?;
        if segment.len() < RING_OFFSET {
            return Err("connection segment too short".into());
        }
        // SAFETY: at least 32 readable bytes at a page-aligned address; plain integers.
        let h: ConnHeader =
            unsafe { std::ptr::read_volatile(segment.as_ptr() as *const ConnHeader) };
        if h.magic != CONN_MAGIC || h.version != LAYOUT_VERSION {
            return Err("connection segment has a bad magic or version".into());
        }
        if h.total_len != segment.len() as u64 || h.ring_offset != RING_OFFSET as u64 {
            return Err("connection segment geometry does not match its length".into());
        }
        // SAFETY: the ring region [RING_OFFSET, len) lies inside the mapping, 64-aligned;
        // attach validates the slot count against the region length.
        let producer = unsafe {
            ResponseRing::attach(
                NonNull::new_unchecked(segment.as_ptr().add(RING_OFFSET)),
                segment.len() - RING_OFFSET,
            )
        }
        .map_err(|e| format!("connection segment's ring is malformed: {e}"))?;
        // SAFETY: the doorbell line lies inside the mapping (len >= RING_OFFSET).
        let doorbell = unsafe { &*(segment.as_ptr().add(DOORBELL_OFFSET) as *const DoorbellWords) };
        Ok((ConnSegment { doorbell, segment }, producer))
    }
    pub(crate) fn doorbell(&self) -> &'static DoorbellWords {
        self.doorbell
    }
    pub(crate) fn segment(&self) -> &Segment {
        &self.segment
    }
}
