//! The polled ring on the non-coherent emulator: producer and consumer as two emulated hosts
//! on two threads and in two processes, back-pressure, restarts, hostile bytes, torn and
//! stale records, and the two faults (a flush left out, an invalidation left out) that
//! must stop delivery. Also a run on real memory through `Direct` views.
#![cfg(not(loom))]
// Real threads on real memory, never built under loom: clippy.toml's ban (enforced under
// `--cfg loom`) does not apply, and without loom the shim's atomics are std's types anyway.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::Command;
use std::time::{Duration, Instant};

use netless_ring::layout::LayoutError;
use netless_ring::polled::{AttachError, Consumer, PolledRing, PopError, Producer, PushError};
use netless_shm::coherence::{Coherence, Direct, Emulated, Faults, View};
use netless_shm::Segment;

const CHILD_ENV: &str = "NETLESS_RING_POLLED_CHILD";
const FD_ENV: &str = "NETLESS_RING_POLLED_FD";
const COUNT_ENV: &str = "NETLESS_RING_POLLED_COUNT";
/// The longest any test may wait for records to arrive.
const PATIENCE: Duration = Duration::from_secs(60);
/// How long the fault tests watch for records that must not arrive.
const WATCH: Duration = Duration::from_millis(300);

/// SplitMix64.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The payload of record `seq`, recomputable on both sides: mostly short, now and then up
/// to `max` bytes.
fn payload(seq: u64, max: usize) -> Vec<u8> {
    let r = mix(seq);
    let len = match r % 8 {
        0 => (r >> 8) as usize % (max + 1),
        1 => 0,
        _ => (r >> 8) as usize % 200.min(max + 1),
    };
    (0..len as u64)
        .map(|i| mix(seq ^ (i << 32)) as u8)
        .collect()
}

fn segment(len: usize) -> Segment {
    Segment::create("polled-test", len).unwrap()
}

fn emulated(segment: &Segment) -> View<'_> {
    Emulated::of_segment(segment).unwrap().into()
}

fn faulty(segment: &Segment, faults: Faults) -> View<'_> {
    let mut view = Emulated::of_segment(segment).unwrap();
    view.set_faults(faults);
    view.into()
}

/// A ring filling `segment`, initialised through a host of its own.
fn ring(segment: &Segment) -> PolledRing {
    let ring = PolledRing::new(0, segment.len()).unwrap();
    ring.init(&mut emulated(segment)).unwrap();
    ring
}

fn push(producer: &mut Producer<'_>, record: &[u8], deadline: Instant) {
    loop {
        match producer.try_push(record) {
            Ok(()) => return,
            Err(PushError::Full) => {
                assert!(Instant::now() < deadline, "the ring stayed full");
                std::thread::yield_now();
            }
            Err(e) => panic!("push: {e}"),
        }
    }
}

/// Pops `count` records, checking each against `payload`.
fn consume(consumer: &mut Consumer<'_>, count: u64, deadline: Instant) {
    let max = consumer.max_record_len();
    let mut out = Vec::new();
    for seq in 1..=count {
        loop {
            match consumer.try_pop(&mut out) {
                Ok(Some(len)) => {
                    assert_eq!(len, out.len());
                    assert_eq!(consumer.consumed(), seq);
                    assert!(out == payload(seq, max), "record {seq} arrived changed");
                    break;
                }
                Ok(None) => {
                    assert!(Instant::now() < deadline, "record {seq} never arrived");
                    std::thread::yield_now();
                }
                Err(e) => panic!("record {seq}: {e}"),
            }
        }
    }
}

/// Polls for `watch` and returns what arrived (must be nothing in the fault tests).
fn arrivals_within(consumer: &mut Consumer<'_>, watch: Duration) -> (u64, Vec<PopError>) {
    let until = Instant::now() + watch;
    let (mut delivered, mut errors) = (0, Vec::new());
    let mut out = Vec::new();
    while Instant::now() < until {
        match consumer.try_pop(&mut out) {
            Ok(Some(_)) => delivered += 1,
            Ok(None) => std::thread::yield_now(),
            Err(e) => errors.push(e),
        }
    }
    (delivered, errors)
}

