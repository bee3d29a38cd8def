//! DmRPC-net's nested chain across two hosts: by value through the gateways against by
//! reference through the memory node (see [`netless_benchmarks::hosts`]).

fn main() -> std::process::ExitCode {
    use netless_benchmarks::hosts;
    netless_benchmarks::harness::main(
        "cross_host",
        "DmRPC-net Fig. 5 across two hosts: by value via the gateways vs by reference via the memory node",
        hosts::run,
        hosts::peer,
    )
}
