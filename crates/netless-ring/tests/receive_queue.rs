//! Threaded tests of the receive queue: MPMC stress, Full, and what a misbehaving client
//! can do to the shared tail and cells (holes, garbage, corrupt tail).
#![cfg(not(loom))]
// Real threads on real memory, never built under loom: clippy.toml's ban (enforced under
// `--cfg loom`) does not apply, and without loom the shim's atomics are std's types anyway.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use netless_ring::{ConsumerHead, Dequeue, EnqueueError, ReceiveQueue};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

fn parts(capacity: usize) -> (AtomicU64, Vec<AtomicU64>) {
    (
        AtomicU64::new(0),
        (0..capacity).map(|_| AtomicU64::new(0)).collect(),
    )
}

struct XorShift(u64);
impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[test]
fn mpmc_stress_every_value_exactly_once() {
    const PRODUCERS: u32 = 4;
    const ITEMS: u32 = if cfg!(miri) { 300 } else { 100_000 }; // Miri interprets every access
    const CONSUMERS: usize = 2;
    let (tail, cells) = parts(64);
    let queue = ReceiveQueue::from_parts(&tail, &cells).unwrap();
    let head = ConsumerHead::new();
    let received = AtomicUsize::new(0);
    let total = (PRODUCERS * ITEMS) as usize;

    let per_consumer: Vec<Vec<u32>> = std::thread::scope(|s| {
        for p in 0..PRODUCERS {
            s.spawn(move || {
                for i in 0..ITEMS {
                    let value = (p << 24) | i;
                    let mut attempts = 0u32;
                    while let Err(e) = queue.try_enqueue(value) {
                        assert!(matches!(e, EnqueueError::Full | EnqueueError::Contended));
                        attempts += 1;
                        if attempts.is_multiple_of(16) {
                            std::thread::yield_now();
                        } else {
                            std::hint::spin_loop();
                        }
                    }
                }
            });
        }
        let consumers: Vec<_> = (0..CONSUMERS)
            .map(|_| {
                let (head, received) = (&head, &received);
                s.spawn(move || {
                    let mut got = Vec::with_capacity(total);
                    while received.load(Ordering::Relaxed) < total {
                        match queue.try_dequeue(head) {
                            Dequeue::Item(v) => {
                                got.push(v);
                                received.fetch_add(1, Ordering::Relaxed);
                            }
                            Dequeue::Empty => std::thread::yield_now(),
                            Dequeue::Skipped => panic!("an honest run never skips"),
                        }
                    }
                    got
                })
            })
            .collect();
        consumers.into_iter().map(|c| c.join().unwrap()).collect()
    });

    let mut seen = vec![false; total];
    for got in &per_consumer {
        // Each consumer takes positions in increasing order, so per producer its values
        // are increasing.
        let mut last = [None::<u32>; PRODUCERS as usize];
        for &v in got {
            let (p, i) = ((v >> 24) as usize, v & 0xff_ffff);
            assert!(p < PRODUCERS as usize && i < ITEMS, "foreign value {v:#x}");
            assert!(
                last[p].is_none_or(|l| l < i),
                "out of order for producer {p}"
            );
            last[p] = Some(i);
            let index = p * ITEMS as usize + i as usize;
            assert!(!seen[index], "value {v:#x} received twice");
            seen[index] = true;
        }
    }
    assert!(seen.iter().all(|&s| s), "a value was lost");
    assert_eq!(queue.try_dequeue(&head), Dequeue::Empty);
    assert_eq!(head.position(), total as u64);
    assert_eq!(tail.load(Ordering::Relaxed), total as u64);
}

