//! A replica, control or connection segment a peer created, attached and used: see
//! `netless::fuzzing::segment_layout`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| netless::fuzzing::segment_layout(data));
