//! A replica segment, mapped and validated: one trust group's receive queues, control lines,
//! block table and blocks, with the server's read-only control segment beside it.
//!
//! Creating writes the geometry; attaching reads it once from the peer's memory, validates
//! every offset and size against the segment's real length, and from then on only the
//! validated private copy is used. Nothing outside this module computes a pointer into a
//! replica segment from a value stored in it; a run of blocks is handed out as a bounds-checked
//! [`BlockRun`].

use std::os::fd::OwnedFd;
use std::ptr::NonNull;
use std::sync::Arc;

use netless_ring::{DoorbellWords, ReceiveQueue};
use netless_shm::fabric::Extent;
use netless_shm::Segment;

use super::control::ControlSegment;
use super::layout::{
    atomic_u32_slice, provisioning, ClientControl, QueueHead, ReplicaHeader, ServerControl,
    WorkerStats, CLIENT_CONTROL_OFFSET, FIXED_END, LAYOUT_VERSION, QUEUE_LINES, REPLICA_MAGIC,
};
use super::place::Place;
use super::run::BlockRun;
use crate::status::Status;
use crate::sync::{AtomicU32, Ordering};
use crate::wire::header::align64;

/// Largest replica segment a client agrees to map.
pub(crate) const MAX_REPLICA_LEN: usize = 1 << 30;
/// Most blocks (table words) in a replica segment.
pub(crate) const MAX_BLOCKS: u32 = 1 << 24;
/// Most receive queues in a replica segment.
pub(crate) const MAX_QUEUES: u32 = 1024;

/// The shape of a replica segment to create (server side).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReplicaSpec {
    pub(crate) block_size: u32,
    /// One of `layout::provisioning`.
    pub(crate) provisioning: u32,
    pub(crate) nparts: u32,
    pub(crate) part_blocks: u32,
    pub(crate) nqueues: u32,
    /// Most blocks one connection may hold at once.
    pub(crate) quota_blocks: u32,
    pub(crate) max_message: u32,
    pub(crate) max_connections: u32,
}

/// One receive queue of a replica and its two lines, borrowed from the mapping (which the
/// `ReplicaSegment` owns: the views are handed out only bound to it).
pub(crate) struct QueueView {
    queue: ReceiveQueue<'static>,
    doorbell: &'static DoorbellWords,
    head: &'static QueueHead,
}

impl QueueView {
    /// The queue of block indexes.
    #[inline(always)]
    pub(crate) fn queue(&self) -> &ReceiveQueue<'_> {
        &self.queue
    }

    /// The doorbell its workers sleep on.
    #[inline(always)]
    pub(crate) fn doorbell(&self) -> &DoorbellWords {
        self.doorbell
    }

    /// Its consumer position as the server publishes it.
    #[inline(always)]
    pub(crate) fn head(&self) -> &QueueHead {
        self.head
    }

    /// Requests queued and not yet taken, as the server last published its position (a
    /// hint: the tail is written by clients), clamped to `0..=capacity`.
    pub(crate) fn depth(&self) -> u64 {
        let depth = self
            .queue
            .tail_hint()
            .wrapping_sub(self.head.position.load(Ordering::Relaxed));
        if (depth as i64) < 0 {
            0
        } else {
            depth.min(u64::from(self.queue.capacity()))
        }
    }
}

/// A mapped replica segment, and the server's control segment.
pub(crate) struct ReplicaSegment {
    geometry: ReplicaHeader,
    queues: Box<[QueueView]>,
    /// In `control`'s mapping, which the `Arc` keeps.
    server_control: &'static ServerControl,
    client_control: &'static ClientControl,
    table: &'static [AtomicU32],
    blocks: NonNull<u8>,
    control: Arc<ControlSegment>,
    /// Where it is in a fabric region, if the server made it in one.
    extent: Option<Extent>,
    // Declared last: the views above borrow its mapping, which must outlive them.
    segment: Segment,
}

// SAFETY: the raw `blocks` pointer refers to the shared mapping owned by `segment`, which is
// Send + Sync; all access through it is by copies into and out of shared memory.
unsafe impl Send for ReplicaSegment {}
// SAFETY: as above.
unsafe impl Sync for ReplicaSegment {}

impl ReplicaSegment {
    /// Creates and lays out a replica segment (server side), beside the server's `control`.
    #[cfg(feature = "fuzzing")]
    pub(crate) fn create(
        service: &str,
        spec: ReplicaSpec,
        control: Arc<ControlSegment>,
    ) -> Result<ReplicaSegment, Status> {
        Self::create_in(service, spec, control, Place::Memfd)
    }

