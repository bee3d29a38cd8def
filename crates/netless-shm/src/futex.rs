//! Process-shared futexes on a 32-bit word in shared memory.
//!
//! This module owns the `FUTEX_WAIT`/`FUTEX_WAKE` system calls. They are *shared* futexes
//! (no `FUTEX_PRIVATE_FLAG`): the kernel keys them by the physical page, so a waiter in one
//! process is woken by a waker in another mapping the same segment. It never decides when to
//! sleep or wake (the "spin, then publish sleeping, then wait" protocol belongs to the ring
//! layer) and never touches the word except through the kernel's compare.
//!
//! Under `cfg(loom)` the word is a loom atomic, which is not real memory: waiting becomes a
//! check of the value plus [`crate::sync::yield_now`], and waking is a no-op returning 0.

use std::time::Duration;

use crate::sync::AtomicU32;

/// Why [`futex_wait`] returned. In every case, re-check the condition you are waiting for:
/// the kernel allows spurious wake-ups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FutexWait {
    /// A `FUTEX_WAKE` (or a spurious wake-up) ended the wait.
    Woken,
    /// The word did not hold `expected` when the call started (`EAGAIN`): no sleep happened.
    ValueChanged,
    /// The timeout expired.
    TimedOut,
    /// A signal interrupted the wait (`EINTR`).
    Interrupted,
}

/// Sleeps while `*word == expected`, until woken by [`futex_wake`], the timeout expires, or
/// a signal arrives.
///
/// The compare and the sleep are atomic with respect to [`futex_wake`]: a waker that changes
/// the word and then wakes can never be missed. `timeout` is relative; `None` waits forever.
/// The word may live in memory shared with other processes.
///
/// ```
/// use std::time::Duration;
/// use netless_shm::{futex_wait, sync::AtomicU32, FutexWait};
///
/// let word = AtomicU32::new(1);
/// assert_eq!(futex_wait(&word, 0, None), FutexWait::ValueChanged);
/// assert_eq!(
///     futex_wait(&word, 1, Some(Duration::from_millis(1))),
///     FutexWait::TimedOut
/// );
/// ```
#[cfg(not(loom))]
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) -> FutexWait {
    use rustix::io::Errno;
    use rustix::thread::futex::Timespec;

    let timespec = timeout.map(|t| Timespec {
        // Saturate absurd timeouts (> 292 billion years) instead of wrapping.
        tv_sec: i64::try_from(t.as_secs()).unwrap_or(i64::MAX),
        tv_nsec: i64::from(t.subsec_nanos()),
    });
    match sys_wait(word, expected, timespec.as_ref()) {
        Ok(()) => FutexWait::Woken,
        Err(Errno::AGAIN) => FutexWait::ValueChanged,
        Err(Errno::TIMEDOUT) => FutexWait::TimedOut,
        Err(Errno::INTR) => FutexWait::Interrupted,
        // EFAULT/EINVAL/ENOSYS cannot happen for a valid, aligned `&AtomicU32`, a normalised
        // timespec and a Linux kernel; report them as a spurious wake-up so callers re-check.
        Err(errno) => {
            debug_assert!(false, "futex wait failed unexpectedly: {errno}");
            FutexWait::Woken
        }
    }
}

/// Most words one [`futex_wait_any`] waits on (the kernel's `FUTEX_WAITV_MAX` is 128; a
/// server worker needs one per trust group's queue and one per wake source of its handler).
pub const WAIT_ANY_MAX: usize = 16;

