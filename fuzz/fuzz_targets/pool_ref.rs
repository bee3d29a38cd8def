//! A Ref's encoding, a Ref mapped from a slot and pages another member wrote, a pool segment a
//! coordinator passed: see `netless_pool::fuzzing::pool_ref`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| netless_pool::fuzzing::pool_ref(data));
