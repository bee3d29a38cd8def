//! End-to-end test of `cross_host --quick`: the real binary, its two hosts (network
//! namespaces), gateways, memory node, tiers and client, and the JSON it writes: every
//! point measured both ways with no failed call, and the latency paths all answered. Needs
//! root and `ip`; without them the test says `SKIPPED:` and passes.

use std::time::Duration;

use netless_testing::{run, TestDir, TwoHosts};

const BIN: &str = env!("CARGO_BIN_EXE_cross_host");

#[test]
fn measures_the_chain_both_ways_across_two_hosts() {
    if let Err(why) = TwoHosts::new("probe") {
        println!("SKIPPED: {why}");
        return;
    }
    let dir = TestDir::new("cross-host");
    let json_path = dir.path.join("cross.json");
    let json_arg = json_path.to_str().expect("utf-8 temp path");
    let out = run(
        BIN,
        &dir,
        &["--quick", "--json", json_arg],
        Duration::from_secs(300),
    );
    let report = out.describe();
    assert_eq!(out.status.code(), Some(0), "{report}");
    let text = std::fs::read_to_string(&json_path).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["experiment"], "cross_host", "{text}");
    let chain = v["chain"].as_array().unwrap();
    let mut points: Vec<(u64, u64)> = chain
        .iter()
        .map(|p| (p["hops"].as_u64().unwrap(), p["size"].as_u64().unwrap()))
        .collect();
    points.sort();
    assert_eq!(
        points,
        [(1, 65536), (1, 1 << 20), (7, 65536), (7, 1 << 20)],
        "{text}"
    );
    for (p, rounds) in chain.iter().zip(v["chain_rounds"].as_array().unwrap()) {
        for side in ["by_value", "by_ref"] {
            assert_eq!(p[side]["errors"], 0, "{side} of {rounds}");
            assert!(
                p[side]["calls_per_s"].as_f64().unwrap() > 0.0,
                "{side} of {p}"
            );
        }
    }
    let latency = v["latency"].as_array().unwrap();
    let vias: Vec<&str> = latency.iter().map(|l| l["via"].as_str().unwrap()).collect();
    assert_eq!(vias, ["local", "egress", "direct"], "{text}");
    for l in latency {
        for round in l["rounds"].as_array().unwrap() {
            assert_eq!(round["errors"], 0, "{l}");
            assert!(round["p50_us"].as_f64().unwrap() > 0.0, "{l}");
        }
    }
}
