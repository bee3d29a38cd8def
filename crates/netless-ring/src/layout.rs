//! Byte layouts of everything this crate places in shared memory, and the only code that
//! turns a raw region pointer into references to them.
//!
//! A region holding a receive queue or a response ring is, at a 64-byte aligned address:
//!
//! ```text
//! offset 0    RegionHeader   (64 B)  magic, layout version, capacity (cells or slots)
//! offset 64   PositionLine   (64 B)  queue: shared tail (producers write)
//!                                    ring:  consumer head (the consumer writes)
//! offset 128  payload                queue: capacity x u64 cells
//!                                    ring:  nslots x 64 B slots
//! ```
//!
//! [`DoorbellWords`] is one 64-byte line of its own, embedded wherever the caller likes.
//! This module validates the region's alignment and size and the header of a region it
//! attaches to; it never interprets the payload (the queue and ring modules do).

use crate::sync::{AtomicU32, AtomicU64};
#[cfg(not(loom))]
use core::ptr::NonNull;

/// Version of the layouts in this module; written at `init`, checked at `attach`.
pub const LAYOUT_VERSION: u32 = 1;

/// Size of a cache line, and alignment of every region and line in this module.
pub const CACHE_LINE: usize = 64;

/// Magic of a receive queue region: `"NLRECVQ1"`.
pub const RECEIVE_QUEUE_MAGIC: u64 = u64::from_le_bytes(*b"NLRECVQ1");

/// Magic of a response ring region: `"NLRESPR1"`.
pub const RESPONSE_RING_MAGIC: u64 = u64::from_le_bytes(*b"NLRESPR1");

/// Offset of the cells (queue) or slots (ring) from the start of a region.
pub const PAYLOAD_OFFSET: usize = 2 * CACHE_LINE;

/// Size of one response ring slot.
pub const SLOT_BYTES: usize = 64;

/// Why a region could not be initialised or attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    /// The region does not start on a 64-byte boundary.
    #[error("shared region at {addr:#x} is not 64-byte aligned: place it at a cache-line boundary of the mapping")]
    Misaligned {
        /// The region's address.
        addr: usize,
    },
    /// The region is shorter than the layout needs.
    #[error(
        "shared region is {got} bytes but the layout needs {needed}: size it with bytes_needed()"
    )]
    TooSmall {
        /// Bytes the layout needs.
        needed: usize,
        /// Bytes the caller provided.
        got: usize,
    },
    /// A capacity (cells or slots) is not a power of two in the allowed range.
    #[error("capacity {capacity} is invalid: it must be a power of two in {min}..={max}")]
    BadCapacity {
        /// The requested or stored capacity.
        capacity: u64,
        /// Smallest allowed.
        min: u64,
        /// Largest allowed.
        max: u64,
    },
    /// The header does not carry the expected magic number.
    #[error("region holds magic {found:#018x}, not a {what} ({expected:#018x}): wrong offset, or not initialised yet")]
    BadMagic {
        /// What was expected there.
        what: &'static str,
        /// The magic found.
        found: u64,
        /// The magic expected.
        expected: u64,
    },
    /// The header was written by an incompatible version of this crate.
    #[error("region has layout version {found}, this build understands {expected}: upgrade both sides together")]
    VersionMismatch {
        /// Version in the header.
        found: u32,
        /// [`LAYOUT_VERSION`].
        expected: u32,
    },
}

/// Validates a capacity: a power of two in `min..=max`.
pub(crate) fn check_capacity(capacity: u64, min: u64, max: u64) -> Result<(), LayoutError> {
    if capacity.is_power_of_two() && (min..=max).contains(&capacity) {
        Ok(())
    } else {
        Err(LayoutError::BadCapacity { capacity, min, max })
    }
}

/// First line of a queue or ring region. Written once by `init` (magic last, Release),
/// read once by `attach` (magic first, Acquire).
#[repr(C, align(64))]
pub struct RegionHeader {
    /// [`RECEIVE_QUEUE_MAGIC`] or [`RESPONSE_RING_MAGIC`]; 0 while being initialised.
    pub magic: AtomicU64,
    /// [`LAYOUT_VERSION`].
    pub version: AtomicU32,
    /// Number of cells (queue) or slots (ring).
    pub capacity: AtomicU32,
    _reserved: [u8; 48],
}

