//! The pool segment's layout and the one place that turns its raw bytes into typed views.
//!
//! ```text
//! 0          PoolHeader     geometry, written once by the creator, validated at attach
//! 4096       members        MAX_MEMBERS × MemberRow (64 B): the process table
//! m_end      slots          nslots × RefSlot (128 B): refs created and not yet collected
//! words_off  page words     npages × AtomicU64: the holder set of each page (bit m = member m)
//! hints_off  free hints     npages / 64 × AtomicU64: bit set = page probably free
//! pages_off  pages          npages × 4 KiB, page aligned
//! ```
//!
//! Every field here may be written by any member, so each is read as an atomic snapshot and
//! checked before use; nothing here trusts a peer.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use netless_shm::Segment;

use crate::PoolError;

/// Bytes per pool page.
pub const PAGE_SIZE: usize = 4096;
/// Members a domain can hold at once: one holder bit each in a page word.
pub const MAX_MEMBERS: usize = 56;
/// Page tables a ref slot can name (each lists up to [`TABLE_ENTRIES`] pages).
pub(crate) const SLOT_TABLES: usize = 24;
/// Page indexes per page-table page.
pub(crate) const TABLE_ENTRIES: usize = PAGE_SIZE / 4;
/// The largest buffer one Ref can name: 24 tables × 1024 pages × 4 KiB = 96 MiB.
pub const MAX_REF_BYTES: usize = SLOT_TABLES * TABLE_ENTRIES * PAGE_SIZE;

pub(crate) const MAGIC: u64 = u64::from_le_bytes(*b"NLPOOL01");
pub(crate) const VERSION: u32 = 2;
const MEMBERS_OFFSET: usize = PAGE_SIZE;

/// Holder bits of a page word (bits `MAX_MEMBERS..64` are never set by an honest member).
pub(crate) const HOLDER_MASK: u64 = (1 << MAX_MEMBERS) - 1;

/// Geometry, written by the creator before anyone else can see the segment.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct PoolHeader {
    pub magic: u64,
    pub version: u32,
    pub page_size: u32,
    pub domain_id: u64,
    pub npages: u32,
    pub nslots: u32,
    pub slots_offset: u64,
    pub words_offset: u64,
    pub hints_offset: u64,
    pub pages_offset: u64,
    pub total_len: u64,
}

/// Member row states (low byte of [`MemberRow::state`]; the high 32 bits count reuses).
pub(crate) mod member_state {
    pub(crate) const FREE: u64 = 0;
    pub(crate) const JOINING: u64 = 1;
    pub(crate) const ALIVE: u64 = 2;
    pub(crate) const REAPING: u64 = 3;
}

/// One process's row in the process table.
#[repr(C, align(64))]
pub(crate) struct MemberRow {
    /// `generation << 32 | state`.
    pub state: AtomicU64,
    /// The member's pid in its own pid namespace, and that namespace (the inode of its
    /// `/proc/self/ns/pid`, 0 if unknown): a process of that namespace that sees this pid
    /// at the other end of a socket is this member.
    pub pid: AtomicU32,
    pub pid_ns: AtomicU64,
    /// Bytes this member copied: copy-on-write page copies and `rread`/`rwrite`/by-value
    /// transfers (statistics, written only by the member).
    pub bytes_copied: AtomicU64,
    /// Pages this member copied on write.
    pub pages_copied: AtomicU64,
    /// Refs this member created.
    pub refs_created: AtomicU64,
    /// Refs this member mapped.
    pub refs_mapped: AtomicU64,
    /// The member's liveness token: the byte of the domain's `members` file it holds locked
    /// while it runs (`members`).
    pub token: AtomicU64,
}
const _: () = assert!(std::mem::size_of::<MemberRow>() == 64);

/// Ref slot states (low byte of [`RefSlot::state`]).
pub(crate) mod slot_state {
    pub(crate) const FREE: u64 = 0;
    pub(crate) const BUILDING: u64 = 1;
    pub(crate) const READY: u64 = 2;
    pub(crate) const TAKEN: u64 = 3;
}

/// A Ref in the pool: the pages of a buffer, listed in page-table pages held by the creator.
#[repr(C, align(128))]
pub(crate) struct RefSlot {
    /// `generation << 32 | creator member << 8 | state`.
    pub state: AtomicU64,
    pub len: AtomicU64,
    pub npages: AtomicU32,
    pub ntables: AtomicU32,
    pub tables: [AtomicU32; SLOT_TABLES],
}
const _: () = assert!(std::mem::size_of::<RefSlot>() == 128);

