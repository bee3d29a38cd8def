//! The polled ring against a model (a queue of byte strings), on emulated hosts, for random
//! sizes of ring and random interleavings of pushes and pops: every record comes out once,
//! whole and in order, a published record is always visible to the next pop, and a push is
//! refused as full only while records are unconsumed (or, on an empty ring, until the
//! consumer has passed the skip marker the refusal published).
#![cfg(not(loom))]

use std::collections::VecDeque;

use netless_ring::polled::{PolledRing, PushError};
use netless_shm::coherence::{Emulated, View};
use netless_shm::Segment;
use proptest::prelude::*;

fn emulated(segment: &Segment) -> View<'_> {
    Emulated::of_segment(segment).unwrap().into()
}

proptest! {
    #[test]
    fn the_ring_behaves_as_a_queue(
        data_lines in prop::sample::select(vec![2u64, 3, 5, 8, 13]),
        ops in prop::collection::vec((any::<bool>(), any::<u16>()), 1..400),
    ) {
        let segment = Segment::create("polled-model", PolledRing::bytes_needed(data_lines) + 64)
            .unwrap();
        // At an offset, so the ring's lines are not the view's first ones.
        let ring = PolledRing::new(64, PolledRing::bytes_needed(data_lines)).unwrap();
        ring.init(&mut emulated(&segment)).unwrap();
        let mut producer = ring.producer(emulated(&segment)).unwrap();
        let mut consumer = ring.consumer(emulated(&segment)).unwrap();
        let max = producer.max_record_len();
        let mut model: VecDeque<Vec<u8>> = VecDeque::new();
        let mut out = Vec::new();
        for (i, (push, len)) in ops.into_iter().enumerate() {
            if push {
                let len = usize::from(len) % (max + 2);
                let body: Vec<u8> = (0..len).map(|j| (i * 7 + j) as u8).collect();
                match producer.try_push(&body) {
                    Ok(()) => model.push_back(body),
                    Err(PushError::TooLarge) => prop_assert!(len > max),
                    Err(PushError::Full) if model.is_empty() => {
                        prop_assert_eq!(consumer.try_pop(&mut out), Ok(None));
                        prop_assert_eq!(producer.try_push(&body), Ok(()));
                        model.push_back(body);
                    }
                    Err(PushError::Full) => {}
                    Err(e) => prop_assert!(false, "push: {}", e),
                }
            } else {
                let popped = consumer.try_pop(&mut out);
                match model.pop_front() {
                    Some(expected) => {
                        prop_assert_eq!(popped, Ok(Some(expected.len())));
                        prop_assert_eq!(&out, &expected);
                    }
                    None => prop_assert_eq!(popped, Ok(None)),
                }
            }
        }
        while let Some(expected) = model.pop_front() {
            prop_assert_eq!(consumer.try_pop(&mut out), Ok(Some(expected.len())));
            prop_assert_eq!(&out, &expected);
        }
        prop_assert_eq!(consumer.try_pop(&mut out), Ok(None));
        prop_assert_eq!(consumer.consumed(), producer.records());
    }
}
