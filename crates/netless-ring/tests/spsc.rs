//! Threaded tests of the response ring: a long producer/consumer run with wrap and PAD,
//! limits, and what a misbehaving peer can write into the head and the record words.
#![cfg(not(loom))]
// Real threads on real memory, never built under loom: clippy.toml's ban (enforced under
// `--cfg loom`) does not apply, and without loom the shim's atomics are std's types anyway.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use netless_ring::{Corrupt, PushError, ResponseRing};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

fn words(nslots: usize) -> (AtomicU64, Vec<AtomicU64>) {
    (
        AtomicU64::new(0),
        (0..nslots * 8).map(|_| AtomicU64::new(0)).collect(),
    )
}

/// SplitMix64: length and content of record `seq`, recomputable on both sides.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[test]
fn a_million_records_arrive_in_order_and_intact() {
    // Under Miri, which interprets every access, far fewer (here and below).
    const RECORDS: u64 = if cfg!(miri) { 2_000 } else { 1_000_000 };
    let pattern: Vec<u8> = (0..2048u32).map(|i| mix(u64::from(i)) as u8).collect();
    let payload = |seq: u64| {
        let len = (mix(seq) % 1001) as usize;
        let offset = (seq % 1024) as usize;
        &pattern[offset..offset + len]
    };
    let (mut head, mut slots) = words(64);
    let (mut producer, mut consumer) = ResponseRing::from_parts(&mut head, &mut slots).unwrap();
    assert!(producer.max_record_len() >= 1008);
    let consumer_gone = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut full = 0u64;
            for seq in 0..RECORDS {
                let header = seq.to_le_bytes();
                loop {
                    // Every other record through the fixed-header path: the same bytes.
                    let pushed = if seq % 2 == 0 {
                        producer.try_push(&[&header, payload(seq)])
                    } else {
                        producer.try_push_header(&header, payload(seq))
                    };
                    match pushed {
                        Ok(()) => break,
                        Err(PushError::Full) => {
                            full += 1;
                            // A consumer that failed its checks stops draining: end, not hang.
                            if consumer_gone.load(Ordering::Acquire) {
                                return full;
                            }
                            std::thread::yield_now();
                        }
                        Err(e) => panic!("push {seq}: {e}"),
                    }
                }
            }
            full
        });
        s.spawn(|| {
            // Set when this thread ends, panicking or not.
            struct Gone<'a>(&'a AtomicBool);
            impl Drop for Gone<'_> {
                fn drop(&mut self) {
                    self.0.store(true, Ordering::Release);
                }
            }
            let _gone = Gone(&consumer_gone);
            let mut seq = 0;
            let mut out = vec![0u8; 2048];
            // A record that never comes (its word lost, say) fails the test, not hangs it.
            let (mut empty, mut since) = (0u32, std::time::Instant::now());
            while seq < RECORDS {
                let Some(record) = consumer.peek().expect("honest ring is never corrupt") else {
                    empty += 1;
                    if empty.is_multiple_of(1024) {
                        assert!(
                            since.elapsed() < std::time::Duration::from_secs(60),
                            "record {seq} never arrived"
                        );
                    }
                    std::thread::yield_now();
                    continue;
                };
                since = std::time::Instant::now();
                let body = record.body();
                let expected = payload(seq);
                assert_eq!(body.len(), 8 + expected.len(), "record {seq}");
                assert_eq!(u64::from_le_bytes(body[..8].try_into().unwrap()), seq);
                assert!(body[8..] == *expected, "record {seq} content");
                if seq % 1024 == 0 {
                    let n = record.copy_to(&mut out);
                    assert_eq!(&out[..n], body);
                }
                record.release();
                seq += 1;
            }
            assert!(consumer.peek().unwrap().is_none());
            assert!(!consumer.has_next());
        });
    });
}

#[test]
fn pad_records_wrap_to_slot_zero() {
    let (mut head, mut slots) = words(8);
    let (mut producer, mut consumer) = ResponseRing::from_parts(&mut head, &mut slots).unwrap();
    // 3-slot records (len 150): positions 0, 3, then PAD at 6 and the record at 8.
    for round in 0..50u8 {
        let body = [round; 150];
        producer.try_push(&[&body]).unwrap();
        assert!(consumer.has_next());
        let record = consumer.peek().unwrap().unwrap();
        assert_eq!(record.body(), &body[..]);
        record.release();
        assert!(!consumer.has_next());
    }
    // 50 records of 3 slots, plus a 2-slot PAD before every odd record but the first
    // (8 = 3 + 3 + 2).
    assert_eq!(producer.position(), 50 / 2 * 8 - 2);
    assert_eq!(consumer.position(), producer.position());
}

