//! Test-only fault injection (feature `fault-injection`): lets a test play a faulty or
//! malicious peer that writes garbage into shared memory, so the other side's validation can
//! be exercised across real processes. Never enabled in normal builds.

use crate::client::Client;
use crate::pipeline::Pipeline;
use crate::segment::layout::{block_state, conn_tag};
use crate::segment::ReplicaSegment;
use crate::sync::Ordering;
use crate::wire::header::{
    compact_flags, kind, wire_flags, CompactHeader, ShortHeader, WireHeader, HEADER_LEN,
    SHORT_HEADER_LEN,
};

/// Ways a faulty client can corrupt a replica's shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientFault {
    /// A request whose fragment length exceeds the blocks it occupies.
    BadLength,
    /// A request whose block run extends past the end of the buffer.
    BadOffset,
    /// A request pointing at blocks leased to nobody.
    ForeignBlocks,
    /// A request whose body length exceeds the maximum message size.
    HugeBody,
    /// Out-of-range block indexes and garbage words written straight into the queue.
    GarbageQueue,
    /// A queue entry for a request with a wrong sequence/kind field.
    BadKind,
    /// A compact batch whose second request claims a body that runs past the batch's blocks.
    BadCompactBatch,
    /// A compact batch whose second request says it repeats the first's method and names
    /// one too.
    BadSameMethod,
    /// A request behind a 32-byte `ShortHeader` whose body runs 8 bytes past its one block.
    BadShortHeader,
    /// A well-formed batch of two requests with full headers and no `BATCH_COMPACT`, a
    /// format retired in protocol 9.
    PlainBatch,
    /// The published consumer head rewound to 0, so the queue looks as deep as every
    /// request ever sent (clients then refuse to call under an SLO), and nobody notified.
    StaleHead,
    /// The queue's shared tail thrown ten laps (and a bit) ahead of where it is: every
    /// producer would find the cells "stale" and give up, for good unless it is repaired.
    TailJump,
    /// Every free block of the buffer claimed under our own tag, past any quota, and kept.
    HogBlocks,
    /// Every free block of the buffer marked with a tag no connection owns.
    ForeignTags,
}

/// Makes `client` misbehave as `fault` says. The server should close this client's
/// connection (or drop the garbage) and keep serving everyone else.
pub fn inject(client: &Client, fault: ClientFault) {
    let shared = client.connection();
    let replica = &shared.replica;
    let (conn_index, token) = shared.conn_identity();
    let table = replica.table();
    let nblocks = table.len() as u32;
    let block = replica.block_size();
    let mut header = WireHeader {
        token,
        call_id: 0xdead_0000_0001,
        conn_index,
        kind: kind::REQUEST,
        body_len: 16,
        frag_len: 16,
        method_len: 4,
        nblocks: 1,
        ..WireHeader::default()
    };
    let view = replica.queue_for(conn_index);
    let queue = view.queue();
    match fault {
        ClientFault::HogBlocks | ClientFault::ForeignTags => {
            let (tag, _) = shared.lease_identity();
            let tag = if fault == ClientFault::HogBlocks {
                block_state::owned(tag)
            } else {
                conn_tag(0xfffe, 0x7fff)
            };
            for word in table {
                let _ = word.compare_exchange(
                    block_state::FREE,
                    tag,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                );
            }
            return;
        }
        ClientFault::StaleHead => {
            view.head().position.store(0, Ordering::Relaxed);
            return;
        }
        ClientFault::TailJump => {
            let lap = u64::from(queue.capacity());
            queue.overwrite_tail(queue.tail_hint().wrapping_add(10 * lap + 3));
            return;
        }
        ClientFault::GarbageQueue => {
            for value in [u32::MAX, nblocks, nblocks + 7, 0x8000_0000] {
                let _ = queue.try_enqueue(value);
            }
            // And a free (unleased) block with a plausible header.
            write_at(replica, nblocks - 1, &header);
            let _ = queue.try_enqueue(nblocks - 1);
            netless_ring::notify(view.doorbell());
            return;
        }
        ClientFault::BadLength => header.frag_len = (block * 4) as u32,
        ClientFault::BadOffset => header.nblocks = nblocks + 10,
        ClientFault::HugeBody => {
            header.body_len = u32::MAX;
            header.frag_len = 16;
        }
        ClientFault::BadKind => header.kind = 77,
        ClientFault::BadShortHeader => {
            let body = (block - SHORT_HEADER_LEN + 8) as u32;
            header.body_len = body;
            header.frag_len = body;
            let short = ShortHeader::of(&header).expect("a whole request without extras");
            let start = shared.claim_for_fault(1).expect("a block");
            if let Some(dst) = replica.run(start, 1) {
                dst.write(0, &[short.as_bytes()]);
            }
            let _ = queue.try_enqueue(start);
            netless_ring::notify(view.doorbell());
            return;
        }
        ClientFault::ForeignBlocks => {}
        ClientFault::PlainBatch => {
            let start = shared.claim_for_fault(4).expect("four blocks");
            header.nblocks = 4;
            let mut second = header;
            header.reserved[0] = wire_flags::BATCH_MORE;
            second.call_id += 1;
            if let Some(dst) = replica.run(start, 4) {
                // The first header and body (80 bytes) and the second at 128 fit 256 bytes.
                for (at, h) in [(0, &header), (128, &second)] {
                    dst.write(at, &[h.as_bytes(), b"Echo"]);
                }
            }
            let _ = queue.try_enqueue(start);
            netless_ring::notify(view.doorbell());
            return;
        }
        ClientFault::BadCompactBatch | ClientFault::BadSameMethod => {
            let start = shared.claim_for_fault(2).expect("two blocks");
            header.nblocks = 2;
            header.reserved[0] = wire_flags::BATCH_MORE | wire_flags::BATCH_COMPACT;
            let second = if fault == ClientFault::BadCompactBatch {
                CompactHeader {
                    call_id: 0xdead_0002,
                    body_len: 4096,
                    method_len: 4,
                    flags: 0,
                }
            } else {
                CompactHeader {
                    call_id: 0xdead_0002,
                    body_len: 8,
                    method_len: 4,
                    flags: compact_flags::SAME_METHOD,
                }
            };
            if let Some(dst) = replica.run(start, 2) {
                // The first header, its 16-byte body and the compact header at 80 fit in
                // two blocks (128 bytes).
                dst.write(0, &[header.as_bytes(), b"Echo"]);
                dst.write(HEADER_LEN + 16, &[second.as_bytes()]);
            }
            let _ = queue.try_enqueue(start);
            netless_ring::notify(view.doorbell());
            return;
        }
    }
    // Lease one block under our real tag: find one of ours via a real claim.
    let start = if fault == ClientFault::ForeignBlocks {
        (0..nblocks)
            .rev()
            .find(|&b| table[b as usize].load(Ordering::Acquire) == block_state::FREE)
            .expect("a free block")
    } else {
        shared.claim_for_fault(1).expect("a block")
    };
    write_at(replica, start, &header);
    let _ = queue.try_enqueue(start);
    netless_ring::notify(view.doorbell());
}

