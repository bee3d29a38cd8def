//! Wake-ups between processes: a waiter polls for a bounded spin budget, then announces
//! that it sleeps and sleeps on a shared futex word; a waker issues the `FUTEX_WAKE`
//! syscall only when someone announced sleeping, so notifying through a doorbell nobody sleeps on costs one
//! fence and one load.
//!
//! This module owns the protocol on [`DoorbellWords`] (`sleepers`, `seq`); it never knows
//! what the waiter waits for (the caller's `poll` closure) and never trusts the words:
//! `sleepers` may be corrupted by a peer, so it is only used to decide whether to issue a
//! wake syscall, with wrapping arithmetic, and every sleep is bounded by `max_sleep`, so a
//! peer that never notifies (crashed, malicious, or a corrupted counter) delays us by at most
//! that much per sleep, never forever.
//!
//! # Why no wake-up is lost
//!
//! Waiter: `s = seq`; `sleepers += 1`; `fence(SeqCst)`; `poll()`; `futex_wait(seq, s)`.
//! Waker: publish the data; `fence(SeqCst)`; `if sleepers != 0 { seq += 1; futex_wake }`.
//!
//! The two SeqCst fences are totally ordered (Dekker). If the waker's fence comes first,
//! the waiter's `poll()` after its fence sees the data and it does not sleep. If the
//! waiter's fence comes first, the waker's load sees `sleepers != 0` and bumps `seq`.
//! That load is Acquire and the increment a (SeqCst, hence Release) RMW, so the waiter's
//! earlier read `s` happens before the bump: `seq != s` from then on. The kernel checks
//! `seq == s` atomically with going to sleep, so either the wait returns at once
//! (`ValueChanged`) or the waiter is already asleep when `futex_wake` runs. The
//! waiter-side fence is needed because a SeqCst RMW followed by an Acquire load (inside
//! `poll`) is not a store-load barrier in the language model (it is on x86, where the
//! fence after a locked RMW is cheap; it is only on the sleep path anyway).

use crate::contention;
use crate::futex::{futex_wait, futex_wait_any, futex_wake, FutexWait, WAIT_ANY_MAX};
pub use crate::layout::DoorbellWords;
use crate::sync::fence;
use crate::sync::hint::spin_loop;
use crate::sync::yield_now;
use crate::sync::Ordering::{Acquire, Relaxed, Release, SeqCst};
use core::fmt;
use core::str::FromStr;
use std::time::{Duration, Instant};

/// How a waiter waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum WaitMode {
    /// Poll until the deadline; never sleep (lowest latency, burns a core). While another
    /// thread is queued for its CPU ([`crate::contention`]) it yields the CPU every 64 polls
    /// (a few microseconds) rather than hold it.
    Spin,
    /// Poll once, then sleep on the futex (lowest CPU, adds a wake-up to the latency).
    Futex,
    /// Poll for [`WaitPolicy::spin`], then sleep; while another thread is queued for its
    /// CPU the polls yield the CPU every so often, as [`WaitMode::Spin`]'s do.
    #[default]
    Adaptive,
    /// Poll for [`WaitPolicy::spin`], giving the CPU to any other runnable thread between
    /// polls (`sched_yield`), then sleep. For more busy threads than cores: a waiter that
    /// yields lets the thread it waits for run, and is found awake, so its waker makes no
    /// wake-up system call (and sends no inter-processor interrupt).
    Yield,
}

impl WaitMode {
    /// The name used by [`FromStr`] and [`fmt::Display`].
    pub const fn as_str(self) -> &'static str {
        match self {
            WaitMode::Spin => "spin",
            WaitMode::Futex => "futex",
            WaitMode::Adaptive => "adaptive",
            WaitMode::Yield => "yield",
        }
    }
}

impl fmt::Display for WaitMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A wait mode name other than `spin`, `futex` or `adaptive`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("unknown wait mode: expected `spin`, `futex`, `adaptive` or `yield`")]
pub struct ParseWaitModeError;

