//! The benchmarks' stopwatch: the CPU's invariant time-stamp counter, calibrated against
//! `CLOCK_MONOTONIC`, so reading it costs a few nanoseconds instead of the ~20 ns of
//! `Instant::now()` on this VM (which would otherwise be a sizeable part of a 0.5 µs sample).
//!
//! A benchmark times every row it compares (netless, floor, gRPC) with one stopwatch from one
//! pinned thread, so the counter never crosses cores; this module never pins, nor decides
//! what is timed. Where the CPU has no invariant TSC (or is not x86-64), it falls back to
//! `Instant`. The overhead of one reading is measured, for the benchmark to print with its
//! results.

use std::time::{Duration, Instant};

/// A calibrated stopwatch.
#[derive(Clone, Copy, Debug)]
pub struct Stopwatch {
    /// Nanoseconds per tick, or `None` to use `Instant`.
    ns_per_tick: Option<f64>,
    origin: Instant,
}

/// A reading of a [`Stopwatch`].
#[derive(Clone, Copy, Debug)]
pub struct Mark(u64);

impl Stopwatch {
    /// Calibrates against `CLOCK_MONOTONIC` for about 20 ms.
    pub fn calibrate() -> Stopwatch {
        let origin = Instant::now();
        if !invariant_tsc() {
            return Stopwatch {
                ns_per_tick: None,
                origin,
            };
        }
        let (t0, c0) = (Instant::now(), ticks());
        std::thread::sleep(Duration::from_millis(20));
        let (t1, c1) = (Instant::now(), ticks());
        let ns = (t1 - t0).as_nanos() as f64;
        let ticks = c1.wrapping_sub(c0) as f64;
        let ns_per_tick = (ticks > 0.0).then(|| ns / ticks);
        Stopwatch {
            ns_per_tick,
            origin,
        }
    }

    /// What the stopwatch is based on, for the report.
    pub fn source(&self) -> &'static str {
        if self.ns_per_tick.is_some() {
            "invariant TSC (calibrated)"
        } else {
            "CLOCK_MONOTONIC"
        }
    }

    /// Reads the stopwatch.
    #[inline(always)]
    pub fn mark(&self) -> Mark {
        match self.ns_per_tick {
            Some(_) => Mark(ticks()),
            None => Mark(self.origin.elapsed().as_nanos() as u64),
        }
    }

    /// Nanoseconds from `start` to now.
    #[inline(always)]
    pub fn elapsed_ns(&self, start: Mark) -> u64 {
        let end = self.mark();
        match self.ns_per_tick {
            Some(f) => (end.0.wrapping_sub(start.0) as f64 * f) as u64,
            None => end.0.saturating_sub(start.0),
        }
    }

    /// The median cost of one timed empty interval (two readings), in nanoseconds: what every
    /// sample includes besides the operation it times.
    pub fn overhead_ns(&self) -> f64 {
        let mut samples: Vec<u64> = (0..10_001)
            .map(|_| {
                let m = self.mark();
                self.elapsed_ns(m)
            })
            .collect();
        samples.sort_unstable();
        samples[samples.len() / 2] as f64
    }
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn ticks() -> u64 {
    // LFENCE keeps the reading from moving before earlier instructions complete.
    // SAFETY: LFENCE and RDTSC have no memory-safety preconditions (SSE2 and TSC are part of
    // the x86-64 baseline).
    unsafe {
        std::arch::x86_64::_mm_lfence();
        std::arch::x86_64::_rdtsc()
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn ticks() -> u64 {
    0
}

/// True when /proc/cpuinfo says the TSC runs at a constant rate through sleep states.
fn invariant_tsc() -> bool {
    cfg!(target_arch = "x86_64")
        && std::fs::read_to_string("/proc/cpuinfo")
            .map(|info| info.contains(" constant_tsc") && info.contains(" nonstop_tsc"))
            .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measures_a_sleep_about_right() {
        let watch = Stopwatch::calibrate();
        let start = watch.mark();
        std::thread::sleep(Duration::from_millis(30));
        let ns = watch.elapsed_ns(start);
        assert!(
            (25_000_000..2_000_000_000).contains(&ns),
            "{ns} ns for a 30 ms sleep"
        );
        assert!(watch.overhead_ns() < 10_000.0);
    }
}
