//! Where everything lives in a fabric region, and the one validated view of its words.
//!
//! The region starts with a superblock page; then the member table, the service directory
//! and the unit table (one owner word per allocation unit); then the heap, cut into
//! [`UNIT`]-byte units that segments are made of. Everything but the superblock's fields is
//! derived from the region's size, so a member that opens the region recomputes the layout
//! and checks that the superblock agrees before it trusts any offset.

use std::ptr::NonNull;
use std::sync::Mutex;

use crate::coherence::View;
use crate::sync::{fence, AtomicU64, Ordering};

/// `NLFABRIC` in ASCII, little-endian: written last when a region is formatted.
pub(crate) const MAGIC: u64 = u64::from_le_bytes(*b"NLFABRIC");
/// Version of this layout; a member refuses a region of another.
pub(crate) const VERSION: u64 = 1;
/// A cache line: the unit of single-writer ownership.
pub(crate) const LINE: usize = 64;
/// Allocation unit of the heap (segments are whole units, page aligned).
pub const UNIT: usize = 64 * 1024;
/// Member slots in a region.
pub const MEMBERS: usize = 64;
/// Service directory entries in a region.
pub const DIRECTORY: usize = 128;
/// Bytes of one member slot (two lines: the member's own, then others' notes).
pub(crate) const MEMBER_BYTES: usize = 2 * LINE;
/// Bytes of one directory entry.
pub(crate) const ENTRY_BYTES: usize = 8 * LINE;
/// Longest service name a directory entry holds.
pub const MAX_NAME: usize = 255;
/// Smallest region: the tables and 16 units of heap.
pub const MIN_SIZE: u64 = 2 << 20;
/// Largest region this layout addresses (the unit table's owner words name 2^32 units).
pub const MAX_SIZE: u64 = 1 << 44;

// Superblock words (byte offsets).
pub(crate) const SB_MAGIC: usize = 0;
pub(crate) const SB_VERSION: usize = 8;
pub(crate) const SB_SIZE: usize = 16;
pub(crate) const SB_COHERENCE: usize = 24;
pub(crate) const SB_LEASE_NS: usize = 32;
/// Taken (0 → 1) by the one process that formats a fresh region.
pub(crate) const SB_FORMATTING: usize = 40;

/// The layout of a region of a given size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Geometry {
    pub(crate) size: u64,
    pub(crate) members_off: usize,
    pub(crate) dir_off: usize,
    pub(crate) units_off: usize,
    pub(crate) heap_off: usize,
    pub(crate) heap_units: usize,
}

impl Geometry {
    /// The layout of a region of `size` bytes, or `None` if it is out of range.
    pub(crate) fn of(size: u64) -> Option<Geometry> {
        if !(MIN_SIZE..=MAX_SIZE).contains(&size) {
            return None;
        }
        let size_usize = usize::try_from(size).ok()?;
        let members_off = 4096;
        let dir_off = members_off + MEMBERS * MEMBER_BYTES;
        let units_off = dir_off + DIRECTORY * ENTRY_BYTES;
        // An owner word per unit of the whole region bounds the table; the heap starts
        // after it, unit aligned.
        let max_units = size_usize / UNIT;
        let heap_off = (units_off + max_units * 8).next_multiple_of(UNIT);
        let heap_units = size_usize.checked_sub(heap_off)? / UNIT;
        (heap_units >= 16).then_some(Geometry {
            size,
            members_off,
            dir_off,
            units_off,
            heap_off,
            heap_units,
        })
    }

    pub(crate) fn member(&self, index: usize) -> usize {
        debug_assert!(index < MEMBERS);
        self.members_off + index * MEMBER_BYTES
    }

    pub(crate) fn entry(&self, index: usize) -> usize {
        debug_assert!(index < DIRECTORY);
        self.dir_off + index * ENTRY_BYTES
    }

    pub(crate) fn unit_word(&self, unit: usize) -> usize {
        debug_assert!(unit < self.heap_units);
        self.units_off + unit * 8
    }

    /// The unit an offset of the heap starts, if it is the start of one.
    pub(crate) fn unit_at(&self, offset: u64) -> Option<usize> {
        let offset = usize::try_from(offset).ok()?;
        let rel = offset.checked_sub(self.heap_off)?;
        (rel.is_multiple_of(UNIT) && rel / UNIT < self.heap_units).then_some(rel / UNIT)
    }

    pub(crate) fn unit_offset(&self, unit: usize) -> u64 {
        (self.heap_off + unit * UNIT) as u64
    }
}

/// The mapped region as words and bytes: every access is bounds-checked against the
/// mapping, so no offset (ours or read from the region) reaches outside it.
///
/// Two kinds of words: *atomic* ones ([`Words::word`]: state words, owner words), which
/// every member swaps and which the region keeps coherent (on a fabric without hardware
/// coherence they need the device's atomics); and *single-writer* fields ([`Words::load`],
/// [`Words::store`], [`Words::read`], [`Words::write`]), each line written by one member.
/// In a software-coherent region the latter go through a coherence view: a store is
/// written back at once, a load invalidates its line first. The layouts keep the two kinds
/// on separate lines, since a write-back is of whole lines.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Words {
    base: *mut u8,
    len: usize,
    /// The view single-writer fields go through, in a software-coherent region.
    view: Option<NonNull<Mutex<View<'static>>>>,
}

