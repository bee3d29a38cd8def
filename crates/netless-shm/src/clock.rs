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

/// The one moment both clocks were read, so converting between them costs no clock read.
fn base() -> &'static (std::time::Instant, u64) {
    static BASE: std::sync::OnceLock<(std::time::Instant, u64)> = std::sync::OnceLock::new();
    BASE.get_or_init(|| (std::time::Instant::now(), monotonic_ns()))
}

/// `instant` as CLOCK_MONOTONIC nanoseconds (what deadlines in shared memory carry), without
/// reading the clock: `Instant` is CLOCK_MONOTONIC on Linux, so the two differ by a constant
/// measured once per process (to within the ~20 ns between two clock reads).
pub fn instant_to_monotonic_ns(instant: std::time::Instant) -> u64 {
    let (base_instant, base_ns) = *base();
    if instant >= base_instant {
        base_ns.saturating_add((instant - base_instant).as_nanos() as u64)
    } else {
        base_ns.saturating_sub((base_instant - instant).as_nanos() as u64)
    }
}

/// The inverse of [`instant_to_monotonic_ns`].
pub fn monotonic_ns_to_instant(ns: u64) -> std::time::Instant {
    let (base_instant, base_ns) = *base();
    if ns >= base_ns {
        base_instant + std::time::Duration::from_nanos(ns - base_ns)
    } else {
        base_instant
            .checked_sub(std::time::Duration::from_nanos(base_ns - ns))
            .unwrap_or(base_instant)
    }
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

    #[test]
    fn instant_conversion_round_trips_and_agrees_with_the_clock() {
        let now = std::time::Instant::now();
        let ns = super::instant_to_monotonic_ns(now);
        let direct = super::monotonic_ns();
        assert!(direct.abs_diff(ns) < 5_000_000, "{direct} vs {ns}");
        let later = now + std::time::Duration::from_millis(7);
        let back = super::monotonic_ns_to_instant(super::instant_to_monotonic_ns(later));
        let diff = if back > later {
            back - later
        } else {
            later - back
        };
        assert!(diff < std::time::Duration::from_micros(1), "{diff:?}");
    }
}
