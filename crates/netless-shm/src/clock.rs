//! The host-wide monotonic clock.
//!
//! This module owns reading `CLOCK_MONOTONIC`, which every process on the host shares, so a
//! deadline written into shared memory by one process means the same instant to another.
//! It never uses wall-clock time, which can jump.

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
    // Through libc, not rustix: rustix finds the vDSO by parsing it itself, which faults
    // under valgrind (rustix issue 1559), so a server could not be run under memcheck or
    // callgrind. glibc's call is the same vDSO read.
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid, writable timespec, and CLOCK_MONOTONIC is always present on
    // Linux, so the call only writes `now`.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    debug_assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC) failed");
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

    /// Servers are profiled with callgrind and checked with memcheck, so reading the clock
    /// must work under valgrind (rustix's own vDSO parser faults there). Runs this test
    /// binary's clock tests under valgrind; skipped where valgrind is not installed.
    #[test]
    fn the_clock_reads_under_valgrind() {
        let exe = std::env::current_exe().expect("test binary path");
        let run = std::process::Command::new("valgrind")
            .args(["-q", "--error-exitcode=3"])
            .arg(exe)
            .args([
                "--exact",
                "clock::tests::advances_with_sleep",
                "--test-threads=1",
            ])
            .output();
        let out = match run {
            Ok(out) => out,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                eprintln!("valgrind not installed: skipped");
                return;
            }
            Err(e) => panic!("could not start valgrind: {e}"),
        };
        assert!(
            out.status.success() && String::from_utf8_lossy(&out.stdout).contains("1 passed"),
            "under valgrind: {:?}\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
