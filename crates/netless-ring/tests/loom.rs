//! loom models of the three protocols. Run with
//! `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p netless-ring --test loom --release`.
#![cfg(loom)]

use loom::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use loom::sync::Arc;
use loom::thread;
use netless_ring::{
    doorbell, ConsumerHead, Dequeue, DoorbellWords, EnqueueError, ReceiveQueue, ResponseRing,
};

fn model(bound: usize, f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(bound);
    builder.check(f);
}

struct QueueMemory {
    tail: AtomicU64,
    cells: [AtomicU64; 2],
}

impl QueueMemory {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            tail: AtomicU64::new(0),
            cells: [AtomicU64::new(0), AtomicU64::new(0)],
        })
    }

    fn queue(&self) -> ReceiveQueue<'_> {
        ReceiveQueue::from_parts(&self.tail, &self.cells).unwrap()
    }
}

fn enqueue(queue: ReceiveQueue<'_>, value: u32) {
    loop {
        match queue.try_enqueue(value) {
            Ok(()) => return,
            Err(EnqueueError::Full | EnqueueError::Contended) => thread::yield_now(),
        }
    }
}

/// Takes what is there (bounded), returns the items.
fn drain(queue: ReceiveQueue<'_>, head: &ConsumerHead, attempts: usize) -> Vec<u32> {
    let mut got = Vec::new();
    for _ in 0..attempts {
        match queue.try_dequeue(head) {
            Dequeue::Item(v) => got.push(v),
            Dequeue::Empty => {}
            Dequeue::Skipped => panic!("an honest run never skips"),
        }
    }
    got
}

fn assert_exactly_once(mut got: Vec<u32>, expected: &[u32]) {
    got.sort_unstable();
    assert_eq!(got, expected, "every value exactly once, nothing foreign");
}

#[test]
fn queue_two_producers_one_consumer() {
    model(2, || {
        let memory = QueueMemory::new();
        let head = Arc::new(ConsumerHead::new());
        let producers: Vec<_> = [11u32, 22]
            .into_iter()
            .map(|value| {
                let memory = memory.clone();
                thread::spawn(move || enqueue(memory.queue(), value))
            })
            .collect();
        let consumer = {
            let (memory, head) = (memory.clone(), head.clone());
            thread::spawn(move || drain(memory.queue(), &head, 2))
        };
        for p in producers {
            p.join().unwrap();
        }
        let mut got = consumer.join().unwrap();
        got.extend(drain(memory.queue(), &head, 3));
        assert_exactly_once(got, &[11, 22]);
        assert_eq!(memory.queue().try_dequeue(&head), Dequeue::Empty);
    });
}

#[test]
fn queue_one_producer_two_consumers() {
    model(2, || {
        let memory = QueueMemory::new();
        let head = Arc::new(ConsumerHead::new());
        let producer = {
            let memory = memory.clone();
            thread::spawn(move || {
                enqueue(memory.queue(), 11);
                enqueue(memory.queue(), 22);
            })
        };
        let consumers: Vec<_> = (0..2)
            .map(|_| {
                let (memory, head) = (memory.clone(), head.clone());
                thread::spawn(move || drain(memory.queue(), &head, 1))
            })
            .collect();
        producer.join().unwrap();
        let mut got = Vec::new();
        for c in consumers {
            got.extend(c.join().unwrap());
        }
        got.extend(drain(memory.queue(), &head, 3));
        assert_exactly_once(got, &[11, 22]);
        assert_eq!(head.position(), 2);
    });
}

#[test]
fn queue_one_producer_two_consumers_with_wrap() {
    // Three values through two cells while two workers take concurrently: a worker can be
    // preempted between taking a cell and bumping the head while the cell is refilled for
    // the next lap; the other worker must not mistake that refill for corruption.
    model(2, || {
        let memory = QueueMemory::new();
        let head = Arc::new(ConsumerHead::new());
        let producer = {
            let memory = memory.clone();
            thread::spawn(move || {
                for value in [11, 22, 33] {
                    enqueue(memory.queue(), value);
                }
            })
        };
        let consumers: Vec<_> = (0..2)
            .map(|_| {
                let (memory, head) = (memory.clone(), head.clone());
                thread::spawn(move || drain(memory.queue(), &head, 1))
            })
            .collect();
        let mut got = Vec::new();
        for c in consumers {
            got.extend(c.join().unwrap());
        }
        // The producer may be waiting for room: keep taking until all three arrived.
        while got.len() < 3 {
            match memory.queue().try_dequeue(&head) {
                Dequeue::Item(v) => got.push(v),
                Dequeue::Empty => thread::yield_now(),
                Dequeue::Skipped => panic!("an honest run never skips"),
            }
        }
        producer.join().unwrap();
        assert_exactly_once(got, &[11, 22, 33]);
        assert_eq!(memory.queue().try_dequeue(&head), Dequeue::Empty);
    });
}

