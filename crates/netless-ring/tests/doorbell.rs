//! Threaded tests of the doorbell: prompt futex wake-ups, deadlines, `max_sleep`, spin
//! budgets, and no lost wake-ups over many round trips.
#![cfg(not(loom))]
// Real threads on real memory, never built under loom: clippy.toml's ban (enforced under
// `--cfg loom`) does not apply, and without loom the shim's atomics are std's types anyway.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use netless_ring::{contention, doorbell, DoorbellWords, TimedOut, WaitMode, WaitPolicy};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

fn policy(mode: WaitMode, spin: Duration) -> WaitPolicy {
    WaitPolicy { mode, spin }
}

fn wait_until(mut condition: impl FnMut() -> bool) {
    let started = Instant::now();
    while !condition() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "condition never became true"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_sleeping_waiter_is_woken_promptly_by_ring() {
    let words = DoorbellWords::new();
    let flag = AtomicBool::new(false);
    let rung_at = std::sync::Mutex::new(None::<Instant>);
    std::thread::scope(|s| {
        let waiter = s.spawn(|| {
            let policy = policy(WaitMode::Futex, Duration::ZERO);
            let deadline = Some(Instant::now() + Duration::from_secs(20));
            let got = doorbell::wait(&words, &policy, deadline, Duration::from_secs(20), || {
                flag.load(Ordering::Acquire).then_some(7)
            });
            (got, Instant::now())
        });
        // Let it fall asleep.
        wait_until(|| words.sleepers() == 1);
        std::thread::sleep(Duration::from_millis(20));
        flag.store(true, Ordering::Release);
        *rung_at.lock().unwrap() = Some(Instant::now());
        doorbell::notify(&words);
        let (got, woke_at) = waiter.join().unwrap();
        assert_eq!(got, Ok(7));
        let latency = woke_at - rung_at.lock().unwrap().unwrap();
        assert!(
            latency < Duration::from_millis(500),
            "woken after {latency:?}"
        );
    });
    assert_eq!(words.sleepers(), 0);
    assert_eq!(words.sequence(), 1);
}

#[test]
fn wait_honours_the_deadline() {
    let words = DoorbellWords::new();
    for mode in [WaitMode::Spin, WaitMode::Futex, WaitMode::Adaptive] {
        let started = Instant::now();
        let deadline = started + Duration::from_millis(30);
        let got = doorbell::wait(
            &words,
            &policy(mode, Duration::from_millis(5)),
            Some(deadline),
            Duration::from_secs(10),
            || None::<()>,
        );
        let elapsed = started.elapsed();
        assert_eq!(got, Err(TimedOut), "{mode}");
        assert!(elapsed >= Duration::from_millis(30), "{mode}: {elapsed:?}");
        assert!(elapsed < Duration::from_millis(1000), "{mode}: {elapsed:?}");
    }
    // A deadline in the past still polls once.
    let past = Instant::now() - Duration::from_millis(1);
    let got = doorbell::wait(
        &words,
        &WaitPolicy::default(),
        Some(past),
        Duration::ZERO,
        || Some(1),
    );
    assert_eq!(got, Ok(1));
    assert_eq!(words.sleepers(), 0);
}

#[test]
fn max_sleep_bounds_every_sleep_when_nobody_rings() {
    // A peer publishes but never notifies (crashed or malicious): the waiter notices within
    // about max_sleep anyway.
    let words = DoorbellWords::new();
    let flag = AtomicBool::new(false);
    let polls = AtomicU32::new(0);
    std::thread::scope(|s| {
        let waiter = s.spawn(|| {
            let started = Instant::now();
            let got = doorbell::wait(
                &words,
                &policy(WaitMode::Futex, Duration::ZERO),
                None,
                Duration::from_millis(20),
                || {
                    polls.fetch_add(1, Ordering::Relaxed);
                    flag.load(Ordering::Acquire).then_some(())
                },
            );
            (got, started.elapsed())
        });
        std::thread::sleep(Duration::from_millis(100));
        let set_at = Instant::now();
        flag.store(true, Ordering::Release); // no notification
        let (got, _) = waiter.join().unwrap();
        assert_eq!(got, Ok(()));
        assert!(set_at.elapsed() < Duration::from_millis(1000));
    });
    // ~100 ms / 20 ms sleeps, two polls per sleep: far from a spin.
    let polls = polls.load(Ordering::Relaxed);
    assert!((3..=60).contains(&polls), "{polls} polls");
}

#[test]
fn adaptive_idle_waiting_does_not_spin_beyond_its_budget() {
    let words = DoorbellWords::new();
    let spin = Duration::from_millis(2);
    let started = Instant::now();
    let mut late_polls = 0u32;
    let mut total_polls = 0u32;
    let mut contended = false;
    let got = doorbell::wait(
        &words,
        &policy(WaitMode::Adaptive, spin),
        Some(started + Duration::from_millis(200)),
        Duration::from_millis(20),
        || {
            total_polls += 1;
            contended |= contention::contended(Instant::now());
            // Generous slack for a loaded machine (the clock is read every 64 polls).
            if started.elapsed() > spin + Duration::from_millis(8) {
                late_polls += 1;
            }
            None::<()>
        },
    );
    assert_eq!(got, Err(TimedOut));
    // 200 ms of 20 ms sleeps: ~10 sleeps x 2 polls, no spinning after timed-out sleeps.
    assert!(late_polls <= 40, "{late_polls} polls after the spin budget");
    // While another thread is queued for this one's CPU the polls yield, and may be few.
    if !contended {
        assert!(total_polls > 64, "it did spin first ({total_polls} polls)");
    }
}

#[test]
fn spin_mode_never_sleeps() {
    let words = DoorbellWords::new();
    let started = Instant::now();
    let mut polls = 0u64;
    let mut contended = false;
    let got = doorbell::wait(
        &words,
        &policy(WaitMode::Spin, Duration::ZERO),
        Some(started + Duration::from_millis(20)),
        Duration::ZERO,
        || {
            polls += 1;
            contended |= contention::contended(Instant::now());
            assert_eq!(words.sleepers(), 0);
            None::<()>
        },
    );
    assert_eq!(got, Err(TimedOut));
    if !contended {
        assert!(polls > 1000, "{polls} polls in 20 ms");
    }
}

#[test]
fn ping_pong_loses_no_wake_up() {
    // Two threads hand a token back and forth through two doorbells, always going to sleep
    // (spin budget 0). A lost wake-up would stall a round trip for max_sleep (2 s).
    const ROUND_TRIPS: u32 = 20_000;
    let bells = [DoorbellWords::new(), DoorbellWords::new()];
    let turn = AtomicU32::new(0); // even: ping's move, odd: pong's move
    let policy = policy(WaitMode::Adaptive, Duration::ZERO);
    let max_sleep = Duration::from_secs(2);
    let started = Instant::now();
    std::thread::scope(|s| {
        for side in 0..2u32 {
            let (bells, turn, policy) = (&bells, &turn, &policy);
            s.spawn(move || {
                let mut slow = 0;
                for round in 0..ROUND_TRIPS {
                    let mine = 2 * round + side;
                    let before = Instant::now();
                    doorbell::wait(&bells[side as usize], policy, None, max_sleep, || {
                        (turn.load(Ordering::Acquire) == mine).then_some(())
                    })
                    .unwrap();
                    if before.elapsed() >= max_sleep {
                        slow += 1;
                    }
                    turn.store(mine + 1, Ordering::Release);
                    doorbell::notify(&bells[1 - side as usize]);
                }
                assert_eq!(slow, 0, "side {side}: lost wake-ups");
            });
        }
    });
    assert_eq!(turn.load(Ordering::Relaxed), 2 * ROUND_TRIPS);
    eprintln!("{ROUND_TRIPS} futex round trips in {:?}", started.elapsed());
}