impl FromStr for WaitMode {
    type Err = ParseWaitModeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "spin" => Ok(WaitMode::Spin),
            "futex" => Ok(WaitMode::Futex),
            "adaptive" => Ok(WaitMode::Adaptive),
            "yield" => Ok(WaitMode::Yield),
            _ => Err(ParseWaitModeError),
        }
    }
}

/// How long and how to wait before sleeping.
///
/// ```
/// use netless_ring::{WaitMode, WaitPolicy};
/// let policy: WaitPolicy = WaitPolicy { mode: "futex".parse().unwrap(), ..Default::default() };
/// assert_eq!(policy.mode, WaitMode::Futex);
/// assert_eq!(WaitPolicy::default().spin, WaitPolicy::DEFAULT_SPIN);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitPolicy {
    /// The mode.
    pub mode: WaitMode,
    /// Spin budget of [`WaitMode::Adaptive`] and [`WaitMode::Yield`] before each sleep that
    /// follows a wake-up.
    pub spin: Duration,
}

impl WaitPolicy {
    /// Default spin budget: 50 µs.
    pub const DEFAULT_SPIN: Duration = Duration::from_micros(50);
}

impl Default for WaitPolicy {
    fn default() -> Self {
        Self {
            mode: WaitMode::Adaptive,
            spin: Self::DEFAULT_SPIN,
        }
    }
}

/// The deadline passed before `poll` returned something.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("deadline passed while waiting on the doorbell")]
pub struct TimedOut;

/// How one [`Sleeper::sleep`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SleepOutcome {
    /// Woken by a notification (or spuriously).
    Woken,
    /// Someone rang between [`DoorbellWords::announce_sleep`] and the sleep: did not sleep.
    ValueChanged,
    /// The timeout elapsed.
    TimedOut,
    /// A signal interrupted the sleep.
    Interrupted,
}

/// Notifies through the doorbell: wakes one sleeping waiter, if any announced sleeping. Call it after
/// publishing what the waiter polls for. Costs one fence and one load when nobody sleeps.
pub fn notify(words: &DoorbellWords) {
    notify_count(words, 1);
}

/// Notifies every sleeping waiter.
pub fn notify_all(words: &DoorbellWords) {
    notify_count(words, u32::MAX);
}

#[inline]
fn notify_count(words: &DoorbellWords, count: u32) {
    // SeqCst fence: orders the caller's publication before the `sleepers` load (module docs).
    fence(SeqCst);
    // Acquire: see module docs (orders the waiter's read of `seq` before our bump).
    if words.sleepers.load(Acquire) != 0 {
        words.seq.fetch_add(1, Release);
        futex_wake(&words.seq, count);
    }
}

impl DoorbellWords {
    /// Announces that the caller is about to sleep: reads the sequence, counts itself in
    /// `sleepers` and fences. The caller must then poll once more (anything published
    /// before a notification that did not see this announcement is visible now) and, if there is
    /// still nothing, call [`Sleeper::sleep`]. Dropping the [`Sleeper`] retracts the
    /// announcement. [`wait`] does all of this; use this directly to integrate with another
    /// reactor.
    pub fn announce_sleep(&self) -> Sleeper<'_> {
        // Read before counting ourselves: a notification that sees our count bumps `seq` after this.
        let ticket = self.seq.load(Acquire);
        // Wrapping (fetch_add wraps): the value may have been corrupted by a peer.
        self.sleepers.fetch_add(1, SeqCst);
        // SeqCst fence: the store-load barrier of the Dekker pair (module docs).
        fence(SeqCst);
        Sleeper {
            words: self,
            ticket,
        }
    }

    /// Current sequence number (bumped by every notification that saw a sleeper). For tests and
    /// statistics.
    pub fn sequence(&self) -> u32 {
        self.seq.load(Relaxed)
    }

    /// Current count of announced sleepers (untrusted; for statistics).
    pub fn sleepers(&self) -> u32 {
        self.sleepers.load(Relaxed)
    }
}