#[test]
fn queue_wraps_with_a_concurrent_consumer() {
    // Capacity 2, three values: the third reuses cell 0 on lap 1.
    model(2, || {
        let memory = QueueMemory::new();
        let head = Arc::new(ConsumerHead::new());
        let producer = {
            let memory = memory.clone();
            thread::spawn(move || {
                for value in [1, 2, 3] {
                    enqueue(memory.queue(), value);
                }
            })
        };
        let mut got = Vec::new();
        while got.len() < 3 {
            match memory.queue().try_dequeue(&head) {
                Dequeue::Item(v) => got.push(v),
                Dequeue::Empty => thread::yield_now(),
                Dequeue::Skipped => panic!("an honest run never skips"),
            }
        }
        producer.join().unwrap();
        assert_eq!(got, [1, 2, 3], "one producer, one consumer: FIFO");
    });
}

#[test]
fn queue_two_producers_single_consumer_with_wrap() {
    // The single-consumer fast path (plain stores): two producers racing a consumer that
    // frees cells with plain stores, across a wrap.
    fn take(queue: ReceiveQueue<'_>, head: &ConsumerHead, attempts: usize) -> Vec<u32> {
        let mut got = Vec::new();
        for _ in 0..attempts {
            match queue.try_dequeue_single_consumer(head, true, |_| {}) {
                Dequeue::Item(v) => got.push(v),
                Dequeue::Empty => {}
                Dequeue::Skipped => panic!("an honest run never skips"),
            }
        }
        got
    }
    model(2, || {
        let memory = QueueMemory::new();
        let head = Arc::new(ConsumerHead::new());
        // One item through first, so the two below land on positions 1 and 2: cell 1 of lap
        // 0 and cell 0 of lap 1 (a wrap).
        enqueue(memory.queue(), 9);
        assert_eq!(take(memory.queue(), &head, 1), [9]);
        let producers: Vec<_> = [1u32, 2]
            .into_iter()
            .map(|value| {
                let memory = memory.clone();
                thread::spawn(move || enqueue(memory.queue(), value))
            })
            .collect();
        let mut got = take(memory.queue(), &head, 2);
        for p in producers {
            p.join().unwrap();
        }
        got.extend(take(memory.queue(), &head, 3));
        assert_exactly_once(got, &[1, 2]);
        assert_eq!(memory.queue().try_dequeue(&head), Dequeue::Empty);
    });
}

struct RingMemory {
    head: AtomicU64,
    words: Vec<AtomicU64>,
}

