//! End-to-end tests of the `netless` binary: every test runs the real executable as separate
//! processes, in its own private socket directory (`NETLESS_DIR`), with bounded waits only
//! (see `common` for how the processes are run and killed).

mod common;

use std::path::Path;
use std::time::Duration;

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
fn bench_echo_writes_json_in_the_documented_shape() {
    let dir = TestDir::new("bench");
    let json_path = dir.path.join("echo.json");
    let json_arg = json_path.to_str().expect("utf-8 temp path");
    let out = run(
        &dir,
        &[
            "bench", "echo", "--calls", "300", "--rounds", "2", "--quiet", "--json", json_arg,
        ],
        Duration::from_secs(120),
    );
    let report = out.describe();
    assert_eq!(out.status.code(), Some(0), "{report}");

    // The table.
    assert!(
        out.stdout.contains("speed-up vs grpc-http2 (p50)"),
        "{report}"
    );
    for header in ["transport", "payload", "calls", "p50 µs", "p99 µs"] {
        assert!(out.stdout.contains(header), "no `{header}`\n{report}");
    }
    for transport in ["grpc-http2", "netless-proto", "netless-raw", "floor"] {
        assert!(
            out.stdout.lines().any(|l| l.starts_with(transport)),
            "no table row for {transport}\n{report}"
        );
    }

    // The JSON.
    let text = std::fs::read_to_string(&json_path)
        .unwrap_or_else(|e| panic!("reading {}: {e}\n{report}", json_path.display()));
    let v: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("bad JSON: {e}\n{text}"));
    assert_eq!(v["experiment"], "echo", "{text}");
    assert!(v["machine"].is_object(), "{text}");
    let rows = v["rows"].as_array().unwrap_or_else(|| panic!("{text}"));

    let mut got: Vec<(String, u64)> = Vec::new();
    for row in rows {
        let transport = row["transport"]
            .as_str()
            .unwrap_or_else(|| panic!("row without a transport: {row}"));
        let num = |key: &str| {
            row[key]
                .as_f64()
                .unwrap_or_else(|| panic!("`{key}` is not a number in {row}"))
        };
        let payload = row["payload_bytes"]
            .as_u64()
            .unwrap_or_else(|| panic!("`payload_bytes` is not an integer in {row}"));
        let calls = row["calls"]
            .as_u64()
            .unwrap_or_else(|| panic!("`calls` is not an integer in {row}"));
        assert_eq!(calls, 300, "every row records --calls calls: {row}");
        let (avg, p50, p99, p999) = (num("avg_us"), num("p50_us"), num("p99_us"), num("p999_us"));
        assert!(avg > 0.0, "{row}");
        assert!(
            0.0 < p50 && p50 <= p99 && p99 <= p999,
            "percentiles out of order: {row}"
        );
        got.push((transport.to_string(), payload));
    }
    got.sort();
    let mut want: Vec<(String, u64)> = [
        ("grpc-http2", 64),
        ("netless-proto", 64),
        ("netless-raw", 64),
        ("floor", 64),
        ("grpc-http2", 4096),
        ("netless-proto", 4096),
        ("netless-raw", 4096),
    ]
    .iter()
    .map(|(t, p)| (t.to_string(), *p))
    .collect();
    want.sort();
    assert_eq!(got, want, "{text}");
}

#[test]
fn bench_grpc_compares_tcp_netless_and_the_gateway() {
    let dir = TestDir::new("bgrpc");
    let json_path = dir.path.join("grpc.json");
    let json_arg = json_path.to_str().expect("utf-8 temp path");
    let out = run(
        &dir,
        &[
            "bench",
            "grpc",
            "--calls",
            "200",
            "--throughput-calls",
            "500",
            "--json",
            json_arg,
        ],
        Duration::from_secs(120),
    );
    let report = out.describe();
    assert_eq!(out.status.code(), Some(0), "{report}");
    let text = std::fs::read_to_string(&json_path).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["experiment"], "grpc", "{text}");
    let mut got: Vec<(String, u64)> = v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            assert!(row["p50_us"].as_f64().unwrap() > 0.0, "{row}");
            assert!(
                row["throughput_calls_per_s"].as_f64().unwrap() > 0.0,
                "{row}"
            );
            (
                row["transport"].as_str().unwrap().to_string(),
                row["payload_bytes"].as_u64().unwrap(),
            )
        })
        .collect();
    got.sort();
    let mut want: Vec<(String, u64)> = ["tonic-tcp", "tonic-netless", "tcp-gateway-netless"]
        .iter()
        .flat_map(|t| [(t.to_string(), 64), (t.to_string(), 4096)])
        .collect();
    want.sort();
    assert_eq!(got, want, "{text}");
}