/// An announced sleep (see [`DoorbellWords::announce_sleep`]); dropping it retracts it.
#[must_use = "dropping a Sleeper retracts the announcement; call sleep()"]
pub struct Sleeper<'w> {
    words: &'w DoorbellWords,
    ticket: u32,
}

impl Sleeper<'_> {
    /// The sequence number read at the announcement: the sleep returns at once if the
    /// doorbell's sequence differs from it.
    pub fn ticket(&self) -> u32 {
        self.ticket
    }

    /// Sleeps until notified, at most `timeout`, then retracts the announcement.
    pub fn sleep(self, timeout: Duration) -> SleepOutcome {
        match futex_wait(&self.words.seq, self.ticket, Some(timeout)) {
            FutexWait::Woken => SleepOutcome::Woken,
            FutexWait::ValueChanged => SleepOutcome::ValueChanged,
            FutexWait::TimedOut => SleepOutcome::TimedOut,
            FutexWait::Interrupted => SleepOutcome::Interrupted,
        }
    }
}

impl Drop for Sleeper<'_> {
    fn drop(&mut self) {
        // Relaxed: a stale count only costs a useless wake syscall.
        self.words.sleepers.fetch_sub(1, Relaxed);
    }
}

impl fmt::Debug for Sleeper<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sleeper")
            .field("ticket", &self.ticket)
            .finish()
    }
}

/// Waits until `poll` returns `Some`, per `policy`, until `deadline` (`None`: no deadline).
///
/// `poll` is called first, before anything else (no clock read on the fast path). Spinning
/// reads the clock only every 64 polls. Every sleep lasts at most `max_sleep` (and not past
/// the deadline), so a peer that never notifies cannot keep us asleep: after a timed-out sleep
/// we poll once and sleep again; after a wake-up, [`WaitMode::Adaptive`] spins its budget
/// again. [`WaitMode::Spin`] without a deadline spins until `poll` succeeds.
///
/// ```
/// use netless_ring::{doorbell, DoorbellWords, WaitPolicy};
/// use std::time::{Duration, Instant};
///
/// let words = DoorbellWords::new();
/// let deadline = Some(Instant::now() + Duration::from_millis(5));
/// let outcome = doorbell::wait(&words, &WaitPolicy::default(), deadline, Duration::from_millis(1), || None::<()>);
/// assert_eq!(outcome, Err(netless_ring::TimedOut));
/// doorbell::notify(&words); // nobody sleeps: no syscall
/// ```
pub fn wait<T>(
    words: &DoorbellWords,
    policy: &WaitPolicy,
    deadline: Option<Instant>,
    max_sleep: Duration,
    poll: impl FnMut() -> Option<T>,
) -> Result<T, TimedOut> {
    wait_counted(words, policy, deadline, max_sleep, &mut 0, poll)
}

/// [`wait`], adding to `sleeps` each time it went to sleep on the futex (for stats: each is
/// a wake-up the waker paid a system call for, or a timed-out sleep).
pub fn wait_counted<T>(
    words: &DoorbellWords,
    policy: &WaitPolicy,
    deadline: Option<Instant>,
    max_sleep: Duration,
    sleeps: &mut u64,
    poll: impl FnMut() -> Option<T>,
) -> Result<T, TimedOut> {
    wait_any_counted(&[words], policy, deadline, max_sleep, sleeps, poll)
}