/// Sleeps while every `*word == expected` of `words`, until any of them is woken by
/// [`futex_wake`], the timeout expires, or a signal arrives (`futex_waitv`, Linux ≥ 5.16).
///
/// As with [`futex_wait`], the compares and the sleep are atomic with respect to wakers, and
/// the words may live in memory shared with other processes. Only the first
/// [`WAIT_ANY_MAX`] words are watched. On a kernel without `futex_waitv` it sleeps on the
/// first word only, for at most a millisecond, so the others are noticed late but never
/// missed for long.
///
/// ```
/// use std::time::Duration;
/// use netless_shm::{futex_wait_any, sync::AtomicU32, FutexWait};
///
/// let (a, b) = (AtomicU32::new(1), AtomicU32::new(2));
/// assert_eq!(futex_wait_any(&[(&a, 1), (&b, 3)], None), FutexWait::ValueChanged);
/// assert_eq!(
///     futex_wait_any(&[(&a, 1), (&b, 2)], Some(Duration::from_millis(1))),
///     FutexWait::TimedOut
/// );
/// ```
#[cfg(not(loom))]
pub fn futex_wait_any(words: &[(&AtomicU32, u32)], timeout: Option<Duration>) -> FutexWait {
    use rustix::io::Errno;
    use rustix::thread::futex::{self, Timespec, Wait, WaitFlags, WaitPtr, WaitvFlags};

    let words = &words[..words.len().min(WAIT_ANY_MAX)];
    match words {
        [] => {
            std::thread::sleep(timeout.unwrap_or(Duration::from_millis(1)));
            return FutexWait::TimedOut;
        }
        [(word, expected)] => return futex_wait(word, *expected, timeout),
        _ => {}
    }
    let mut waits = [Wait::new(); WAIT_ANY_MAX];
    for (wait, (word, expected)) in waits.iter_mut().zip(words) {
        wait.val = u64::from(*expected);
        wait.uaddr = WaitPtr::new(word.as_ptr().cast());
        // No FUTEX2_PRIVATE: shared futexes, as `futex_wait`'s, so that wakers in other
        // processes (FUTEX_WAKE without the private flag) reach us.
        wait.flags = WaitFlags::SIZE_U32;
    }
    // futex_waitv takes an absolute deadline on the clock it is given.
    let deadline = timeout.map(|t| {
        let now = crate::monotonic_ns();
        let ns = now % 1_000_000_000 + u64::from(t.subsec_nanos());
        Timespec {
            tv_sec: ((now / 1_000_000_000) as i64)
                .saturating_add(i64::try_from(t.as_secs()).unwrap_or(i64::MAX))
                .saturating_add((ns / 1_000_000_000) as i64),
            tv_nsec: (ns % 1_000_000_000) as i64,
        }
    });
    match futex::waitv(
        &waits[..words.len()],
        WaitvFlags::empty(),
        deadline.as_ref(),
        rustix::time::ClockId::Monotonic,
    ) {
        Ok(_) => FutexWait::Woken,
        Err(Errno::AGAIN) => FutexWait::ValueChanged,
        Err(Errno::TIMEDOUT) => FutexWait::TimedOut,
        Err(Errno::INTR) => FutexWait::Interrupted,
        Err(Errno::NOSYS) => {
            let (word, expected) = words[0];
            let short = Duration::from_millis(1);
            futex_wait(
                word,
                expected,
                Some(timeout.map_or(short, |t| t.min(short))),
            )
        }
        Err(errno) => {
            debug_assert!(false, "futex_waitv failed unexpectedly: {errno}");
            FutexWait::Woken
        }
    }
}

/// Wakes up to `count` threads (in any process) sleeping in [`futex_wait`] on `word`, and
/// returns how many were woken.
///
/// ```
/// use netless_shm::{futex_wake, sync::AtomicU32};
///
/// let word = AtomicU32::new(0);
/// assert_eq!(futex_wake(&word, u32::MAX), 0); // nobody is waiting
/// ```
#[cfg(not(loom))]
pub fn futex_wake(word: &AtomicU32, count: u32) -> usize {
    // The kernel treats count as a signed int: clamp so u32::MAX means "all".
    let count = count.min(i32::MAX as u32);
    sys_wake(word, count).unwrap_or_else(|errno| {
        debug_assert!(false, "futex wake failed unexpectedly: {errno}");
        0
    })
}