/// Runs `producer` on a new thread and `consumer` on this one over a fresh 4-slot ring.
fn with_ring(
    producer: impl FnOnce(netless_ring::Producer<'static>) + Send + 'static,
    consumer: impl FnOnce(netless_ring::Consumer<'static>),
) {
    let memory = Box::into_raw(Box::new(RingMemory {
        head: AtomicU64::new(0),
        words: (0..4 * 8).map(|_| AtomicU64::new(0)).collect(),
    }));
    {
        // SAFETY: `memory` is live until the Box is rebuilt below, after both halves are
        // gone (the producer's thread is joined, the consumer dropped).
        let memory = unsafe { &mut *memory };
        let (p, c) = ResponseRing::from_parts(&mut memory.head, &mut memory.words).unwrap();
        let handle = thread::spawn(move || producer(p));
        consumer(c);
        handle.join().unwrap();
    }
    // SAFETY: created by Box::into_raw above; no borrow of it remains.
    drop(unsafe { Box::from_raw(memory) });
}

fn body(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| seed.wrapping_add(i as u8)).collect()
}

fn push(producer: &mut netless_ring::Producer<'_>, data: &[u8]) {
    let (first, rest) = data.split_at(data.len() / 2);
    loop {
        match producer.try_push(&[first, rest]) {
            Ok(()) => return,
            Err(netless_ring::PushError::Full) => thread::yield_now(),
            Err(e) => panic!("{e}"),
        }
    }
}

fn receive(consumer: &mut netless_ring::Consumer<'_>, expected: &[Vec<u8>]) {
    let mut out = [0u8; 128];
    for data in expected {
        loop {
            match consumer.peek().expect("honest ring") {
                Some(record) => {
                    assert_eq!(record.len(), data.len());
                    let n = record.copy_to(&mut out);
                    assert_eq!(&out[..n], &data[..], "body visible with the record word");
                    record.release();
                    break;
                }
                None => thread::yield_now(),
            }
        }
    }
}

#[test]
fn ring_bodies_are_visible_in_order() {
    model(2, || {
        let records = vec![body(1, 20), body(100, 9)];
        let sent = records.clone();
        with_ring(
            move |mut p| {
                for data in &sent {
                    push(&mut p, data);
                }
            },
            |mut c| {
                receive(&mut c, &records);
                assert!(c.peek().unwrap().is_none());
            },
        );
    });
}

#[test]
fn ring_wraps_with_a_pad() {
    // 4 slots: A (2 slots) at 0, B (1 slot) at 2, then C (2 slots) does not fit at 3: PAD at
    // 3 and C at 4 (slot 0) once A is released.
    model(2, || {
        let records = vec![body(1, 57), body(50, 3), body(200, 57)];
        let sent = records.clone();
        with_ring(
            move |mut p| {
                for data in &sent {
                    push(&mut p, data);
                }
                assert_eq!(p.position(), 6);
            },
            |mut c| {
                receive(&mut c, &records);
                assert_eq!(c.position(), 6);
            },
        );
    });
}

#[test]
fn doorbell_loses_no_wake_up() {
    // The waiter announces it sleeps and polls once more; if it still sees nothing it would
    // sleep on `ticket` (forget keeps it counted as a sleeper). The waker publishes and
    // notifies. Whatever the interleaving, either the waiter saw the data or the sequence moved
    // past its ticket, so the kernel would not keep it asleep.
    model(3, || {
        let words = Arc::new(DoorbellWords::new());
        let data = Arc::new(AtomicBool::new(false));
        let waker = {
            let (words, data) = (words.clone(), data.clone());
            thread::spawn(move || {
                data.store(true, Ordering::Release);
                doorbell::notify(&words);
            })
        };
        let sleeper = words.announce_sleep();
        let saw = data.load(Ordering::Acquire);
        let ticket = sleeper.ticket();
        if saw {
            drop(sleeper);
        } else {
            std::mem::forget(sleeper);
        }
        waker.join().unwrap();
        assert!(saw || words.sequence() != ticket, "lost wake-up");
    });
}

#[test]
fn doorbell_two_waiters_notify_all() {
    model(2, || {
        let words = Arc::new(DoorbellWords::new());
        let data = Arc::new(AtomicBool::new(false));
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let (words, data) = (words.clone(), data.clone());
                thread::spawn(move || {
                    let sleeper = words.announce_sleep();
                    let saw = data.load(Ordering::Acquire);
                    let ticket = sleeper.ticket();
                    if saw {
                        drop(sleeper);
                    } else {
                        std::mem::forget(sleeper);
                    }
                    (saw, ticket)
                })
            })
            .collect();
        data.store(true, Ordering::Release);
        doorbell::notify_all(&words);
        for w in waiters {
            let (saw, ticket) = w.join().unwrap();
            assert!(saw || words.sequence() != ticket, "lost wake-up");
        }
    });
}

#[test]
fn doorbell_any_loses_no_wake_up() {
    // A waiter announces on two doorbells and polls once more; the waker publishes and notifies
    // the second. Either the waiter saw the data or that doorbell's sequence moved past the
    // ticket the waiter would sleep on.
    model(3, || {
        let words = Arc::new((DoorbellWords::new(), DoorbellWords::new()));
        let data = Arc::new(AtomicBool::new(false));
        let waker = {
            let (words, data) = (words.clone(), data.clone());
            thread::spawn(move || {
                data.store(true, Ordering::Release);
                doorbell::notify(&words.1);
            })
        };
        let both = [&words.0, &words.1];
        let sleepers = doorbell::announce_sleep_any(&both);
        let saw = data.load(Ordering::Acquire);
        let ticket = sleepers.ticket(1);
        if saw {
            drop(sleepers);
        } else {
            std::mem::forget(sleepers);
        }
        waker.join().unwrap();
        assert!(saw || words.1.sequence() != ticket, "lost wake-up");
    });
}
