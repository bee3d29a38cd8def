//! The same tonic client over TCP, over the netless `Channel`, and through the gateway (see
//! [`netless_benchmarks::grpc`]).

fn main() -> std::process::ExitCode {
    use netless_benchmarks::grpc;
    netless_benchmarks::harness::main(
        "grpc_paths",
        "The same tonic client code over TCP/HTTP2, over the netless Channel, and through the gateway",
        grpc::run,
        grpc::peer,
    )
}
