//! A shared futex woken across two processes. The parent spawns this test binary again as
//! the child (running only `child_futex_waiter`), handing it a memfd segment by fd number.
// Never built under loom: clippy.toml's ban (enforced under `--cfg loom`) does not apply,
// and without loom the shim's atomics are std's types anyway.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]
#![cfg(not(loom))] // Uses real shared memory; loom atomics only work inside loom::model.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::Command;
use std::time::{Duration, Instant};

use netless_shm::sync::{AtomicU32, Ordering};
use netless_shm::{futex_wait, futex_wake, FutexWait, Segment};

const CHILD_ENV: &str = "NETLESS_SHM_TEST_CHILD";
const FD_ENV: &str = "NETLESS_SHM_TEST_FD";

/// Word layout in the segment: the futex word, the child's "ready" flag, its wake count,
/// and the count of timeouts it saw.
struct Words<'a> {
    futex: &'a AtomicU32,
    ready: &'a AtomicU32,
    woken: &'a AtomicU32,
    timed_out: &'a AtomicU32,
}

fn words(segment: &Segment) -> Words<'_> {
    assert!(segment.len() >= 16);
    let at = |i: usize| {
        // SAFETY: the segment is page aligned and at least 16 bytes long, so word `i < 4` is
        // an aligned, in-bounds u32 that lives as long as `segment`; all access is atomic.
        unsafe { &*(segment.as_ptr().add(4 * i) as *const AtomicU32) }
    };
    Words {
        futex: at(0),
        ready: at(1),
        woken: at(2),
        timed_out: at(3),
    }
}

#[test]
fn futex_wakes_across_processes() {
    let segment = Segment::create("futex-test", 4096).unwrap();
    // A non-close-on-exec duplicate for the child to inherit.
    let inheritable = rustix::io::dup(segment.fd()).unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_futex_waiter",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, "1")
        .env(FD_ENV, inheritable.as_raw_fd().to_string())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    drop(inheritable);

    let w = words(&segment);
    let deadline = Instant::now() + Duration::from_secs(10);
    while w.ready.load(Ordering::Acquire) == 0 {
        if Instant::now() > deadline || child.try_wait().unwrap().is_some() {
            let _ = child.kill();
            panic!("child never became ready: {:?}", child.wait());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    // Wake with the word unchanged until the kernel reports a woken waiter: proof that the
    // child process was asleep on this shared word and our wake reached it.
    let mut woke_child = false;
    while !woke_child {
        woke_child = futex_wake(w.futex, 1) == 1;
        if !woke_child {
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("child never slept on the futex");
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    w.futex.store(1, Ordering::Release);
    futex_wake(w.futex, u32::MAX);

    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("child did not exit after the wake");
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    assert!(status.success(), "child failed: {status}");
    assert!(w.woken.load(Ordering::Acquire) >= 1);
    assert_eq!(w.timed_out.load(Ordering::Acquire), 0);
}

/// The child half, run only when spawned by `futex_wakes_across_processes` (via `--ignored`).
#[test]
#[ignore = "the child half of futex_wakes_across_processes"]
fn child_futex_waiter() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let raw: i32 = std::env::var(FD_ENV).unwrap().parse().unwrap();
    // SAFETY: the parent dup'ed a segment fd without FD_CLOEXEC and passed its number; we are
    // its only owner in this process.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let segment = Segment::attach(fd, 4096).unwrap();
    let w = words(&segment);
    w.ready.store(1, Ordering::Release);
    while w.futex.load(Ordering::Acquire) == 0 {
        match futex_wait(w.futex, 0, Some(Duration::from_secs(10))) {
            FutexWait::Woken => {
                w.woken.fetch_add(1, Ordering::AcqRel);
            }
            FutexWait::TimedOut => {
                w.timed_out.fetch_add(1, Ordering::AcqRel);
                panic!("child was never woken");
            }
            FutexWait::ValueChanged | FutexWait::Interrupted => {}
        }
    }
}
