//! A page-pool domain's join request and its coordinator's reply: see
//! `netless_pool::fuzzing::coordinator_frame`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| netless_pool::fuzzing::coordinator_frame(data));
