//! The gateway's path → service → socket mapping, `grpc-timeout` values, metadata ↔ HTTP headers
//! and trailers, stream payloads: see `netless_grpc::fuzzing::grpc_mapping`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| netless_grpc::fuzzing::grpc_mapping(data));
