//! End-to-end test of `echo_latency`: the real binary, its peers (a tonic server, the
//! user's echo servers, one of them in a fabric region, the floor) in a private socket
//! directory (`NETLESS_DIR`), and the table and JSON it writes; and its usage errors.

use std::time::Duration;

use netless_testing::{run, TestDir, SHORT};

const BIN: &str = env!("CARGO_BIN_EXE_echo_latency");

#[test]
fn writes_json_in_the_documented_shape() {
    let dir = TestDir::new("echo");
    let json_path = dir.path.join("echo.json");
    let json_arg = json_path.to_str().expect("utf-8 temp path");
    let out = run(
        BIN,
        &dir,
        &[
            "--calls", "300", "--rounds", "2", "--quiet", "--json", json_arg,
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
    for transport in [
        "grpc-http2",
        "netless-proto",
        "netless-raw",
        "netless-fabric-hw",
        "floor",
    ] {
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
        ("netless-fabric-hw", 64),
        ("netless-fabric-sw", 64),
        ("floor", 64),
        ("grpc-http2", 4096),
        ("netless-proto", 4096),
        ("netless-raw", 4096),
        ("netless-fabric-hw", 4096),
        ("netless-fabric-sw", 4096),
    ]
    .iter()
    .map(|(t, p)| (t.to_string(), *p))
    .collect();
    want.sort();
    assert_eq!(got, want, "{text}");

    // The fabric rows' ratios to netless-raw, at each payload, in the table and the JSON.
    assert!(
        out.stdout
            .contains("netless-fabric-hw (netless fabric (hardware coherence)) over netless-raw"),
        "{report}"
    );
    assert!(
        out.stdout.contains(
            "netless-fabric-sw (netless fabric (software coherence, flushes)) over netless-raw"
        ),
        "{report}"
    );
    let ratios = v["fabric_vs_raw"]
        .as_array()
        .unwrap_or_else(|| panic!("{text}"));
    let mut payloads: Vec<(String, u64)> = ratios
        .iter()
        .map(|r| {
            let transport = r["transport"].as_str().unwrap_or_default().to_string();
            assert!(transport.starts_with("netless-fabric-"), "{r}");
            assert!(r["p50_over_raw"].as_f64().is_some_and(|x| x > 0.0), "{r}");
            assert!(r["p99_over_raw"].as_f64().is_some_and(|x| x > 0.0), "{r}");
            (transport, r["payload_bytes"].as_u64().unwrap())
        })
        .collect();
    payloads.sort_unstable();
    let want: Vec<(String, u64)> = ["netless-fabric-hw", "netless-fabric-sw"]
        .iter()
        .flat_map(|t| [(t.to_string(), 64), (t.to_string(), 4096)])
        .collect();
    assert_eq!(payloads, want, "{text}");
}

#[test]
fn bad_arguments_fail_with_usage_and_the_peers_stay_hidden() {
    let dir = TestDir::new("usage");
    let out = run(BIN, &dir, &["--no-such-flag"], SHORT);
    let report = out.describe();
    assert_eq!(out.status.code(), Some(2), "usage errors exit 2\n{report}");
    assert!(out.stderr.contains("Usage:"), "{report}");
    assert!(out.stderr.contains("--no-such-flag"), "{report}");
    assert!(out.stdout.is_empty(), "{report}");

    // Arguments that parse but make no sense: an error, not a panic.
    let out = run(BIN, &dir, &["--calls", "0"], SHORT);
    let report = out.describe();
    assert_eq!(out.status.code(), Some(2), "{report}");
    assert!(out.stderr.starts_with("echo_latency: "), "{report}");
    assert!(out.stderr.contains("--calls"), "{report}");

    // --help lists the benchmark's options, not the hidden peer roles.
    let out = run(BIN, &dir, &["--help"], SHORT);
    let report = out.describe();
    assert_eq!(out.status.code(), Some(0), "{report}");
    assert!(out.stdout.contains("--calls"), "{report}");
    assert!(!out.stdout.contains("peer"), "{report}");
}
