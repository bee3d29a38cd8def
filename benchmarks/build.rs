//! Generates the prost messages and tonic client/server for `proto/echo.proto`.
//!
//! No `protoc` is needed: `protox` (a pure-Rust protobuf compiler) parses the file into a
//! `FileDescriptorSet`, and `tonic-prost-build` turns that into Rust code in `OUT_DIR`
//! (`bench.rs`, included by `src/proto.rs`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    const PROTO: &str = "proto/echo.proto";
    println!("cargo:rerun-if-changed={PROTO}");
    println!("cargo:rerun-if-changed=build.rs");

    let fds = protox::compile([PROTO], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
