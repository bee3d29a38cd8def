//! Probe: the bare data movement of a netless call (queue cell + 128-byte block one way,
//! ring record the other) between two pinned processes, without any RPC logic.
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::time::Instant;

use netless_ring::{ConsumerHead, Dequeue, ReceiveQueue, ResponseRing};
use netless_shm::Segment;

const Q: usize = 0;
const QLEN: usize = 128 + 8 * 64;
const BLOCKS: usize = 4096;
const RING: usize = 8192;
const LEN: usize = RING + 128 + 64 * 256;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() > 1 {
        let fd = unsafe { OwnedFd::from_raw_fd(args[1].parse().unwrap()) };
        let seg = Segment::attach(fd, LEN).unwrap();
        netless_shm::pin_current_thread(1).unwrap();
        let base = seg.as_ptr();
        let q = unsafe { ReceiveQueue::attach(NonNull::new_unchecked(base.add(Q)), QLEN) }.unwrap();
        let mut prod =
            unsafe { ResponseRing::attach(NonNull::new_unchecked(base.add(RING)), LEN - RING) }
                .unwrap();
        let head = ConsumerHead::new();
        let mode = std::env::var("MODE").unwrap_or_default();
        loop {
            if let Dequeue::Item(b) = q.try_dequeue_single_consumer(&head, false, |_| {}) {
                if b == u32::MAX {
                    return;
                }
                let blk = unsafe { base.add(BLOCKS + b as usize * 128) };
                let mut buf = [0u8; 96];
                unsafe { std::ptr::copy_nonoverlapping(blk, buf.as_mut_ptr(), 96) };
                let _ = mode;
                while prod.try_push(&[&buf]).is_err() {}
            }
        }
    }
    let seg = Segment::create("probe", LEN).unwrap();
    let base = seg.as_ptr();
    let q = unsafe { ReceiveQueue::init(NonNull::new_unchecked(base.add(Q)), QLEN, 64) }.unwrap();
    let mut cons =
        unsafe { ResponseRing::init(NonNull::new_unchecked(base.add(RING)), LEN - RING, 256) }
            .unwrap();
    let fd = rustix::io::dup(seg.fd()).unwrap();
    rustix::io::fcntl_setfd(&fd, rustix::io::FdFlags::empty()).unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .arg(fd.as_raw_fd().to_string())
        .spawn()
        .unwrap();
    netless_shm::pin_current_thread(0).unwrap();
    let mut times = Vec::new();
    let payload = [7u8; 96];
    for i in 0..200_000u32 {
        let t = Instant::now();
        let b = i % 2;
        let blk = unsafe { base.add(BLOCKS + b as usize * 128) };
        unsafe { std::ptr::copy_nonoverlapping(payload.as_ptr(), blk, 96) };
        while q.try_enqueue(b).is_err() {}
        loop {
            if let Ok(Some(r)) = cons.peek() {
                let mut out = [0u8; 96];
                r.copy_to(&mut out);
                r.release();
                break;
            }
        }
        times.push(t.elapsed().as_nanos() as u64);
    }
    q.try_enqueue(u32::MAX).unwrap();
    child.wait().unwrap();
    times.sort();
    println!(
        "p50 {} ns  p99 {} ns",
        times[times.len() / 2],
        times[times.len() * 99 / 100]
    );
}
