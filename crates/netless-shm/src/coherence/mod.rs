//! Access to a region several hosts share without (or with) hardware cache coherence: the
//! [`Coherence`] mode of a region and the [`View`] through which one host reads and writes it.
//!
//! Under software coherence (a CXL-style fabric region mapped by hosts whose caches do not
//! snoop each other), a store sits in the writer's cache until it is written back, and a
//! load may be served from a line cached long ago. A [`View`] makes the cache operations
//! explicit: [`View::flush`] writes the lines covering a range back to memory and fences,
//! [`View::invalidate`] drops them so the next read comes from memory. Protocols above
//! (`netless-ring`'s polled ring) write, flush, then publish an index; and invalidate, then
//! read. Under hardware coherence the two are ordering fences only.
//!
//! Two kinds of view: [`Direct`] on the real mapping (cache-line instructions on x86-64),
//! and [`Emulated`], a non-coherent emulator for tests in which every view is a host with
//! a private copy of the whole region that only `flush` and `invalidate` move bytes in and
//! out of. This module owns the bounds checks and the cache-line primitives; it never
//! interprets the bytes of a region.

mod direct;
mod emulated;

use core::fmt;
use core::str::FromStr;

pub use direct::{Direct, FlushInstruction};
pub use emulated::{Emulated, Faults};

/// Size of a cache line, the unit of [`View::flush`] and [`View::invalidate`].
pub const LINE: usize = 64;

/// How the hosts sharing a region see each other's writes.
///
/// ```
/// use netless_shm::coherence::Coherence;
///
/// assert_eq!("software".parse::<Coherence>().unwrap(), Coherence::Software);
/// assert_eq!(Coherence::default().to_string(), "hardware");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Coherence {
    /// The caches keep the region coherent (one host, or a coherent fabric): flushes and
    /// invalidations are ordering fences only.
    #[default]
    Hardware,
    /// Nothing keeps caches coherent: writers write lines back and readers invalidate them.
    Software,
}

impl Coherence {
    /// The mode's name, as [`FromStr`] parses it.
    pub fn as_str(self) -> &'static str {
        match self {
            Coherence::Hardware => "hardware",
            Coherence::Software => "software",
        }
    }
}

impl fmt::Display for Coherence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A string that names no [`Coherence`] mode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown coherence mode {0:?}: expected \"hardware\" or \"software\"")]
pub struct ParseCoherenceError(pub String);

impl FromStr for Coherence {
    type Err = ParseCoherenceError;

    fn from_str(s: &str) -> Result<Coherence, ParseCoherenceError> {
        match s {
            "hardware" => Ok(Coherence::Hardware),
            "software" => Ok(Coherence::Software),
            _ => Err(ParseCoherenceError(s.to_owned())),
        }
    }
}

/// An access a [`View`] refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ViewError {
    /// The range does not lie inside the view.
    #[error("access of {len} bytes at offset {offset} lies outside the {region}-byte view")]
    OutOfBounds {
        /// Start of the range.
        offset: usize,
        /// Length of the range.
        len: usize,
        /// Length of the view.
        region: usize,
    },
    /// A word access at an offset that is not a multiple of 8.
    #[error("8-byte access at offset {offset}, which is not 8-byte aligned")]
    Misaligned {
        /// The offset.
        offset: usize,
    },
    /// The region given to a constructor does not start on a line or is not whole lines.
    #[error(
        "region at {addr:#x} of {len} bytes is not whole 64-byte lines: \
         map it at a line boundary with a length that is a multiple of 64"
    )]
    BadRegion {
        /// The region's address.
        addr: usize,
        /// The region's length.
        len: usize,
    },
}

/// Checks that `[offset, offset + len)` lies in a region of `region` bytes.
#[inline]
fn check_range(offset: usize, len: usize, region: usize) -> Result<(), ViewError> {
    match offset.checked_add(len) {
        Some(end) if end <= region => Ok(()),
        _ => Err(ViewError::OutOfBounds {
            offset,
            len,
            region,
        }),
    }
}

