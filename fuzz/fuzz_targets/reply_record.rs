//! A response ring record as a client reads it: a reply or a batch of compact replies: see
//! `netless::fuzzing::reply_record`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| netless::fuzzing::reply_record(data));