pub(crate) fn slot_word(generation: u32, creator: usize, state: u64) -> u64 {
    (u64::from(generation) << 32) | ((creator as u64) << 8) | state
}
pub(crate) fn slot_parts(word: u64) -> (u32, usize, u64) {
    (
        (word >> 32) as u32,
        ((word >> 8) & 0xff) as usize,
        word & 0xff,
    )
}

/// How big a pool is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolGeometry {
    /// Pages of 4 KiB.
    pub pages: u32,
    /// Refs that can be outstanding at once, domain-wide.
    pub ref_slots: u32,
}

impl Default for PoolGeometry {
    /// 256 MiB of pages (memory is only used once touched) and 16384 ref slots.
    fn default() -> PoolGeometry {
        PoolGeometry {
            pages: 65536,
            ref_slots: 16384,
        }
    }
}

fn align_up(x: usize, to: usize) -> usize {
    x.div_ceil(to) * to
}

impl PoolGeometry {
    pub(crate) fn validate(&self) -> Result<(), PoolError> {
        if !(64..=1 << 24).contains(&self.pages) || !self.pages.is_multiple_of(64) {
            return Err(PoolError::Config(format!(
                "pages must be a multiple of 64 in 64..=16777216, got {}",
                self.pages
            )));
        }
        if !(1..=1 << 20).contains(&self.ref_slots) {
            return Err(PoolError::Config(format!(
                "ref_slots must be 1..=1048576, got {}",
                self.ref_slots
            )));
        }
        Ok(())
    }

    pub(crate) fn header(&self, domain_id: u64) -> PoolHeader {
        let npages = self.pages as usize;
        let slots_offset = MEMBERS_OFFSET + MAX_MEMBERS * 64;
        let words_offset = slots_offset + self.ref_slots as usize * 128;
        let hints_offset = words_offset + npages * 8;
        let pages_offset = align_up(hints_offset + npages / 8, PAGE_SIZE);
        PoolHeader {
            magic: MAGIC,
            version: VERSION,
            page_size: PAGE_SIZE as u32,
            domain_id,
            npages: self.pages,
            nslots: self.ref_slots,
            slots_offset: slots_offset as u64,
            words_offset: words_offset as u64,
            hints_offset: hints_offset as u64,
            pages_offset: pages_offset as u64,
            total_len: (pages_offset + npages * PAGE_SIZE) as u64,
        }
    }
}

/// The mapped pool: typed, bounds-checked views of the segment.
pub(crate) struct PoolMap {
    segment: Segment,
    header: PoolHeader,
}

impl std::fmt::Debug for PoolMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolMap")
            .field("domain_id", &format_args!("{:016x}", self.header.domain_id))
            .field("npages", &self.header.npages)
            .finish()
    }
}

impl PoolMap {
    /// Creates a new pool segment, all pages free.
    pub(crate) fn create(geometry: PoolGeometry, domain_id: u64) -> Result<PoolMap, PoolError> {
        geometry.validate()?;
        let header = geometry.header(domain_id);
        let segment = Segment::create("netless-pool", header.total_len as usize)?;
        Self::lay_out(segment, header)
    }

    /// Lays out a new pool, all pages free, in `segment`: zero-filled, made by the caller
    /// (in a fabric region), exactly `geometry`'s length.
    pub(crate) fn create_in(
        segment: Segment,
        geometry: PoolGeometry,
        domain_id: u64,
    ) -> Result<PoolMap, PoolError> {
        geometry.validate()?;
        let header = geometry.header(domain_id);
        if segment.len() as u64 != header.total_len {
            return Err(PoolError::Corrupt(format!(
                "a pool of this geometry takes {} bytes, not {}",
                header.total_len,
                segment.len()
            )));
        }
        Self::lay_out(segment, header)
    }

    fn lay_out(segment: Segment, header: PoolHeader) -> Result<PoolMap, PoolError> {
        // SAFETY: the segment is fresh, private to this process and at least a page long, so
        // the header's 64 bytes at offset 0 are in bounds and nobody else reads them yet.
        unsafe { (segment.as_ptr() as *mut PoolHeader).write(header) };
        let map = PoolMap { segment, header };
        for hint in map.hints() {
            hint.store(u64::MAX, Ordering::Relaxed);
        }
        Ok(map)
    }