#[test]
fn single_consumer_stress_every_value_exactly_once_in_order() {
    // The single-consumer path frees cells a cache line at a time (capacity >= 64), so
    // producers wrap onto cells freed lazily; nothing may be lost, doubled or reordered.
    const PRODUCERS: u32 = 3;
    const ITEMS: u32 = if cfg!(miri) { 300 } else { 100_000 }; // Miri interprets every access
    for capacity in [64usize, 128] {
        let (tail, cells) = parts(capacity);
        let queue = ReceiveQueue::from_parts(&tail, &cells).unwrap();
        let head = ConsumerHead::new();
        let total = (PRODUCERS * ITEMS) as usize;
        let got: Vec<u32> = std::thread::scope(|s| {
            for p in 0..PRODUCERS {
                s.spawn(move || {
                    for i in 0..ITEMS {
                        let mut attempts = 0u32;
                        while let Err(e) = queue.try_enqueue((p << 24) | i) {
                            assert!(matches!(e, EnqueueError::Full | EnqueueError::Contended));
                            attempts += 1;
                            if attempts.is_multiple_of(16) {
                                std::thread::yield_now();
                            }
                        }
                    }
                });
            }
            let mut got = Vec::with_capacity(total);
            let mut polls = 0u64;
            while got.len() < total {
                polls += 1;
                match queue.try_dequeue_single_consumer(&head, polls.is_multiple_of(256), |_| {}) {
                    Dequeue::Item(v) => got.push(v),
                    Dequeue::Empty => std::thread::yield_now(),
                    Dequeue::Skipped => panic!("an honest run never skips"),
                }
            }
            got
        });
        let mut last = [None::<u32>; PRODUCERS as usize];
        let mut seen = vec![false; total];
        for v in got {
            let (p, i) = ((v >> 24) as usize, v & 0xff_ffff);
            assert!(
                last[p].is_none_or(|l| l < i),
                "out of order for producer {p}"
            );
            last[p] = Some(i);
            let index = p * ITEMS as usize + i as usize;
            assert!(!seen[index], "value {v:#x} received twice");
            seen[index] = true;
        }
        assert!(seen.iter().all(|&s| s), "a value was lost");
        assert_eq!(
            queue.try_dequeue_single_consumer(&head, true, |_| {}),
            Dequeue::Empty
        );
    }
}

#[test]
fn full_is_reported_and_clears_after_a_dequeue() {
    let (tail, cells) = parts(4);
    let queue = ReceiveQueue::from_parts(&tail, &cells).unwrap();
    let head = ConsumerHead::new();
    for round in 0..5 {
        for i in 0..4 {
            queue.try_enqueue(i).unwrap();
        }
        assert_eq!(queue.try_enqueue(99), Err(EnqueueError::Full));
        assert_eq!(queue.len_hint(&head), 4);
        assert_eq!(queue.try_dequeue(&head), Dequeue::Item(0));
        queue.try_enqueue(4).unwrap();
        assert_eq!(
            queue.try_enqueue(99),
            Err(EnqueueError::Full),
            "round {round}"
        );
        for i in 1..5 {
            assert_eq!(queue.try_dequeue(&head), Dequeue::Item(i));
        }
        assert_eq!(queue.try_dequeue(&head), Dequeue::Empty);
        assert_eq!(queue.len_hint(&head), 0);
    }
}

#[test]
fn a_hole_is_skipped() {
    let (tail, cells) = parts(8);
    let queue = ReceiveQueue::from_parts(&tail, &cells).unwrap();
    let head = ConsumerHead::new();
    // A malicious client bumps the tail without filling cell 0.
    tail.store(1, Ordering::Relaxed);
    queue.try_enqueue(7).unwrap();
    assert_eq!(queue.try_dequeue(&head), Dequeue::Skipped);
    assert_eq!(queue.try_dequeue(&head), Dequeue::Item(7));
    assert_eq!(queue.try_dequeue(&head), Dequeue::Empty);
    // Holes right at the tail: the consumer skips, producers catch up.
    tail.store(4, Ordering::Relaxed);
    for _ in 0..2 {
        assert_eq!(queue.try_dequeue(&head), Dequeue::Skipped);
    }
    assert_eq!(queue.try_dequeue(&head), Dequeue::Empty);
    for i in 0..20 {
        queue.try_enqueue(i).unwrap();
        assert_eq!(queue.try_dequeue(&head), Dequeue::Item(i));
    }
}