#[test]
fn records_of_random_sizes_arrive_in_order_across_wraps_on_two_threads() {
    const RECORDS: u64 = 20_000;
    let segment = segment(PolledRing::bytes_needed(64));
    let ring = ring(&segment);
    let mut producer = ring.producer(emulated(&segment)).unwrap();
    let mut consumer = ring.consumer(emulated(&segment)).unwrap();
    let max = producer.max_record_len();
    assert_eq!(max, 64 * 64 - 16);
    let deadline = Instant::now() + PATIENCE;
    std::thread::scope(|s| {
        s.spawn(move || {
            for seq in 1..=RECORDS {
                push(&mut producer, &payload(seq, max), deadline);
            }
            // A record as long as the whole ring passes too.
            push(&mut producer, &vec![7; max], deadline);
        });
        consume(&mut consumer, RECORDS, deadline);
        let mut out = Vec::new();
        while consumer.try_pop(&mut out).unwrap().is_none() {
            assert!(Instant::now() < deadline);
            std::thread::yield_now();
        }
        assert_eq!(out, vec![7; max]);
    });
}

#[test]
fn direct_views_run_the_ring_on_real_memory() {
    const RECORDS: u64 = 5_000;
    for coherence in [Coherence::Software, Coherence::Hardware] {
        let segment = segment(PolledRing::bytes_needed(32));
        let ring = PolledRing::new(0, segment.len()).unwrap();
        let direct = || View::from(Direct::of_segment(&segment, coherence).unwrap());
        ring.init(&mut direct()).unwrap();
        let mut producer = ring.producer(direct()).unwrap();
        let mut consumer = ring.consumer(direct()).unwrap();
        let max = producer.max_record_len();
        let deadline = Instant::now() + PATIENCE;
        std::thread::scope(|s| {
            s.spawn(move || {
                for seq in 1..=RECORDS {
                    push(&mut producer, &payload(seq, max), deadline);
                }
            });
            consume(&mut consumer, RECORDS, deadline);
        });
    }
}

#[test]
fn hosts_in_two_processes_deliver_in_order() {
    const RECORDS: u64 = 5_000;
    let segment = segment(PolledRing::bytes_needed(32));
    let ring = ring(&segment);
    let mut producer = ring.producer(emulated(&segment)).unwrap();
    // A non-close-on-exec duplicate for the child to inherit.
    let inheritable = rustix::io::dup(segment.fd()).unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_consumer",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, "1")
        .env(FD_ENV, inheritable.as_raw_fd().to_string())
        .env(COUNT_ENV, RECORDS.to_string())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    drop(inheritable);
    let deadline = Instant::now() + PATIENCE;
    let max = producer.max_record_len();
    for seq in 1..=RECORDS {
        loop {
            match producer.try_push(&payload(seq, max)) {
                Ok(()) => break,
                Err(PushError::Full) => {
                    if Instant::now() > deadline || child.try_wait().unwrap().is_some() {
                        let _ = child.kill();
                        panic!("the child stopped consuming at {seq}: {:?}", child.wait());
                    }
                    std::thread::yield_now();
                }
                Err(e) => panic!("push: {e}"),
            }
        }
    }
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the child did not finish");
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    assert!(status.success(), "the child failed: {status}");
}

/// The consumer half of `hosts_in_two_processes_deliver_in_order`, run only when spawned
/// by it (via `--ignored`).
#[test]
#[ignore = "the child half of hosts_in_two_processes_deliver_in_order"]
fn child_consumer() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let raw: i32 = std::env::var(FD_ENV).unwrap().parse().unwrap();
    let count: u64 = std::env::var(COUNT_ENV).unwrap().parse().unwrap();
    // SAFETY: the parent dup'ed a segment fd without FD_CLOEXEC and passed its number; we are
    // its only owner in this process.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let segment = Segment::attach(fd, 1 << 20).unwrap();
    let ring = PolledRing::new(0, segment.len()).unwrap();
    let mut consumer = ring.consumer(emulated(&segment)).unwrap();
    consume(&mut consumer, count, Instant::now() + PATIENCE);
}

