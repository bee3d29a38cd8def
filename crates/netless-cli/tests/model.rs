//! Tests of the queueing-model commands, `netless size` and `netless sim`, run as the real
//! binary with bounded waits: the paper's worked example, input validation, the simulator's
//! Erlang-C self-check, the Table I shape and the JSON report.

mod common;

use std::time::Duration;

use common::*;

/// How long the `--quick` simulation may take (some 15 s of an unoptimised build on 2 cores).
const SIMULATION: Duration = Duration::from_secs(180);

fn assert_within(what: &str, got: f64, want: f64, relative: f64) {
    let error = (got - want).abs() / want;
    assert!(
        error <= relative,
        "{what}: {got} is {:.1}% off {want}",
        error * 100.0
    );
}

#[test]
fn size_reproduces_the_nebula_worked_example() {
    let dir = TestDir::new("size");
    let out = run(
        &dir,
        &[
            "size",
            "--workers",
            "64",
            "--offered-load",
            "63",
            "--mean-msg-bytes",
            "1024",
            "--json",
        ],
        SHORT,
    );
    assert!(out.status.success(), "{}", out.describe());
    let json: serde_json::Value = serde_json::from_str(&out.stdout).expect("one JSON object");
    let number = |key: &str| {
        json[key]
            .as_f64()
            .unwrap_or_else(|| panic!("no number `{key}` in {json}"))
    };
    // NEBULA §IV-C: "for a 64-core CPU at an extreme load of A = 63, E[Nq] = 54"; §V-C: 1 KB
    // messages give "a 540KB buffer" and "a 1KB bitvector".
    assert_within("E[Nq]", number("mean_queue"), 54.0, 0.02);
    assert_within("buffer KiB", number("buffer_kib"), 540.0, 0.02);
    assert_within("utilisation", number("utilisation"), 63.0 / 64.0, 1e-12);
    let slots = number("slots");
    assert_eq!(number("buffer_bytes"), slots * 64.0);
    assert_eq!(number("bitvector_bytes"), (slots / 8.0).ceil());
    assert!(number("bitvector_bytes") < 1.1 * 1024.0, "{json}");
    assert!(number("wait_probability") > 0.0 && number("wait_probability") < 1.0);

    let text = run(
        &dir,
        &[
            "size",
            "--workers",
            "64",
            "--offered-load",
            "63",
            "--mean-msg-bytes",
            "1024",
        ],
        SHORT,
    );
    assert!(text.status.success(), "{}", text.describe());
    for figure in ["53.91 requests", "552064 bytes", "8626", "1079 bytes"] {
        assert!(
            text.stdout.contains(figure),
            "no `{figure}` in\n{}",
            text.stdout
        );
    }
}

#[test]
fn size_rejects_an_unstable_or_empty_server() {
    let dir = TestDir::new("bad");
    for load in ["64", "70"] {
        let args = [
            "size",
            "--workers",
            "64",
            "--offered-load",
            load,
            "--mean-msg-bytes",
            "1024",
        ];
        let out = run(&dir, &args, SHORT);
        assert_eq!(out.status.code(), Some(2), "{}", out.describe());
        assert!(
            out.stderr.contains("must be below") && out.stderr.contains("without bound"),
            "{}",
            out.describe()
        );
    }
    for args in [
        [
            "--workers",
            "0",
            "--offered-load",
            "0.5",
            "--mean-msg-bytes",
            "64",
        ],
        [
            "--workers",
            "4",
            "--offered-load",
            "0",
            "--mean-msg-bytes",
            "64",
        ],
        [
            "--workers",
            "4",
            "--offered-load",
            "2",
            "--mean-msg-bytes",
            "0",
        ],
    ] {
        let out = run(&dir, &[&["size"], &args[..]].concat(), SHORT);
        assert_eq!(out.status.code(), Some(2), "{}", out.describe());
        assert!(out.stderr.contains("must be"), "{}", out.describe());
    }
}

#[test]
fn sim_rejects_an_unstable_load() {
    let dir = TestDir::new("unstable");
    let out = run(&dir, &["sim", "--loads", "0.5,1.2"], SHORT);
    assert_eq!(out.status.code(), Some(2), "{}", out.describe());
    assert!(out.stderr.contains("without bound"), "{}", out.describe());
}

