//! Generates the canonical `helloworld.Greeter` service used by this crate's tests and
//! examples. No `protoc` is needed: `protox` parses the file in pure Rust and
//! `tonic-prost-build` writes the code into `OUT_DIR`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    const PROTO: &str = "proto/helloworld.proto";
    println!("cargo:rerun-if-changed={PROTO}");
    println!("cargo:rerun-if-changed=build.rs");
    let fds = protox::compile([PROTO], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