/// A 64-bit position alone on its cache line (queue tail, ring head), so the side that
/// writes it does not false-share with the header or the payload.
#[repr(C, align(64))]
pub struct PositionLine {
    /// The position.
    pub position: AtomicU64,
    _pad: [u8; 56],
}

/// The two words of a doorbell, on a cache line of their own. All-zero bytes are a valid
/// initial state, so a freshly mapped (zero-filled) segment needs no initialisation.
#[repr(C, align(64))]
pub struct DoorbellWords {
    /// Number of waiters that announced they are about to sleep (or sleep). Wrapping; a
    /// peer may corrupt it, which at worst costs a useless wake-up syscall or a sleep
    /// bounded by `max_sleep`.
    pub(crate) sleepers: AtomicU32,
    /// Futex word: bumped by a waker that saw sleepers.
    pub(crate) seq: AtomicU32,
    _pad: [u8; 56],
}

impl DoorbellWords {
    /// Bytes a doorbell occupies (one cache line).
    pub const BYTES: usize = 64;

    /// A doorbell nobody sleeps on.
    #[cfg(not(loom))]
    pub const fn new() -> Self {
        Self {
            sleepers: AtomicU32::new(0),
            seq: AtomicU32::new(0),
            _pad: [0; 56],
        }
    }

    /// A doorbell nobody sleeps on.
    #[cfg(loom)]
    pub fn new() -> Self {
        Self {
            sleepers: AtomicU32::new(0),
            seq: AtomicU32::new(0),
            _pad: [0; 56],
        }
    }

    /// Views the doorbell at the start of a shared region (zero-filled memory is a valid,
    /// idle doorbell).
    ///
    /// # Safety
    /// `region` must be valid for reads and writes of `region_len` bytes for `'a`, stay
    /// mapped for `'a`, and be accessed by this and other processes only as the atomics of
    /// [`DoorbellWords`] (no non-atomic Rust references to those bytes may exist).
    #[cfg(not(loom))]
    pub unsafe fn at<'a>(region: NonNull<u8>, region_len: usize) -> Result<&'a Self, LayoutError> {
        check_region(region, region_len, Self::BYTES)?;
        // SAFETY: aligned and large enough (checked above); valid for `'a` and accessed only
        // atomically (caller's contract); every bit pattern is a valid `DoorbellWords`.
        Ok(unsafe { region.cast::<DoorbellWords>().as_ref() })
    }
}

impl Default for DoorbellWords {
    fn default() -> Self {
        Self::new()
    }
}

impl core::fmt::Debug for RegionHeader {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        use crate::sync::Ordering::Relaxed;
        f.debug_struct("RegionHeader")
            .field("magic", &format_args!("{:#018x}", self.magic.load(Relaxed)))
            .field("version", &self.version.load(Relaxed))
            .field("capacity", &self.capacity.load(Relaxed))
            .finish_non_exhaustive()
    }
}

impl core::fmt::Debug for PositionLine {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        use crate::sync::Ordering::Relaxed;
        f.debug_struct("PositionLine")
            .field("position", &self.position.load(Relaxed))
            .finish_non_exhaustive()
    }
}

impl core::fmt::Debug for DoorbellWords {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        use crate::sync::Ordering::Relaxed;
        f.debug_struct("DoorbellWords")
            .field("sleepers", &self.sleepers.load(Relaxed))
            .field("seq", &self.seq.load(Relaxed))
            .finish()
    }
}