fn write_at(replica: &ReplicaSegment, block: u32, header: &WireHeader) {
    if let Some(dst) = replica.run(block, 1) {
        dst.write(0, &[header.as_bytes()]);
    }
}

/// The byte `steal_kept_tail` fills a stolen block with.
const CANARY: u8 = 0xc5;

/// Plays a faulty server that hands the last block of one of `pipe`'s idle kept runs (of
/// two blocks or more) to another connection: its table word gets a tag no connection of
/// this pipeline has, and its bytes a canary. Returns the block, or `None` if no such run
/// is kept. The pipeline must not write that block again ([`canary_intact`]).
pub fn steal_kept_tail(pipe: &Pipeline) -> Option<u32> {
    let (start, blocks) = pipe
        .idle_kept_runs()
        .into_iter()
        .find(|&(_, blocks)| blocks >= 2)?;
    let replica = &pipe.client().connection().replica;
    let block = start + blocks - 1;
    let dst = replica.run(block, 1)?;
    dst.write(0, &[&vec![CANARY; dst.len()]]);
    // A tag of the last connection index of the largest generation: no live connection's.
    replica.table()[block as usize].store(conn_tag(0xfffe, 0x7fff), Ordering::Release);
    Some(block)
}

/// Whether `block` still holds the canary [`steal_kept_tail`] wrote.
pub fn canary_intact(pipe: &Pipeline, block: u32) -> bool {
    let replica = &pipe.client().connection().replica;
    replica.run(block, 1).is_some_and(|src| {
        src.bytes(0, src.len())
            .is_some_and(|bytes| bytes.iter().all(|&b| b == CANARY))
    })
}

