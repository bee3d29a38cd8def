//! Property tests of everything that decodes bytes another process wrote: whatever the
//! bytes, decoding returns a value or an error, never panics, and anything accepted keeps the
//! invariants the code slicing with it relies on.

use proptest::prelude::*;

use crate::segment::BlockRun;
use crate::wire::handshake::Frame;
use crate::wire::header::{
    kind, ResponseHeader, WireHeader, HEADER_LEN, RESPONSE_HEADER_LEN, SHORT_HEADER_LEN,
};
use crate::wire::metadata::Metadata;

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn request_header_validation_bounds_every_slice(
        bytes in proptest::collection::vec(any::<u8>(), HEADER_LEN),
        max_message in 0usize..10_000,
        capacity in 0usize..10_000,
    ) {
        // SAFETY: `bytes` holds HEADER_LEN bytes.
        let h = unsafe { WireHeader::read_from(bytes.as_ptr()) };
        if h.validate_shape(max_message, capacity).is_ok() {
            let body = h.body_len as usize;
            prop_assert!(body <= max_message);
            prop_assert!(h.frag_len as usize <= capacity);
            prop_assert!(h.frag_offset as usize + h.frag_len as usize <= body);
            prop_assert!(h.method_len as usize + h.metadata_len as usize <= body);
        }
    }

    #[test]
    fn a_request_header_of_either_form_is_read_whole(
        mut bytes in proptest::collection::vec(any::<u8>(), HEADER_LEN),
        short in any::<bool>(),
    ) {
        // Bytes 28..30 are the kind in both forms.
        if short {
            bytes[28..30].copy_from_slice(&kind::REQUEST_SHORT.to_le_bytes());
        } else if bytes[28..30] == kind::REQUEST_SHORT.to_le_bytes() {
            bytes[28] ^= 1;
        }
        let (h, len) = BlockRun::over(&mut bytes.clone()).request_header();
        if short {
            // A short header stands for a whole request with nothing but method and payload.
            prop_assert_eq!(len, SHORT_HEADER_LEN);
            prop_assert_eq!(h.kind, kind::REQUEST);
            prop_assert_eq!((h.frag_offset, h.frag_len), (0, h.body_len));
            prop_assert_eq!((h.deadline_ns, h.metadata_len, h.reserved[1]), (0, 0, 0));
            prop_assert_eq!(&h.token.to_le_bytes()[..], &bytes[..8]);
        } else {
            prop_assert_eq!(len, HEADER_LEN);
            prop_assert_eq!(h.as_bytes().as_slice(), bytes.as_slice());
        }
    }

    #[test]
    fn response_header_validation_bounds_every_slice(
        bytes in proptest::collection::vec(any::<u8>(), RESPONSE_HEADER_LEN),
        max_message in 0usize..10_000,
        capacity in 0usize..10_000,
    ) {
        // SAFETY: `bytes` holds RESPONSE_HEADER_LEN bytes.
        let h = unsafe { ResponseHeader::read_from(bytes.as_ptr()) };
        if h.validate_shape(max_message, capacity).is_ok() {
            let body = h.body_len as usize;
            prop_assert!(h.frag_len as usize <= capacity);
            prop_assert!(h.frag_offset as usize + h.frag_len as usize <= body);
            prop_assert!(h.metadata_len as usize <= body);
        }
    }

    #[test]
    fn metadata_decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = Metadata::decode(&bytes);
    }

    #[test]
    fn metadata_round_trips(pairs in proptest::collection::vec(("[a-z0-9-]{1,20}", proptest::collection::vec(any::<u8>(), 0..50)), 0..8)) {
        let mut md = Metadata::new();
        for (k, v) in &pairs {
            md.insert(k, v);
        }
        let mut buf = Vec::new();
        md.encode_into(&mut buf);
        prop_assert_eq!(Metadata::decode(&buf).unwrap(), md);
    }

    #[test]
    fn handshake_decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        if let Some(frame) = Frame::decode(&bytes) {
            // Whatever decodes re-encodes to something that decodes to the same frame.
            prop_assert_eq!(Frame::decode(&frame.encode()), Some(frame));
        }
    }
}