/// The `FUTEX_WAIT` system call on `word`, shared (no `FUTEX_PRIVATE_FLAG`): the word may
/// be in memory other processes map.
#[cfg(all(not(loom), not(miri)))]
fn sys_wait(
    word: &AtomicU32,
    expected: u32,
    timeout: Option<&rustix::thread::futex::Timespec>,
) -> rustix::io::Result<()> {
    use rustix::thread::futex::{self, Flags};
    futex::wait(word, Flags::empty(), expected, timeout)
}

/// The `FUTEX_WAKE` system call on `word`, shared, as [`sys_wait`]'s.
#[cfg(all(not(loom), not(miri)))]
fn sys_wake(word: &AtomicU32, count: u32) -> rustix::io::Result<usize> {
    use rustix::thread::futex::{self, Flags};
    futex::wake(word, Flags::empty(), count)
}

/// Under Miri: the same call through `libc::syscall` with the argument types Miri's futex
/// shim checks. rustix passes the word as `*const AtomicU32`, which Miri (nightly from
/// 2026-09) reports as undefined behaviour for a C-variadic `syscall`; the kernel does not
/// care, Miri wants `*mut u32`.
#[cfg(all(not(loom), miri))]
fn sys_wait(
    word: &AtomicU32,
    expected: u32,
    timeout: Option<&rustix::thread::futex::Timespec>,
) -> rustix::io::Result<()> {
    let timeout = timeout.map(|t| libc::timespec {
        tv_sec: t.tv_sec,
        tv_nsec: t.tv_nsec,
    });
    let timeout = timeout
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // FUTEX_WAIT reads the word (a live, aligned AtomicU32) and the timespec (alive for the
    // call, or null).
    // SAFETY: both are valid for those reads, as just said.
    let r = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected as i32,
            timeout,
        )
    };
    if r == -1 {
        Err(last_errno())
    } else {
        Ok(())
    }
}

/// [`sys_wait`]'s companion under Miri.
#[cfg(all(not(loom), miri))]
fn sys_wake(word: &AtomicU32, count: u32) -> rustix::io::Result<usize> {
    // SAFETY: FUTEX_WAKE only uses the word's address (a live, aligned AtomicU32).
    let r = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            count as i32,
        )
    };
    if r == -1 {
        Err(last_errno())
    } else {
        Ok(r as usize)
    }
}

#[cfg(all(not(loom), miri))]
fn last_errno() -> rustix::io::Errno {
    let code = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    rustix::io::Errno::from_raw_os_error(code)
}

/// Loom stand-in for the shared futex wait: returns [`FutexWait::ValueChanged`] if the word
/// differs from `expected`, otherwise yields to the model scheduler and reports a spurious
/// [`FutexWait::Woken`]. Callers must re-check their condition, as with the real futex.
#[cfg(loom)]
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) -> FutexWait {
    let _ = timeout;
    if word.load(crate::sync::Ordering::SeqCst) != expected {
        return FutexWait::ValueChanged;
    }
    crate::sync::yield_now();
    FutexWait::Woken
}

/// Loom stand-in for [`futex_wait_any`]: [`FutexWait::ValueChanged`] if any word differs
/// from its expected value, otherwise a yield and a spurious [`FutexWait::Woken`].
#[cfg(loom)]
pub fn futex_wait_any(words: &[(&AtomicU32, u32)], timeout: Option<Duration>) -> FutexWait {
    let _ = timeout;
    if words
        .iter()
        .any(|(word, expected)| word.load(crate::sync::Ordering::SeqCst) != *expected)
    {
        return FutexWait::ValueChanged;
    }
    crate::sync::yield_now();
    FutexWait::Woken
}