#[test]
fn full_and_too_large() {
    let (mut head, mut slots) = words(8);
    let (mut producer, mut consumer) = ResponseRing::from_parts(&mut head, &mut slots).unwrap();
    let max = producer.max_record_len();
    assert_eq!(max, 4 * 64 - 8);
    assert_eq!(
        producer.try_push(&[&vec![0; max + 1]]),
        Err(PushError::TooLarge)
    );
    assert_eq!(
        producer.try_push(&[&vec![1; max - 10], &[2; 11]]),
        Err(PushError::TooLarge)
    );
    assert_eq!(
        producer.try_push_header(&[1; 8], &vec![2; max - 7]),
        Err(PushError::TooLarge)
    );
    producer.try_push(&[&vec![3; max]]).unwrap();
    producer
        .try_push_header(&[4; 8], &vec![4; max - 8])
        .unwrap();
    assert_eq!(producer.try_push(&[]), Err(PushError::Full));
    assert_eq!(producer.try_push_header(&[5; 4], &[]), Err(PushError::Full));
    let record = consumer.peek().unwrap().unwrap();
    assert_eq!(record.len(), max);
    record.release();
    producer.try_push(&[]).unwrap();
    consumer.peek().unwrap().unwrap().release();
    let record = consumer.peek().unwrap().unwrap();
    assert!(record.is_empty());
    record.release();
    assert!(consumer.peek().unwrap().is_none());

    // Free space that is not contiguous: a PAD would be needed and does not fit.
    let (mut head, mut slots) = words(8);
    let (mut producer, mut consumer) = ResponseRing::from_parts(&mut head, &mut slots).unwrap();
    for i in 0..6u8 {
        producer.try_push(&[&[i]]).unwrap();
    }
    for _ in 0..2 {
        consumer.peek().unwrap().unwrap().release();
    }
    // 4 slots free (6, 7, 0, 1) but a 3-slot record needs 2 PAD slots first.
    assert_eq!(producer.try_push(&[&[9; 150]]), Err(PushError::Full));
    producer.try_push(&[&[8; 100]]).unwrap(); // 2 slots: fits at 6..8
    for i in 2..6u8 {
        assert_eq!(consumer.peek().unwrap().unwrap().body(), &[i]);
        consumer.peek().unwrap().unwrap().release();
    }
    assert_eq!(consumer.peek().unwrap().unwrap().body(), &[8; 100]);
}

/// A 64-byte aligned region with both sides of a ring, and raw access to its words as a
/// misbehaving peer would have.
struct Region {
    lines: Vec<Line>,
}

#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Line([u8; 64]);

impl Region {
    fn new(nslots: u32) -> Self {
        Self {
            lines: vec![Line([0xee; 64]); ResponseRing::bytes_needed(nslots) / 64],
        }
    }

    fn ptr(&mut self) -> NonNull<u8> {
        NonNull::new(self.lines.as_mut_ptr().cast()).unwrap()
    }

    /// The peer's view of word `index` of the region (8-byte units).
    fn word(&self, index: usize) -> &AtomicU64 {
        assert!(index < self.lines.len() * 8);
        // SAFETY: in bounds and 8-aligned; the region is only accessed atomically or
        // through the ring, and these tests do not race with the ring's body copies.
        unsafe { AtomicU64::from_ptr(self.lines.as_ptr().cast::<u64>().cast_mut().add(index)) }
    }
}

const HEAD_WORD: usize = 8;
fn record_word_index(slot: u64, nslots: u64) -> usize {
    16 + (slot % nslots) as usize * 8
}

