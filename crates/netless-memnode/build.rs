//! Generates the memory node's gRPC service. No `protoc` is needed: `protox` parses the file
//! in pure Rust and `tonic-prost-build` writes the code into `OUT_DIR`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    const PROTO: &str = "proto/memnode.proto";
    println!("cargo:rerun-if-changed={PROTO}");
    println!("cargo:rerun-if-changed=build.rs");
    let fds = protox::compile([PROTO], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // Page data as `Bytes`: a page read is a reference count, not a copy.
        .bytes(".netless.memnode")
        .compile_fds(fds)?;
    Ok(())
}