/// Plays a client of a trust group gone mad: XORs `flips` random bytes (from `seed`, a
/// xorshift state it advances) at random places of every segment `client` maps writable,
/// its group's replica segment (headers, queues, table, blocks) and its own connection
/// segment. Neither other groups nor the server's control segment are in reach.
pub fn flip_random_bytes(client: &Client, seed: &mut u64, flips: usize) {
    let conn = client.connection();
    let segments = [conn.replica.segment(), conn.conn_segment().segment()];
    for _ in 0..flips {
        let r = xorshift(seed);
        let segment = segments[(r & 1) as usize];
        let at = (r >> 8) as usize % segment.len();
        let bits = (xorshift(seed) as u8).max(1);
        // SAFETY: `at < len`, inside the mapping, which lives as long as `client`; the byte
        // is shared memory, so it is changed with an atomic RMW.
        let byte = unsafe { &*(segment.as_ptr().add(at) as *const std::sync::atomic::AtomicU8) };
        byte.fetch_xor(bits, std::sync::atomic::Ordering::Relaxed);
    }
}

fn xorshift(state: &mut u64) -> u64 {
    let mut x = (*state).max(1);
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    x
}

/// What a client could do to the server's control segment (registers, stats) with the fd it
/// received: `Ok(())` if every attempt failed, as it must, else what succeeded.
pub fn try_write_registers(client: &Client) -> Result<(), &'static str> {
    let fd = client
        .connection()
        .replica
        .control_fd_for_fault()
        .ok_or("no control segment fd")?;
    // SAFETY: a fresh mapping of our own choosing, unmapped at once; nothing aliases it.
    let mapped = unsafe {
        rustix::mm::mmap(
            std::ptr::null_mut(),
            4096,
            rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
            rustix::mm::MapFlags::SHARED,
            fd,
            0,
        )
    };
    if let Ok(ptr) = mapped {
        // SAFETY: the mapping just made, 4096 bytes.
        let _ = unsafe { rustix::mm::munmap(ptr, 4096) };
        return Err("mapped it writable");
    }
    if rustix::io::pwrite(fd, &[0xff; 8], 64).is_ok() {
        return Err("wrote it with pwrite");
    }
    let reopened = std::fs::OpenOptions::new().write(true).open(format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(&fd)
    ));
    if let Ok(mut file) = reopened {
        use std::io::Write;
        if file.write_all(&[0xff; 8]).is_ok() {
            return Err("wrote it through /proc/self/fd");
        }
    }
    Ok(())
}

/// Free and total blocks of `client`'s group's buffer, as its block table says now.
pub fn table_census(client: &Client) -> (u32, u32) {
    let table = client.connection().replica.table();
    let free = table
        .iter()
        .filter(|w| w.load(Ordering::Relaxed) == block_state::FREE)
        .count();
    (free as u32, table.len() as u32)
}

/// `client`'s connection as the server knows it: its index, block tag and secret token.
pub fn identity(client: &Client) -> (u32, u32, u64) {
    let conn = client.connection();
    let (index, token) = conn.conn_identity();
    (index, conn.lease_identity().0, token)
}

/// Plays a client that learned another connection's `identity` (index, tag, token) and
/// sends `count` well-formed `Echo` requests in its name through its own buffer and queue,
/// its blocks marked with the victim's tag. Returns how many it enqueued.
pub fn forge_requests(client: &Client, identity: (u32, u32, u64), count: u32) -> u32 {
    let conn = client.connection();
    let replica = &conn.replica;
    let (victim_index, victim_tag, victim_token) = identity;
    let (own_index, _) = conn.conn_identity();
    let view = replica.queue_for(own_index);
    let mut sent = 0;
    for i in 0..count {
        let Some(start) = conn.claim_for_fault(2) else {
            break;
        };
        let header = WireHeader {
            token: victim_token,
            call_id: 0xf0f0_0000 + u64::from(i),
            conn_index: victim_index,
            kind: kind::REQUEST,
            body_len: 4 + 6,
            frag_len: 4 + 6,
            method_len: 4,
            nblocks: 2,
            ..WireHeader::default()
        };
        if let Some(dst) = replica.run(start, 2) {
            dst.write(0, &[header.as_bytes(), b"Echo", b"forged"]);
        }
        for b in start..start + 2 {
            replica.table()[b as usize].store(block_state::owned(victim_tag), Ordering::Release);
        }
        if view.queue().try_enqueue(start).is_ok() {
            sent += 1;
        }
    }
    netless_ring::notify(view.doorbell());
    sent
}

/// Whether `needle` appears anywhere in the segments `client` maps writable.
pub fn segments_contain(client: &Client, needle: &[u8]) -> bool {
    let conn = client.connection();
    [conn.replica.segment(), conn.conn_segment().segment()]
        .iter()
        .any(|segment| {
            let bytes: Vec<u8> = (0..segment.len())
                // SAFETY: inside the mapping, which lives as long as `client`; volatile
                // reads, as other processes may be writing it.
                .map(|i| unsafe { segment.as_ptr().add(i).read_volatile() })
                .collect();
            bytes.windows(needle.len()).any(|w| w == needle)
        })
}