#[test]
fn corrupt_record_words_are_reported() {
    let nslots = 8u64;
    let tag = |position: u64| (position + 1) << 32;
    let cases: [(u64, u64, &str); 5] = [
        (0, tag(0) | 249, "len above max_record_len"),
        (0, tag(0) | u64::from(u32::MAX), "PAD at slot 0"),
        (0, tag(0) | (u32::MAX - 1) as u64, "huge len"),
        (6, tag(6) | 200, "record crossing the end of the array"),
        (5, tag(5) | 250, "record crossing the end of the array"),
    ];
    for (position, word, what) in cases {
        let mut region = Region::new(nslots as u32);
        let ptr = region.ptr();
        // SAFETY: `region` outlives both halves; one producer, one consumer.
        let mut consumer = unsafe { ResponseRing::init(ptr, region.lines.len() * 64, 8) }.unwrap();
        // SAFETY: as above.
        let mut producer = unsafe { ResponseRing::attach(ptr, region.lines.len() * 64) }.unwrap();
        for _ in 0..position {
            producer.try_push(&[]).unwrap();
            consumer.peek().unwrap().unwrap().release();
        }
        region
            .word(record_word_index(position, nslots))
            .store(word, Ordering::Release);
        assert!(consumer.has_next());
        assert_eq!(consumer.peek().err(), Some(Corrupt), "{what}");
        assert_eq!(consumer.peek().err(), Some(Corrupt), "{what}, again");
    }
}

#[test]
fn garbage_never_panics_either_side() {
    let nslots = 16u64;
    let mut rng = 0x1234_5678_9abc_def0u64;
    let mut next = move || {
        rng = mix(rng);
        rng
    };
    let trials = if cfg!(miri) { 30 } else { 3000 };
    for trial in 0..trials {
        let mut region = Region::new(nslots as u32);
        let ptr = region.ptr();
        let len = region.lines.len() * 64;
        // SAFETY: `region` outlives both halves; one producer, one consumer.
        let mut consumer = unsafe { ResponseRing::init(ptr, len, nslots as u32) }.unwrap();
        // SAFETY: as above.
        let mut producer = unsafe { ResponseRing::attach(ptr, len) }.unwrap();
        // Some honest traffic first so positions are not all zero.
        for i in 0..(next() % 40) {
            let body = vec![i as u8; (next() % 300) as usize];
            if producer.try_push(&[&body]).is_ok() {
                consumer.peek().unwrap().unwrap().release();
            }
        }
        // Then a peer scribbles over record words (with plausible tags) and the head.
        let base = consumer.position();
        for _ in 0..(next() % 8) {
            let slot = base + next() % nslots;
            let word = match next() % 4 {
                0 => next(),
                1 => ((slot + 1) << 32) | (next() % 1200),
                2 => ((slot + 1) << 32) | u64::from(u32::MAX),
                _ => ((slot + 1) << 32) | (next() & 0xffff_ffff),
            };
            region
                .word(record_word_index(slot, nslots))
                .store(word, Ordering::Release);
        }
        if trial % 2 == 0 {
            let head = match next() % 3 {
                0 => next(),
                1 => producer.position().wrapping_add(1 + next() % 4),
                _ => producer.position().wrapping_sub(nslots + 1 + next() % 4),
            };
            region.word(HEAD_WORD).store(head, Ordering::Release);
        }
        let mut out = [0u8; 2048];
        for _ in 0..(2 * nslots) {
            match consumer.peek() {
                Ok(Some(record)) => {
                    let n = record.copy_to(&mut out);
                    assert_eq!(n, record.body().len());
                    assert!(record.len() <= 8 * 64 - 8);
                    record.release();
                }
                Ok(None) | Err(Corrupt) => break,
            }
        }
        for _ in 0..4 {
            match producer.try_push(&[&[7; 100]]) {
                Ok(()) | Err(PushError::Full) | Err(PushError::Corrupt) => {}
                Err(PushError::TooLarge) => unreachable!(),
            }
        }
    }
}

