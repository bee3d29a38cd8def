//! What a hostile or broken host can write into a polled ring: random bytes anywhere in it,
//! and each control word and header field set to what a check must refuse. Every case ends
//! in an error or in the right records, never in a panic, an out-of-bounds access, a hang or
//! a wrong record delivered.
#![cfg(not(loom))]

use netless_ring::polled::{Consumer, PolledRing, PopError, PushError};
use netless_shm::coherence::{Emulated, View};
use netless_shm::Segment;

/// SplitMix64.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn payload(seq: u64) -> Vec<u8> {
    let len = mix(seq) as usize % 300;
    (0..len as u64)
        .map(|i| mix(seq ^ (i << 32)) as u8)
        .collect()
}

fn emulated(segment: &Segment) -> View<'_> {
    Emulated::of_segment(segment).unwrap().into()
}

/// A host that writes `bytes` at `offset` and flushes them.
fn scribble(segment: &Segment, offset: usize, bytes: &[u8]) {
    let mut host = emulated(segment);
    host.write(offset, bytes).unwrap();
    host.flush(offset, bytes.len()).unwrap();
}

/// Pops until nothing more comes (bounded), asserting that whatever is delivered is the
/// record due; returns how many were delivered and the errors.
fn drain(consumer: &mut Consumer<'_>, bound: usize) -> (u64, Vec<PopError>) {
    let mut out = Vec::new();
    let (mut delivered, mut errors) = (0, Vec::new());
    for _ in 0..bound {
        match consumer.try_pop(&mut out) {
            Ok(Some(len)) => {
                assert_eq!(len, out.len());
                assert!(
                    out == payload(consumer.consumed()),
                    "a wrong record delivered"
                );
                delivered += 1;
            }
            Ok(None) => break,
            Err(e) => {
                assert!(out.is_empty());
                errors.push(e);
            }
        }
    }
    (delivered, errors)
}

#[test]
fn random_bytes_anywhere_in_the_ring_give_errors_or_the_right_records() {
    const ROUNDS: u64 = 3_000;
    let segment = Segment::create("polled-hostile", PolledRing::bytes_needed(32)).unwrap();
    let ring = PolledRing::new(0, segment.len()).unwrap();
    let mut outcomes = [0u64; 3];
    for round in 0..ROUNDS {
        let mut r = mix(round);
        let mut next = || {
            r = mix(r);
            r
        };
        ring.init(&mut emulated(&segment)).unwrap();
        let mut producer = ring.producer(emulated(&segment)).unwrap();
        let mut consumer = ring.consumer(emulated(&segment)).unwrap();
        for seq in 1..=next() % 12 {
            if producer.try_push(&payload(seq)).is_err() {
                break;
            }
        }
        drain(&mut consumer, (next() % 4) as usize);
        for _ in 0..1 + next() % 3 {
            let offset = next() as usize % ring.len();
            let len = (1 + next() as usize % 64).min(ring.len() - offset);
            let bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            scribble(&segment, offset, &bytes);
        }
        // Both sides carry on, and new ones attach: whatever they get, never garbage.
        let _ = producer.try_push(&payload(producer.records() + 1));
        let (delivered, errors) = drain(&mut consumer, 64);
        outcomes[0] += delivered;
        outcomes[1] += errors.len() as u64;
        if let Ok(mut late) = ring.consumer(emulated(&segment)) {
            drain(&mut late, 64);
        }
        match ring.producer(emulated(&segment)) {
            Ok(mut late) => {
                for _ in 0..40 {
                    let seq = late.records() + 1;
                    match late.try_push(&payload(seq)) {
                        Ok(()) | Err(PushError::Full) => {}
                        Err(_) => outcomes[2] += 1,
                    }
                }
            }
            Err(_) => outcomes[2] += 1,
        }
    }
    // The runs did exercise both outcomes.
    assert!(outcomes.iter().all(|&n| n > 0), "{outcomes:?}");
}

/// The ring's word offsets, as the layout documents them.
const TAIL: usize = 2 * 64;
const HEAD: usize = 4 * 64;
const DATA: usize = 6 * 64;

fn store_word(segment: &Segment, offset: usize, value: u64) {
    scribble(segment, offset, &value.to_le_bytes());
}

