//! A connection's response ring (`netless_ring::ResponseRing`): the client's `Consumer` reads
//! slots the server writes, the server's `Producer` reads the head the client writes and
//! attaches to a ring region the client laid out.
//!
//! Input: `form: u8`, then
//!
//! - form bit 0 clear: `slots: u8` (4 << slots % 5 slots), `start: u64` (the ring's first
//!   position: tags wrap at 32 bits), then operations until the input ends: an honest push,
//!   a peek (with or without release), or the peer's store of any word of the slots or the
//!   head. While the peer has stored nothing, every record comes out as it was pushed, in
//!   order, a push fails only on a ring holding unreleased records, and a peek finds nothing
//!   only on an empty one; whatever the peer stores, a record lies inside the slots;
//! - form bit 0 set: `len: u16`, then a region's bytes (header, head line, slots), attached
//!   as a server attaches a client's ring and pushed into: a push that is not refused stays
//!   inside the region.
#![no_main]

use std::collections::VecDeque;
use std::sync::atomic::AtomicU64;

use libfuzzer_sys::fuzz_target;
use netless_fuzz::{Input, Region};
use netless_ring::layout::SLOT_BYTES;
use netless_ring::{Consumer, PushError, ResponseRing};

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    if input.u8() & 1 == 0 {
        operations(input);
    } else {
        attach(input);
    }
});

/// The barrier word a producer leaves in a free slot at `position` (`!tag << 32`).
fn barrier(position: u64) -> u64 {
    u64::from(!(position.wrapping_add(1) as u32)) << 32
}

fn operations(mut input: Input<'_>) {
    let nslots = 4u32 << (input.u8() % 5);
    let start = input.u64();
    let words = nslots as usize * SLOT_BYTES / 8;
    // The head word on a line of its own, then the slots: as `from_parts` takes them.
    let region = Region::new(64 + nslots as usize * SLOT_BYTES);
    region.store_u64(0, start);
    // A ring at `start` as its producer leaves it: every free slot holds a barrier.
    for i in 0..u64::from(nslots) {
        let position = start.wrapping_add(i);
        let slot = (position % u64::from(nslots)) as usize;
        region.store_u64(64 + slot * SLOT_BYTES, barrier(position));
    }
    let base = region.ptr().as_ptr();
    // SAFETY: the head word and the slot words lie inside the region, which outlives both
    // ends (declared first), is 64-byte aligned and is otherwise reached only through its raw
    // pointer, by atomic stores (the peer) and byte copies while no end reads them.
    let (head, slots) = unsafe {
        (
            &mut *base.cast::<AtomicU64>(),
            std::slice::from_raw_parts_mut(base.add(64).cast::<AtomicU64>(), words),
        )
    };
    let (mut producer, mut consumer) = ResponseRing::from_parts(head, slots).expect("a ring");
    let slots = base as usize + 64..base as usize + 64 + nslots as usize * SLOT_BYTES;
    let max = producer.max_record_len();
    let mut pushed: VecDeque<Vec<u8>> = VecDeque::new();
    let (mut corrupted, mut count) = (false, 0u32);
    while !input.is_empty() {
        match input.u8() % 4 {
            0 => {
                let len = usize::from(input.u16()) % (max + 2);
                count = count.wrapping_add(1);
                let body: Vec<u8> = (0..len).map(|i| (count as usize * 31 + i) as u8).collect();
                match producer.try_push(&[&body]) {
                    Ok(()) => pushed.push_back(body),
                    Err(PushError::TooLarge) => assert!(len > max, "a record of {len} refused"),
                    Err(PushError::Full) => {
                        assert!(corrupted || !pushed.is_empty(), "an empty ring full");
                    }
                    Err(PushError::Corrupt) => assert!(corrupted, "an honest head refused"),
                }
            }
            op @ (1 | 2) => {
                let release = op == 1;
                peek(&mut consumer, &slots, max, &mut pushed, corrupted, release);
            }
            _ => {
                let which = usize::from(input.u16()) % (words + 1);
                let value = input.u64();
                // The last word stands for the head (the client's, read by the producer).
                region.store_u64(if which == words { 0 } else { 64 + which * 8 }, value);
                corrupted = true;
            }
        }
    }
}

/// One peek, checked against the records pushed (while the peer has stored nothing).
fn peek(
    consumer: &mut Consumer<'_>,
    slots: &std::ops::Range<usize>,
    max: usize,
    pushed: &mut VecDeque<Vec<u8>>,
    corrupted: bool,
    release: bool,
) {
    let has_next = consumer.has_next();
    match consumer.peek() {
        Ok(Some(record)) => {
            assert!(
                record.len() <= max,
                "a record of {} in a ring of {max}",
                record.len()
            );
            let body = record.body();
            let at = body.as_ptr() as usize;
            assert!(
                slots.contains(&at) && at + body.len() <= slots.end,
                "a record outside"
            );
            let mut copy = vec![0; body.len()];
            assert_eq!(record.copy_to(&mut copy), body.len());
            if !corrupted {
                assert!(has_next);
                assert_eq!(Some(&copy), pushed.front(), "not the record pushed next");
            }
            if release {
                record.release();
                pushed.pop_front();
            }
        }
        Ok(None) => assert!(corrupted || pushed.is_empty(), "a pushed record not found"),
        Err(_) => assert!(corrupted, "an honest ring corrupt"),
    }
}

fn attach(mut input: Input<'_>) {
    let len = usize::from(input.u16()) % (ResponseRing::bytes_needed(64) + 1);
    let region = Region::new(len);
    region.write(0, input.rest());
    let ptr = region.ptr();
    // SAFETY: the region outlives the producer (declared first), holds `len` bytes and is
    // reached only through it.
    let Ok(mut producer) = (unsafe { ResponseRing::attach(ptr, len) }) else {
        return;
    };
    let (base, max) = (ptr.as_ptr() as usize, producer.max_record_len());
    assert!(
        ResponseRing::bytes_needed(producer.nslots()) <= len,
        "a ring past its region"
    );
    for round in 0..2 * producer.nslots() as usize {
        let body = vec![round as u8; [0, 1, 57, max][round % 4]];
        match producer.try_push(&[&body]) {
            Ok(()) => {}
            Err(PushError::TooLarge) => panic!("a record of {} refused", body.len()),
            Err(_) => break,
        }
        let next = producer.next_record_ptr() as usize;
        assert!(
            next >= base && next + 8 <= base + len,
            "the next record outside"
        );
    }
}
