//! The host-wide monotonic clock.
//!
//! This module owns reading `CLOCK_MONOTONIC`, which every process on the host shares, so a
//! deadline written into shared memory by one process means the same instant to another.
//! It never uses wall-clock time, which can jump.

use rustix::time::{clock_gettime, ClockId};

/// Nanoseconds of `CLOCK_MONOTONIC` (time since boot, excluding suspend). Comparable across
/// processes on the same host.
///
/// ```
/// let a = netless_shm::monotonic_ns();
/// let b = netless_shm::monotonic_ns();
/// assert!(b >= a);
/// ```
#[inline]
pub fn monotonic_ns() -> u64 {
    let now = clock_gettime(ClockId::Monotonic);
    // CLOCK_MONOTONIC is never negative; u64 nanoseconds last 584 years of uptime.
    (now.tv_sec as u64) * 1_000_000_000 + now.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    #[test]
    fn advances_with_sleep() {
        let a = super::monotonic_ns();
        std::thread::sleep(std::time::Duration::from_millis(5));
        let b = super::monotonic_ns();
        assert!(b - a >= 5_000_000, "{a} -> {b}");
    }
}
