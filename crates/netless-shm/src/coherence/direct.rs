//! [`Direct`]: a view of the real mapping, and the cache-line instructions it issues.
//!
//! On x86-64 under software coherence a flush writes each line back with `clwb` (the line
//! stays cached, clean), else `clflushopt`, else `clflush`, then `sfence`; an invalidation
//! evicts each line with `clflushopt`, else `clflush`, then `mfence`. Which instructions the
//! CPU has is read from CPUID once per process. Other architectures get the fences alone:
//! they have no software coherence here yet, only the orderings hardware coherence needs.

use core::marker::PhantomData;
use core::ptr::NonNull;
use std::sync::OnceLock;

use super::{check_range, check_region, check_word, lines, Coherence, ViewError, LINE};
use crate::sync::{fence, AtomicU64, Ordering};

/// The instruction a software-coherent flush writes a line back with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FlushInstruction {
    /// `clwb`: written back, the line stays cached.
    Clwb,
    /// `clflushopt`: written back and evicted, weakly ordered (fenced once per flush).
    Clflushopt,
    /// `clflush`: written back and evicted, ordered with every other store.
    Clflush,
    /// No cache-line instruction on this architecture: fences only.
    FenceOnly,
}

impl FlushInstruction {
    /// The best write-back instruction this CPU has (CPUID, read once per process).
    pub fn detect() -> FlushInstruction {
        detected().0
    }
}

/// (write-back, evict) instructions of this CPU, read once per process.
fn detected() -> (FlushInstruction, FlushInstruction) {
    static DETECTED: OnceLock<(FlushInstruction, FlushInstruction)> = OnceLock::new();
    *DETECTED.get_or_init(detect_pair)
}

/// (write-back, evict) instructions, from CPUID leaf 7 (EBX bit 23 `clflushopt`, bit 24 `clwb`).
#[cfg(target_arch = "x86_64")]
fn detect_pair() -> (FlushInstruction, FlushInstruction) {
    let leaf7 = if core::arch::x86_64::__get_cpuid_max(0).0 >= 7 {
        core::arch::x86_64::__cpuid_count(7, 0).ebx
    } else {
        0
    };
    let clflushopt = leaf7 & (1 << 23) != 0;
    let clwb = leaf7 & (1 << 24) != 0;
    let evict = if clflushopt {
        FlushInstruction::Clflushopt
    } else {
        FlushInstruction::Clflush
    };
    (if clwb { FlushInstruction::Clwb } else { evict }, evict)
}

#[cfg(not(target_arch = "x86_64"))]
fn detect_pair() -> (FlushInstruction, FlushInstruction) {
    (FlushInstruction::FenceOnly, FlushInstruction::FenceOnly)
}

/// Issues `instruction` on the line at `line`.
///
/// # Safety
/// `line` points into a mapping that stays mapped during the call.
#[cfg(target_arch = "x86_64")]
#[inline]
unsafe fn line_op(instruction: FlushInstruction, line: *const u8) {
    match instruction {
        // SAFETY: `clwb` only writes a cached line back; the caller keeps `line` mapped, so
        // it cannot fault. CPUID said the CPU has it (it is only chosen then).
        FlushInstruction::Clwb => unsafe {
            core::arch::asm!("clwb [{0}]", in(reg) line, options(nostack, preserves_flags))
        },
        // SAFETY: `clflushopt` writes the line back and evicts it, which changes no byte of
        // memory; `line` is mapped (caller), and CPUID said the CPU has the instruction.
        FlushInstruction::Clflushopt => unsafe {
            core::arch::asm!("clflushopt [{0}]", in(reg) line, options(nostack, preserves_flags))
        },
        // SAFETY: `clflush` is baseline x86-64 (SSE2); it changes no byte of memory and
        // `line` is mapped (caller).
        FlushInstruction::Clflush => unsafe { core::arch::x86_64::_mm_clflush(line) },
        FlushInstruction::FenceOnly => {}
    }
}

