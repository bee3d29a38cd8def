//! Micro-benchmark of `netless::Metadata`'s wire encoding: encoding a call's metadata into a
//! message body and decoding (and validating) it on the other side, for the empty metadata
//! of most calls and a few gRPC-like pairs.
//!
//! `cargo bench -p netless-benchmarks --bench metadata [-- FILTER]`

use std::hint::black_box;

use netless::Metadata;
use netless_benchmarks::harness::micro::Micro;

fn main() {
    let micro = Micro::from_args();
    let mut grpc = Metadata::new();
    grpc.insert("x-request-id", "4f1c2a7e-9b3d-4c5e-8f6a-1b2c3d4e5f60");
    grpc.insert("grpc-timeout", "100m");
    grpc.insert("authorization", "Bearer 0123456789abcdef0123456789abcdef");
    for (name, md) in [("empty", Metadata::new()), ("3 pairs", grpc)] {
        let mut out = Vec::with_capacity(md.encoded_len());
        md.encode_into(&mut out);
        assert_eq!(out.len(), md.encoded_len());
        assert_eq!(Metadata::decode(&out).expect("valid"), md);
        micro.run(&format!("metadata encode: {name}"), 1, || {
            out.clear();
            black_box(&md).encode_into(&mut out);
            black_box(&out);
        });
        micro.run(&format!("metadata decode: {name}"), 1, || {
            black_box(Metadata::decode(black_box(&out)).expect("valid"));
        });
    }
}
