//! NotNets Table 1 on this machine: a sequential call over gRPC/HTTP2, over netless with
//! protobuf and raw bytes, and the shared-memory floor (see [`netless_benchmarks::echo`]).

fn main() -> std::process::ExitCode {
    use netless_benchmarks::echo;
    netless_benchmarks::harness::main(
        "echo_latency",
        "NotNets Table 1: gRPC over HTTP/2 vs netless (protobuf and raw) vs the shared-memory floor",
        echo::run,
        echo::peer,
    )
}