/// Loom stand-in for the shared futex wake: a no-op that reports 0 threads woken (loom waiters
/// never really sleep; see [`futex_wait`]).
#[cfg(loom)]
pub fn futex_wake(word: &AtomicU32, count: u32) -> usize {
    let _ = (word, count);
    0
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::sync::Ordering;
    use std::sync::Arc;
    use std::time::Instant;

    #[test]
    fn mismatch_returns_value_changed_immediately() {
        let word = AtomicU32::new(7);
        let start = Instant::now();
        assert_eq!(
            futex_wait(&word, 8, Some(Duration::from_secs(10))),
            FutexWait::ValueChanged
        );
        assert!(start.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn timeout_returns_timed_out() {
        let word = AtomicU32::new(0);
        let start = Instant::now();
        // A signal could interrupt the wait; retry in that (unlikely) case.
        let result = loop {
            match futex_wait(&word, 0, Some(Duration::from_millis(20))) {
                FutexWait::Interrupted => continue,
                other => break other,
            }
        };
        assert_eq!(result, FutexWait::TimedOut);
        assert!(start.elapsed() >= Duration::from_millis(20));
    }

    #[test]
    fn wait_any_wakes_on_either_word() {
        for which in 0..2 {
            let words = Arc::new([AtomicU32::new(0), AtomicU32::new(0)]);
            let waiter = {
                let words = Arc::clone(&words);
                std::thread::spawn(move || {
                    while words[which].load(Ordering::Acquire) == 0 {
                        let [a, b] = &*words;
                        let outcome =
                            futex_wait_any(&[(a, 0), (b, 0)], Some(Duration::from_secs(10)));
                        assert_ne!(outcome, FutexWait::TimedOut, "never woken");
                    }
                })
            };
            // Wake the word's sleepers until the kernel says it woke ours: it was asleep on
            // both words, and this one woke it.
            let deadline = Instant::now() + Duration::from_secs(10);
            while futex_wake(&words[which], 1) == 0 {
                assert!(Instant::now() < deadline, "waiter never went to sleep");
                std::thread::sleep(Duration::from_millis(1));
            }
            words[which].store(1, Ordering::Release);
            futex_wake(&words[which], u32::MAX);
            waiter.join().unwrap();
        }
    }

    #[test]
    fn wait_any_times_out() {
        let (a, b) = (AtomicU32::new(0), AtomicU32::new(5));
        let start = Instant::now();
        let result = loop {
            match futex_wait_any(&[(&a, 0), (&b, 5)], Some(Duration::from_millis(20))) {
                FutexWait::Interrupted => continue,
                other => break other,
            }
        };
        assert_eq!(result, FutexWait::TimedOut);
        assert!(start.elapsed() >= Duration::from_millis(20));
    }

    #[test]
    fn wake_without_waiters_wakes_nobody() {
        let word = AtomicU32::new(0);
        assert_eq!(futex_wake(&word, 1), 0);
        assert_eq!(futex_wake(&word, u32::MAX), 0);
    }

    #[test]
    fn wake_between_threads() {
        let word = Arc::new(AtomicU32::new(0));
        let waiter = {
            let word = Arc::clone(&word);
            std::thread::spawn(move || {
                let mut woken = 0;
                while word.load(Ordering::Acquire) == 0 {
                    match futex_wait(&word, 0, Some(Duration::from_secs(10))) {
                        FutexWait::Woken => woken += 1,
                        FutexWait::TimedOut => panic!("never woken"),
                        FutexWait::ValueChanged | FutexWait::Interrupted => {}
                    }
                }
                woken
            })
        };
        // Keep waking with the word unchanged until the kernel reports it woke the waiter:
        // proof that it was really asleep on this word.
        let deadline = Instant::now() + Duration::from_secs(10);
        while futex_wake(&word, 1) == 0 {
            assert!(Instant::now() < deadline, "waiter never went to sleep");
            std::thread::sleep(Duration::from_millis(1));
        }
        word.store(1, Ordering::Release);
        futex_wake(&word, u32::MAX);
        assert!(waiter.join().unwrap() >= 1);
    }
}
