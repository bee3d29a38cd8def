//! A run of request blocks as a server worker reads it: either header form, the fragment, a compact
//! batch's every request: see `netless::fuzzing::request_run`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| netless::fuzzing::request_run(data));
