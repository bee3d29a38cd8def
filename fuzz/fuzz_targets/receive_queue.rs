//! A server's receive queue (`netless_ring::ReceiveQueue`): the server's workers dequeue
//! from cells and a tail that clients write, and clients attach to a queue region the server
//! laid out.
//!
//! Input: `form: u8`, then
//!
//! - form bit 0 clear: `cells: u8` (2 << cells % 6 cells), then operations until the input
//!   ends: an honest enqueue, a dequeue of each kind, a tail repair, or a client's store of
//!   the tail or of any cell. While no client has stored anything, the queue is exactly a
//!   FIFO: every item comes out once, in order, it is full only at its capacity and empty
//!   only when nothing is queued. Whatever the clients stored, the queue recovers once they
//!   stop: the worker drains it, and an item enqueued then comes out;
//! - form bit 0 set: `len: u16`, then a region's bytes (header, tail line, cells), attached
//!   as a client attaches the server's queue, then used: every access stays inside it.
#![no_main]

use std::collections::VecDeque;

use libfuzzer_sys::fuzz_target;
use netless_fuzz::{Input, Region};
use netless_ring::layout::PAYLOAD_OFFSET;
use netless_ring::{ConsumerHead, Dequeue, EnqueueError, ReceiveQueue};

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    if input.u8() & 1 == 0 {
        operations(input);
    } else {
        attach(input);
    }
});

/// The item an honest client enqueues to see whether the queue recovered.
const MARK: u32 = 0x600d_f00d;

fn operations(mut input: Input<'_>) {
    let capacity = 2u32 << (input.u8() % 6);
    let len = ReceiveQueue::bytes_needed(capacity);
    let region = Region::new(len);
    // SAFETY: the region outlives both views (declared first), holds `len` bytes, and is
    // otherwise reached only through its raw pointer, by atomic stores.
    let server = unsafe { ReceiveQueue::init(region.ptr(), len, capacity) }.expect("a queue");
    // SAFETY: the client's view of the same region, which outlives it (declared first) and
    // holds `len` bytes; both views touch it only by atomics.
    let client = unsafe { ReceiveQueue::attach(region.ptr(), len) }.expect("an initialised queue");
    assert_eq!(client.capacity(), capacity);
    let head = ConsumerHead::new();
    let mut queued: VecDeque<u32> = VecDeque::new();
    let mut corrupted = false;
    while !input.is_empty() {
        let op = input.u8();
        match op % 8 {
            0 => {
                let value = input.u32();
                match client.try_enqueue(value) {
                    Ok(()) => queued.push_back(value),
                    Err(EnqueueError::Full) => {
                        assert!(corrupted || queued.len() == capacity as usize, "full early");
                    }
                    Err(EnqueueError::Contended) => assert!(corrupted, "contended alone"),
                }
            }
            1..=4 => {
                let check_holes = op & 0x80 != 0;
                let mut hint = None;
                let got = match op % 8 {
                    1 => server.try_dequeue(&head),
                    2 => server.try_dequeue_no_hole_check(&head),
                    3 => server.try_dequeue_single_consumer(&head, check_holes, |v| hint = Some(v)),
                    _ => server.try_dequeue_with(&head, check_holes, |v| hint = Some(v)),
                };
                if let (Dequeue::Item(v), 3 | 4) = (got, op % 8) {
                    assert_eq!(hint, Some(v), "the hint was another item");
                }
                if !corrupted {
                    assert_eq!(
                        got,
                        queued.pop_front().map_or(Dequeue::Empty, Dequeue::Item)
                    );
                }
            }
            5 => {
                let repaired = server.repair_tail(&head);
                assert!(corrupted || repaired.is_none(), "an honest tail repaired");
            }
            6 => {
                client.overwrite_tail(input.u64());
                corrupted = true;
            }
            _ => {
                let cell = usize::from(input.u8()) % capacity as usize;
                region.store_u64(PAYLOAD_OFFSET + cell * 8, input.u64());
                corrupted = true;
            }
        }
        if !corrupted {
            assert_eq!(server.len_hint(&head), queued.len() as u64);
        }
    }
    if corrupted {
        assert_recovers(&server, &client, &head, capacity);
    }
}

/// Once the clients stop writing garbage, a worker's draining brings the queue back: an item
/// enqueued then is dequeued.
fn assert_recovers(
    server: &ReceiveQueue<'_>,
    client: &ReceiveQueue<'_>,
    head: &ConsumerHead,
    capacity: u32,
) {
    let polls = 4 * capacity as usize + 4;
    for _ in 0..8 {
        for _ in 0..polls {
            if server.try_dequeue(head) == Dequeue::Empty {
                break;
            }
        }
        if client.try_enqueue(MARK).is_err() {
            continue;
        }
        for _ in 0..polls {
            if server.try_dequeue(head) == Dequeue::Item(MARK) {
                return;
            }
        }
    }
    panic!(
        "the queue stays jammed: tail {}, head {}",
        client.tail_hint(),
        head.position()
    );
}

fn attach(mut input: Input<'_>) {
    let len = usize::from(input.u16()) % (ReceiveQueue::bytes_needed(64) + 1);
    let region = Region::new(len);
    region.write(0, input.rest());
    // SAFETY: the region outlives the view (declared first), holds `len` bytes and is reached
    // only through it.
    let Ok(queue) = (unsafe { ReceiveQueue::attach(region.ptr(), len) }) else {
        return;
    };
    assert!(
        ReceiveQueue::bytes_needed(queue.capacity()) <= len,
        "a queue past its region"
    );
    let head = ConsumerHead::new();
    for round in 0..2 * queue.capacity() {
        let _ = queue.try_enqueue(round);
        let _ = queue.try_dequeue(&head);
        let _ = queue.try_dequeue_single_consumer(&head, true, |_| {});
    }
    let _ = queue.repair_tail(&head);
    queue.prefetch_next_cell();
}
