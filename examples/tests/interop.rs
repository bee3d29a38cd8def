//! gRPC's interop test cases: `interop_client`, in a process of its own, runs every case of
//! the interop test descriptions against `interop_server` in another, over netless (a
//! netless `Channel`, no socket on the call path) and, for reference, over TCP.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{run_to_end, ServerProcess};
use netless_examples::interop::client::CASES;

/// Runs `interop_client` with `args` for `cases`, and checks that each passed.
fn run_client(server: &ServerProcess, args: &[&str], cases: &[&str]) {
    let finished = run_to_end(
        Command::new(env!("CARGO_BIN_EXE_interop_client"))
            .args(args)
            .args(["--test_case", &cases.join(",")])
            .env("NETLESS_DIR", &server.dir),
        Duration::from_secs(120),
    );
    for case in cases {
        assert!(
            finished.out.contains(&format!("PASS {case}\n")),
            "{case} did not pass ({args:?}):\n{}{}",
            finished.out,
            finished.err
        );
    }
}

#[test]
fn rust_interop_client_passes_every_case_over_netless() {
    let server = ServerProcess::start(env!("CARGO_BIN_EXE_interop_server"), &[]);
    run_client(&server, &["--transport", "netless"], &CASES);
}

/// The same client against tonic's own HTTP/2 server, which shows that the cases test what
/// they say. But for `timeout_on_sleeping_server`: over HTTP/2 tonic holds the deadline of
/// neither end of a stream once its response headers are out (a netless channel does).
#[test]
fn rust_interop_client_passes_over_tcp_too() {
    let server = ServerProcess::start(env!("CARGO_BIN_EXE_interop_server"), &[]);
    let cases: Vec<&str> = CASES
        .into_iter()
        .filter(|&case| case != "timeout_on_sleeping_server")
        .collect();
    let addr = format!("http://{}", server.tcp);
    run_client(&server, &["--transport", "tcp", "--addr", &addr], &cases);
}
