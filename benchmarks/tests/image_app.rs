//! End-to-end test of `image_app --quick`: the real binary, its fourteen tier processes (a
//! tcp and a netless chain of seven) and its client, and the JSON it writes: every transport
//! measured (unloaded, closed loop and every offered load), no failed call, and every
//! receipt the store answered matching what the pipeline computes locally on the same
//! picture (size, length and checksum of the stored JPEG). It asserts behaviour, not speed.

use std::time::Duration;

use netless_testing::{run, TestDir};

const BIN: &str = env!("CARGO_BIN_EXE_image_app");

#[test]
fn runs_the_image_service_over_three_transports_and_stores_the_right_pictures() {
    let dir = TestDir::new("image-app");
    let json_path = dir.path.join("images.json");
    let plot_path = dir.path.join("images.svg");
    let out = run(
        BIN,
        &dir,
        &[
            "--quick",
            "--json",
            json_path.to_str().expect("utf-8 temp path"),
            "--plot",
            plot_path.to_str().expect("utf-8 temp path"),
        ],
        Duration::from_secs(300),
    );
    let report = out.describe();
    assert_eq!(out.status.code(), Some(0), "{report}");
    let text = std::fs::read_to_string(&json_path).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["experiment"], "image_app", "{text}");
    let transports = ["tcp", "by_value", "by_ref"];

    let summary = v["summary"].as_array().unwrap();
    let names: Vec<&str> = summary
        .iter()
        .map(|s| s["transport"].as_str().unwrap())
        .collect();
    assert_eq!(names, transports, "{text}");
    for s in summary {
        assert_eq!(s["errors"], 0, "{s}");
        assert_eq!(s["mismatches"], 0, "{s}");
        assert!(s["unloaded_p50_us"].as_f64().unwrap() > 0.0, "{s}");
        assert!(s["closed_loop_peak_per_s"].as_f64().unwrap() > 0.0, "{s}");
        assert!(
            s["at"]["cpu_ms_per_request"].as_f64().unwrap() >= 0.0,
            "{s}"
        );
    }

    // Every reply of every window was checked against the local pipeline, and every window
    // that made calls had replies.
    let mut windows = Vec::new();
    for key in ["unloaded", "peaks"] {
        windows.extend(v[key].as_array().unwrap().iter().map(|pair| &pair[1]));
    }
    let points = v["points"].as_array().unwrap();
    assert_eq!(points.len(), 2 * transports.len(), "two loads each: {text}");
    windows.extend(points.iter().map(|p| &p["measured"]));
    for w in windows {
        assert_eq!(w["errors"], 0, "{w}");
        assert_eq!(w["mismatches"], 0, "{w}");
        // A short open-loop window at a low rate may see no Poisson arrival at all: then
        // there is nothing to answer. Every call that was made was answered.
        let (calls, completed) = (
            w["calls"].as_u64().unwrap(),
            w["completed"].as_u64().unwrap(),
        );
        assert!(completed > 0 || calls == 0, "{w}");
    }
    for t in transports {
        let mine: Vec<_> = points.iter().filter(|p| p["transport"] == t).collect();
        assert_eq!(mine.len(), 2, "{t}: {text}");
        let answered: u64 = mine
            .iter()
            .map(|p| p["measured"]["completed"].as_u64().unwrap())
            .sum();
        assert!(answered > 0, "{t} answered no offered call: {text}");
    }
    // The windows' CPU time names all seven tiers.
    let tiers = v["tiers"].as_array().unwrap();
    assert_eq!(tiers.len(), 7, "{text}");
    let plot = std::fs::read_to_string(&plot_path).unwrap();
    assert!(
        plot.starts_with("<svg") && plot.contains("by_ref"),
        "{plot}"
    );
}
