//! [`Emulated`]: a non-coherent host simulated in software, for testing protocols meant for
//! software coherence on an ordinary (coherent) machine.
//!
//! Each `Emulated` view is one host with a cache as large as the region that never evicts
//! on its own: a private copy of the region, filled from the shared region when the view is
//! made. Reads and writes touch only the private copy. [`Emulated::flush`] copies the covered
//! 64-byte lines to the shared region, whole, as a write-back does (so it clobbers whatever
//! another host wrote to the same line: the hazard single-writer lines avoid), and
//! [`Emulated::invalidate`] copies them back, discarding the private content. A line never
//! invalidated reads as it was when the view was made, or as this host last wrote it: the
//! worst a real cache can do. [`Faults`] leave flushes or invalidations out, to show that a
//! protocol needs them.
//!
//! The shared region is touched with relaxed 8-byte atomics and a fence after each flush and
//! invalidation, so hosts in threads of one process do not race in Rust's memory model;
//! hosts in other processes map the same file and make their own views.

use core::marker::PhantomData;
use core::ptr::NonNull;

use super::{check_range, check_region, check_word, lines, ViewError, LINE};
use crate::sync::{fence, AtomicU64, Ordering};

/// Operations an [`Emulated`] host leaves out, to show what breaks without them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Faults {
    /// [`Emulated::flush`] does nothing: this host's writes never reach other hosts.
    pub skip_flush: bool,
    /// [`Emulated::invalidate`] does nothing: this host keeps reading its stale copy.
    pub skip_invalidate: bool,
}

/// One emulated host's view of a shared region: see the module documentation.
///
/// ```
/// use netless_shm::coherence::Emulated;
/// use netless_shm::Segment;
///
/// let segment = Segment::create("emulated-example", 4096)?;
/// let mut a = Emulated::of_segment(&segment)?;
/// let mut b = Emulated::of_segment(&segment)?;
/// a.store_u64(0, 42)?;
/// b.invalidate(0, 8)?;
/// assert_eq!(b.load_u64(0)?, 0, "not flushed yet");
/// a.flush(0, 8)?;
/// assert_eq!(b.load_u64(0)?, 0, "flushed, but b reads its stale line");
/// b.invalidate(0, 8)?;
/// assert_eq!(b.load_u64(0)?, 42);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Emulated<'a> {
    shared: NonNull<u8>,
    private: Box<[u8]>,
    faults: Faults,
    _region: PhantomData<&'a [AtomicU64]>,
}

// An `Emulated` owns its private copy and points at a shared region valid for `'a`
// (constructor contracts), which it touches only with atomics.
// SAFETY: see the paragraph above; nothing in it is tied to a thread.
unsafe impl Send for Emulated<'_> {}
// SAFETY: `&Emulated` reads the private copy and does atomic stores to the shared region.
unsafe impl Sync for Emulated<'_> {}

impl<'a> Emulated<'a> {
    /// A host's view of the whole of `segment`.
    ///
    /// # Errors
    /// [`ViewError::BadRegion`] unless the segment's length is a multiple of 64.
    pub fn of_segment(segment: &'a crate::Segment) -> Result<Emulated<'a>, ViewError> {
        // SAFETY: the segment's mapping is valid for as long as the borrow and its length is
        // sealed; the emulated hosts touch it only atomically.
        unsafe { Emulated::from_raw(segment.as_ptr(), segment.len()) }
    }

    /// A host's view of `len` bytes at `base`, its private copy filled from them.
    ///
    /// # Safety
    /// `[base, base + len)` is mapped readable and writable for `'a`, and every other access
    /// to it is atomic (other emulated views, atomics of the test).
    ///
    /// # Errors
    /// [`ViewError::BadRegion`] unless `base` is 64-byte aligned and `len` a non-zero
    /// multiple of 64.
    pub unsafe fn from_raw(base: *mut u8, len: usize) -> Result<Emulated<'a>, ViewError> {
        check_region(base as usize, len)?;
        let shared = NonNull::new(base).ok_or(ViewError::BadRegion { addr: 0, len })?;
        let mut view = Emulated {
            shared,
            private: vec![0; len].into_boxed_slice(),
            faults: Faults::default(),
            _region: PhantomData,
        };
        for line in 0..len / LINE {
            view.load_line(line);
        }
        fence(Ordering::SeqCst);
        Ok(view)
    }

    /// Makes this host leave out the operations `faults` names, from now on.
    pub fn set_faults(&mut self, faults: Faults) {
        self.faults = faults;
    }