#[test]
fn sim_skips_the_erlang_c_check_where_it_does_not_apply() {
    let dir = TestDir::new("skip");
    let out = run(
        &dir,
        &[
            "sim",
            "--workers",
            "4",
            "--dist",
            "deterministic",
            "--dispatch",
            "partitioned",
            "--loads",
            "0.5",
            "--requests",
            "2000",
        ],
        SHORT,
    );
    assert!(out.status.success(), "{}", out.describe());
    assert!(out.stdout.contains("check not run"), "{}", out.describe());
}

/// One `--quick` run at 16 and 64 workers: every check row passes, Table I is printed for
/// each worker count and dispatch, and the JSON report holds the same rows. The run is
/// deterministic (default seed), and its check rows' relative errors have standard
/// deviations of 1.0–1.3% (over 26 seeds), so 5% is 3.8 or more of them away for any seed.
#[test]
fn sim_quick_agrees_with_erlang_c_and_prints_table_one() {
    let dir = TestDir::new("sim");
    let json_path = dir.path.join("sim.json");
    let json_arg = json_path.to_str().expect("a UTF-8 temp path");
    let out = run(
        &dir,
        &["sim", "--quick", "--workers", "16,64", "--json", json_arg],
        SIMULATION,
    );
    let report = std::fs::read_to_string(&json_path);
    assert!(out.status.success(), "{}", out.describe());

    for k in ["16", "64"] {
        let rows: Vec<&str> = out
            .stdout
            .lines()
            .filter(|line| line.split_whitespace().next() == Some(k))
            .filter(|line| line.ends_with("PASS") || line.ends_with("FAIL"))
            .collect();
        assert_eq!(rows.len(), 2, "check rows for k = {k}:\n{}", out.stdout);
        assert!(rows.iter().all(|row| row.ends_with("PASS")), "{rows:#?}");
    }
    let tables = out
        .stdout
        .lines()
        .filter(|line| line.contains("Max Load @ SLO") && line.contains("99th% Q. Depth @ SLO"))
        .count();
    assert_eq!(tables, 4, "one Table I per k and dispatch:\n{}", out.stdout);
    for row in ["Deterministic", "Exponential", "Bimodal"] {
        assert_eq!(
            out.stdout
                .lines()
                .filter(|l| l.trim_start().starts_with(row))
                .count(),
            4,
            "{row} rows:\n{}",
            out.stdout
        );
    }

    let report: serde_json::Value =
        serde_json::from_str(&report.expect("the JSON report was written")).expect("valid JSON");
    assert_eq!(
        report["points"].as_array().map(Vec::len),
        Some(2 * 3 * 2 * 9)
    );
    assert_eq!(report["check_passed"], serde_json::Value::Bool(true));
    let check = report["erlang_c_check"].as_array().expect("check rows");
    assert_eq!(check.len(), 4);
    for row in check {
        let error = row["relative_error"].as_f64().expect("relative_error");
        assert!(error.abs() <= 0.05, "{row}");
    }
    // Pooling: one shared queue sustains a higher load under the SLO than random
    // partitioning, for every k and service-time distribution.
    let slo = report["max_load_at_slo"].as_array().expect("SLO rows");
    assert_eq!(slo.len(), 2 * 2 * 3);
    let max_load = |k: u64, dispatch: &str, distribution: &str| {
        slo.iter()
            .find(|row| {
                row["workers"] == k
                    && row["dispatch"] == dispatch
                    && row["distribution"] == distribution
            })
            .and_then(|row| row["max_load"].as_f64())
            .unwrap_or_else(|| panic!("no max load for {k} {dispatch} {distribution}"))
    };
    for k in [16, 64] {
        for distribution in ["deterministic", "exponential", "bimodal"] {
            let single = max_load(k, "single", distribution);
            let partitioned = max_load(k, "partitioned", distribution);
            assert!(
                single > partitioned,
                "{k} {distribution}: {single} ≤ {partitioned}"
            );
        }
    }
}
