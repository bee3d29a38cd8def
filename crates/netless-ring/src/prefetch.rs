//! Cache hints for the hot paths: fetch a line for reading, or take it exclusive before
//! writing it, so the transfer from the other core overlaps with other work instead of
//! stalling it.
//!
//! Prefetches are hints: they never fault, never change memory and may be ignored, so any
//! address (even a stale or garbage one computed from a peer's data) is harmless. This module
//! never reads or writes the memory it names. Under loom and Miri (which cannot run inline
//! assembly) the hints compile to nothing.

/// Starts fetching the cache line holding `ptr` for reading.
#[inline(always)]
pub fn prefetch_read(ptr: *const u8) {
    #[cfg(all(target_arch = "x86_64", not(loom), not(miri)))]
    // SAFETY: PREFETCHT0 is a hint: it does not fault on any address and does not modify
    // memory or registers other than the cache.
    unsafe {
        std::arch::asm!("prefetcht0 [{}]", in(reg) ptr, options(nostack, preserves_flags, readonly));
    }
    #[cfg(not(all(target_arch = "x86_64", not(loom), not(miri))))]
    let _ = ptr;
}

/// Starts taking the cache line holding `ptr` exclusive, ahead of a write to it. On x86-64
/// CPUs without PREFETCHW the instruction decodes as a no-op.
#[inline(always)]
pub fn prefetch_write(ptr: *const u8) {
    #[cfg(all(target_arch = "x86_64", not(loom), not(miri)))]
    // SAFETY: PREFETCHW is a hint: it does not fault on any address and does not modify
    // memory contents.
    unsafe {
        std::arch::asm!("prefetchw [{}]", in(reg) ptr, options(nostack, preserves_flags, readonly));
    }
    #[cfg(not(all(target_arch = "x86_64", not(loom), not(miri))))]
    let _ = ptr;
}

/// [`prefetch_write`] for each 64-byte line of `[ptr, ptr + len)`, at most `max_lines`.
#[inline]
pub fn prefetch_write_range(ptr: *const u8, len: usize, max_lines: usize) {
    let lines = len.div_ceil(64).min(max_lines);
    for i in 0..lines {
        prefetch_write(ptr.wrapping_add(i * 64));
    }
}

/// Starts fetching the cache line holding `ptr` into the L2 cache only (PREFETCHT1), which
/// does not hold one of the few L1 miss buffers for the whole transfer.
#[inline(always)]
pub fn prefetch_read_l2(ptr: *const u8) {
    #[cfg(all(target_arch = "x86_64", not(loom), not(miri)))]
    // SAFETY: PREFETCHT1 is a hint: it does not fault on any address and does not modify
    // memory or registers other than the cache.
    unsafe {
        std::arch::asm!("prefetcht1 [{}]", in(reg) ptr, options(nostack, preserves_flags, readonly));
    }
    #[cfg(not(all(target_arch = "x86_64", not(loom), not(miri))))]
    let _ = ptr;
}

/// Prefetches each 64-byte line of `[ptr, ptr + len)`, at most `max_lines`: the first few
/// into L1 (they are needed first), the rest into L2, so many more misses are in flight at
/// once than the L1 miss buffers allow.
#[inline]
pub fn prefetch_read_range(ptr: *const u8, len: usize, max_lines: usize) {
    let lines = len.div_ceil(64).min(max_lines);
    for i in 0..lines {
        if i < 8 {
            prefetch_read(ptr.wrapping_add(i * 64));
        } else {
            prefetch_read_l2(ptr.wrapping_add(i * 64));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hints_accept_any_address() {
        let buf = [0u8; 256];
        prefetch_read(buf.as_ptr());
        prefetch_write(buf.as_ptr());
        prefetch_write_range(buf.as_ptr(), 256, 8);
        prefetch_read_range(buf.as_ptr(), 256, 8);
        prefetch_read(std::ptr::null());
        prefetch_write(usize::MAX as *const u8);
        assert_eq!(buf[0], 0);
    }
}
