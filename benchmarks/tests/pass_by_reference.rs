//! End-to-end test of `pass_by_reference --quick`: the real binary, its tiers in one domain
//! in a private socket directory (`NETLESS_DIR`), and the copies it counts. It checks
//! behaviour (every row present and verified, the bytes each variant copies), never speed.

use std::time::Duration;

use netless_testing::{run, TestDir};

const BIN: &str = env!("CARGO_BIN_EXE_pass_by_reference");

#[test]
fn passes_by_reference_and_counts_the_copies() {
    let dir = TestDir::new("dmrpc");
    let json_path = dir.path.join("dmrpc.json");
    let svg_path = dir.path.join("dmrpc.svg");
    let out = run(
        BIN,
        &dir,
        &[
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
    // ... and again through a memory fabric's pool.
    let fabric = v["transfer_fabric"]
        .as_array()
        .expect("fabric transfer rows");
    assert_eq!(fabric.len(), 2, "{text}");
    for row in transfer.iter().chain(fabric) {
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
