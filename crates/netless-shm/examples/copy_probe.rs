//! Why netless copies payloads with [`netless_shm::copy`] instead of plain `memcpy`.
//!
//! Copies `--len` bytes (default 4096, then 65536) between two buffers at many distances
//! modulo 4 KiB, with `core::ptr::copy_nonoverlapping` (glibc's `memcpy`) and with
//! [`netless_shm::copy::copy_bytes`], interleaved, and prints the mean and worst time per
//! copy of each and the distances at which `memcpy` was more than twice as slow as its own
//! median. On CPUs whose `rep movsb` has a slow case (AMD Zen 3: a destination a few bytes
//! after the source modulo 4 KiB) the worst case differs by an order of magnitude.
//!
//! ```text
//! cargo run --release -p netless-shm --example copy_probe [-- LEN ...]
//! ```

use std::hint::black_box;
use std::time::Instant;

/// Distances tried: every 4 bytes up to 128 (where the slow case lives), then a spread.
fn distances() -> Vec<usize> {
    let mut d: Vec<usize> = (0..=128).step_by(4).collect();
    d.extend((1..32).map(|k| k * 127 + 131));
    d.extend([1, 7, 14, 2048, 4000, 4090]);
    d.sort_unstable();
    d.dedup();
    d
}

/// Nanoseconds per copy of `len` bytes from `src` to `dst` with `copy`, over `iters` copies.
fn time(
    copy: unsafe fn(*const u8, *mut u8, usize),
    src: *const u8,
    dst: *mut u8,
    len: usize,
    iters: u32,
) -> f64 {
    let start = Instant::now();
    for _ in 0..iters {
        // SAFETY: main() hands in two disjoint ranges of at least `len` bytes.
        unsafe { copy(black_box(src), black_box(dst), len) };
    }
    start.elapsed().as_nanos() as f64 / f64::from(iters)
}

/// `ptr::copy_nonoverlapping` with the signature of `copy_bytes`.
///
/// # Safety
/// As `copy_nonoverlapping`.
unsafe fn libc_copy(src: *const u8, dst: *mut u8, len: usize) {
    // SAFETY: the caller's contract.
    unsafe { core::ptr::copy_nonoverlapping(src, dst, len) }
}

fn main() {
    let lens: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let lens = if lens.is_empty() {
        vec![4096, 65536]
    } else {
        lens
    };
    for len in lens {
        let mut buf = vec![1u8; 2 * len + 2 * 8192 + 4096];
        let base = buf.as_mut_ptr();
        // The source starts page-aligned plus 16 (a heap buffer's usual start); the
        // destination lies `len + 8192` further on, plus the distance tried.
        let src_off = (4096 - (base as usize % 4096)) % 4096 + 16;
        let iters = (64 * 1024 * 1024 / len.max(64)).clamp(200, 20_000) as u32;
        let mut rows = Vec::new();
        for d in distances() {
            let dst_off = src_off + len + 8192 - (len + 8192) % 4096 + d;
            // SAFETY: both offsets plus `len` lie inside `buf`, and the ranges are disjoint
            // (the destination starts more than `len` bytes after the source).
            let (src, dst) = unsafe { (base.add(src_off) as *const u8, base.add(dst_off)) };
            let libc = time(libc_copy, src, dst, len, iters);
            let ours = time(netless_shm::copy::copy_bytes, src, dst, len, iters);
            rows.push((d, libc, ours));
        }
        let mean =
            |f: fn(&(usize, f64, f64)) -> f64| rows.iter().map(f).sum::<f64>() / rows.len() as f64;
        let worst = |f: fn(&(usize, f64, f64)) -> f64| rows.iter().map(f).fold(0.0, f64::max);
        let mut sorted: Vec<f64> = rows.iter().map(|r| r.1).collect();
        sorted.sort_by(f64::total_cmp);
        let median = sorted[sorted.len() / 2];
        let slow: Vec<String> = rows
            .iter()
            .filter(|r| r.1 > 2.0 * median)
            .map(|r| format!("{} ({:.0} ns)", r.0, r.1))
            .collect();
        println!(
            "{len} bytes, {} distances mod 4 KiB: memcpy mean {:.0} ns, worst {:.0} ns; copy_bytes mean {:.0} ns, worst {:.0} ns",
            rows.len(),
            mean(|r| r.1),
            worst(|r| r.1),
            mean(|r| r.2),
            worst(|r| r.2),
        );
        if slow.is_empty() {
            println!("  memcpy was never more than twice its median ({median:.0} ns)");
        } else {
            println!(
                "  memcpy over twice its median ({median:.0} ns) at distances: {}",
                slow.join(", ")
            );
        }
    }
}