#[test]
fn a_tail_thrown_a_lap_away_is_put_back() {
    for jump in [100u64, 8 * 1000 + 3, u64::MAX - 20, (1 << 40) + 29] {
        let (tail, cells) = parts(8);
        let queue = ReceiveQueue::from_parts(&tail, &cells).unwrap();
        let head = ConsumerHead::new();
        queue.try_enqueue(1).unwrap();
        queue.try_enqueue(2).unwrap();
        // A malicious client writes the tail far ahead (or, wrapping, behind); not by a
        // multiple of 2^31 laps, whose cell turns (32 bits) alias lap 0 and just work.
        tail.store(2u64.wrapping_add(jump), Ordering::Relaxed);
        // Producers give up and the consumer cannot believe it: jammed, until repaired.
        assert!(queue.try_enqueue(3).is_err(), "jump {jump}");
        assert_eq!(queue.repair_tail(&head), Some(2), "jump {jump}");
        assert_eq!(queue.repair_tail(&head), None, "a sane tail is left alone");
        queue.try_enqueue(3).unwrap();
        for i in 1..=3 {
            assert_eq!(queue.try_dequeue(&head), Dequeue::Item(i));
        }
        // The consumer repairs it too when it checks for holes.
        tail.store(3u64.wrapping_add(jump), Ordering::Relaxed);
        assert_eq!(queue.try_dequeue(&head), Dequeue::Empty);
        assert_eq!(tail.load(Ordering::Relaxed), 3, "jump {jump}");
        queue.try_enqueue(4).unwrap();
        assert_eq!(queue.try_dequeue(&head), Dequeue::Item(4));
    }
    // Within a lap either way, the tail is a producer's business, not a repair's.
    let (tail, cells) = parts(8);
    let queue = ReceiveQueue::from_parts(&tail, &cells).unwrap();
    let head = ConsumerHead::new();
    tail.store(8, Ordering::Relaxed);
    assert_eq!(queue.repair_tail(&head), None);
}

#[test]
fn a_tail_left_behind_the_head_at_a_scribbled_cell_is_put_back() {
    // Found by the receive_queue fuzz target. The turn of a cell scribbled on: "still holds
    // the previous lap's item" (producers answer Full), or nothing a producer can place
    // (they answer Contended).
    for garbage in [u64::from(u32::MAX) << 32, 0x3535_3535_3030_303d] {
        let (tail, cells) = parts(2);
        let queue = ReceiveQueue::from_parts(&tail, &cells).unwrap();
        let head = ConsumerHead::new();
        // A faulty client scribbles on the cell at the tail; the consumer skips it, so the
        // head passes the tail (producers would bump past the cell it freed)...
        cells[0].store(garbage, Ordering::Relaxed);
        assert_eq!(queue.try_dequeue(&head), Dequeue::Skipped);
        assert_eq!((tail.load(Ordering::Relaxed), head.position()), (0, 1));
        // ...then scribbles on it again: producers at the tail can neither fill nor pass
        // it, and the head never comes back to it.
        cells[0].store(garbage, Ordering::Relaxed);
        assert!(queue.try_enqueue(1).is_err(), "{garbage:#x}");
        // The consumer's hole check puts the tail back at the head.
        assert_eq!(queue.try_dequeue(&head), Dequeue::Empty);
        assert_eq!(tail.load(Ordering::Relaxed), 1, "{garbage:#x}");
        queue.try_enqueue(1).unwrap();
        assert_eq!(queue.try_dequeue(&head), Dequeue::Item(1));
    }
    // One behind at a cell the consumer took (a producer that has not bumped the tail
    // yet): the producers' business, not a repair's.
    let (tail, cells) = parts(2);
    let queue = ReceiveQueue::from_parts(&tail, &cells).unwrap();
    let head = ConsumerHead::new();
    queue.try_enqueue(7).unwrap();
    tail.store(0, Ordering::Relaxed);
    assert_eq!(queue.try_dequeue(&head), Dequeue::Item(7));
    assert_eq!(queue.repair_tail(&head), None);
    queue.try_enqueue(8).unwrap();
    assert_eq!(queue.try_dequeue(&head), Dequeue::Item(8));
}