    /// As [`ReplicaSegment::create`], in `place`.
    pub(crate) fn create_in(
        service: &str,
        spec: ReplicaSpec,
        control: Arc<ControlSegment>,
        place: Place<'_>,
    ) -> Result<ReplicaSegment, Status> {
        // `run` relies on blocks of at least a full header.
        if !spec.block_size.is_power_of_two() || !(64..=65536).contains(&spec.block_size) {
            return Err(Status::invalid_argument(
                "block_size must be a power of two in 64..=65536",
            ));
        }
        let nblocks = spec
            .nparts
            .checked_mul(spec.part_blocks)
            .filter(|&n| (1..=MAX_BLOCKS).contains(&n))
            .ok_or_else(|| Status::invalid_argument("receive buffer has too many blocks"))?;
        // Every queued request holds at least one block, so no queue can hold more.
        let queue_capacity = spec.part_blocks.next_power_of_two().max(2);
        let qctl_offset = FIXED_END;
        let queue_offset = align64(qctl_offset + spec.nqueues as usize * QUEUE_LINES);
        let queue_stride = align64(ReceiveQueue::bytes_needed(queue_capacity));
        let table_offset = queue_offset + spec.nqueues as usize * queue_stride;
        let blocks_offset = (table_offset + nblocks as usize * 4)
            .next_multiple_of(spec.block_size.clamp(64, 4096) as usize);
        let total_len = blocks_offset + nblocks as usize * spec.block_size as usize;
        if total_len > MAX_REPLICA_LEN {
            return Err(Status::invalid_argument(format!(
                "the receive buffer needs a {total_len}-byte segment, more than the {MAX_REPLICA_LEN}-byte limit: lower buffer_bytes or max_connections"
            )));
        }
        let geometry = ReplicaHeader {
            magic: REPLICA_MAGIC,
            version: LAYOUT_VERSION,
            block_size: spec.block_size,
            nblocks,
            queue_capacity,
            max_message: spec.max_message,
            max_connections: spec.max_connections,
            queue_offset: queue_offset as u64,
            table_offset: table_offset as u64,
            blocks_offset: blocks_offset as u64,
            total_len: total_len as u64,
            provisioning: spec.provisioning,
            nparts: spec.nparts,
            part_blocks: spec.part_blocks,
            nqueues: spec.nqueues,
            queue_stride: queue_stride as u64,
            qctl_offset: qctl_offset as u64,
            quota_blocks: spec.quota_blocks.clamp(1, spec.part_blocks),
            pad: 0,
            reserved: [0; 3],
        };
        let (segment, extent) = place
            .segment(&format!("netless-replica-{service}"), total_len)
            .map_err(|e| {
                Status::resource_exhausted(format!("cannot create replica segment: {e}"))
            })?;
        let base = segment.as_ptr();
        // SAFETY: the segment is at least 128 bytes, page aligned, and nobody else maps it yet.
        unsafe { std::ptr::write(base as *mut ReplicaHeader, geometry) };
        let mut queues = Vec::with_capacity(spec.nqueues as usize);
        for q in 0..spec.nqueues as usize {
            // SAFETY: queue q's region [queue_offset + q·stride, +stride) is inside the segment
            // (total_len covers it), 64-byte aligned, and used only through the queue's atomics.
            let queue = unsafe {
                ReceiveQueue::init(
                    NonNull::new_unchecked(base.add(queue_offset + q * queue_stride)),
                    queue_stride,
                    queue_capacity,
                )
            }
            .map_err(|e| Status::internal(format!("receive queue layout: {e}")))?;
            queues.push(queue);
        }
        // SAFETY: geometry was computed above, so the views lie within the segment.
        let mut replica = unsafe { Self::assemble(segment, geometry, queues, control) }?;
        replica.extent = extent;
        Ok(replica)
    }

    /// Writes the segment's geometry and its queues' headers back from the server's private
    /// copy (server side, before a client attaches): a faulty member of the group may have
    /// overwritten them, and the next client would refuse the segment.
    pub(crate) fn restore_headers(&self) {
        let base = self.segment.as_ptr();
        let g = self.geometry;
        // SAFETY: the header's 128 bytes lie at the start of the mapping (aligned, in
        // bounds). The volatile write may be several stores that race a peer's writes; the
        // header is plain integers, valid whatever bytes end up there, and this process
        // never reads it back (the server keeps its geometry privately).
        unsafe { std::ptr::write_volatile(base as *mut ReplicaHeader, g) };
        for q in 0..g.nqueues as usize {
            // SAFETY: queue q's region lies inside the mapping, 64-byte aligned (computed at
            // create), accessed only as the queue layout's atomics.
            let _ = unsafe {
                ReceiveQueue::restore_header(
                    NonNull::new_unchecked(
                        base.add(g.queue_offset as usize + q * g.queue_stride as usize),
                    ),
                    g.queue_stride as usize,
                    g.queue_capacity,
                )
            };
        }
    }