// SAFETY: `Words` is a pointer and a length into a shared mapping, and one to the view of
// it, that outlive every use (the `Fabric` owning both holds them, and every holder of a
// copy holds the `Fabric`); all access is through atomics, volatile copies, or the view
// under its lock, which are sound from any thread.
unsafe impl Send for Words {}
// SAFETY: as for `Send`: shared references hand out only atomics and copies.
unsafe impl Sync for Words {}

impl Words {
    /// # Safety
    /// `base` must be valid for reads and writes of `len` bytes, aligned to 64, and `view`
    /// (a view of the same bytes) valid, for as long as any copy of the returned value is
    /// used.
    pub(crate) unsafe fn new(
        base: *mut u8,
        len: usize,
        view: Option<NonNull<Mutex<View<'static>>>>,
    ) -> Words {
        Words { base, len, view }
    }

    fn check(&self, offset: usize, len: usize) {
        assert!(
            offset.checked_add(len).is_some_and(|end| end <= self.len),
            "fabric bytes {offset:#x}+{len} outside the {}-byte mapping",
            self.len
        );
    }

    fn view(&self) -> Option<std::sync::MutexGuard<'_, View<'static>>> {
        self.view.map(|v| {
            // SAFETY: the view outlives `self` (see `new`), and is only used under its lock.
            let view = unsafe { v.as_ref() };
            view.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        })
    }

    /// The aligned 8-byte atomic word at `offset`. Offsets are computed from a validated
    /// geometry; one outside the mapping is a bug here, not peer input, so it panics.
    pub(crate) fn word(&self, offset: usize) -> &AtomicU64 {
        assert!(offset.is_multiple_of(8));
        self.check(offset, 8);
        // SAFETY: in bounds and 8-aligned (the base is page aligned), checked above; the
        // mapping outlives `self` (see `new`); AtomicU64 has the layout of u64 and every
        // process accesses these words atomically.
        unsafe { &*(self.base.add(offset) as *const AtomicU64) }
    }

    /// The single-writer field at `offset`, fresh from the region.
    pub(crate) fn load(&self, offset: usize) -> u64 {
        self.check(offset, 8);
        match self.view() {
            Some(mut view) => {
                let _ = view.invalidate(offset & !(LINE - 1), LINE);
                view.load_u64(offset).unwrap_or(0)
            }
            None => self.word(offset).load(Ordering::Acquire),
        }
    }

    /// Stores the single-writer field at `offset` and writes it back.
    pub(crate) fn store(&self, offset: usize, value: u64) {
        self.check(offset, 8);
        match self.view() {
            Some(mut view) => {
                let _ = view.store_u64(offset, value);
                let _ = view.flush(offset & !(LINE - 1), LINE);
            }
            None => self.word(offset).store(value, Ordering::Release),
        }
    }

    /// Copies `out.len()` bytes at `offset` out of the region, fresh from it.
    pub(crate) fn read(&self, offset: usize, out: &mut [u8]) {
        self.check(offset, out.len());
        if let Some(mut view) = self.view() {
            let start = offset & !(LINE - 1);
            let _ = view.invalidate(start, (offset + out.len()).next_multiple_of(LINE) - start);
            if view.read(offset, out).is_err() {
                out.fill(0);
            }
            return;
        }
        for (i, b) in out.iter_mut().enumerate() {
            // SAFETY: `offset + i < len`, checked above; a volatile read of a byte another
            // process may be writing yields some byte, never undefined behaviour in practice
            // for plain shared memory (the value is validated by the caller).
            *b = unsafe { self.base.add(offset + i).read_volatile() };
        }
        fence(Ordering::Acquire);
    }

    /// Copies `bytes` into the region at `offset` and writes them back.
    pub(crate) fn write(&self, offset: usize, bytes: &[u8]) {
        self.check(offset, bytes.len());
        if let Some(mut view) = self.view() {
            let _ = view.write(offset, bytes);
            let start = offset & !(LINE - 1);
            let _ = view.flush(start, (offset + bytes.len()).next_multiple_of(LINE) - start);
            return;
        }
        fence(Ordering::Release);
        for (i, &b) in bytes.iter().enumerate() {
            // SAFETY: `offset + i < len`, checked above; this process owns the line it
            // writes by the protocol (a directory entry it claimed).
            unsafe { self.base.add(offset + i).write_volatile(b) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_fits_the_tables_before_a_unit_aligned_heap() {
        for size in [MIN_SIZE, 64 << 20, (1 << 30) + 12345, MAX_SIZE] {
            let g = Geometry::of(size).unwrap();
            assert!(g.units_off + g.heap_units * 8 <= g.heap_off);
            assert_eq!(g.heap_off % UNIT, 0);
            assert!(g.heap_off as u64 + (g.heap_units * UNIT) as u64 <= size);
            assert_eq!(g.unit_at(g.unit_offset(3)), Some(3));
            assert_eq!(g.unit_at(g.unit_offset(3) + 4096), None);
            assert_eq!(g.unit_at(0), None);
        }
        assert!(Geometry::of(MIN_SIZE - 1).is_none());
        assert!(Geometry::of(MAX_SIZE + 1).is_none());
    }
}
