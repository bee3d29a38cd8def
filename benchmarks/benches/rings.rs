//! Micro-benchmarks of the rings of `netless-ring`, in one process and one thread: the SPSC
//! response ring (push a record, then peek and release it) and the MPSC receive queue
//! (enqueue a block index, then dequeue it). They time the data structures' own work on
//! cache-hot memory, not a transfer between cores (the experiment binaries measure that).
//!
//! `cargo bench -p netless-benchmarks --bench rings [-- FILTER]`

use std::hint::black_box;
use std::sync::atomic::AtomicU64;

use netless_benchmarks::harness::micro::Micro;
use netless_ring::{ConsumerHead, Dequeue, ReceiveQueue, ResponseRing};

/// Slots of the response ring (64 bytes each): 64 KiB, a client's usual ring.
const RING_SLOTS: usize = 1024;
/// Cells of the receive queue.
const QUEUE_CELLS: usize = 1024;

fn main() {
    let micro = Micro::from_args();
    response_ring(&micro);
    receive_queue(&micro);
}

fn response_ring(micro: &Micro) {
    let mut head = AtomicU64::new(0);
    let mut words: Vec<AtomicU64> = (0..RING_SLOTS * 8).map(|_| AtomicU64::new(0)).collect();
    let (mut producer, mut consumer) =
        ResponseRing::from_parts(&mut head, &mut words).expect("a valid ring");
    for len in [8usize, 56, 512] {
        let body = vec![0x5a_u8; len];
        // Checked once, then timed.
        producer.try_push(&[&body]).expect("room");
        let record = consumer.peek().expect("sound").expect("a record");
        assert_eq!(record.body(), &body[..]);
        record.release();
        micro.run(
            &format!("spsc response ring: push + pop {len} B"),
            1,
            || {
                producer.try_push(&[black_box(&body)]).expect("room");
                let record = consumer.peek().expect("sound").expect("a record");
                black_box(record.body());
                record.release();
            },
        );
    }
    // A batch of replies pushed, then drained: the producer and the consumer each run ahead.
    let body = [0xa5_u8; 56];
    micro.run("spsc response ring: push 32, pop 32 (56 B)", 32, || {
        for _ in 0..32 {
            producer.try_push(&[black_box(&body)]).expect("room");
        }
        for _ in 0..32 {
            let record = consumer.peek().expect("sound").expect("a record");
            black_box(record.body());
            record.release();
        }
    });
}

fn receive_queue(micro: &Micro) {
    let tail = AtomicU64::new(0);
    let cells: Vec<AtomicU64> = (0..QUEUE_CELLS).map(|_| AtomicU64::new(0)).collect();
    let queue = ReceiveQueue::from_parts(&tail, &cells).expect("a valid queue");
    let head = ConsumerHead::new();
    queue.try_enqueue(7).expect("room");
    assert_eq!(queue.try_dequeue(&head), Dequeue::Item(7));
    micro.run("mpsc receive queue: enqueue + dequeue", 1, || {
        queue.try_enqueue(black_box(42)).expect("room");
        black_box(queue.try_dequeue(&head));
    });
    micro.run("mpsc receive queue: enqueue 32, dequeue 32", 32, || {
        for i in 0..32 {
            queue.try_enqueue(black_box(i)).expect("room");
        }
        for _ in 0..32 {
            black_box(queue.try_dequeue(&head));
        }
    });
}
