//! Generates the prost messages and tonic clients/servers for `proto/echo.proto`,
//! `proto/chain.proto` and `proto/images.proto`.
//!
//! No `protoc` is needed: `protox` (a pure-Rust protobuf compiler) parses the file into a
//! `FileDescriptorSet`, and `tonic-prost-build` turns that into Rust code in `OUT_DIR`
//! (`bench.rs`, `chain.rs` and `images.rs`, included by `src/proto.rs`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    const PROTOS: [&str; 3] = [
        "proto/echo.proto",
        "proto/chain.proto",
        "proto/images.proto",
    ];
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    println!("cargo:rerun-if-changed=build.rs");

    let fds = protox::compile(PROTOS, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