/// [`wait_counted`] on several doorbells at once: `poll` checks everything they announce,
/// and a sleep ends when any of them is notified (one `futex_waitv`). For a thread that serves
/// more than one source, such as a server worker that also collects the replies of calls it
/// made. At most [`WAIT_ANY_MAX`] doorbells are slept on; the rest are only polled.
///
/// ```
/// use netless_ring::{doorbell, DoorbellWords, WaitPolicy};
/// use std::time::{Duration, Instant};
///
/// let (a, b) = (DoorbellWords::new(), DoorbellWords::new());
/// let deadline = Some(Instant::now() + Duration::from_millis(5));
/// let outcome = doorbell::wait_any_counted(&[&a, &b], &WaitPolicy::default(), deadline,
///     Duration::from_millis(1), &mut 0, || None::<()>);
/// assert_eq!(outcome, Err(netless_ring::TimedOut));
/// ```
pub fn wait_any_counted<T>(
    words: &[&DoorbellWords],
    policy: &WaitPolicy,
    deadline: Option<Instant>,
    max_sleep: Duration,
    sleeps: &mut u64,
    mut poll: impl FnMut() -> Option<T>,
) -> Result<T, TimedOut> {
    if let Some(value) = poll() {
        return Ok(value);
    }
    let mut budget = match policy.mode {
        WaitMode::Spin => None,
        WaitMode::Futex => Some(Duration::ZERO),
        WaitMode::Adaptive | WaitMode::Yield => Some(policy.spin),
    };
    let yielding = policy.mode == WaitMode::Yield;
    loop {
        if let Some(value) = spin(&mut poll, deadline, budget, yielding)? {
            return Ok(value);
        }
        let timeout = match deadline {
            Some(deadline) => deadline
                .checked_duration_since(Instant::now())
                .filter(|left| !left.is_zero())
                .ok_or(TimedOut)?
                .min(max_sleep),
            None => max_sleep,
        };
        let outcome = match words {
            [one] => {
                let sleeper = one.announce_sleep();
                if let Some(value) = poll() {
                    return Ok(value);
                }
                *sleeps += 1;
                sleeper.sleep(timeout)
            }
            many => {
                let sleepers = announce_sleep_any(many);
                if let Some(value) = poll() {
                    return Ok(value);
                }
                *sleeps += 1;
                sleepers.sleep(timeout)
            }
        };
        if let Some(value) = poll() {
            return Ok(value);
        }
        budget = match (policy.mode, outcome) {
            (
                WaitMode::Adaptive | WaitMode::Yield,
                SleepOutcome::Woken | SleepOutcome::ValueChanged,
            ) => Some(policy.spin),
            _ => Some(Duration::ZERO),
        };
    }
}

/// [`DoorbellWords::announce_sleep`] on several doorbells (the first [`WAIT_ANY_MAX`]) at
/// once, with one fence: the caller then polls once more for everything they announce and,
/// if there is still nothing, calls [`SleepSet::sleep`], which returns when any of them
/// is notified. [`wait_any_counted`] does all of this.
pub fn announce_sleep_any<'w>(words: &'w [&'w DoorbellWords]) -> SleepSet<'w> {
    let words = &words[..words.len().min(WAIT_ANY_MAX)];
    let mut tickets = [0; WAIT_ANY_MAX];
    for (ticket, w) in tickets.iter_mut().zip(words) {
        // As in `announce_sleep`: read the sequence, then count ourselves.
        *ticket = w.seq.load(Acquire);
        w.sleepers.fetch_add(1, SeqCst);
    }
    // One store-load barrier for all the announcements.
    fence(SeqCst);
    SleepSet { words, tickets }
}

/// Announced sleeps on several doorbells (see [`announce_sleep_any`]); dropping it retracts
/// them all. Each announcement follows [`DoorbellWords::announce_sleep`]'s protocol, so a
/// notification of any of them after the caller's last poll ends the sleep (module docs).
#[must_use = "dropping a SleepSet retracts the announcements; call sleep()"]
pub struct SleepSet<'w> {
    words: &'w [&'w DoorbellWords],
    tickets: [u32; WAIT_ANY_MAX],
}