#[cfg(not(target_arch = "x86_64"))]
#[inline]
unsafe fn line_op(_instruction: FlushInstruction, _line: *const u8) {}

/// Orders the write-backs issued before it before every later store (`sfence`).
#[inline]
fn store_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `sfence` is baseline x86-64 (SSE); it only orders stores.
    unsafe {
        core::arch::x86_64::_mm_sfence()
    };
    #[cfg(not(target_arch = "x86_64"))]
    fence(Ordering::SeqCst);
}

/// Completes the evictions issued before it before every later load (`mfence`).
#[inline]
fn full_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `mfence` is baseline x86-64 (SSE2); it only orders loads and stores.
    unsafe {
        core::arch::x86_64::_mm_mfence()
    };
    #[cfg(not(target_arch = "x86_64"))]
    fence(Ordering::SeqCst);
}

/// A view of the real mapping: reads and writes go to memory through this host's cache, and
/// under [`Coherence::Software`] flushes and invalidations are cache-line instructions.
#[derive(Debug)]
pub struct Direct<'a> {
    base: NonNull<u8>,
    len: usize,
    coherence: Coherence,
    write_back: FlushInstruction,
    evict: FlushInstruction,
    _region: PhantomData<&'a [AtomicU64]>,
}

// A `Direct` is a pointer to a mapping valid for `'a` (constructor contracts); what it does
// to the memory is the same whichever thread does it.
// SAFETY: see the paragraph above.
unsafe impl Send for Direct<'_> {}
// SAFETY: `&Direct` gives reads, atomic loads, flushes and fences only, all of which other
// hosts may be doing to the same memory at the same time by design.
unsafe impl Sync for Direct<'_> {}