    /// The operations this host leaves out.
    pub fn faults(&self) -> Faults {
        self.faults
    }

    /// Length of the region in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.private.len()
    }

    /// Always `false`: a view covers at least one line.
    #[inline]
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The shared word at `offset`, a multiple of 8 below `len`.
    #[inline]
    fn shared_word(&self, offset: usize) -> &AtomicU64 {
        debug_assert!(offset.is_multiple_of(8) && offset + 8 <= self.len());
        // SAFETY: callers pass word offsets of whole lines inside the region (the region is
        // whole lines, 64-byte aligned), so the word is aligned and mapped for 'a, which
        // outlives `&self`; every access to the shared region is atomic (contract).
        unsafe { AtomicU64::from_ptr(self.shared.as_ptr().add(offset).cast::<u64>()) }
    }

    /// Copies line `line` from the shared region into the private copy.
    fn load_line(&mut self, line: usize) {
        for word in (line * LINE..(line + 1) * LINE).step_by(8) {
            let value = self.shared_word(word).load(Ordering::Relaxed);
            self.private[word..word + 8].copy_from_slice(&value.to_ne_bytes());
        }
    }

    /// Copies line `line` from the private copy to the shared region.
    fn store_line(&self, line: usize) {
        for word in (line * LINE..(line + 1) * LINE).step_by(8) {
            let value = u64::from_ne_bytes(self.private_word(word));
            self.shared_word(word).store(value, Ordering::Relaxed);
        }
    }

    /// The private copy's bytes of the word at `offset`, checked by the caller.
    #[inline]
    fn private_word(&self, offset: usize) -> [u8; 8] {
        let mut bytes = [0; 8];
        bytes.copy_from_slice(&self.private[offset..offset + 8]);
        bytes
    }

    /// See [`super::View::read`]: from the private copy.
    ///
    /// # Errors
    /// [`ViewError::OutOfBounds`].
    pub fn read(&self, offset: usize, buf: &mut [u8]) -> Result<(), ViewError> {
        check_range(offset, buf.len(), self.len())?;
        buf.copy_from_slice(&self.private[offset..offset + buf.len()]);
        Ok(())
    }

    /// See [`super::View::write`]: to the private copy.
    ///
    /// # Errors
    /// [`ViewError::OutOfBounds`].
    pub fn write(&mut self, offset: usize, buf: &[u8]) -> Result<(), ViewError> {
        check_range(offset, buf.len(), self.len())?;
        self.private[offset..offset + buf.len()].copy_from_slice(buf);
        Ok(())
    }

    /// See [`super::View::load_u64`]: from the private copy.
    ///
    /// # Errors
    /// [`ViewError::Misaligned`], [`ViewError::OutOfBounds`].
    pub fn load_u64(&self, offset: usize) -> Result<u64, ViewError> {
        check_word(offset, self.len())?;
        Ok(u64::from_ne_bytes(self.private_word(offset)))
    }

    /// See [`super::View::store_u64`]: to the private copy.
    ///
    /// # Errors
    /// [`ViewError::Misaligned`], [`ViewError::OutOfBounds`].
    pub fn store_u64(&mut self, offset: usize, value: u64) -> Result<(), ViewError> {
        check_word(offset, self.len())?;
        self.private[offset..offset + 8].copy_from_slice(&value.to_ne_bytes());
        Ok(())
    }

    /// See [`super::View::flush`]: copies the covered lines, whole, to the shared region
    /// (nothing under [`Faults::skip_flush`]), then fences.
    ///
    /// # Errors
    /// [`ViewError::OutOfBounds`].
    pub fn flush(&self, offset: usize, len: usize) -> Result<(), ViewError> {
        check_range(offset, len, self.len())?;
        if !self.faults.skip_flush {
            for line in lines(offset, len) {
                self.store_line(line);
            }
        }
        fence(Ordering::SeqCst);
        Ok(())
    }

    /// See [`super::View::invalidate`]: copies the covered lines, whole, from the shared
    /// region over the private copy (nothing under [`Faults::skip_invalidate`]), then fences.
    ///
    /// # Errors
    /// [`ViewError::OutOfBounds`].
    pub fn invalidate(&mut self, offset: usize, len: usize) -> Result<(), ViewError> {
        check_range(offset, len, self.len())?;
        if !self.faults.skip_invalidate {
            for line in lines(offset, len) {
                self.load_line(line);
            }
        }
        fence(Ordering::SeqCst);
        Ok(())
    }

    /// See [`super::View::fence`].
    pub fn fence(&self) {
        fence(Ordering::SeqCst);
    }
}
