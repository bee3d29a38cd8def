//! A connection segment, mapped and validated: the client's doorbell and response ring.
//!
//! The client creates it and passes its fd at connect; the server attaches it, checks its
//! geometry against the mapping's real length once, and from then on uses only the
//! validated views (the ring's producer end and the doorbell).

use std::os::fd::OwnedFd;
use std::ptr::NonNull;

use netless_ring::{Consumer, DoorbellWords, Producer, ResponseRing};
use netless_shm::fabric::Extent;
use netless_shm::Segment;

use super::Place;

use super::layout::{ConnHeader, CONN_MAGIC, DOORBELL_OFFSET, LAYOUT_VERSION};
use crate::status::Status;

/// Largest connection segment a server agrees to map.
const MAX_CONN_LEN: usize = (1 << 30) + 4096;
/// Where a connection segment's response ring starts.
const RING_OFFSET: usize = 256;

/// A mapped connection segment.
pub(crate) struct ConnSegment {
    doorbell: &'static DoorbellWords,
    /// Where it is in a fabric region, if it is in one.
    extent: Option<Extent>,
    // Declared last: the views above borrow its mapping, which must outlive them.
    segment: Segment,
}

impl ConnSegment {
    /// Creates a connection segment whose ring holds about `ring_bytes` (client side), and
    /// the consumer end of its ring.
    pub(crate) fn create(ring_bytes: usize) -> Result<(ConnSegment, Consumer<'static>), Status> {
        Self::create_in(ring_bytes, Place::Memfd)
    }

    /// As [`ConnSegment::create`], in `place`.
    pub(crate) fn create_in(
        ring_bytes: usize,
        place: Place<'_>,
    ) -> Result<(ConnSegment, Consumer<'static>), Status> {
        let ring_slots = (ring_bytes / 64).next_power_of_two().max(64) as u32;
        // 256: the ring's slots then start 128-byte aligned, so a record's first two lines are an
        // aligned pair the adjacent-line prefetcher fetches together.
        let ring_offset = RING_OFFSET;
        let total_len = ring_offset + ResponseRing::bytes_needed(ring_slots);
        let (segment, extent) = place.segment("netless-conn", total_len).map_err(|e| {
            Status::resource_exhausted(format!("cannot create connection segment: {e}"))
        })?;
        let header = ConnHeader {
            magic: CONN_MAGIC,
            version: LAYOUT_VERSION,
            ring_slots,
            ring_offset: ring_offset as u64,
            total_len: total_len as u64,
        };
        // SAFETY: the segment is page aligned and longer than RING_OFFSET bytes.
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
        Ok((
            ConnSegment {
                doorbell,
                extent,
                segment,
            },
            consumer,
        ))
    }

    /// Maps a connection segment received from a client and validates it (server side); its
    /// ring may take at most `max_ring` bytes.
    pub(crate) fn attach(
        fd: OwnedFd,
        max_ring: usize,
    ) -> Result<(ConnSegment, Producer<'static>), String> {
        let max_len = Self::max_len(max_ring);
        let segment = Segment::attach(fd, max_len).map_err(|e| match e {
            netless_shm::Error::SegmentTooLarge { len, .. } => format!(
                "the client's response ring takes {len} bytes, more than the {max_ring} this \
                 server maps (its max_client_ring): lower ClientConfig::ring_bytes"
            ),
            e => format!("cannot map connection segment: {e}"),
        })?;
        Self::attach_segment(segment)
    }

    /// The longest connection segment whose ring takes at most `max_ring` bytes.
    pub(crate) fn max_len(max_ring: usize) -> usize {
        (RING_OFFSET + ResponseRing::bytes_needed((max_ring / 64) as u32)).min(MAX_CONN_LEN)
    }

    /// Validates a client's connection segment mapped from a fabric region (server side; the
    /// caller checked its length against [`ConnSegment::max_len`]).
    pub(crate) fn attach_segment(
        segment: Segment,
    ) -> Result<(ConnSegment, Producer<'static>), String> {
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
        Ok((
            ConnSegment {
                doorbell,
                extent: None,
                segment,
            },
            producer,
        ))
    }
    pub(crate) fn doorbell(&self) -> &DoorbellWords {
        self.doorbell
    }
    pub(crate) fn segment(&self) -> &Segment {
        &self.segment
    }
    /// Where it is in a fabric region, if this side made it in one.
    pub(crate) fn extent(&self) -> Option<Extent> {
        self.extent
    }
}

#[cfg(feature = "fault-injection")]
impl ConnSegment {
    /// Test-only: fills everything after the doorbell line with garbage (a server that
    /// scribbles over the client's response ring).
    pub(crate) fn fault_scribble(&self) {
        let seg = &self.segment;
        // SAFETY: every byte from 192 to the end lies inside the mapping (a connection segment
        // is longer than RING_OFFSET = 256); this is deliberate test garbage, written as bytes.
        unsafe { std::ptr::write_bytes(seg.as_ptr().add(192), 0xa5, seg.len() - 192) };
    }
}