/// Checks that an 8-byte word at `offset` is aligned and lies in a region of `region` bytes.
#[inline]
fn check_word(offset: usize, region: usize) -> Result<(), ViewError> {
    if !offset.is_multiple_of(8) {
        return Err(ViewError::Misaligned { offset });
    }
    check_range(offset, 8, region)
}

/// Checks a constructor's region: line-aligned, whole lines, not empty.
fn check_region(addr: usize, len: usize) -> Result<(), ViewError> {
    if !addr.is_multiple_of(LINE) || !len.is_multiple_of(LINE) || len == 0 {
        return Err(ViewError::BadRegion { addr, len });
    }
    Ok(())
}

/// The lines (as indices from the start of the region) covering `[offset, offset + len)`,
/// after the range has been checked.
#[inline]
fn lines(offset: usize, len: usize) -> core::ops::Range<usize> {
    if len == 0 {
        return 0..0;
    }
    offset / LINE..(offset + len).div_ceil(LINE)
}

/// One host's access to a shared region: every read, write, flush and invalidation of a
/// software-coherence protocol goes through it. Offsets are from the region's start; every
/// access is bounds-checked and an out-of-range one is an error, never a fault.
///
/// Each host (process, or thread playing a host) makes its own view of a region; a view is
/// one writer's path to the lines it writes, so writing takes `&mut self`.
///
/// ```
/// use netless_shm::coherence::{Coherence, Direct, View};
/// use netless_shm::Segment;
///
/// let segment = Segment::create("view-example", 4096)?;
/// let mut view = View::from(Direct::of_segment(&segment, Coherence::Software)?);
/// view.write(64, b"hello")?;
/// view.flush(64, 5)?;
/// view.store_u64(128, 7)?;
/// view.flush(128, 8)?;
/// view.invalidate(64, 72)?;
/// let mut back = [0; 5];
/// view.read(64, &mut back)?;
/// assert_eq!(&back, b"hello");
/// assert_eq!(view.load_u64(128)?, 7);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub enum View<'a> {
    /// The real mapping.
    Direct(Direct<'a>),
    /// A host of the non-coherent emulator.
    Emulated(Emulated<'a>),
}

impl<'a> From<Direct<'a>> for View<'a> {
    fn from(direct: Direct<'a>) -> View<'a> {
        View::Direct(direct)
    }
}

impl<'a> From<Emulated<'a>> for View<'a> {
    fn from(emulated: Emulated<'a>) -> View<'a> {
        View::Emulated(emulated)
    }
}

impl<'a> View<'a> {
    /// A host's view of `len` bytes at `base`: the non-coherent emulator leaving out what
    /// `emulation`'s faults name, or (`None`) the real mapping with `coherence`.
    ///
    /// # Safety
    /// As [`Direct::from_raw`] and [`Emulated::from_raw`]: `[base, base + len)` is mapped
    /// readable and writable for `'a`, and every other access to it is atomic or through
    /// views.
    ///
    /// # Errors
    /// [`ViewError::BadRegion`] unless `base` is 64-byte aligned and `len` a non-zero
    /// multiple of 64.
    pub unsafe fn from_raw(
        base: *mut u8,
        len: usize,
        coherence: Coherence,
        emulation: Option<Faults>,
    ) -> Result<View<'a>, ViewError> {
        Ok(match emulation {
            Some(faults) => {
                // SAFETY: the caller's contract, which is `Emulated::from_raw`'s.
                let mut view = unsafe { Emulated::from_raw(base, len) }?;
                view.set_faults(faults);
                View::Emulated(view)
            }
            // SAFETY: the caller's contract, which is `Direct::from_raw`'s.
            None => View::Direct(unsafe { Direct::from_raw(base, len, coherence) }?),
        })
    }
}

