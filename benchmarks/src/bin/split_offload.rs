//! Split gRPC Figure 2: one tonic process against the gateway forwarding to a
//! business-logic process (see [`netless_benchmarks::split`]).

fn main() -> std::process::ExitCode {
    use netless_benchmarks::split;
    netless_benchmarks::harness::main(
        "split_offload",
        "Split gRPC Figure 2: one tonic process vs gateway + business-logic process",
        split::run,
        split::peer,
    )
}
