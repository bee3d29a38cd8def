//! A connection handshake frame (`Greeting`, `Hello`, `Welcome`, `Reject`, `Goodbye`): see
//! `netless::fuzzing::handshake_frame`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| netless::fuzzing::handshake_frame(data));
