//! A waiter that notices oversubscription: while more threads are runnable than there are
//! CPUs, the doorbell's polls give the CPU away instead of holding it. Its own test binary,
//! as its busy threads would make every other waiting test of a binary yield.
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
fn a_spinning_waiter_gives_its_cpu_away_while_threads_outnumber_cpus() {
    // Busy threads, two per CPU online and one more, make the machine oversubscribed; a
    // `Spin` waiter among them that held its CPU would run about a fair share of the wait
    // (2 CPUs / 6 threads here: a third of it), one that yields between polls runs only for
    // its polls.
    let Some(cpus) = std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|list| {
            list.trim()
                .split(',')
                .map(|r| match r.split_once('-') {
                    Some((a, b)) => Some(b.parse::<u32>().ok()? - a.parse::<u32>().ok()? + 1),
                    None => r.parse::<u32>().ok().map(|_| 1),
                })
                .sum::<Option<u32>>()
        })
    else {
        println!("SKIPPED: no /sys/devices/system/cpu/online to count the CPUs by");
        return;
    };
    if !std::path::Path::new("/proc/loadavg").exists() {
        println!("SKIPPED: no /proc/loadavg to count runnable threads by");
        return;
    }
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
