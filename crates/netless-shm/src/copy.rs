//! Bulk copies into and out of shared memory that stay fast whatever the two addresses are.
//!
//! glibc's `memcpy` moves large blocks (from about 2 KiB on CPUs with FSRM) with `rep movsb`.
//! On AMD Zen 3 that instruction runs 5 to 25 times slower when the destination lies a few
//! bytes after the source modulo 4 KiB (measured on this project's EPYC VM: 1.4 µs instead of
//! 60 ns for 4 KiB, 24 µs instead of 1.5 µs for 64 KiB). Where a message lands in a block run
//! or a ring record has nothing to do with where the caller's buffer is, and consecutive heap
//! buffers of about 4 KiB sit 4 KiB + 16 bytes apart, so a transport that used `memcpy` for
//! its payloads would hit that case on some calls, and then on every call with the same
//! buffers. [`copy_bytes`] copies large ranges with 32-byte vector loads and aligned stores
//! instead, which costs the same as `memcpy` at every distance where `memcpy` is fast.
//!
//! This module only copies bytes: it never interprets them, and reading memory a peer may
//! be writing at the same time is as harmless here as in `memcpy` (the bytes copied may be
//! torn; whoever reads them validates them).

/// From this length on, [`copy_bytes`] uses its own loop (below it glibc never uses
/// `rep movsb`, and its vector code is fast at every alignment).
const LARGE: usize = 2048;

/// Copies `len` bytes from `src` to `dst`, like [`core::ptr::copy_nonoverlapping`].
///
/// # Safety
/// `src` is valid for reads and `dst` for writes of `len` bytes, and the two ranges do not
/// overlap (the contract of `copy_nonoverlapping`; alignment does not matter).
#[inline]
pub unsafe fn copy_bytes(src: *const u8, dst: *mut u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    if len >= LARGE && std::is_x86_feature_detected!("avx2") {
        // SAFETY: the caller's contract, and AVX2 is available (checked just above).
        unsafe { copy_avx2(src, dst, len) };
        return;
    }
    // SAFETY: the caller's contract.
    unsafe { core::ptr::copy_nonoverlapping(src, dst, len) };
}

/// Copies `src` into `dst` (of the same length), like `<[u8]>::copy_from_slice`.
///
/// ```
/// let mut dst = vec![0u8; 5000];
/// let src: Vec<u8> = (0..5000).map(|i| i as u8).collect();
/// netless_shm::copy::copy_slice(&mut dst, &src);
/// assert_eq!(dst, src);
/// ```
///
/// # Panics
/// If the lengths differ.
#[inline]
pub fn copy_slice(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "copy_slice: lengths differ");
    // SAFETY: two distinct slices of `src.len()` bytes (`dst` is borrowed mutably, so the
    // ranges cannot overlap).
    unsafe { copy_bytes(src.as_ptr(), dst.as_mut_ptr(), src.len()) };
}

/// Appends `src` to `out`, like `Vec::extend_from_slice`.
///
/// ```
/// let mut out = b"ab".to_vec();
/// netless_shm::copy::extend(&mut out, b"cd");
/// assert_eq!(out, b"abcd");
/// ```
#[inline]
pub fn extend(out: &mut Vec<u8>, src: &[u8]) {
    out.reserve(src.len());
    let len = out.len();
    // SAFETY: `reserve` made room for `src.len()` more bytes after `len`, which `src` (a
    // shared borrow, so not `out`'s buffer) cannot overlap; they are all written before
    // `set_len` makes them part of the vector.
    unsafe {
        copy_bytes(src.as_ptr(), out.as_mut_ptr().add(len), src.len());
        out.set_len(len + src.len());
    }
}

/// The large-copy loop: one unaligned 32-byte store for the head, then four 32-byte loads
/// and four aligned stores per step, and the last 32 bytes (overlapping what came before,
/// with the same bytes) for the tail.
///
/// # Safety
/// As [`copy_bytes`], with `len >= 64`, on a CPU with AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn copy_avx2(src: *const u8, dst: *mut u8, len: usize) {
    use core::arch::x86_64::{
        __m256i, _mm256_loadu_si256, _mm256_store_si256, _mm256_storeu_si256,
    };
    debug_assert!(len >= 64);
    // SAFETY: every load below reads 32 bytes at `src + i` with `i + 32 <= len`, and every
    // store writes 32 bytes at `dst + i` with `i + 32 <= len`: inside the caller's ranges.
    // The aligned stores use `dst + i` with `(dst + i) % 32 == 0` (the head advances to it).
    unsafe {
        let head = _mm256_loadu_si256(src.cast::<__m256i>());
        let tail = _mm256_loadu_si256(src.add(len - 32).cast::<__m256i>());
        _mm256_storeu_si256(dst.cast::<__m256i>(), head);
        // First offset at which dst is 32-byte aligned (1..=32: the head covered it).
        let mut i = 32 - (dst as usize & 31);
        while i + 128 <= len {
            let a = _mm256_loadu_si256(src.add(i).cast::<__m256i>());
            let b = _mm256_loadu_si256(src.add(i + 32).cast::<__m256i>());
            let c = _mm256_loadu_si256(src.add(i + 64).cast::<__m256i>());
            let d = _mm256_loadu_si256(src.add(i + 96).cast::<__m256i>());
            _mm256_store_si256(dst.add(i).cast::<__m256i>(), a);
            _mm256_store_si256(dst.add(i + 32).cast::<__m256i>(), b);
            _mm256_store_si256(dst.add(i + 64).cast::<__m256i>(), c);
            _mm256_store_si256(dst.add(i + 96).cast::<__m256i>(), d);
            i += 128;
        }
        while i + 32 <= len {
            let a = _mm256_loadu_si256(src.add(i).cast::<__m256i>());
            _mm256_store_si256(dst.add(i).cast::<__m256i>(), a);
            i += 32;
        }
        _mm256_storeu_si256(dst.add(len - 32).cast::<__m256i>(), tail);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every length around the threshold and the loop's steps, at every relative alignment
    /// of source and destination, copies exactly and writes nothing outside the range.
    #[test]
    fn copies_exactly_at_every_alignment() {
        let src: Vec<u8> = (0..9000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        for len in [0, 1, 63, 64, 2047, 2048, 2049, 2080, 2175, 4096, 4100, 8191] {
            for src_off in [0, 1, 17, 31] {
                for dst_off in [0, 3, 16, 32, 33] {
                    let mut dst = vec![0xeeu8; len + 100];
                    // SAFETY: both ranges lie inside their vectors and do not overlap.
                    unsafe {
                        copy_bytes(
                            src.as_ptr().add(src_off),
                            dst.as_mut_ptr().add(dst_off),
                            len,
                        )
                    };
                    assert_eq!(&dst[dst_off..dst_off + len], &src[src_off..src_off + len]);
                    assert!(dst[..dst_off].iter().all(|&b| b == 0xee));
                    assert!(dst[dst_off + len..].iter().all(|&b| b == 0xee));
                }
            }
        }
    }

    #[test]
    fn extend_appends() {
        let src: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
        let mut out = vec![9u8; 3];
        extend(&mut out, &src);
        assert_eq!(&out[..3], &[9, 9, 9]);
        assert_eq!(&out[3..], &src[..]);
    }
}
