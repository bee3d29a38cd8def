//! The cost of the bare data path of one netless call, with no RPC logic on top.
//!
//! Two processes pinned to CPUs 0 and 1 share one sealed `memfd` segment. The client process
//! writes a 96-byte message into a request block, enqueues the block index into a
//! [`ReceiveQueue`] and spins on its [`ResponseRing`]; the server process dequeues the index
//! (single consumer), copies the message out of the block and pushes it back as a ring
//! record. A round trip is three dependent cache-line transfers (queue cell, block, ring
//! record) plus whatever the lines' previous owners add: the floor that `netless` calls sit
//! on. It prints the p50 and p99 round-trip time over 200 000 calls after a warm-up.
//!
//! ```text
//! cargo run --release -p netless-ring --example pingpong_probe
//! ```
//!
//! The process re-executes itself as the server side, passing the segment's fd as argv[1].

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::time::Instant;

use netless_ring::{ConsumerHead, Dequeue, ReceiveQueue, ResponseRing};
use netless_shm::Segment;

/// Cells of the receive queue.
const QUEUE_CELLS: u32 = 64;
/// Where the receive queue starts in the segment.
const QUEUE_OFFSET: usize = 0;
/// Where the request blocks start.
const BLOCKS_OFFSET: usize = 4096;
/// Distance between two request blocks.
const BLOCK_BYTES: usize = 128;
/// Where the response ring starts (its slots then start 128-byte aligned).
const RING_OFFSET: usize = 8192;
/// Slots of the response ring.
const RING_SLOTS: u32 = 256;
/// Length of the whole segment.
const SEGMENT_BYTES: usize = RING_OFFSET + ResponseRing::bytes_needed(RING_SLOTS);
/// Bytes of each message, both ways.
const MESSAGE_BYTES: usize = 96;
/// Block index that tells the server side to exit.
const STOP: u32 = u32::MAX;
/// Round trips before measuring, and measured round trips.
const WARM_UP: u32 = 20_000;
const CALLS: u32 = 200_000;

fn main() {
    match std::env::args().nth(1) {
        Some(fd) => serve(fd.parse().expect("argv[1] is the segment's fd")),
        None => measure(),
    }
}

/// The pointer `offset` bytes into `segment`.
fn at(segment: &Segment, offset: usize) -> NonNull<u8> {
    assert!(offset < segment.len());
    // SAFETY: `offset` is inside the mapping (asserted), so the result is in bounds and,
    // being derived from the mapping's non-null base, non-null.
    unsafe { NonNull::new_unchecked(segment.as_ptr().add(offset)) }
}

/// The server side: echoes each block it dequeues as a ring record until told to stop.
fn serve(fd: i32) {
    // SAFETY: the parent cleared FD_CLOEXEC on this fd and passed its number to us; nothing
    // else in this process owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let segment = Segment::attach(fd, SEGMENT_BYTES).expect("attach the probe segment");
    netless_shm::pin_current_thread(1).expect("pin the server side to CPU 1");
    let queue_len = BLOCKS_OFFSET - QUEUE_OFFSET;
    // SAFETY: the region lies inside the mapping, which outlives `queue`, and is accessed by
    // both processes only through the queue's atomics.
    let queue = unsafe { ReceiveQueue::attach(at(&segment, QUEUE_OFFSET), queue_len) }
        .expect("attach the receive queue");
    let ring_len = SEGMENT_BYTES - RING_OFFSET;
    // SAFETY: the ring region lies inside the mapping, which outlives `producer`; this
    // process is its only producer.
    let mut producer = unsafe { ResponseRing::attach(at(&segment, RING_OFFSET), ring_len) }
        .expect("attach the response ring");
    let head = ConsumerHead::new();
    let mut message = [0u8; MESSAGE_BYTES];
    loop {
        let Dequeue::Item(block) = queue.try_dequeue_single_consumer(&head, false, |_| {}) else {
            continue;
        };
        if block == STOP {
            return;
        }
        let src = at(&segment, BLOCKS_OFFSET + block as usize * BLOCK_BYTES);
        // SAFETY: the block lies inside the mapping and the client does not write it until
        // it has our response.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), message.as_mut_ptr(), MESSAGE_BYTES) };
        while producer.try_push(&[&message]).is_err() {}
    }
}

/// The client side: creates the segment, starts the server side, and times round trips.
fn measure() {
    let segment = Segment::create("pingpong-probe", SEGMENT_BYTES).expect("create the segment");
    let queue_len = BLOCKS_OFFSET - QUEUE_OFFSET;
    // SAFETY: the region lies inside the fresh mapping, which outlives `queue`, and is
    // accessed by both processes only through the queue's atomics.
    let queue = unsafe { ReceiveQueue::init(at(&segment, QUEUE_OFFSET), queue_len, QUEUE_CELLS) }
        .expect("initialise the receive queue");
    let ring_len = SEGMENT_BYTES - RING_OFFSET;
    let mut consumer =
        // SAFETY: the ring region lies inside the fresh mapping, which outlives `consumer`;
        // this process is its only consumer.
        unsafe { ResponseRing::init(at(&segment, RING_OFFSET), ring_len, RING_SLOTS) }
            .expect("initialise the response ring");

    let fd = rustix::io::dup(segment.fd()).expect("dup the segment fd");
    rustix::io::fcntl_setfd(&fd, rustix::io::FdFlags::empty()).expect("clear FD_CLOEXEC");
    let mut server = std::process::Command::new(std::env::current_exe().expect("own path"))
        .arg(fd.as_raw_fd().to_string())
        .spawn()
        .expect("start the server side");
    drop(fd);
    netless_shm::pin_current_thread(0).expect("pin the client side to CPU 0");

    let message = [7u8; MESSAGE_BYTES];
    let mut reply = [0u8; MESSAGE_BYTES];
    let mut nanos = Vec::with_capacity(CALLS as usize);
    for call in 0..WARM_UP + CALLS {
        let start = Instant::now();
        // Alternate two blocks, as a client reusing its cached run after the server let go.
        let block = call % 2;
        let dst = at(&segment, BLOCKS_OFFSET + block as usize * BLOCK_BYTES);
        // SAFETY: the block lies inside the mapping and the server side reads it only after
        // the enqueue below, and is done with it once its response is in.
        unsafe { std::ptr::copy_nonoverlapping(message.as_ptr(), dst.as_ptr(), MESSAGE_BYTES) };
        while queue.try_enqueue(block).is_err() {}
        let record = loop {
            if let Ok(Some(record)) = consumer.peek() {
                break record;
            }
        };
        record.copy_to(&mut reply);
        record.release();
        if call >= WARM_UP {
            nanos.push(start.elapsed().as_nanos() as u64);
        }
    }
    queue.try_enqueue(STOP).expect("stop the server side");
    server.wait().expect("wait for the server side");
    assert_eq!(reply, message, "the echo came back changed");

    nanos.sort_unstable();
    let percentile = |p: usize| nanos[nanos.len() * p / 100];
    println!(
        "bare data path round trip (queue cell + {MESSAGE_BYTES}-byte block, ring record), {CALLS} calls: p50 {} ns, p99 {} ns",
        percentile(50),
        percentile(99)
    );
}