    /// Maps a replica segment received from a server and validates its geometry, beside the
    /// server's (read-only) `control` segment (client side).
    pub(crate) fn attach(
        fd: OwnedFd,
        control: Arc<ControlSegment>,
    ) -> Result<ReplicaSegment, Status> {
        let segment = Segment::attach(fd, MAX_REPLICA_LEN)
            .map_err(|e| Status::unavailable(format!("cannot map the server's segment: {e}")))?;
        Self::attach_segment(segment, control)
    }

    /// Validates a server's replica segment mapped from a fabric region (client side).
    pub(crate) fn attach_segment(
        segment: Segment,
        control: Arc<ControlSegment>,
    ) -> Result<ReplicaSegment, Status> {
        if segment.len() > MAX_REPLICA_LEN {
            return Err(Status::unavailable(
                "the server's replica segment is larger than a client maps",
            ));
        }
        let bad = |what: &str| {
            Err(Status::unavailable(format!(
                "the server's replica segment is malformed ({what}); is it a netless server of the same version?"
            )))
        };
        if segment.len() < FIXED_END {
            return bad("too short");
        }
        let header = segment.as_ptr() as *const ReplicaHeader;
        // SAFETY: the segment is page aligned and at least 128 bytes; ReplicaHeader is plain
        // integers (any bytes are a valid value). This is the one read of the header.
        let g: ReplicaHeader = unsafe { std::ptr::read_volatile(header) };
        if g.magic != REPLICA_MAGIC {
            return bad("bad magic");
        }
        if g.version != LAYOUT_VERSION {
            return bad("layout version mismatch");
        }
        if !g.block_size.is_power_of_two() || !(64..=65536).contains(&g.block_size) {
            return bad("block size");
        }
        if g.nblocks < 1
            || g.nblocks > MAX_BLOCKS
            || g.max_connections == 0
            || g.max_connections > 0xffff
            || g.provisioning > provisioning::PER_CONNECTION
            || g.nparts == 0
            || g.part_blocks == 0
            || g.nparts.checked_mul(g.part_blocks) != Some(g.nblocks)
            || !(1..=MAX_QUEUES).contains(&g.nqueues)
            || !(1..=g.part_blocks).contains(&g.quota_blocks)
        {
            return bad("counts");
        }
        if g.total_len != segment.len() as u64 {
            return bad("length");
        }
        let len = segment.len() as u64;
        let queues_end = g
            .queue_stride
            .checked_mul(u64::from(g.nqueues))
            .and_then(|n| n.checked_add(g.queue_offset));
        let qctl_end = g
            .qctl_offset
            .checked_add(u64::from(g.nqueues) * QUEUE_LINES as u64);
        let t_end = g.table_offset.checked_add(u64::from(g.nblocks) * 4);
        let b_end = g
            .blocks_offset
            .checked_add(u64::from(g.nblocks) * u64::from(g.block_size));
        let ordered = g.qctl_offset >= FIXED_END as u64
            && g.qctl_offset.is_multiple_of(64)
            && g.queue_offset.is_multiple_of(64)
            && g.queue_stride.is_multiple_of(64)
            && g.queue_stride > 0
            && g.table_offset.is_multiple_of(64)
            && g.blocks_offset.is_multiple_of(64)
            && qctl_end.is_some_and(|e| e <= g.queue_offset)
            && queues_end.is_some_and(|e| e <= g.table_offset)
            && t_end.is_some_and(|e| e <= g.blocks_offset)
            && b_end.is_some_and(|e| e <= len);
        if !ordered {
            return bad("region offsets");
        }
        let mut queues = Vec::with_capacity(g.nqueues as usize);
        for q in 0..u64::from(g.nqueues) {
            // SAFETY: queue q's region [queue_offset + q·stride, +stride) lies inside the
            // mapping and is 64-byte aligned (checked above); attach validates the capacity.
            let queue = unsafe {
                ReceiveQueue::attach(
                    NonNull::new_unchecked(
                        segment
                            .as_ptr()
                            .add((g.queue_offset + q * g.queue_stride) as usize),
                    ),
                    g.queue_stride as usize,
                )
            }
            .map_err(|e| {
                Status::unavailable(format!("the server's receive queue is malformed: {e}"))
            })?;
            queues.push(queue);
        }
        // SAFETY: every region was bounds-checked against the mapping above.
        unsafe { Self::assemble(segment, g, queues, control) }
    }

