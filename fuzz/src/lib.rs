//! What the fuzz targets in `fuzz_targets/` share: reading an input as fields, and a
//! cache-line aligned region standing in for a mapped segment.
//!
//! Most targets call an entry point of the crate that owns the decoder (each crate's
//! `fuzzing` module, behind its `fuzzing` feature); the ring targets drive `netless-ring`'s
//! public API directly.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

/// A fuzz input read front to back: fixed-width fields, zero once the bytes run out.
#[derive(Debug)]
pub struct Input<'a>(pub &'a [u8]);

impl<'a> Input<'a> {
    /// The next `N` bytes (zero-padded).
    pub fn array<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0; N];
        let n = N.min(self.0.len());
        out[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        out
    }

    /// The next byte.
    pub fn u8(&mut self) -> u8 {
        self.array::<1>()[0]
    }

    /// The next little-endian `u16`.
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.array())
    }

    /// The next little-endian `u32`.
    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.array())
    }

    /// The next little-endian `u64`.
    pub fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.array())
    }

    /// Whether every byte has been read.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The bytes not read yet.
    pub fn rest(self) -> &'a [u8] {
        self.0
    }
}

/// One cache line, so a `Vec` of them is a 64-byte aligned region.
#[derive(Clone, Copy, Debug)]
#[repr(C, align(64))]
pub struct Line(pub [u8; 64]);

/// A 64-byte aligned region of `len` bytes (rounded up to whole lines), zero-filled: what the
/// ring crate's `init` and `attach` take as a mapped segment's region. Heap memory, so the
/// address sanitizer sees any access outside it. It is reached only through its raw pointer
/// (as a mapping is), so the views the ring makes of it stay valid while it is written.
#[derive(Debug)]
pub struct Region {
    lines: NonNull<Line>,
    count: usize,
    len: usize,
}

impl Region {
    /// A zero-filled region of `len` bytes.
    pub fn new(len: usize) -> Region {
        let lines: Box<[Line]> = vec![Line([0; 64]); len.div_ceil(64)].into_boxed_slice();
        let count = lines.len();
        let lines = NonNull::new(Box::into_raw(lines).cast::<Line>()).expect("a Box's pointer");
        Region { lines, count, len }
    }

    /// Its first byte.
    pub fn ptr(&self) -> NonNull<u8> {
        self.lines.cast()
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Writes `bytes` from byte `at` (cut at the region's end), as a peer writes its memory.
    pub fn write(&self, at: usize, bytes: &[u8]) {
        let n = bytes.len().min(self.len.saturating_sub(at));
        // SAFETY: at + n <= len <= the lines' bytes; nothing holds a reference to them.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr().as_ptr().add(at), n) };
    }

    /// Stores `value` in the 8-aligned word at byte `at`, as another process's atomic store.
    ///
    /// # Panics
    /// If the word is not inside the region or not 8-aligned.
    pub fn store_u64(&self, at: usize, value: u64) {
        assert!(
            at % 8 == 0 && at + 8 <= self.len,
            "a word outside the region"
        );
        // SAFETY: inside the region and 8-aligned (asserted); the ring reads it atomically.
        let word = unsafe { AtomicU64::from_ptr(self.ptr().as_ptr().add(at).cast()) };
        word.store(value, Ordering::Release);
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        let lines = std::ptr::slice_from_raw_parts_mut(self.lines.as_ptr(), self.count);
        // SAFETY: the pointer and count of the boxed slice `new` leaked, dropped once.
        drop(unsafe { Box::from_raw(lines) });
    }
}
