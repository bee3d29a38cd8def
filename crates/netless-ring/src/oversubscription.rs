//! Whether the machine has more runnable threads than CPUs. A waiter that spins then holds
//! a CPU another runnable thread is queued for (often the very thread it waits for, on the
//! same core), so the waits of [`crate::doorbell`] give the CPU away between polls instead.
//!
//! The count is the kernel's: the fourth field of `/proc/loadavg` (`runnable/all`), against
//! the CPUs online. Whichever waiter finds the answer older than [`REFRESH`] reads the file
//! (a few microseconds, allocating nothing); every other call is two relaxed loads. Where
//! either file cannot be read (no procfs, Miri, loom) the answer is `false`, and waits spin
//! as they always did.
//!
//! ```
//! // On an idle machine, usually false; either way it is cheap to ask on every poll.
//! let _busy: bool = netless_ring::oversubscription::oversubscribed();
//! ```

use std::time::{Duration, Instant};

/// How long an answer stands before a waiter reads the count again: short against the 50 µs
/// to milliseconds a wait spins, long against the read.
pub const REFRESH: Duration = Duration::from_millis(1);

/// Whether more threads are runnable than there are CPUs online, as of at most [`REFRESH`]
/// ago.
pub fn oversubscribed() -> bool {
    oversubscribed_at(Instant::now())
}

/// [`oversubscribed`] for a caller that has just read the clock.
pub fn oversubscribed_at(now: Instant) -> bool {
    imp::oversubscribed_at(now)
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

#[cfg(not(any(loom, miri)))]
mod imp {
    use std::io::Read as _;
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

    fn cpus() -> Option<u32> {
        static CPUS: OnceLock<Option<u32>> = OnceLock::new();
        *CPUS.get_or_init(|| {
            let text = std::fs::read_to_string("/sys/devices/system/cpu/online").ok()?;
            parse_cpu_list(&text)
        })
    }

    /// Reads the runnable count now; `None` if it cannot.
    fn read() -> Option<bool> {
        let cpus = cpus()?;
        let mut buf = [0u8; 128];
        let mut file = std::fs::File::open("/proc/loadavg").ok()?;
        let n = file.read(&mut buf).ok()?;
        parse_loadavg(&buf[..n], cpus)
    }

    pub(super) fn oversubscribed_at(now: Instant) -> bool {
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
        STATE.store((stamp << 1) | u64::from(fresh), Relaxed);
        fresh
    }
}

#[cfg(any(loom, miri))]
mod imp {
    pub(super) fn oversubscribed_at(_now: std::time::Instant) -> bool {
        false
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

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
        assert_eq!(
            parse_loadavg(b"0.52 0.58 0.59 1/467 12345\n", 2),
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

    #[cfg(not(miri))]
    #[test]
    fn sees_more_runnable_threads_than_cpus() {
        // Two spinning threads per CPU online, and one more: the machine is oversubscribed
        // while they run, whatever else it does.
        let Some(cpus) = std::fs::read_to_string("/sys/devices/system/cpu/online")
            .ok()
            .and_then(|text| parse_cpu_list(&text))
        else {
            println!("SKIPPED: no /sys/devices/system/cpu/online to count the CPUs by");
            return;
        };
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let spinners: Vec<_> = (0..2 * cpus + 1)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut seen = false;
        while !seen && Instant::now() < deadline {
            std::thread::sleep(REFRESH);
            seen = oversubscribed();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for s in spinners {
            s.join().unwrap();
        }
        assert!(
            seen,
            "{} spinning threads on {cpus} CPUs never counted as oversubscribed",
            2 * cpus + 1
        );
    }
}