    /// Maps a pool segment received from the domain's coordinator, validating its geometry.
    pub(crate) fn attach(
        fd: std::os::fd::OwnedFd,
        expect_domain: Option<u64>,
    ) -> Result<PoolMap, PoolError> {
        Self::attach_segment(Segment::attach(fd, 1 << 40)?, expect_domain)
    }

    /// Validates a pool segment mapped from a fabric region.
    pub(crate) fn attach_segment(
        segment: Segment,
        expect_domain: Option<u64>,
    ) -> Result<PoolMap, PoolError> {
        let header = if segment.len() >= PAGE_SIZE {
            // SAFETY: the segment has at least a page, so the header's bytes are in bounds; it is
            // read once by value (plain integers, any bit pattern is valid), then validated.
            unsafe { (segment.as_ptr() as *const PoolHeader).read() }
        } else {
            return Err(PoolError::Corrupt(
                "pool segment shorter than its header".into(),
            ));
        };
        let geometry = PoolGeometry {
            pages: header.npages,
            ref_slots: header.nslots,
        };
        let bad = |what: &str| Err(PoolError::Corrupt(format!("pool header: {what}")));
        if header.magic != MAGIC || header.version != VERSION {
            return bad("wrong magic or version (another netless version?)");
        }
        if geometry.validate().is_err() || geometry.header(header.domain_id) != header {
            return bad("inconsistent geometry");
        }
        if header.total_len != segment.len() as u64 {
            return bad("length does not match the segment");
        }
        if let Some(id) = expect_domain {
            if id != header.domain_id {
                return Err(PoolError::Corrupt(format!(
                    "the coordinator passed the pool of domain {:016x}, expected {id:016x}",
                    header.domain_id
                )));
            }
        }
        Ok(PoolMap { segment, header })
    }

    pub(crate) fn segment(&self) -> &Segment {
        &self.segment
    }

    pub(crate) fn domain_id(&self) -> u64 {
        self.header.domain_id
    }

    pub(crate) fn npages(&self) -> u32 {
        self.header.npages
    }

    pub(crate) fn nslots(&self) -> u32 {
        self.header.nslots
    }

    /// A typed array at `offset` of the segment.
    ///
    /// # Safety
    /// `offset + len * size_of::<T>()` must lie inside the segment, `offset` must be aligned
    /// for `T`, and `T` must be made of atomics (valid for any bit pattern, shareable).
    unsafe fn array<T>(&self, offset: u64, len: usize) -> &[T] {
        // SAFETY: by the caller's contract.
        unsafe {
            std::slice::from_raw_parts(self.segment.as_ptr().add(offset as usize) as *const T, len)
        }
    }

    pub(crate) fn members(&self) -> &[MemberRow] {
        // SAFETY: the geometry (validated at create/attach) places MAX_MEMBERS 64-byte rows at
        // MEMBERS_OFFSET, 64-byte aligned, inside the segment; MemberRow is all atomics.
        unsafe { self.array(MEMBERS_OFFSET as u64, MAX_MEMBERS) }
    }

    pub(crate) fn slots(&self) -> &[RefSlot] {
        // SAFETY: validated geometry puts nslots 128-byte slots inside the segment at
        // slots_offset = 4096 + 56 × 64 = 7680 = 60 × 128 (aligned); RefSlot is all atomics.
        unsafe { self.array(self.header.slots_offset, self.header.nslots as usize) }
    }

    pub(crate) fn words(&self) -> &[AtomicU64] {
        // SAFETY: validated geometry: npages u64 words at words_offset (8-aligned), inside.
        unsafe { self.array(self.header.words_offset, self.header.npages as usize) }
    }

    pub(crate) fn hints(&self) -> &[AtomicU64] {
        // SAFETY: validated geometry: npages / 64 u64 words at hints_offset (8-aligned), inside.
        unsafe { self.array(self.header.hints_offset, self.header.npages as usize / 64) }
    }

    /// Pointer to the first byte of page `page` (which the caller has bounds-checked).
    pub(crate) fn page_ptr(&self, page: u32) -> *mut u8 {
        debug_assert!(page < self.header.npages);
        self.segment
            .as_ptr()
            .wrapping_add(self.header.pages_offset as usize + page as usize * PAGE_SIZE)
    }
}
