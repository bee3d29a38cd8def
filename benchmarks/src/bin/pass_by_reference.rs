//! DmRPC Figures 5–7: pass by value against pass by reference through the domain page
//! pool, and copy-on-write (see [`netless_benchmarks::dmrpc`]).

fn main() -> std::process::ExitCode {
    use netless_benchmarks::dmrpc;
    netless_benchmarks::harness::main(
        "pass_by_reference",
        "DmRPC Figs. 5-7: pass by value vs by reference (domain page pool), copy-on-write",
        dmrpc::run,
        dmrpc::peer,
    )
}
