//! Dagger Figures 5–6: pipelined 64 B echo throughput and latency by request batching (see
//! [`netless_benchmarks::dagger`]).

fn main() -> std::process::ExitCode {
    use netless_benchmarks::dagger;
    netless_benchmarks::harness::main(
        "batching",
        "Dagger Figs. 5-6: pipelined 64 B echo throughput and latency by request batching",
        dagger::run,
        dagger::peer,
    )
}