impl<'a> Direct<'a> {
    /// A view of the whole of `segment`.
    ///
    /// # Errors
    /// [`ViewError::BadRegion`] unless the segment's length is a multiple of 64.
    pub fn of_segment(
        segment: &'a crate::Segment,
        coherence: Coherence,
    ) -> Result<Direct<'a>, ViewError> {
        // SAFETY: the segment's mapping is valid for as long as the borrow and its length is
        // sealed; its users share it through views or atomics.
        unsafe { Direct::from_raw(segment.as_ptr(), segment.len(), coherence) }
    }

    /// A view of `len` bytes at `base`.
    ///
    /// # Safety
    /// `[base, base + len)` is mapped readable and writable for `'a`, and the other hosts
    /// access it only through views (or atomically where they share words).
    ///
    /// # Errors
    /// [`ViewError::BadRegion`] unless `base` is 64-byte aligned and `len` a non-zero
    /// multiple of 64.
    pub unsafe fn from_raw(
        base: *mut u8,
        len: usize,
        coherence: Coherence,
    ) -> Result<Direct<'a>, ViewError> {
        check_region(base as usize, len)?;
        let base = NonNull::new(base).ok_or(ViewError::BadRegion { addr: 0, len })?;
        Ok(Direct {
            base,
            len,
            coherence,
            write_back: detected().0,
            evict: detected().1,
            _region: PhantomData,
        })
    }

    /// Length of the region in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always `false`: a view covers at least one line.
    #[inline]
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The coherence the view assumes.
    #[inline]
    pub fn coherence(&self) -> Coherence {
        self.coherence
    }

    /// The instruction [`Direct::flush`] writes lines back with under software coherence.
    pub fn flush_instruction(&self) -> FlushInstruction {
        self.write_back
    }

    /// See [`super::View::read`].
    ///
    /// # Errors
    /// [`ViewError::OutOfBounds`].
    #[inline]
    pub fn read(&self, offset: usize, buf: &mut [u8]) -> Result<(), ViewError> {
        check_range(offset, buf.len(), self.len)?;
        // SAFETY: the range is inside the mapping (checked), valid for 'a; `buf` is ours and
        // cannot overlap shared memory. Bytes another host writes meanwhile may be torn,
        // which the protocols above detect.
        unsafe {
            crate::copy::copy_bytes(self.base.as_ptr().add(offset), buf.as_mut_ptr(), buf.len())
        };
        Ok(())
    }

    /// See [`super::View::write`].
    ///
    /// # Errors
    /// [`ViewError::OutOfBounds`].
    #[inline]
    pub fn write(&mut self, offset: usize, buf: &[u8]) -> Result<(), ViewError> {
        check_range(offset, buf.len(), self.len)?;
        // SAFETY: the range is inside the mapping (checked), valid for writes for 'a; `buf`
        // is ours and cannot overlap it.
        unsafe { crate::copy::copy_bytes(buf.as_ptr(), self.base.as_ptr().add(offset), buf.len()) };
        Ok(())
    }

    /// The word at `offset`, already checked to be aligned and in bounds.
    #[inline]
    fn word(&self, offset: usize) -> &AtomicU64 {
        // SAFETY: `offset + 8 <= len` and `offset % 8 == 0` (checked by the callers), the base
        // is 64-byte aligned, so the word is aligned and inside the mapping, valid for 'a
        // (which outlives `&self`); shared words are accessed atomically by every host.
        unsafe { AtomicU64::from_ptr(self.base.as_ptr().add(offset).cast::<u64>()) }
    }

    /// See [`super::View::load_u64`].
    ///
    /// # Errors
    /// [`ViewError::Misaligned`], [`ViewError::OutOfBounds`].
    #[inline]
    pub fn load_u64(&self, offset: usize) -> Result<u64, ViewError> {
        check_word(offset, self.len)?;
        Ok(self.word(offset).load(Ordering::Acquire))
    }

    /// See [`super::View::store_u64`].
    ///
    /// # Errors
    /// [`ViewError::Misaligned`], [`ViewError::OutOfBounds`].
    #[inline]
    pub fn store_u64(&mut self, offset: usize, value: u64) -> Result<(), ViewError> {
        check_word(offset, self.len)?;
        self.word(offset).store(value, Ordering::Release);
        Ok(())
    }

    /// Issues `instruction` on every line covering `[offset, offset + len)`, checked.
    #[inline]
    fn each_line(&self, instruction: FlushInstruction, offset: usize, len: usize) {
        for line in lines(offset, len) {
            // SAFETY: the range is inside the mapping (checked by the callers) and the view's
            // lines are whole (constructor), so every covering line is mapped for 'a.
            unsafe { line_op(instruction, self.base.as_ptr().add(line * LINE)) };
        }
    }

    /// See [`super::View::flush`].
    ///
    /// # Errors
    /// [`ViewError::OutOfBounds`].
    #[inline]
    pub fn flush(&self, offset: usize, len: usize) -> Result<(), ViewError> {
        check_range(offset, len, self.len)?;
        match self.coherence {
            Coherence::Hardware => fence(Ordering::Release),
            Coherence::Software => {
                self.each_line(self.write_back, offset, len);
                store_fence();
            }
        }
        Ok(())
    }

    /// See [`super::View::invalidate`].
    ///
    /// # Errors
    /// [`ViewError::OutOfBounds`].
    #[inline]
    pub fn invalidate(&mut self, offset: usize, len: usize) -> Result<(), ViewError> {
        check_range(offset, len, self.len)?;
        match self.coherence {
            Coherence::Hardware => fence(Ordering::Acquire),
            Coherence::Software => {
                self.each_line(self.evict, offset, len);
                full_fence();
            }
        }
        Ok(())
    }

    /// See [`super::View::fence`].
    #[inline]
    pub fn fence(&self) {
        match self.coherence {
            Coherence::Hardware => fence(Ordering::SeqCst),
            Coherence::Software => full_fence(),
        }
    }
}
