//! Whether the CPU this thread runs on is contended: another runnable thread is queued for
//! it. A waiter that spins then holds a CPU the other thread needs (often the very thread it
//! waits for, on the same core), so the waits of [`crate::doorbell`] give it away instead.
//!
//! The evidence is the thread's own, so it speaks for its CPU alone and costs no system
//! call to gather:
//! - a gap between two of a spinning waiter's clock reads far longer than its polls take
//!   ([`PREEMPTED`]): the thread was preempted, so something else wanted its CPU;
//! - a yield that took long ([`SWITCHED`]): another thread ran in it, so one was queued.
//!
//! Either marks the thread's CPU contended for [`HOLD`]. While it is, waits yield; each yield
//! that finds another thread renews it, and once yields come back at once (nothing queued)
//! it lapses and the waiter spins again.
//!
//! ```
//! use netless_ring::contention;
//! use std::time::{Duration, Instant};
//!
//! let now = Instant::now();
//! contention::observe(now, Duration::from_micros(5)); // 64 polls' worth: nothing to see
//! assert!(!contention::contended(now));
//! contention::observe(now, Duration::from_millis(3)); // preempted for a time slice
//! assert!(contention::contended(now));
//! assert!(!contention::contended(now + contention::HOLD));
//! ```

use std::time::{Duration, Instant};

/// A gap between a spinning waiter's clock reads this long means it was preempted: 64 polls
/// take microseconds, a time slice of another thread milliseconds.
pub const PREEMPTED: Duration = Duration::from_micros(200);
/// A yield this long ran another thread: one that returns at once takes under a microsecond
/// (a system call).
pub const SWITCHED: Duration = Duration::from_micros(3);
/// How long one piece of evidence keeps the CPU contended.
pub const HOLD: Duration = Duration::from_millis(10);

/// Whether this thread's CPU counts as contended at `now`.
pub fn contended(now: Instant) -> bool {
    imp::until().is_some_and(|until| now < until)
}

/// Records that this thread's clock moved by `gap` between two reads of a spin (a gap of
/// [`PREEMPTED`] or more marks its CPU contended).
pub fn observe(now: Instant, gap: Duration) {
    if gap >= PREEMPTED {
        imp::mark(now);
    }
}

/// Yields the CPU, and records whether another thread ran meanwhile; returns the time after.
pub fn give_way(before: Instant) -> Instant {
    crate::sync::yield_now();
    let after = Instant::now();
    if after.saturating_duration_since(before) >= SWITCHED {
        imp::mark(after);
    }
    after
}

#[cfg(not(loom))]
mod imp {
    use std::cell::Cell;
    use std::time::Instant;

    use super::HOLD;

    thread_local! {
        /// Until when this thread's CPU counts as contended.
        static UNTIL: Cell<Option<Instant>> = const { Cell::new(None) };
    }

    pub(super) fn until() -> Option<Instant> {
        UNTIL.with(Cell::get)
    }

    pub(super) fn mark(now: Instant) {
        UNTIL.with(|u| u.set(now.checked_add(HOLD)));
    }
}

// Loom's threads are not OS threads (a thread-local would be shared between them) and its
// models do not run long enough to be preempted: never contended.
#[cfg(loom)]
mod imp {
    pub(super) fn until() -> Option<std::time::Instant> {
        None
    }

    pub(super) fn mark(_now: std::time::Instant) {}
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_long_gap_marks_the_cpu_contended_for_a_while() {
        let now = Instant::now();
        assert!(!contended(now));
        observe(now, PREEMPTED / 2);
        assert!(!contended(now));
        observe(now, PREEMPTED);
        assert!(contended(now));
        assert!(contended(now + HOLD / 2));
        assert!(!contended(now + HOLD));
        // Per thread: another thread's CPU is not this one's.
        assert!(!std::thread::spawn(move || contended(now)).join().unwrap());
    }

    #[test]
    fn a_yield_that_took_long_marks_the_cpu_contended() {
        // Taken a long while "before" the yield: as if another thread had run in it.
        let long_ago = Instant::now() - SWITCHED * 10;
        let after = give_way(long_ago);
        assert!(contended(after));
        assert!(!contended(after + HOLD));
    }
}
