//! Generates the example services. No `protoc` is needed: `protox` parses the files in pure
//! Rust and `tonic-prost-build` writes the code into `OUT_DIR`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    const PROTOS: [&str; 5] = [
        "proto/helloworld.proto",
        "proto/route_guide.proto",
        // grpc's interop test service (`grpc.testing.TestService`) and what it imports
        "proto/grpc/testing/empty.proto",
        "proto/grpc/testing/messages.proto",
        "proto/grpc/testing/test.proto",
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