#[test]
fn bench_split_measures_every_point_and_draws_the_plot() {
    let dir = TestDir::new("bsplit");
    let json_path = dir.path.join("split.json");
    let svg_path = dir.path.join("split.svg");
    let out = run(
        &dir,
        &[
            "bench",
            "split",
            "--duration-ms",
            "60",
            "--in-flight",
            "4",
            "--json",
            json_path.to_str().unwrap(),
            "--plot",
            svg_path.to_str().unwrap(),
        ],
        Duration::from_secs(180),
    );
    let report = out.describe();
    assert_eq!(out.status.code(), Some(0), "{report}");
    assert!(out.stdout.contains("knee (1 KiB, split)"), "{report}");
    let text = std::fs::read_to_string(&json_path).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let rows = v["rows"].as_array().unwrap();
    // 7 business-logic times x 2 messages x 2 setups.
    assert_eq!(rows.len(), 28, "{text}");
    for row in rows {
        assert!(row["calls"].as_u64().unwrap() > 0, "{row}");
        assert!(
            row["p50_us"].as_f64().unwrap() <= row["p99_us"].as_f64().unwrap(),
            "{row}"
        );
    }
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("baseline") && svg.contains("split"));
}

#[test]
fn bench_dmrpc_passes_by_reference_and_counts_the_copies() {
    let dir = TestDir::new("bdmrpc");
    let json_path = dir.path.join("dmrpc.json");
    let svg_path = dir.path.join("dmrpc.svg");
    let out = run(
        &dir,
        &[
            "bench",
            "dmrpc",
            "--quick",
            "--json",
            json_path.to_str().unwrap(),
            "--plot",
            svg_path.to_str().unwrap(),
        ],
        Duration::from_secs(180),
    );
    let report = out.describe();
    assert_eq!(out.status.code(), Some(0), "{report}");
    assert!(out.stdout.contains("Acceptance figures"), "{report}");
    let text = std::fs::read_to_string(&json_path).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["experiment"], "dmrpc", "{text}");
    let rows = v["rows"].as_array().unwrap();
    let of = |experiment: &str, variant: &str| -> Vec<&serde_json::Value> {
        rows.iter()
            .filter(|r| r["experiment"] == experiment && r["variant"] == variant)
            .collect()
    };
    let f = |row: &serde_json::Value, key: &str| -> f64 {
        row[key]
            .as_f64()
            .unwrap_or_else(|| panic!("{key} missing in {row}"))
    };
    // 3 sizes x 7 hops; 2 sizes x 3 write fractions; 4 payload sizes; two variants each.
    for (experiment, variants, n) in [
        ("nested_chain", ["by_value", "by_ref"], 21),
        ("cow", ["cow", "copy"], 6),
        ("load_balancer", ["by_value", "by_ref"], 4),
    ] {
        for variant in variants {
            assert_eq!(
                of(experiment, variant).len(),
                n,
                "{experiment}/{variant}: {text}"
            );
        }
    }
    assert_eq!(rows.len(), 62, "{text}");
    // The crossover experiment measured both variants at each of its sizes (every reply's
    // sum was checked by the benchmark itself).
    let transfer = v["transfer"].as_array().expect("transfer rows");
    assert_eq!(transfer.len(), 2, "{text}");
    for row in transfer {
        assert!(
            f(row, "by_value_p50_us") > 0.0 && f(row, "by_ref_p50_us") > 0.0,
            "{row}"
        );
    }
    for row in rows {
        // Every reply was checked: the sums in the chain and the load balancer, what the
        // callee saw and the client's buffer afterwards in the cow experiment.
        assert_eq!(row["verified"], true, "{row}");
        assert!(row["calls"].as_u64().unwrap() > 0, "{row}");
        assert!(f(row, "throughput_per_s") > 0.0, "{row}");
        assert!(f(row, "p50_us") <= f(row, "p99_us"), "{row}");
    }
    // Retried calls (a full receive buffer) may have been forwarded part of the way: exact
    // counts hold only for rows without retries.
    let exact = |row: &serde_json::Value| row["retries"].as_u64() == Some(0);

    // The chain: by value every hop copies the array once; by reference only the 32-byte
    // Ref travels, and nobody copies anything (the last tier sums the pages in place).
    for row in of("nested_chain", "by_value") {
        let copied = f(row, "size_bytes") * f(row, "hops");
        if exact(row) {
            assert_eq!(f(row, "payload_bytes_copied_per_call"), copied, "{row}");
        }
        assert!(f(row, "payload_bytes_copied_per_call") >= copied, "{row}");
        assert_eq!(f(row, "handle_bytes_per_call"), 0.0, "{row}");
    }
    for row in of("nested_chain", "by_ref") {
        assert_eq!(f(row, "bytes_copied_per_call"), 0.0, "{row}");
        if exact(row) {
            assert_eq!(f(row, "maps_per_call"), 1.0, "{row}");
        }
        assert_eq!(f(row, "payload_bytes_copied_per_call"), 0.0, "{row}");
        assert_eq!(f(row, "pool_bytes_copied_per_call"), 0.0, "{row}");
        if exact(row) {
            assert_eq!(
                f(row, "handle_bytes_per_call"),
                32.0 * f(row, "hops"),
                "{row}"
            );
        }
    }

    // The load balancer: by reference the forwarder copies no payload bytes and no pool
    // bytes, and forwards 32 bytes per request; by value it copies each payload once.
    for row in rows.iter().filter(|r| r["experiment"] == "load_balancer") {
        assert!(f(row, "forwarder_cpu_us_per_call") >= 0.0, "{row}");
    }
    for row in of("load_balancer", "by_ref") {
        assert_eq!(
            f(row, "forwarder_payload_bytes_copied_per_call"),
            0.0,
            "{row}"
        );
        assert_eq!(f(row, "forwarder_pool_bytes_copied_per_call"), 0.0, "{row}");
        assert_eq!(f(row, "forwarder_bytes_copied_per_call"), 0.0, "{row}");
        if exact(row) {
            assert_eq!(f(row, "forwarder_handle_bytes_per_call"), 32.0, "{row}");
        }
    }
    for row in of("load_balancer", "by_value") {
        if exact(row) {
            assert_eq!(
                f(row, "forwarder_payload_bytes_copied_per_call"),
                f(row, "size_bytes"),
                "{row}"
            );
        }
        assert_eq!(f(row, "forwarder_handle_bytes_per_call"), 0.0, "{row}");
    }

    // Copy-on-write copies the pages written, and only those; the copy variant copies the
    // whole buffer first and then writes its private copy in place.
    for row in of("cow", "cow") {
        let written = f(row, "size_bytes") * f(row, "write_fraction");
        assert_eq!(f(row, "pool_bytes_copied_per_call"), written, "{row}");
        assert_eq!(f(row, "pages_copied_per_call"), written / 4096.0, "{row}");
        assert_eq!(f(row, "copy_us"), 0.0, "{row}");
    }
    for row in of("cow", "copy") {
        let written = f(row, "size_bytes") * f(row, "write_fraction");
        assert_eq!(
            f(row, "pool_bytes_copied_per_call"),
            f(row, "size_bytes") + written,
            "{row}"
        );
        assert_eq!(f(row, "pages_copied_per_call"), 0.0, "{row}");
    }
    for key in [
        "chain_7hop_64k_ref_over_value",
        "cow_1m_0pct_ops_ratio",
        "create_ref_speedup_1m",
    ] {
        assert!(v["summary"][key].as_f64().is_some(), "{key}: {text}");
    }
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("by value") && svg.contains("by ref"));
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
    usage_error(&["bench", "echo", "--no-such-flag"], "--no-such-flag");

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

    // Arguments that parse but make no sense: an error, not a panic.
    let out = run(&dir, &["bench", "echo", "--calls", "0"], SHORT);
    let report = out.describe();
    assert_eq!(out.status.code(), Some(2), "{report}");
    assert!(out.stderr.starts_with("netless: "), "{report}");
    assert!(out.stderr.contains("--calls"), "{report}");

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
