//! Generates the example services. No `protoc` is needed: `protox` parses the files in pure
//! Rust and `tonic-prost-build` writes the code into `OUT_DIR`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    const PROTOS: [&str; 2] = ["proto/helloworld.proto", "proto/route_guide.proto"];
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
