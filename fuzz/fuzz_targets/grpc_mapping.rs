//! The gateway's path → service → allow-list → socket mapping, `grpc-timeout` values, bearer
//! tokens, backends' error messages, metadata ↔ HTTP headers and trailers, stream payloads:
//! see `netless_grpc::fuzzing::grpc_mapping`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| netless_grpc::fuzzing::grpc_mapping(data));
