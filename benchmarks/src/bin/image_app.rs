//! A 7-tier image service written as tonic services, over tonic's TCP transport, netless by
//! value and netless by reference, at rising load (see [`netless_benchmarks::images`]).

fn main() -> std::process::ExitCode {
    use netless_benchmarks::images;
    netless_benchmarks::harness::main(
        "image_app",
        "DmRPC's 7-tier image pipeline as tonic services: tcp vs netless by value vs by reference",
        images::run,
        images::peer,
    )
}