impl SleepSet<'_> {
    /// The sequence number read from the `i`th doorbell at the announcement.
    pub fn ticket(&self, i: usize) -> u32 {
        self.tickets[i]
    }

    /// Sleeps until any of the doorbells is notified, at most `timeout`, then retracts the
    /// announcements.
    pub fn sleep(self, timeout: Duration) -> SleepOutcome {
        if self.words.is_empty() {
            std::thread::sleep(timeout);
            return SleepOutcome::TimedOut;
        }
        let mut pairs = [(&self.words[0].seq, 0u32); WAIT_ANY_MAX];
        for ((pair, w), ticket) in pairs.iter_mut().zip(self.words).zip(self.tickets) {
            *pair = (&w.seq, ticket);
        }
        match futex_wait_any(&pairs[..self.words.len()], Some(timeout)) {
            FutexWait::Woken => SleepOutcome::Woken,
            FutexWait::ValueChanged => SleepOutcome::ValueChanged,
            FutexWait::TimedOut => SleepOutcome::TimedOut,
            FutexWait::Interrupted => SleepOutcome::Interrupted,
        }
    }
}

impl fmt::Debug for SleepSet<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SleepSet")
            .field("tickets", &&self.tickets[..self.words.len()])
            .finish()
    }
}

impl Drop for SleepSet<'_> {
    fn drop(&mut self) {
        for w in self.words {
            // Relaxed, as in `Sleeper::drop`.
            w.sleepers.fetch_sub(1, Relaxed);
        }
    }
}

/// Polls for `budget` (`None`: until the deadline), yielding the CPU between polls if
/// `yielding`. `Ok(None)`: budget spent.
///
/// Otherwise the polls spin, and every 64th reads the clock. While this thread's CPU is
/// contended ([`contention`]: the thread was preempted, or a yield ran another thread, in
/// the last few milliseconds), or may be, it yields the CPU there: a spin would hold a CPU
/// another thread, maybe the one that will answer, is queued for. The 64 polls in between
/// (a few microseconds) still catch a reply from a peer running on another CPU.
fn spin<T>(
    poll: &mut impl FnMut() -> Option<T>,
    deadline: Option<Instant>,
    budget: Option<Duration>,
    yielding: bool,
) -> Result<Option<T>, TimedOut> {
    if budget == Some(Duration::ZERO) {
        return Ok(None);
    }
    let mut last = Instant::now();
    let spin_end = budget.and_then(|budget| last.checked_add(budget));
    let mut polls: u32 = 0;
    loop {
        if yielding {
            yield_now();
        } else {
            spin_loop();
        }
        if let Some(value) = poll() {
            return Ok(Some(value));
        }
        polls = polls.wrapping_add(1);
        // A yield may last a whole time slice of another thread: check the clock after each.
        if yielding || polls.is_multiple_of(64) {
            let now = Instant::now();
            if deadline.is_some_and(|deadline| now >= deadline) {
                return Err(TimedOut);
            }
            if spin_end.is_some_and(|end| now >= end) {
                return Ok(None);
            }
            last = if yielding {
                now
            } else {
                contention::checkpoint(last, now)
            };
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn mode_names_round_trip() {
        for mode in [
            WaitMode::Spin,
            WaitMode::Futex,
            WaitMode::Adaptive,
            WaitMode::Yield,
        ] {
            assert_eq!(mode.to_string().parse::<WaitMode>(), Ok(mode));
        }
        assert_eq!("Spin".parse::<WaitMode>(), Err(ParseWaitModeError));
        assert_eq!(WaitMode::default(), WaitMode::Adaptive);
    }

    #[test]
    fn sleeper_counts() {
        let words = DoorbellWords::new();
        let sleeper = words.announce_sleep();
        assert_eq!(words.sleepers(), 1);
        notify(&words);
        assert_eq!(words.sequence(), 1);
        assert_eq!(
            sleeper.sleep(Duration::from_secs(5)),
            SleepOutcome::ValueChanged
        );
        assert_eq!(words.sleepers(), 0);
        notify(&words);
        assert_eq!(words.sequence(), 1);
    }
}
