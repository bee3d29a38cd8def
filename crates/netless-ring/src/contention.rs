//! Whether the CPU this thread runs on is contended: another runnable thread is queued for
//! it. A waiter that spins then holds a CPU the other thread needs (often the very thread it
//! waits for, on the same core), so the waits of [`crate::doorbell`] give it away instead.
//!
//! The evidence is the thread's own, so it speaks for its CPU alone:
//! - a gap between two of a spinning waiter's clock reads far longer than its polls take
//!   ([`PREEMPTED`]): the thread was preempted, so something else wanted its CPU;
//! - a yield that took long ([`SWITCHED`]): another thread ran in it, so one was queued.
//!
//! Either marks the thread's CPU contended for [`HOLD`]; each yield that finds another
//! thread renews it, and [`CALM_AFTER`] yields in a row that come back at once end it. A spin too short to be
//! preempted (an adaptive waiter's 50 µs) gathers no evidence by itself, so while the machine
//! as a whole has more runnable threads than CPUs (the fourth field of `/proc/loadavg`,
//! read at most once per [`REFRESH`] by one waiter of the process) a waiter probes with a
//! yield; yields that come back at once say the queued thread is on another CPU, and the
//! waiter stops probing for [`HOLD`].
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
/// How long one piece of evidence holds: the CPU stays contended, or unprobed.
pub const HOLD: Duration = Duration::from_millis(10);
/// How long the machine's runnable count stands before a waiter reads it again.
pub const REFRESH: Duration = Duration::from_millis(1);
/// Yields in a row that came back at once before a waiter stops probing: one alone proves
/// little, as the scheduler may run the yielder again when the queued thread has had more
/// than its share.
pub const CALM_AFTER: u32 = 8;

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

/// Whether a spinning waiter should yield its CPU at `now`: it is contended, or it may be
/// (the machine has more runnable threads than CPUs) and has not been probed lately.
pub fn should_give_way(now: Instant) -> bool {
    contended(now) || (!imp::quiet(now) && machine::oversubscribed(now))
}

/// A spinning waiter's checkpoint, `now` being its clock read after `last`: records the gap
/// ([`observe`]), gives the CPU away if it [`should_give_way`], and returns the time to count
/// the next gap from.
pub fn checkpoint(last: Instant, now: Instant) -> Instant {
    observe(now, now.saturating_duration_since(last));
    if should_give_way(now) {
        give_way(now)
    } else {
        now
    }
}

/// Yields the CPU, and records whether another thread ran meanwhile (the CPU is contended)
/// or not ([`CALM_AFTER`] such yields in a row: it is not, and needs no probe for a while);
/// returns the time after.
pub fn give_way(before: Instant) -> Instant {
    crate::sync::yield_now();
    let after = Instant::now();
    if after.saturating_duration_since(before) >= SWITCHED {
        imp::mark(after);
    } else {
        imp::calm(after);
    }
    after
}

/// `runnable > cpus`, from `/proc/loadavg`'s text (`"0.52 0.58 0.59 3/467 12345"`); `None`
/// for text not in that shape.
#[cfg_attr(any(loom, miri), allow(dead_code))]
fn parse_loadavg(text: &[u8], cpus: u32) -> Option<bool> {
    let text = std::str::from_utf8(text).ok()?;
    let (runnable, _) = text.split_whitespace().nth(3)?.split_once('/')?;
    Some(runnable.parse::<u32>().ok()? > cpus)
}

/// The number of CPUs in `/sys/devices/system/cpu/online`'s list (`"0-3,8,10-11"`).
#[cfg_attr(any(loom, miri), allow(dead_code))]
fn parse_cpu_list(text: &str) -> Option<u32> {
    let mut count = 0u32;
    for range in text.trim().split(',') {
        let (lo, hi) = match range.split_once('-') {
            Some((lo, hi)) => (lo.parse::<u32>().ok()?, hi.parse::<u32>().ok()?),
            None => {
                let one = range.parse::<u32>().ok()?;
                (one, one)
            }
        };
        count = count.checked_add(hi.checked_sub(lo)?.checked_add(1)?)?;
    }
    (count > 0).then_some(count)
}

/// The machine-wide hint, cached for the process.
#[cfg(not(any(loom, miri)))]
mod machine {
    use std::fs::File;
    use std::os::unix::fs::FileExt as _;
    // A process-local cache, never in shared memory: std's atomic, not the shim's.
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    use std::sync::OnceLock;
    use std::time::Instant;

    use super::{parse_cpu_list, parse_loadavg, REFRESH};

    /// The cached answer: bit 0 the flag, the rest the refresh time in µs after [`base`]
    /// (0: never refreshed).
    static STATE: AtomicU64 = AtomicU64::new(0);

    fn base() -> Instant {
        static BASE: OnceLock<Instant> = OnceLock::new();
        *BASE.get_or_init(Instant::now)
    }