impl View<'_> {
    /// Length of the region in bytes (a multiple of [`LINE`], never 0).
    #[inline]
    pub fn len(&self) -> usize {
        match self {
            View::Direct(v) => v.len(),
            View::Emulated(v) => v.len(),
        }
    }

    /// Always `false`: a view covers at least one line.
    #[inline]
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The coherence the view's accesses assume ([`Emulated`] is always software).
    #[inline]
    pub fn coherence(&self) -> Coherence {
        match self {
            View::Direct(v) => v.coherence(),
            View::Emulated(_) => Coherence::Software,
        }
    }

    /// Copies `buf.len()` bytes at `offset` into `buf`. Under software coherence they come
    /// from this host's cache: invalidate the lines first to see other hosts' writes.
    ///
    /// # Errors
    /// [`ViewError::OutOfBounds`].
    #[inline]
    pub fn read(&self, offset: usize, buf: &mut [u8]) -> Result<(), ViewError> {
        match self {
            View::Direct(v) => v.read(offset, buf),
            View::Emulated(v) => v.read(offset, buf),
        }
    }

    /// Copies `buf` to `offset`. Under software coherence other hosts see it once the lines
    /// are flushed.
    ///
    /// # Errors
    /// [`ViewError::OutOfBounds`].
    #[inline]
    pub fn write(&mut self, offset: usize, buf: &[u8]) -> Result<(), ViewError> {
        match self {
            View::Direct(v) => v.write(offset, buf),
            View::Emulated(v) => v.write(offset, buf),
        }
    }

    /// Loads the 8-byte word at `offset` in one single-copy atomic access (Acquire).
    ///
    /// # Errors
    /// [`ViewError::Misaligned`], [`ViewError::OutOfBounds`].
    #[inline]
    pub fn load_u64(&self, offset: usize) -> Result<u64, ViewError> {
        match self {
            View::Direct(v) => v.load_u64(offset),
            View::Emulated(v) => v.load_u64(offset),
        }
    }

    /// Stores the 8-byte word at `offset` in one single-copy atomic access (Release).
    ///
    /// # Errors
    /// [`ViewError::Misaligned`], [`ViewError::OutOfBounds`].
    #[inline]
    pub fn store_u64(&mut self, offset: usize, value: u64) -> Result<(), ViewError> {
        match self {
            View::Direct(v) => v.store_u64(offset, value),
            View::Emulated(v) => v.store_u64(offset, value),
        }
    }

    /// Writes the lines covering `[offset, offset + len)` back to memory, then fences stores,
    /// so that a store made after it (an index that publishes the range) reaches other hosts
    /// after the range does. A fence only under hardware coherence.
    ///
    /// # Errors
    /// [`ViewError::OutOfBounds`].
    #[inline]
    pub fn flush(&self, offset: usize, len: usize) -> Result<(), ViewError> {
        match self {
            View::Direct(v) => v.flush(offset, len),
            View::Emulated(v) => v.flush(offset, len),
        }
    }

    /// Drops this host's cached copy of the lines covering `[offset, offset + len)`, then
    /// fences, so that the next reads of them come from memory. Never invalidate a line
    /// this host writes and has not flushed: [`Direct`] would write it back first, but
    /// [`Emulated`] (like a cache that discards) loses the writes. A fence only under
    /// hardware coherence.
    ///
    /// # Errors
    /// [`ViewError::OutOfBounds`].
    #[inline]
    pub fn invalidate(&mut self, offset: usize, len: usize) -> Result<(), ViewError> {
        match self {
            View::Direct(v) => v.invalidate(offset, len),
            View::Emulated(v) => v.invalidate(offset, len),
        }
    }

    /// A full fence: every earlier load and store of this host (and, under software
    /// coherence, every earlier flush or invalidation) completes before any later one.
    #[inline]
    pub fn fence(&self) {
        match self {
            View::Direct(v) => v.fence(),
            View::Emulated(v) => v.fence(),
        }
    }
}

#[cfg(test)]
mod tests;
