//! End-to-end test of `split_offload`: the real binary, the baseline server, the business
//! logic and the user's gateway in a private socket directory (`NETLESS_DIR`), the table,
//! the JSON and the plot.

use std::time::Duration;

use netless_testing::{run, TestDir};

const BIN: &str = env!("CARGO_BIN_EXE_split_offload");

#[test]
fn measures_every_point_and_draws_the_plot() {
    let dir = TestDir::new("split");
    let json_path = dir.path.join("split.json");
    let svg_path = dir.path.join("split.svg");
    let out = run(
        BIN,
        &dir,
        &[
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