    /// `/proc/loadavg`, kept open (a refresh is one `pread`), and the CPUs online; `None`
    /// where either cannot be read.
    fn sources() -> Option<&'static (File, u32)> {
        static SOURCES: OnceLock<Option<(File, u32)>> = OnceLock::new();
        SOURCES
            .get_or_init(|| {
                let list = std::fs::read_to_string("/sys/devices/system/cpu/online").ok()?;
                Some((File::open("/proc/loadavg").ok()?, parse_cpu_list(&list)?))
            })
            .as_ref()
    }

    fn read() -> Option<bool> {
        let (file, cpus) = sources()?;
        let mut buf = [0u8; 128];
        let n = file.read_at(&mut buf, 0).ok()?;
        parse_loadavg(&buf[..n], *cpus)
    }

    pub(super) fn oversubscribed(now: Instant) -> bool {
        let stamp = (now.saturating_duration_since(base()).as_micros() as u64).max(1);
        let state = STATE.load(Relaxed);
        let flag = state & 1 == 1;
        let refreshed = state >> 1;
        if refreshed != 0 && stamp.saturating_sub(refreshed) < REFRESH.as_micros() as u64 {
            return flag;
        }
        // One waiter refreshes; the others keep the stale answer meanwhile.
        let claimed = (stamp << 1) | u64::from(flag);
        if STATE
            .compare_exchange(state, claimed, Relaxed, Relaxed)
            .is_err()
        {
            return flag;
        }
        let fresh = read().unwrap_or(false);
        // Unless a later refresh has landed meanwhile.
        let _ = STATE.compare_exchange(claimed, (stamp << 1) | u64::from(fresh), Relaxed, Relaxed);
        fresh
    }
}

/// Under loom (its threads are not OS threads) and Miri (no procfs): no hint.
#[cfg(any(loom, miri))]
mod machine {
    pub(super) fn oversubscribed(_now: std::time::Instant) -> bool {
        false
    }
}

#[cfg(not(loom))]
mod imp {
    use std::cell::Cell;
    use std::time::Instant;

    use super::{CALM_AFTER, HOLD};

    thread_local! {
        /// Until when this thread's CPU counts as contended.
        static UNTIL: Cell<Option<Instant>> = const { Cell::new(None) };
        /// Until when this thread's CPU needs no probe (yields found nothing queued).
        static QUIET: Cell<Option<Instant>> = const { Cell::new(None) };
        /// Yields in a row that came back at once.
        static QUICK: Cell<u32> = const { Cell::new(0) };
    }

    pub(super) fn until() -> Option<Instant> {
        UNTIL.with(Cell::get)
    }

    pub(super) fn quiet(now: Instant) -> bool {
        QUIET.with(Cell::get).is_some_and(|until| now < until)
    }

    pub(super) fn mark(now: Instant) {
        UNTIL.with(|u| u.set(now.checked_add(HOLD)));
        QUIET.with(|q| q.set(None));
        QUICK.with(|n| n.set(0));
    }

    pub(super) fn calm(now: Instant) {
        let quick = QUICK.with(|n| {
            n.set(n.get() + 1);
            n.get()
        });
        if quick >= CALM_AFTER {
            UNTIL.with(|u| u.set(None));
            QUIET.with(|q| q.set(now.checked_add(HOLD)));
            QUICK.with(|n| n.set(0));
        }
    }
}

// Loom's threads are not OS threads (a thread-local would be shared between them) and its
// models do not run long enough to be preempted: never contended.
#[cfg(loom)]
mod imp {
    pub(super) fn until() -> Option<std::time::Instant> {
        None
    }

    pub(super) fn quiet(_now: std::time::Instant) -> bool {
        true
    }

    pub(super) fn mark(_now: std::time::Instant) {}

    pub(super) fn calm(_now: std::time::Instant) {}
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
    fn a_yield_that_took_long_marks_the_cpu_contended_and_quick_ones_calm_it() {
        // Taken a long while "before" the yield: as if another thread had run in it.
        let long_ago = Instant::now() - SWITCHED * 10;
        let after = give_way(long_ago);
        assert!(contended(after));
        assert!(should_give_way(after));
        assert!(!contended(after + HOLD));
        // "Before" far ahead: the yields take no time, as when nothing else is queued. The
        // instants asked about are fixed ones, so the clock's pace (Miri's) cannot matter.
        let far = Instant::now() + Duration::from_secs(3600);
        for _ in 1..CALM_AFTER {
            give_way(far);
            assert!(contended(after), "one quick yield proves little");
        }
        let last = give_way(far);
        assert!(!contended(after));
        assert!(imp::quiet(last));
        assert!(
            !should_give_way(last),
            "a calm CPU is not probed again at once"
        );
    }

    #[test]
    fn reads_the_runnable_count_against_the_cpus() {
        assert_eq!(
            parse_loadavg(b"0.52 0.58 0.59 3/467 12345\n", 2),
            Some(true)
        );
        assert_eq!(
            parse_loadavg(b"0.52 0.58 0.59 2/467 12345\n", 2),
            Some(false)
        );
        assert_eq!(parse_loadavg(b"0.52 0.58 0.59\n", 2), None);
        assert_eq!(parse_loadavg(b"a b c x/y z", 2), None);
        assert_eq!(parse_loadavg(&[0xff, 0xfe], 2), None);
    }

    #[test]
    fn counts_the_online_cpu_list() {
        assert_eq!(parse_cpu_list("0-1\n"), Some(2));
        assert_eq!(parse_cpu_list("0"), Some(1));
        assert_eq!(parse_cpu_list("0-3,8,10-11"), Some(7));
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list(""), None);
        assert_eq!(parse_cpu_list("x"), None);
    }
}