#[test]
fn a_full_ring_pushes_back_until_the_consumer_consumes() {
    let segment = segment(PolledRing::bytes_needed(8));
    let ring = ring(&segment);
    let mut producer = ring.producer(emulated(&segment)).unwrap();
    let mut consumer = ring.consumer(emulated(&segment)).unwrap();
    let max = producer.max_record_len();
    assert_eq!(
        producer.try_push(&vec![0; max + 1]),
        Err(PushError::TooLarge)
    );
    // Two-line records: four fill the ring.
    for i in 0..4u8 {
        producer.try_push(&[i; 100]).unwrap();
    }
    assert_eq!(producer.try_push(&[9; 100]), Err(PushError::Full));
    assert_eq!(producer.try_push(&[]), Err(PushError::Full));
    let mut out = Vec::new();
    assert_eq!(consumer.try_pop(&mut out), Ok(Some(100)));
    assert_eq!(out, [0; 100]);
    producer.try_push(&[4; 100]).unwrap();
    assert_eq!(producer.try_push(&[]), Err(PushError::Full));
    for i in 1..5u8 {
        assert_eq!(consumer.try_pop(&mut out), Ok(Some(100)));
        assert_eq!(out, [i; 100]);
    }
    assert_eq!(consumer.try_pop(&mut out), Ok(None));
    // At line 2 of 8: a record of the whole ring needs a skip marker first, which the
    // producer publishes alone while the record cannot fit yet.
    assert_eq!(producer.try_push(&[]), Ok(()));
    assert_eq!(consumer.try_pop(&mut out), Ok(Some(0)));
    assert_eq!(producer.try_push(&vec![5; max]), Err(PushError::Full));
    assert_eq!(consumer.try_pop(&mut out), Ok(None), "only the skip marker");
    producer.try_push(&vec![5; max]).unwrap();
    assert_eq!(consumer.try_pop(&mut out), Ok(Some(max)));
    assert_eq!(out, vec![5; max]);
    assert_eq!(producer.records(), 7);
}

#[test]
fn a_restarted_peer_is_noticed_and_nothing_is_lost() {
    let segment = segment(PolledRing::bytes_needed(8));
    let ring = ring(&segment);
    let mut producer = ring.producer(emulated(&segment)).unwrap();
    assert_eq!(producer.epoch(), 1);
    let mut consumer = ring.consumer(emulated(&segment)).unwrap();
    assert_eq!(consumer.producer_epoch(), 1);
    for i in 1..=3u8 {
        producer.try_push(&[i]).unwrap();
    }
    drop(producer);
    let mut producer = ring.producer(emulated(&segment)).unwrap();
    assert_eq!((producer.epoch(), producer.records()), (2, 3));
    producer.try_push(&[4]).unwrap();
    let mut out = Vec::new();
    assert_eq!(
        consumer.try_pop(&mut out),
        Err(PopError::Restarted { epoch: 2 })
    );
    for i in 1..=4u8 {
        assert_eq!(consumer.try_pop(&mut out), Ok(Some(1)));
        assert_eq!(out, [i]);
    }
    assert_eq!(consumer.try_pop(&mut out), Ok(None));

    // The consumer restarts: it carries on from its head, and the producer sees its epoch
    // when it next reads the consumer's line (when the ring looks full).
    producer.try_push(&[5]).unwrap();
    drop(consumer);
    let mut consumer = ring.consumer(emulated(&segment)).unwrap();
    assert_eq!(consumer.epoch(), 2);
    assert_eq!(producer.consumer_epoch(), 1);
    while producer.try_push(&[6]).is_ok() {}
    assert_eq!(producer.consumer_epoch(), 2);
    assert_eq!(consumer.try_pop(&mut out), Ok(Some(1)));
    assert_eq!(out, [5]);
}

#[test]
fn attaching_checks_the_header_and_the_view() {
    let segment = segment(4096);
    let ring = PolledRing::new(0, 4096).unwrap();
    assert!(matches!(
        ring.consumer(emulated(&segment)),
        Err(AttachError::Layout(LayoutError::BadMagic { found: 0, .. }))
    ));
    ring.init(&mut emulated(&segment)).unwrap();
    let smaller = PolledRing::new(0, 2048).unwrap();
    assert!(matches!(
        smaller.producer(emulated(&segment)),
        Err(AttachError::Geometry { .. })
    ));
    let outside = PolledRing::new(2048, 4096).unwrap();
    assert!(matches!(
        outside.producer(emulated(&segment)),
        Err(AttachError::View(_))
    ));
    assert!(ring.producer(emulated(&segment)).is_ok());
}

