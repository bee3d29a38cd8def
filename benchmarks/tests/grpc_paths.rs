//! End-to-end test of `grpc_paths`: the real binary, its servers and the user's gateway in
//! a private socket directory (`NETLESS_DIR`), and the JSON it writes.

use std::time::Duration;

use netless_testing::{run, TestDir};

const BIN: &str = env!("CARGO_BIN_EXE_grpc_paths");

#[test]
fn compares_tcp_netless_and_the_gateway() {
    let dir = TestDir::new("grpc");
    let json_path = dir.path.join("grpc.json");
    let json_arg = json_path.to_str().expect("utf-8 temp path");
    let out = run(
        BIN,
        &dir,
        &[
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
