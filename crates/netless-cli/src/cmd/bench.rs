//! `netless bench NAME [ARGS…]`: where each benchmark is. The experiments are binaries of
//! the `netless-benchmarks` crate, one per question; this names the one that answers
//! `NAME` and runs it when it was built beside `netless`. It never measures anything itself.

use std::ffi::OsString;
use std::os::unix::process::CommandExt as _;
use std::process::{Command, ExitCode};

/// Each benchmark's name under `netless bench` and its binary in `netless-benchmarks`.
pub const BINARIES: [(&str, &str); 8] = [
    ("echo", "echo_latency"),
    ("grpc", "grpc_paths"),
    ("split", "split_offload"),
    ("dmrpc", "pass_by_reference"),
    ("kvs", "slo_buffers"),
    ("dagger", "batching"),
    ("hosts", "cross_host"),
    ("images", "image_app"),
];

/// Names the benchmark binary for NAME (echo, grpc, split, dmrpc, kvs, dagger, hosts, images), or runs it
/// with ARGS when it sits beside `netless` (built in the same target directory).
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The benchmark: echo, grpc, split, dmrpc, kvs, dagger, hosts or images.
    pub name: String,
    /// Its arguments, passed on unchanged.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub args: Vec<OsString>,
}

/// The binary answering `name`, if any.
pub fn binary(name: &str) -> Option<&'static str> {
    BINARIES
        .iter()
        .find(|(old, _)| *old == name)
        .map(|&(_, binary)| binary)
}

/// Runs the binary for `args.name` in place of this process if it is beside `netless`;
/// otherwise says on stderr which command replaces it and exits with status 2.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let Some(binary) = binary(&args.name) else {
        let names: Vec<&str> = BINARIES.iter().map(|(name, _)| *name).collect();
        eprintln!(
            "netless bench: no benchmark `{}` (there are {})",
            args.name,
            names.join(", ")
        );
        return Ok(ExitCode::from(2));
    };
    let beside = std::env::current_exe()?.with_file_name(binary);
    if beside.is_file() {
        // Only returns if the binary could not be run.
        let error = Command::new(&beside).args(&args.args).exec();
        return Err(anyhow::Error::new(error).context(format!("running {}", beside.display())));
    }
    let mut command = format!("cargo run --release -p netless-benchmarks --bin {binary}");
    if !args.args.is_empty() {
        command.push_str(" --");
        for arg in &args.args {
            command.push(' ');
            command.push_str(&arg.to_string_lossy());
        }
    }
    eprintln!(
        "netless bench {}: the benchmarks are binaries of the netless-benchmarks crate; run\n  {command}",
        args.name
    );
    Ok(ExitCode::from(2))
}