#[test]
fn impossible_positions_are_refused() {
    let segment = Segment::create("polled-positions", PolledRing::bytes_needed(8)).unwrap();
    let ring = PolledRing::new(0, segment.len()).unwrap();
    let mut out = Vec::new();
    for tail in [9, u64::MAX, 1 << 40] {
        ring.init(&mut emulated(&segment)).unwrap();
        let mut consumer = ring.consumer(emulated(&segment)).unwrap();
        let mut producer = ring.producer(emulated(&segment)).unwrap();
        store_word(&segment, TAIL, tail);
        assert_eq!(
            consumer.try_pop(&mut out),
            Err(PopError::Corrupt { head: 0, tail })
        );
        assert!(ring.consumer(emulated(&segment)).is_err());
        assert!(ring.producer(emulated(&segment)).is_err());
        let _ = producer.try_push(&[1]);
    }
    // A head ahead of the tail, or going back.
    ring.init(&mut emulated(&segment)).unwrap();
    let mut producer = ring.producer(emulated(&segment)).unwrap();
    let mut consumer = ring.consumer(emulated(&segment)).unwrap();
    for _ in 0..8 {
        producer.try_push(&[1]).unwrap();
    }
    assert_eq!(consumer.try_pop(&mut out), Ok(Some(1)));
    producer.try_push(&[1]).unwrap();
    store_word(&segment, HEAD, 10);
    assert_eq!(
        producer.try_push(&[1]),
        Err(PushError::Corrupt { head: 10, tail: 9 })
    );
    store_word(&segment, HEAD, 0);
    assert_eq!(
        producer.try_push(&[1]),
        Err(PushError::Corrupt { head: 0, tail: 9 })
    );
    // A tail that goes back.
    for _ in 0..8 {
        assert_eq!(consumer.try_pop(&mut out), Ok(Some(1)));
    }
    store_word(&segment, TAIL, 8);
    assert_eq!(
        consumer.try_pop(&mut out),
        Err(PopError::Corrupt { head: 9, tail: 8 })
    );
}

/// A record header at data line `line` with the given fields.
fn header(segment: &Segment, line: usize, seq: u64, len: u32, crc: u32) {
    let mut bytes = [0; 16];
    bytes[..8].copy_from_slice(&seq.to_le_bytes());
    bytes[8..12].copy_from_slice(&len.to_le_bytes());
    bytes[12..].copy_from_slice(&crc.to_le_bytes());
    scribble(segment, DATA + line * 64, &bytes);
}

#[test]
fn impossible_record_headers_are_refused() {
    let segment = Segment::create("polled-headers", PolledRing::bytes_needed(8)).unwrap();
    let ring = PolledRing::new(0, segment.len()).unwrap();
    let mut out = Vec::new();
    // (seq, len) at line 0 under a tail of 2 lines: each must be refused.
    let cases = [
        (1, 200, "longer than the tail allows"),
        (1, u32::MAX, "a skip marker at line 0"),
        (1, 8 * 64, "longer than the ring"),
        (1, 10, "a checksum that does not match"),
        (2, 10, "the wrong sequence number"),
    ];
    for (seq, len, what) in cases {
        ring.init(&mut emulated(&segment)).unwrap();
        let mut consumer = ring.consumer(emulated(&segment)).unwrap();
        store_word(&segment, TAIL, 2);
        header(&segment, 0, seq, len, 0x1234_5678);
        let got = consumer.try_pop(&mut out);
        assert!(
            matches!(got, Err(PopError::Torn { .. } | PopError::Stale { .. })),
            "{what}: {got:?}"
        );
        assert_eq!(consumer.consumed(), 0, "{what}");
    }
    // A skip marker that claims more lines than the tail covers, at line 6 of 8.
    ring.init(&mut emulated(&segment)).unwrap();
    let mut producer = ring.producer(emulated(&segment)).unwrap();
    let mut consumer = ring.consumer(emulated(&segment)).unwrap();
    for _ in 0..6 {
        producer.try_push(&[3]).unwrap();
    }
    for _ in 0..6 {
        assert_eq!(consumer.try_pop(&mut out), Ok(Some(1)));
    }
    store_word(&segment, TAIL, 7);
    header(&segment, 6, 7, u32::MAX, 0);
    assert_eq!(consumer.try_pop(&mut out), Err(PopError::Torn { seq: 7 }));
}
