//! End-to-end tests of the `netless` binary: every test runs the real executable as separate
//! processes, in its own private socket directory (`NETLESS_DIR`), with bounded waits only
//! (see `common` for how the processes are run and killed).

mod common;

use std::path::Path;

use rustix::process::Signal;

use common::*;

/// `netless echo-server --service <service> --spin-us 5`.
fn start_echo_server(dir: &TestDir, service: &str) -> Proc {
    spawn(
        dir,
        &["echo-server", "--service", service, "--spin-us", "5"],
    )
}

/// Runs `netless ping <service> <args>` until it succeeds, for up to [`STARTUP`] while the
/// server comes up; panics if the server exits or the ping never succeeds.
fn ping_until_ok(dir: &TestDir, server: &mut Proc, service: &str, args: &[&str]) -> Output {
    let mut argv = vec!["ping", service];
    argv.extend_from_slice(args);
    run_until_ok(dir, server, &argv)
}

/// Sends `signal` to the server and checks it exits with status 0 within [`SHUTDOWN`] and
/// removes its socket.
fn stop_server(server: Proc, signal: Signal, socket: &Path) -> Output {
    let out = server.stop(signal);
    assert!(
        !socket.exists(),
        "`{}` left its socket {} behind after {signal:?}",
        out.what,
        socket.display()
    );
    out
}

fn count_lines(text: &str, needle: &str) -> usize {
    text.lines().filter(|l| l.contains(needle)).count()
}

#[test]
fn echo_server_serves_until_sigterm_and_exits_cleanly() {
    let dir = TestDir::new("sig");
    for (signal, service) in [(Signal::TERM, "cli.Echo"), (Signal::INT, "cli.EchoInt")] {
        let mut server = start_echo_server(&dir, service);
        let ping = ping_until_ok(
            &dir,
            &mut server,
            service,
            &["--count", "3", "--interval-ms", "0"],
        );
        let report = ping.describe();
        assert_eq!(ping.status.code(), Some(0), "{report}");
        assert_eq!(
            count_lines(&ping.stdout, &format!("bytes from {service}:")),
            3,
            "{report}"
        );
        assert_eq!(
            count_lines(&ping.stdout, "64 bytes from"),
            3,
            "default payload is 64 bytes\n{report}"
        );
        assert!(
            ping.stdout.lines().any(|l| l == "3 calls, 3 ok, 0 failed"),
            "{report}"
        );
        assert_eq!(
            count_lines(&ping.stdout, "rtt min/avg/p50/p99/max"),
            1,
            "{report}"
        );
        assert!(!ping.stdout.contains("failures by status"), "{report}");

        let socket = dir.socket(service);
        assert!(
            socket.exists(),
            "no socket at {} while serving",
            socket.display()
        );
        let out = stop_server(server, signal, &socket);
        assert!(
            out.stdout
                .contains(&format!("serving `{service}` at {}", socket.display())),
            "{}",
            out.describe()
        );
        assert!(out.stderr.contains("stopped after"), "{}", out.describe());
    }
}

/// A ping whose `n` calls all failed with `code`: exit status 1, the summary line, and the
/// count by status.
fn assert_all_failed(out: &Output, n: usize, code: &str) {
    let report = out.describe();
    assert_eq!(out.status.code(), Some(1), "{report}");
    let summary = format!("{n} calls, 0 ok, {n} failed");
    assert!(out.stdout.lines().any(|l| l == summary), "{report}");
    assert!(
        out.stdout
            .contains(&format!("failures by status: {code} {n}")),
        "{report}"
    );
}

#[test]
fn ping_reports_failures_by_status_and_exits_nonzero() {
    let dir = TestDir::new("ping");

    // No server at all: every call fails with UNAVAILABLE.
    let out = run(
        &dir,
        &["ping", "no.Such", "--count", "2", "--interval-ms", "0"],
        SHORT,
    );
    assert_all_failed(&out, 2, "UNAVAILABLE");
    assert!(!out.stdout.contains("rtt min/avg"), "{}", out.describe());
    // The same pipelined.
    let out = run(
        &dir,
        &["ping", "no.Such", "--count", "5", "--window", "4"],
        SHORT,
    );
    assert_all_failed(&out, 5, "UNAVAILABLE");

    let service = "cli.Payload";
    let mut server = start_echo_server(&dir, service);

    // Empty and large payloads round-trip.
    for (payload, count) in [("0", "2"), ("100000", "2")] {
        let out = ping_until_ok(
            &dir,
            &mut server,
            service,
            &["--count", count, "--interval-ms", "0", "--payload", payload],
        );
        let report = out.describe();
        assert_eq!(out.status.code(), Some(0), "{report}");
        assert!(
            out.stdout
                .starts_with(&format!("PING {service} ({payload} bytes of payload)")),
            "{report}"
        );
        assert_eq!(
            count_lines(&out.stdout, &format!("{payload} bytes from {service}:")),
            2,
            "{report}"
        );
        assert!(
            out.stdout.lines().any(|l| l == "2 calls, 2 ok, 0 failed"),
            "{report}"
        );
    }

    // A zero deadline has always expired when the call is sent: DEADLINE_EXCEEDED.
    let out = run(
        &dir,
        &[
            "ping",
            service,
            "--count",
            "2",
            "--interval-ms",
            "0",
            "--deadline-ms",
            "0",
        ],
        SHORT,
    );
    assert_all_failed(&out, 2, "DEADLINE_EXCEEDED");

    // Larger than the server's maximum message (4 MiB by default): RESOURCE_EXHAUSTED.
    let out = run(
        &dir,
        &[
            "ping",
            service,
            "--count",
            "1",
            "--interval-ms",
            "0",
            "--payload",
            "5000000",
        ],
        SHORT,
    );
    assert_all_failed(&out, 1, "RESOURCE_EXHAUSTED");

    // The failed calls did not hurt the server: it still answers, then stops cleanly.
    let out = run(
        &dir,
        &["ping", service, "--count", "1", "--interval-ms", "0"],
        SHORT,
    );
    assert_eq!(out.status.code(), Some(0), "{}", out.describe());
    stop_server(server, Signal::TERM, &dir.socket(service));
}

