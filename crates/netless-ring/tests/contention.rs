//! A spinning waiter that notices another thread queued for its CPU gives the CPU away
//! instead of holding it. Its own test binary, as its busy threads would make every other
//! waiting test of a binary yield.
#![cfg(not(loom))]
// Real threads on real memory, never built under loom (see tests/doorbell.rs).
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use netless_ring::{doorbell, DoorbellWords, TimedOut, WaitMode, WaitPolicy};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// CPU time this thread has run, ns.
fn thread_cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

#[test]
fn a_spinning_waiter_gives_its_cpu_to_threads_queued_for_it() {
    // Busy threads, two per CPU this process may use and one more, queue for every CPU; a
    // `Spin` waiter among them that held its CPU would run about a fair share of the wait
    // (2 CPUs / 6 threads here: a third of it), one that yields runs only for its polls
    // (and until its first preemption, a time slice).
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
    let stop = AtomicBool::new(false);
    let wait = Duration::from_millis(300);
    let (used, fair) = std::thread::scope(|s| {
        let busy = 2 * cpus + 1;
        for _ in 0..busy {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            });
        }
        let waiter = s.spawn(|| {
            // Let the busy threads start and the count be read with them.
            std::thread::sleep(Duration::from_millis(20));
            let words = DoorbellWords::new();
            let before = thread_cpu_ns();
            let started = Instant::now();
            let outcome = doorbell::wait(
                &words,
                &WaitPolicy {
                    mode: WaitMode::Spin,
                    spin: Duration::ZERO,
                },
                Some(started + wait),
                Duration::from_millis(1),
                || None::<()>,
            );
            assert_eq!(outcome, Err(TimedOut));
            thread_cpu_ns() - before
        });
        let used = waiter.join().unwrap();
        stop.store(true, Ordering::Relaxed);
        let fair = wait.as_nanos() as u64 * u64::from(cpus) / u64::from(busy + 1);
        (used, fair)
    });
    assert!(
        used < fair / 8,
        "the waiter ran {:.1} ms of a {:.0} ms wait among busy threads (a fair share: {:.1} ms): \
         it held its CPU instead of yielding",
        used as f64 / 1e6,
        wait.as_secs_f64() * 1e3,
        fair as f64 / 1e6
    );
}