#[cfg(not(loom))]
const _: () = {
    use core::mem::{align_of, offset_of, size_of};
    assert!(size_of::<RegionHeader>() == 64 && align_of::<RegionHeader>() == 64);
    assert!(offset_of!(RegionHeader, magic) == 0);
    assert!(offset_of!(RegionHeader, version) == 8);
    assert!(offset_of!(RegionHeader, capacity) == 12);
    assert!(size_of::<PositionLine>() == 64 && align_of::<PositionLine>() == 64);
    assert!(offset_of!(PositionLine, position) == 0);
    assert!(size_of::<DoorbellWords>() == DoorbellWords::BYTES);
    assert!(align_of::<DoorbellWords>() == 64);
    assert!(offset_of!(DoorbellWords, sleepers) == 0);
    assert!(offset_of!(DoorbellWords, seq) == 4);
    assert!(size_of::<AtomicU64>() == 8 && align_of::<AtomicU64>() == 8);
    assert!(PAYLOAD_OFFSET == size_of::<RegionHeader>() + size_of::<PositionLine>());
};

/// Checks that `region` is 64-byte aligned and at least `needed` bytes long.
#[cfg(not(loom))]
pub(crate) fn check_region(
    region: NonNull<u8>,
    region_len: usize,
    needed: usize,
) -> Result<(), LayoutError> {
    let addr = region.as_ptr() as usize;
    if !addr.is_multiple_of(CACHE_LINE) {
        return Err(LayoutError::Misaligned { addr });
    }
    if region_len < needed {
        return Err(LayoutError::TooSmall {
            needed,
            got: region_len,
        });
    }
    Ok(())
}

/// The references into a checked region: header, position line, payload start.
#[cfg(not(loom))]
pub(crate) struct RegionParts<'a> {
    pub(crate) header: &'a RegionHeader,
    pub(crate) position: &'a AtomicU64,
    pub(crate) payload: NonNull<u8>,
}

/// Splits a region into header, position line and payload pointer.
///
/// # Safety
/// `check_region(region, len, PAYLOAD_OFFSET)` must have succeeded; the region must be
/// valid for reads and writes for `'a` and its first [`PAYLOAD_OFFSET`] bytes accessed
/// only atomically.
#[cfg(not(loom))]
pub(crate) unsafe fn region_parts<'a>(region: NonNull<u8>) -> RegionParts<'a> {
    // SAFETY: region is 64-aligned with at least PAYLOAD_OFFSET bytes (caller); both
    // structs consist of atomics and padding, valid for every bit pattern.
    let header = unsafe { region.cast::<RegionHeader>().as_ref() };
    // SAFETY: offset 64 is inside the checked prefix; 64-aligned.
    let line = unsafe { region.add(CACHE_LINE).cast::<PositionLine>().as_ref() };
    RegionParts {
        header,
        position: &line.position,
        // SAFETY: PAYLOAD_OFFSET <= region_len, so the result is in bounds (or one past).
        payload: unsafe { region.add(PAYLOAD_OFFSET) },
    }
}

/// Reads and validates the header of a region some other process initialised.
/// Returns the capacity stored there (not yet range-checked).
#[cfg(not(loom))]
pub(crate) fn read_header(
    header: &RegionHeader,
    expected_magic: u64,
    what: &'static str,
) -> Result<u32, LayoutError> {
    use crate::sync::Ordering::{Acquire, Relaxed};
    // Acquire: pairs with init's Release store of the magic, so the capacity, position
    // and payload initialisation are visible once the magic is.
    let magic = header.magic.load(Acquire);
    if magic != expected_magic {
        return Err(LayoutError::BadMagic {
            what,
            found: magic,
            expected: expected_magic,
        });
    }
    let version = header.version.load(Relaxed);
    if version != LAYOUT_VERSION {
        return Err(LayoutError::VersionMismatch {
            found: version,
            expected: LAYOUT_VERSION,
        });
    }
    Ok(header.capacity.load(Relaxed))
}

/// Publishes a header after the rest of the region has been initialised.
#[cfg(not(loom))]
pub(crate) fn write_header(header: &RegionHeader, magic: u64, capacity: u32) {
    use crate::sync::Ordering::{Relaxed, Release};
    header.version.store(LAYOUT_VERSION, Relaxed);
    header.capacity.store(capacity, Relaxed);
    header.magic.store(magic, Release);
}

/// Marks a header as "being initialised" (magic 0) before the region is rewritten.
#[cfg(not(loom))]
pub(crate) fn clear_header(header: &RegionHeader) {
    header.magic.store(0, crate::sync::Ordering::Release);
}