#[test]
fn unknown_subcommand_and_bad_args_fail_with_usage() {
    let dir = TestDir::new("usage");

    let usage_error = |args: &[&str], mention: &str| {
        let out = run(&dir, args, SHORT);
        let report = out.describe();
        assert_eq!(out.status.code(), Some(2), "usage errors exit 2\n{report}");
        assert!(out.stderr.contains("Usage:"), "{report}");
        assert!(out.stderr.contains(mention), "no `{mention}`\n{report}");
        assert!(out.stdout.is_empty(), "{report}");
    };
    usage_error(&["ping"], "<SERVICE>");
    usage_error(&["frobnicate"], "frobnicate");
    usage_error(&[], "Usage:");
    usage_error(&["echo-server"], "--service");

    // A value that does not parse: clap names it (without the usage block).
    let out = run(&dir, &["ping", "x.Y", "--count", "many"], SHORT);
    let report = out.describe();
    assert_eq!(out.status.code(), Some(2), "{report}");
    assert!(
        out.stderr.contains("invalid value 'many' for '--count"),
        "{report}"
    );
    assert!(out.stdout.is_empty(), "{report}");
    let out = run(&dir, &["ping", "x.Y", "--window", "0"], SHORT);
    let report = out.describe();
    assert_eq!(out.status.code(), Some(2), "{report}");
    assert!(
        out.stderr.contains("invalid value '0' for '--window"),
        "{report}"
    );

    // A bad service name is reported, not a crash.
    let out = run(&dir, &["echo-server", "--service", "../escape"], SHORT);
    let report = out.describe();
    assert_eq!(out.status.code(), Some(2), "{report}");
    assert!(out.stderr.contains("netless: "), "{report}");

    // --help lists the public subcommands, not the hidden peer one.
    let out = run(&dir, &["--help"], SHORT);
    let report = out.describe();
    assert_eq!(out.status.code(), Some(0), "{report}");
    for sub in ["echo-server", "ping", "bench"] {
        assert!(out.stdout.contains(sub), "no `{sub}`\n{report}");
    }
    assert!(!out.stdout.contains("bench-peer"), "{report}");
}

/// `netless bench NAME ARGS…` runs the benchmark binary for NAME when it sits beside
/// `netless`, and otherwise names the command that runs it.
#[test]
fn bench_names_or_runs_the_benchmark_binary() {
    let dir = TestDir::new("bench");
    // A `netless` alone in a directory (a hard link, or a copy across file systems).
    let alone = dir.path.join("netless");
    if std::fs::hard_link(BIN, &alone).is_err() {
        std::fs::copy(BIN, &alone).expect("copying netless");
    }
    let alone = alone.to_str().expect("a UTF-8 temp path");

    let out = netless_testing::run(alone, &dir, &["bench", "echo", "--calls", "0"], SHORT);
    let report = out.describe();
    assert_eq!(out.status.code(), Some(2), "{report}");
    assert!(
        out.stderr
            .contains("cargo run --release -p netless-benchmarks --bin echo_latency -- --calls 0"),
        "{report}"
    );
    assert!(out.stdout.is_empty(), "{report}");

    let out = netless_testing::run(alone, &dir, &["bench", "frobnicate"], SHORT);
    let report = out.describe();
    assert_eq!(out.status.code(), Some(2), "{report}");
    assert!(out.stderr.contains("no benchmark `frobnicate`"), "{report}");
    for name in [
        "echo", "grpc", "split", "dmrpc", "kvs", "dagger", "hosts", "images",
    ] {
        assert!(out.stderr.contains(name), "{report}");
    }

    // With the binary beside it, it runs in netless's place with the arguments as given
    // (here a `batching` that is echo(1), so that what it was given shows).
    std::os::unix::fs::symlink("/bin/echo", dir.path.join("batching")).unwrap();
    let args = ["bench", "dagger", "--quick", "--json", "x y"];
    let out = netless_testing::run(alone, &dir, &args, SHORT);
    let report = out.describe();
    assert_eq!(out.status.code(), Some(0), "{report}");
    assert_eq!(out.stdout, "--quick --json x y\n", "{report}");
}

/// The `netless` binary these tests run is the one users get: built without the netless
/// crate's test-only fault-injection hooks. Cargo builds them into every crate of a run that
/// also builds the netless crate's own tests (which enable them), so `scripts/test` runs
/// those apart.
#[test]
fn the_binary_under_test_has_no_fault_injection_hooks() {
    assert!(
        !netless::fault_injection_enabled(),
        "netless was built with its fault-injection hooks: test the binaries without the \
         netless crate's own tests (cargo test --workspace --exclude netless), as \
         scripts/test does"
    );
}