#[test]
fn a_corrupt_head_is_detected_by_the_producer() {
    let nslots = 8u64;
    let mut region = Region::new(nslots as u32);
    let ptr = region.ptr();
    let len = region.lines.len() * 64;
    // SAFETY: `region` outlives the producer; no consumer is used concurrently.
    let _consumer = unsafe { ResponseRing::init(ptr, len, nslots as u32) }.unwrap();
    // SAFETY: as above.
    let mut producer = unsafe { ResponseRing::attach(ptr, len) }.unwrap();
    for _ in 0..8 {
        producer.try_push(&[]).unwrap();
    }
    // Head ahead of the tail.
    region.word(HEAD_WORD).store(9, Ordering::Release);
    assert_eq!(producer.try_push(&[]), Err(PushError::Corrupt));
    // Head more than a ring behind (wraps around below zero).
    region.word(HEAD_WORD).store(u64::MAX, Ordering::Release);
    assert_eq!(producer.try_push(&[]), Err(PushError::Corrupt));
    // Head exactly one ring behind: honest and full.
    region.word(HEAD_WORD).store(0, Ordering::Release);
    assert_eq!(producer.try_push(&[]), Err(PushError::Full));
    region.word(HEAD_WORD).store(1, Ordering::Release);
    assert_eq!(producer.try_push(&[]), Ok(()));
}

/// A `len`-byte body of `fill` for the record the producer at `position` pushes next,
/// carrying at each slot boundary it covers the record word the consumer will expect at
/// that slot one lap later.
fn forged_body(position: u64, nslots: u64, len: usize, fill: u8) -> Vec<u8> {
    let mut start = position;
    if (start % nslots) + (8 + len as u64).div_ceil(64) > nslots {
        start += nslots - start % nslots; // after the PAD
    }
    let mut body = vec![fill; len];
    let mut k = 1u64;
    while (k * 64) as usize <= len {
        let future = start + k + nslots;
        let word = ((future + 1) << 32) | 5;
        let offset = (k * 64 - 8) as usize;
        body[offset..offset + 8].copy_from_slice(&word.to_le_bytes());
        k += 1;
    }
    body
}

#[test]
fn stale_body_bytes_never_look_like_a_record() {
    // Every body carries, at each slot boundary it covers, the record word the consumer will
    // expect at that slot one lap later. Record sizes vary, so later laps peek at slots that
    // held body bytes. The producer's barrier word must hide them.
    let nslots = 8u64;
    let (mut head, mut slots) = words(nslots as usize);
    let (mut producer, mut consumer) = ResponseRing::from_parts(&mut head, &mut slots).unwrap();
    let max = producer.max_record_len();
    let mut rng = 99u64;
    let steps = if cfg!(miri) { 500 } else { 20_000 };
    for step in 0..steps {
        rng = mix(rng);
        let len = (rng % (max as u64 + 1)) as usize;
        let body = forged_body(producer.position(), nslots, len, 0xab);
        producer.try_push(&[&body]).unwrap();
        let record = consumer.peek().unwrap().unwrap();
        assert_eq!(record.body(), &body[..], "step {step}");
        record.release();
        assert!(
            consumer.peek().unwrap().is_none(),
            "step {step}: phantom record"
        );
        assert!(!consumer.has_next(), "step {step}: phantom record");
    }
}

#[test]
fn stale_body_bytes_never_look_like_a_record_while_the_consumer_lags() {
    // As above, with the consumer up to a ring behind: the producer writes its barrier
    // words ahead of each record only into slots the consumer has left, never into records
    // it has still to read, and they still hide every stale body byte.
    let nslots = 16u64;
    let (mut head, mut slots) = words(nslots as usize);
    let (mut producer, mut consumer) = ResponseRing::from_parts(&mut head, &mut slots).unwrap();
    let max = producer.max_record_len();
    let mut queued = std::collections::VecDeque::new();
    let mut rng = 7u64;
    let steps = if cfg!(miri) { 300 } else { 20_000 };
    for step in 0..steps {
        rng = mix(rng);
        let len = (rng % (max as u64 + 1)) as usize;
        let body = forged_body(producer.position(), nslots, len, (step % 251) as u8);
        match producer.try_push(&[&body]) {
            Ok(()) => queued.push_back(body),
            Err(PushError::Full) => {}
            Err(e) => panic!("step {step}: {e}"),
        }
        // Consume none, some or all of what is queued.
        rng = mix(rng);
        let take = (rng % 4) as usize;
        let take = if take == 3 {
            queued.len()
        } else {
            take.min(queued.len())
        };
        for _ in 0..take {
            let expected = queued.pop_front().unwrap();
            let record = consumer.peek().unwrap().expect("a queued record");
            assert_eq!(record.body(), &expected[..], "step {step}");
            record.release();
        }
        if queued.is_empty() {
            assert!(
                consumer.peek().unwrap().is_none(),
                "step {step}: phantom record"
            );
        }
    }
}
