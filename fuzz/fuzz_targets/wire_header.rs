//! The message headers in shared memory (`WireHeader` and its short and compact forms,
//! `ResponseHeader`, `CompactReply`), their shape checks and reply codes, and the metadata
//! encoding: see `netless::fuzzing::wire_header`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| netless::fuzzing::wire_header(data));