    /// # Safety
    /// `geometry` must describe regions inside `segment`, 64-byte aligned.
    unsafe fn assemble(
        segment: Segment,
        geometry: ReplicaHeader,
        queues: Vec<ReceiveQueue<'static>>,
        control: Arc<ControlSegment>,
    ) -> Result<ReplicaSegment, Status> {
        let base = segment.as_ptr();
        let qctl = geometry.qctl_offset as usize;
        let queues = queues
            .into_iter()
            .enumerate()
            .map(|(q, queue)| {
                // SAFETY: queue q's two lines lie in [qctl_offset, queue_offset), inside the
                // mapping and 64-byte aligned; both are atomics only ever accessed atomically.
                let (doorbell, head) = unsafe {
                    let line = base.add(qctl + q * QUEUE_LINES);
                    (
                        &*(line as *const DoorbellWords),
                        &*(line.add(64) as *const QueueHead),
                    )
                };
                QueueView {
                    queue,
                    doorbell,
                    head,
                }
            })
            .collect();
        // SAFETY: the client control line lies below FIXED_END <= qctl_offset, 64-byte
        // aligned; it holds atomics only.
        let client_control = unsafe { &*(base.add(CLIENT_CONTROL_OFFSET) as *const ClientControl) };
        // SAFETY: the line lives in `control`'s mapping, which the `Arc` stored beside this
        // reference keeps for as long as the segment lives.
        let server_control = unsafe { &*(control.server_control() as *const ServerControl) };
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
            queues,
            server_control,
            client_control,
            table,
            blocks,
            control,
            extent: None,
            segment,
        })
    }

    /// Where it is in a fabric region, if the server made it in one.
    pub(crate) fn extent(&self) -> Option<Extent> {
        self.extent
    }

    pub(crate) fn geometry(&self) -> &ReplicaHeader {
        &self.geometry
    }
    /// The receive queues (one unless dispatch is partitioned).
    pub(crate) fn queues(&self) -> &[QueueView] {
        &self.queues
    }
    /// The queue a connection's requests go to.
    pub(crate) fn queue_for(&self, conn_index: u32) -> &QueueView {
        // One queue unless dispatch is partitioned: no division on the hot path then.
        if self.queues.len() == 1 {
            return &self.queues[0];
        }
        &self.queues[conn_index as usize % self.queues.len()]
    }
    pub(crate) fn server_control(&self) -> &ServerControl {
        self.server_control
    }
    pub(crate) fn client_control(&self) -> &ClientControl {
        self.client_control
    }
    pub(crate) fn table(&self) -> &[AtomicU32] {
        self.table
    }
    /// The workers' counters (in the control segment).
    pub(crate) fn stats(&self) -> &[WorkerStats] {
        self.control.stats()
    }
    /// The blocks a connection may allocate from: its partition's range.
    pub(crate) fn partition_for(&self, conn_index: u32) -> std::ops::Range<u32> {
        let p = conn_index % self.geometry.nparts;
        let start = p * self.geometry.part_blocks;
        start..start + self.geometry.part_blocks
    }
    /// How many connections allocate in each partition of the buffer (a hint: the server publishes its connection count).
    pub(crate) fn sharers(&self) -> u32 {
        let g = &self.geometry;
        match g.provisioning {
            provisioning::PER_CONNECTION => 1,
            _ => {
                let conns = self.server_control.connections.load(Ordering::Relaxed);
                conns.div_ceil(g.nparts.max(1)).max(1)
            }
        }
    }

    /// The buffer's shared allocation head, if connections share the partition's head
    /// (a hint any client writes).
    pub(crate) fn shared_head(&self) -> Option<&AtomicU32> {
        (self.geometry.provisioning == provisioning::SHARED)
            .then_some(&self.client_control.alloc_head)
    }

    pub(crate) fn segment(&self) -> &Segment {
        &self.segment
    }

    /// The control segment's fd as a client received it (tests of its seals).
    #[cfg(feature = "fault-injection")]
    pub(crate) fn control_fd_for_fault(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.control.received_fd()
    }
    /// Bytes per block.
    pub(crate) fn block_size(&self) -> usize {
        self.geometry.block_size as usize
    }
    /// The run of `count` blocks from block `index`, or `None` if it does not lie inside the
    /// buffer (or is empty).
    #[inline(always)]
    pub(crate) fn run(&self, index: u32, count: u32) -> Option<BlockRun<'_>> {
        let end = u64::from(index) + u64::from(count);
        if count == 0 || end > u64::from(self.geometry.nblocks) {
            return None;
        }
        let block = self.block_size();
        // SAFETY: index + count <= nblocks, so the run [index·block, (index + count)·block)
        // lies inside the blocks region of the mapping, which lives as long as `self`; the
        // block size is at least 64 (checked at create and attach).
        Some(unsafe {
            BlockRun::new(
                self.blocks.as_ptr().add(index as usize * block),
                count as usize * block,
            )
        })
    }
}
