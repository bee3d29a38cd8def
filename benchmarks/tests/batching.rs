//! End-to-end test of `batching --quick`: the real binary, its server peers in a private
//! socket directory (`NETLESS_DIR`), and the JSON it writes. It checks behaviour (every row
//! present, replies counted, batch sizes that match the settings), never speed.
//!
//! The benchmark runs in its own process group, killed with its peers if it hangs (see
//! `netless_testing`).

use std::time::Duration;

use netless_testing::{run, TestDir};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_batching");

/// How long `--quick` may take (a few seconds optimised; an unoptimised build on a busy
/// 2-core machine is much slower).
const LIMIT: Duration = Duration::from_secs(240);

fn f(row: &Value, key: &str) -> f64 {
    row[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} missing in {row}"))
}

#[test]
fn quick_measures_every_setting_with_its_batch_size() {
    let dir = TestDir::new("q");
    let json_path = dir.path.join("dagger.json");
    let svg_path = dir.path.join("dagger.svg");
    let out = run(
        BIN,
        &dir,
        &[
            "--quick",
            // Two rounds at low load (5% of the peak), one at the other loads.
            "--low-load-rounds",
            "2",
            "--json",
            json_path.to_str().unwrap(),
            "--plot",
            svg_path.to_str().unwrap(),
        ],
        LIMIT,
    );
    let report = out.describe();
    assert_eq!(out.status.code(), Some(0), "{report}");
    for title in [
        "Fig. 5",
        "Fig. 6",
        "Two client threads",
        "Acceptance figures",
    ] {
        assert!(out.stdout.contains(title), "no `{title}` table\n{report}");
    }

    let text = std::fs::read_to_string(&json_path).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["experiment"], "dagger", "{text}");
    assert_eq!(v["config"]["quick"], true, "{text}");
    assert_eq!(v["config"]["payload_bytes"], 64, "{text}");
    assert_eq!(v["config"]["pairs_dispatch"], "cpu-local", "{text}");
    assert_eq!(v["config"]["latency_rounds"], 1, "{text}");
    assert_eq!(v["config"]["low_load_rounds"], 2, "{text}");
    assert!(v["machine"]["nproc"].as_u64().is_some(), "{text}");

    // Throughput: five settings in each of the two sweeps, every one with replies counted
    // and batch sizes that match its setting.
    let throughput = v["throughput"].as_array().expect("throughput rows");
    assert_eq!(throughput.len(), 10, "{text}");
    for (experiment, threads) in [("single", 1), ("pairs", 2)] {
        let rows: Vec<&Value> = throughput
            .iter()
            .filter(|r| r["experiment"] == experiment)
            .collect();
        let settings: Vec<&str> = rows
            .iter()
            .map(|r| r["setting"].as_str().unwrap())
            .collect();
        assert_eq!(
            settings,
            ["B=1", "B=4", "B=16", "B=32", "adaptive(32)"],
            "{text}"
        );
        for row in rows {
            assert_eq!(row["client_threads"], threads, "{row}");
            // The host's pace is timed before every single-client window, and only there.
            let lone = row["round_lone_call_us"].as_array().unwrap();
            if experiment == "single" {
                assert_eq!(
                    lone.len(),
                    row["round_mrps"].as_array().unwrap().len(),
                    "{row}"
                );
                assert!(f(row, "lone_call_us") > 0.0, "{row}");
            } else {
                assert!(lone.is_empty() && row["lone_call_us"].is_null(), "{row}");
            }
            assert!(row["calls"].as_u64().unwrap() > 0, "{row}");
            assert!(f(row, "median_mrps") > 0.0, "{row}");
            assert!(
                f(row, "min_mrps") <= f(row, "median_mrps")
                    && f(row, "median_mrps") <= f(row, "max_mrps"),
                "{row}"
            );
            let batch = f(row, "batch");
            let (client, server) = (f(row, "client_mean_batch"), f(row, "server_mean_batch"));
            match row["batch_mode"].as_str().unwrap() {
                // Every batch of a fixed setting is full inside a measured window (a partial
                // one goes out only at the drain). The server's ratio is taken from counters
                // read mid-batch, so it may be off by a request at either edge.
                "fixed" => {
                    assert!(client <= batch + 1e-9, "{row}");
                    assert!(server <= batch * 1.05 + 0.01, "{row}");
                    if batch == 1.0 {
                        assert_eq!(client, 1.0, "{row}");
                        assert!((server - 1.0).abs() < 0.01, "{row}");
                    } else {
                        assert!(client > 1.0 && server > 1.0, "{row}");
                    }
                }
                "adaptive" => {
                    assert_eq!(batch, 32.0, "{row}");
                    assert!((1.0..=32.0).contains(&client), "{row}");
                    assert!((0.99..=32.0 * 1.05).contains(&server), "{row}");
                }
                other => panic!("unknown batch mode {other}: {row}"),
            }
        }
    }

    // Latency: every setting at the lowest load at least (always run), timed and with
    // p50 <= p99. A saturated point (the host stalled the client for longer than the window,
    // say) may have timed nothing: it is flagged, which is what is checked.
    let latency = v["latency"].as_array().expect("latency rows");
    for setting in ["B=1", "B=4", "adaptive(32)"] {
        let rows: Vec<&Value> = latency.iter().filter(|r| r["setting"] == setting).collect();
        assert!(
            rows.iter().any(|r| f(r, "load_fraction") == 0.05),
            "{setting} has no 5% row: {text}"
        );
        for row in rows {
            assert!(f(row, "offered_mrps") > 0.0, "{row}");
            let rounds = if f(row, "load_fraction") <= 0.1 { 2 } else { 1 };
            assert_eq!(
                row["round_p50_us"].as_array().unwrap().len(),
                rounds,
                "{row}"
            );
            let (scheduled, unsent) = (
                row["scheduled"].as_u64().unwrap(),
                row["unsent"].as_u64().unwrap(),
            );
            assert!(scheduled > 0 && unsent <= scheduled, "{row}");
            // The bench's rule: more than 0.1% of the arrivals left unsent is saturation.
            if unsent * 1000 > scheduled {
                assert_eq!(row["saturated"], true, "{row}");
            }
            if row["calls"].as_u64().unwrap() > 0 {
                assert!(f(row, "p50_us") > 0.0, "{row}");
                assert!(f(row, "p50_us") <= f(row, "p99_us"), "{row}");
            } else {
                assert_eq!(row["saturated"], true, "{row}");
            }
            let client = f(row, "client_mean_batch");
            if client == 0.0 {
                // Not a batch published in the window: only a stalled client does that.
                assert_eq!(row["saturated"], true, "{row}");
                continue;
            }
            match setting {
                "B=1" => assert_eq!(client, 1.0, "{row}"),
                "B=4" => assert!(client > 1.0 && client <= 4.0, "{row}"),
                _ => assert!((1.0..=32.0).contains(&client), "{row}"),
            }
        }
    }

    // The acceptance figures are reported with the ratios they are judged by.
    let acceptance = &v["acceptance"];
    assert!(f(acceptance, "best_mrps") > 0.0, "{text}");
    assert!(f(acceptance, "adaptive_over_best_fixed") > 0.0, "{text}");
    // The 5% load is ≤ 10% of the peak: judged by the median of the rounds' paired ratios,
    // which with two rounds is their mean.
    let low_load = acceptance["low_load"].as_array().unwrap();
    assert_eq!(low_load.len(), 1, "{text}");
    for l in low_load {
        let rounds: Vec<f64> = l["round_ratios"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r.as_f64().unwrap())
            .collect();
        assert_eq!(rounds.len(), 2, "{l}");
        assert!(f(l, "adaptive_over_b1") > 0.0, "{l}");
        assert!(f(l, "adaptive_over_b1_pooled") > 0.0, "{l}");
        let mean = (rounds[0] + rounds[1]) / 2.0;
        assert!((f(l, "adaptive_over_b1") - mean).abs() < 1e-9, "{l}");
    }
    let pace = &acceptance["pace"];
    assert!(
        f(pace, "lone_call_us_min") > 0.0
            && f(pace, "lone_call_us_min") <= f(pace, "lone_call_us_median")
            && f(pace, "lone_call_us_median") <= f(pace, "lone_call_us_max"),
        "{text}"
    );
    // Split only when the paces differ: then every window of a setting is on one side, and
    // a side has a figure exactly when it has windows.
    if !pace["split"].is_null() {
        let split = &pace["split"];
        for who in ["best", "b1"] {
            let mut windows = 0;
            for side in ["quick", "slow"] {
                let n = split[format!("{who}_{side}_windows")].as_u64().unwrap();
                let mrps = &split[format!("{who}_{side}_mrps")];
                assert_eq!(n > 0, mrps.as_f64().is_some_and(|m| m > 0.0), "{text}");
                windows += n;
            }
            assert_eq!(windows, 1, "one round with --quick: {text}");
        }
    }

    // The stats reader read while its windows ran, and its ratio is the one round's.
    let reader = &v["stats_reader"];
    assert!(reader["reads"].as_u64().unwrap() > 0, "{reader}");
    assert!(
        reader["setting"].as_str().unwrap().starts_with("B="),
        "{reader}"
    );
    assert!(f(reader, "waker_mrps") > 0.0, "{reader}");
    // Against no other thread and against a thread waking as often without reading: one
    // round each, so each paired median is that round's ratio.
    for (ratio, rounds) in [
        ("with_over_without", "round_ratios"),
        ("with_over_waker", "waker_round_ratios"),
    ] {
        let rounds = reader[rounds].as_array().unwrap();
        assert_eq!(rounds.len(), 1, "{reader}");
        assert!(f(reader, ratio) > 0.0, "{reader}");
        assert_eq!(f(reader, ratio), rounds[0].as_f64().unwrap(), "{reader}");
    }
    assert!(report.contains("stats read every"), "{report}");

    let svg = std::fs::read_to_string(&svg_path).unwrap();
    assert!(svg.starts_with("<svg"), "not an SVG");
    assert!(svg.contains("p50") && svg.contains("B=4") && svg.contains("adaptive(32)"));
}
