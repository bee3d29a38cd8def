//! NEBULA: receive-buffer provisioning and dispatch of a key-value service under open-loop
//! load, judged by an SLO (see [`netless_benchmarks::kvs`]).

fn main() -> std::process::ExitCode {
    use netless_benchmarks::kvs;
    netless_benchmarks::harness::main(
        "slo_buffers",
        "NEBULA: a key-value service under open-loop load; receive-buffer provisioning and dispatch",
        kvs::run,
        kvs::peer,
    )
}