#[test]
fn a_crashed_producer_never_leaves_a_hole() {
    // A producer that filled its cell and died before bumping the tail: the next producer
    // helps, the consumer sees the item.
    let (tail, cells) = parts(4);
    let queue = ReceiveQueue::from_parts(&tail, &cells).unwrap();
    let head = ConsumerHead::new();
    cells[0].store((1u64 << 32) | 11, Ordering::Relaxed); // turn_full(0), value 11
    queue.try_enqueue(12).unwrap();
    assert_eq!(tail.load(Ordering::Relaxed), 2);
    assert_eq!(queue.try_dequeue(&head), Dequeue::Item(11));
    assert_eq!(queue.try_dequeue(&head), Dequeue::Item(12));
}

#[test]
fn garbage_cells_are_skipped_and_never_hang() {
    let capacity = 16usize;
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    // Under Miri, which interprets every access, far fewer trials (here and below).
    let trials = if cfg!(miri) { 20 } else { 2000 };
    for trial in 0..trials {
        let (tail, cells) = parts(capacity);
        let queue = ReceiveQueue::from_parts(&tail, &cells).unwrap();
        let head = ConsumerHead::new();
        let sane_tail = trial % 3 == 0;
        for cell in &cells {
            let word = match rng.next() % 4 {
                0 => rng.next(),
                1 => (rng.next() % 8) << 32 | (rng.next() & 0xffff_ffff),
                2 => u64::from(u32::MAX) << 32,
                _ => 0,
            };
            cell.store(word, Ordering::Relaxed);
        }
        tail.store(
            match trial % 3 {
                0 => 0,
                1 => rng.next() % (3 * capacity as u64),
                _ => rng.next(),
            },
            Ordering::Relaxed,
        );
        // The consumer drains in a bounded number of calls, whatever it finds.
        let mut calls = 0;
        while queue.try_dequeue(&head) != Dequeue::Empty {
            calls += 1;
            assert!(
                calls < 4 * capacity + 8,
                "consumer does not settle (trial {trial})"
            );
        }
        let started = Instant::now();
        let _ = queue.try_enqueue(1);
        assert!(started.elapsed() < Duration::from_secs(1));
        if sane_tail {
            // With an honest tail the queue recovers: every value comes out (garbage items
            // may come out too: values are untrusted anyway).
            for i in 0..3 * capacity as u32 {
                let marker = 0xabc0_0000 | i;
                let mut tries = 0;
                while queue.try_enqueue(marker).is_err() {
                    let _ = queue.try_dequeue(&head);
                    tries += 1;
                    assert!(tries < 100, "enqueue never succeeds (trial {trial})");
                }
                let mut calls = 0;
                loop {
                    match queue.try_dequeue(&head) {
                        Dequeue::Item(v) if v == marker => break,
                        _ => calls += 1,
                    }
                    assert!(calls < 4 * capacity + 8, "value {i} lost (trial {trial})");
                }
            }
        }
    }
}

#[test]
fn a_corrupt_tail_makes_producers_fail_in_bounded_time() {
    let mut rng = XorShift(12345);
    let trials = if cfg!(miri) { 5 } else { 200 };
    for _ in 0..trials {
        let (tail, cells) = parts(64);
        let queue = ReceiveQueue::from_parts(&tail, &cells).unwrap();
        let head = ConsumerHead::new();
        tail.store(rng.next() | (1 << 40), Ordering::Relaxed);
        let started = Instant::now();
        for _ in 0..10 {
            let _ = queue.try_enqueue(5);
        }
        // (Miri interprets each instruction: its clock says nothing about the CPU's.)
        let bound = Duration::from_secs(if cfg!(miri) { 600 } else { 1 });
        assert!(started.elapsed() < bound);
        // The consumer does not believe a tail more than a lap ahead.
        let mut calls = 0;
        while queue.try_dequeue(&head) != Dequeue::Empty {
            calls += 1;
            assert!(calls < 200);
        }
        assert!(queue.len_hint(&head) <= 64);
    }
    // A tail far ahead with empty cells is reported as contention, not Full.
    let (tail, cells) = parts(8);
    let queue = ReceiveQueue::from_parts(&tail, &cells).unwrap();
    tail.store(8 * 5 + 3, Ordering::Relaxed);
    assert_eq!(queue.try_enqueue(1), Err(EnqueueError::Contended));
}