#[test]
fn a_record_changed_after_it_was_flushed_is_detected_as_torn() {
    let segment = segment(PolledRing::bytes_needed(8));
    let ring = ring(&segment);
    let mut producer = ring.producer(emulated(&segment)).unwrap();
    let mut consumer = ring.consumer(emulated(&segment)).unwrap();
    producer.try_push(&[1; 100]).unwrap();
    // Another host rewrites a payload byte on the record's second line after the producer
    // published it: what a reader racing a rewrite (or a forger) would see.
    let line = ring.offset() + 6 * 64 + 64;
    let mut scribbler = emulated(&segment);
    scribbler.invalidate(line, 64).unwrap();
    let mut bytes = [0; 64];
    scribbler.read(line, &mut bytes).unwrap();
    let original = bytes;
    bytes[10] ^= 1;
    scribbler.write(line, &bytes).unwrap();
    scribbler.flush(line, 64).unwrap();
    let mut out = vec![0xee; 10];
    assert_eq!(consumer.try_pop(&mut out), Err(PopError::Torn { seq: 1 }));
    assert!(out.is_empty(), "nothing of a torn record is delivered");
    assert_eq!(consumer.consumed(), 0);
    // Put back, the same record is delivered: nothing was consumed.
    scribbler.write(line, &original).unwrap();
    scribbler.flush(line, 64).unwrap();
    assert_eq!(consumer.try_pop(&mut out), Ok(Some(100)));
    assert_eq!(out, [1; 100]);
}

#[test]
fn a_record_whose_line_reads_stale_is_reported_not_delivered() {
    let segment = segment(PolledRing::bytes_needed(8));
    let ring = ring(&segment);
    let mut producer = ring.producer(emulated(&segment)).unwrap();
    let mut consumer = ring.consumer(emulated(&segment)).unwrap();
    let first = ring.offset() + 6 * 64;
    // A host that kept the record's first line as it was before the push, and writes it
    // back after the tail was published: the consumer reads an old line under a new tail.
    let stale = emulated(&segment);
    producer.try_push(b"fresh").unwrap();
    stale.flush(first, 64).unwrap();
    let mut out = Vec::new();
    assert_eq!(
        consumer.try_pop(&mut out),
        Err(PopError::Stale {
            expected: 1,
            found: 0
        })
    );
    assert!(out.is_empty());
}

#[test]
fn without_flushes_records_never_arrive() {
    let segment = segment(PolledRing::bytes_needed(64));
    let ring = ring(&segment);
    let skip_flush = Faults {
        skip_flush: true,
        skip_invalidate: false,
    };
    let mut producer = ring.producer(faulty(&segment, skip_flush)).unwrap();
    let mut consumer = ring.consumer(emulated(&segment)).unwrap();
    for seq in 1..=10 {
        producer.try_push(&payload(seq, 200)).unwrap();
    }
    let (delivered, errors) = arrivals_within(&mut consumer, WATCH);
    assert_eq!(
        (delivered, errors),
        (0, vec![]),
        "records arrived without a flush"
    );
    assert_eq!(consumer.consumed(), 0);
}

#[test]
fn without_invalidations_the_consumer_never_sees_the_tail() {
    let segment = segment(PolledRing::bytes_needed(64));
    let ring = ring(&segment);
    let skip_invalidate = Faults {
        skip_flush: false,
        skip_invalidate: true,
    };
    let mut producer = ring.producer(emulated(&segment)).unwrap();
    // Attached before anything is pushed, so its cache holds the empty ring.
    let mut consumer = ring.consumer(faulty(&segment, skip_invalidate)).unwrap();
    for seq in 1..=10 {
        producer.try_push(&payload(seq, 200)).unwrap();
    }
    let (delivered, errors) = arrivals_within(&mut consumer, WATCH);
    assert_eq!(
        (delivered, errors),
        (0, vec![]),
        "records arrived without invalidation"
    );

    // A producer that never invalidates sees the ring full forever, however much the
    // consumer frees.
    let ring = self::ring(&segment);
    let mut producer = ring.producer(faulty(&segment, skip_invalidate)).unwrap();
    let mut consumer = ring.consumer(emulated(&segment)).unwrap();
    let mut pushed = 0u64;
    while producer.try_push(&[1; 48]).is_ok() {
        pushed += 1;
    }
    assert_eq!(pushed, 64);
    let mut out = Vec::new();
    while consumer.try_pop(&mut out).unwrap().is_some() {}
    assert_eq!(consumer.consumed(), 64);
    assert_eq!(producer.try_push(&[1; 48]), Err(PushError::Full));
}

#[test]
fn the_same_runs_deliver_with_both_operations_in_place() {
    // The control for the two fault tests above: nothing but the faults differs.
    let segment = segment(PolledRing::bytes_needed(64));
    let ring = ring(&segment);
    let mut producer = ring.producer(emulated(&segment)).unwrap();
    let mut consumer = ring.consumer(emulated(&segment)).unwrap();
    for seq in 1..=10 {
        producer.try_push(&payload(seq, 200)).unwrap();
    }
    assert_eq!(arrivals_within(&mut consumer, WATCH), (10, vec![]));
}
