//! End-to-end tests of `netless stat` and `netless ctl` against a real `netless echo-server`,
//! each in its own private socket directory (`NETLESS_DIR`), with bounded waits only (see
//! `common` for how the processes are run and killed).

mod common;

use rustix::process::Signal;
use serde_json::Value;

use common::*;

/// Starts `netless echo-server --service <service> <extra>` and waits until `netless stat`
/// can read it (which makes no call, so the server's counters stay at zero).
fn start_server(dir: &TestDir, service: &str, extra: &[&str]) -> Proc {
    let mut args = vec!["echo-server", "--service", service];
    args.extend_from_slice(extra);
    let mut server = spawn(dir, &args);
    run_until_ok(dir, &mut server, &["stat", service, "--json"]);
    server
}

/// `netless stat <service> --json`: the one replica's object.
fn stat(dir: &TestDir, service: &str) -> Value {
    let out = run(dir, &["stat", service, "--json"], SHORT).ok();
    let json = out.json();
    let services = json["services"].as_array().expect("services array");
    assert_eq!(services.len(), 1, "{}", out.describe());
    services[0].clone()
}

fn counter(replica: &Value, key: &str) -> u64 {
    replica[key]
        .as_u64()
        .unwrap_or_else(|| panic!("`{key}` is not a count in {replica:#}"))
}

#[test]
fn stat_counts_calls_and_ctl_reads_and_sets_registers() {
    let dir = TestDir::new("s");
    let service = "t.Stat";
    let server = start_server(&dir, service, &[]);
    run(
        &dir,
        &[
            "ping",
            service,
            "--count",
            "37",
            "--payload",
            "100",
            "--interval-ms",
            "0",
        ],
        SHORT,
    )
    .ok();

    // Read before any ctl call: control calls are served, and counted, like others.
    let s = stat(&dir, service);
    let report = format!("{s:#}");
    assert_eq!(s["service"], service, "{report}");
    assert_eq!(counter(&s, "calls"), 37, "{report}");
    assert_eq!(counter(&s, "errors"), 0, "{report}");
    assert_eq!(s["by_code"], serde_json::json!({ "OK": 37 }), "{report}");
    let bytes_in = counter(&s, "bytes_in");
    assert!((37 * 100..37 * 200).contains(&bytes_in), "{report}");
    assert!(counter(&s, "bytes_out") >= 37 * 100, "{report}");
    assert_eq!(counter(&s, "workers"), 1, "{report}");
    assert!(counter(&s, "entries") >= 1, "{report}");
    assert_eq!(
        s["batch_sizes"].as_array().map(Vec::len),
        Some(9),
        "{report}"
    );
    assert!(
        s["mean_batch"].as_f64().is_some_and(|b| b >= 1.0),
        "{report}"
    );
    assert!(s["registers"]["batch"].is_string(), "{report}");
    assert_eq!(s["registers"]["wait"], "adaptive", "{report}");

    // Every service, as text: one block per refresh, and no escapes when not on a terminal.
    let out = run(
        &dir,
        &["stat", "--count", "2", "--interval-ms", "50"],
        SHORT,
    )
    .ok();
    let report = out.describe();
    assert!(out.stdout.contains("refresh 2/2"), "{report}");
    assert_eq!(out.stdout.matches("SERVICE").count(), 2, "{report}");
    assert_eq!(
        out.stdout
            .lines()
            .filter(|l| l.starts_with("t.Stat "))
            .count(),
        2,
        "{report}"
    );
    assert!(!out.stdout.contains('\x1b'), "{report}");

    let out = run(&dir, &["ctl", service, "get"], SHORT).ok();
    let report = out.describe();
    for key in [
        "batch=",
        "batch_mode=",
        "wait=adaptive",
        "spin_us=",
        "slo_us=",
        "depth_limit=",
        "max_connections=",
    ] {
        assert!(
            out.stdout.lines().any(|l| l.starts_with(key)),
            "no `{key}`\n{report}"
        );
    }
    assert!(out.stdout.contains("how idle workers wait"), "{report}");

    let out = run(&dir, &["ctl", service, "set", "wait=futex"], SHORT).ok();
    assert!(out.stdout.contains("wait=futex "), "{}", out.describe());
    let out = run(&dir, &["ctl", service, "get"], SHORT).ok();
    assert!(out.stdout.contains("wait=futex "), "{}", out.describe());
    assert_eq!(stat(&dir, service)["registers"]["wait"], "futex");

    let out = run(&dir, &["ctl", service, "set", "colour=blue"], SHORT);
    assert_eq!(out.status.code(), Some(2), "{}", out.describe());
    assert!(
        out.stderr.contains("unknown register `colour`")
            && out.stderr.contains("known: batch, batch_mode, wait"),
        "{}",
        out.describe()
    );
    let out = run(&dir, &["ctl", service, "set", "batch=0"], SHORT);
    assert_eq!(out.status.code(), Some(2), "{}", out.describe());
    assert!(out.stderr.contains("1..=256"), "{}", out.describe());

    // Settings apply in order; the first refused one stops the command.
    let out = run(
        &dir,
        &["ctl", service, "set", "batch=4", "wait=never"],
        SHORT,
    );
    assert_eq!(out.status.code(), Some(2), "{}", out.describe());
    assert!(out.stderr.contains("batch=4 applied"), "{}", out.describe());
    assert_eq!(stat(&dir, service)["registers"]["batch"], "4");

    let dir_name = dir.path.display().to_string();
    for args in [
        &["ctl", "t.Nobody", "get"][..],
        &["stat", "t.Nobody", "--json"],
        &["ctl", service, "--replica", "3", "get"],
    ] {
        let out = run(&dir, args, SHORT);
        assert_eq!(out.status.code(), Some(2), "{}", out.describe());
        assert!(
            out.stderr.contains("not found in") && out.stderr.contains(&dir_name),
            "{}",
            out.describe()
        );
    }
    server.stop(Signal::TERM);
}

/// `ping --window`: pipelined calls in fixed batches of 8, each counted once with its bytes
/// (a batch's OK calls are counted together, before its replies go out).
#[test]
fn pipelined_ping_is_counted_call_by_call() {
    let dir = TestDir::new("p");
    let service = "t.Pipe";
    let server = start_server(&dir, service, &[]);
    run(
        &dir,
        &["ctl", service, "set", "batch_mode=fixed", "batch=8"],
        SHORT,
    )
    .ok();
    let ok = |s: &Value| s["by_code"]["OK"].as_u64().unwrap_or(0);
    let before = stat(&dir, service);
    for (window, count) in [("64", "3001"), ("200", "5000")] {
        let out = run(
            &dir,
            &[
                "ping",
                service,
                "--window",
                window,
                "--count",
                count,
                "--payload",
                "100",
            ],
            SHORT,
        )
        .ok();
        assert!(
            out.stdout
                .contains(&format!("{count} calls, {count} ok, 0 failed")),
            "{}",
            out.describe()
        );
    }
    let s = stat(&dir, service);
    let delta = |key: &str| counter(&s, key) - counter(&before, key);
    assert_eq!(delta("calls"), 8001, "{s:#}");
    assert_eq!(ok(&s) - ok(&before), 8001, "{s:#}");
    assert_eq!(delta("errors"), 0, "{s:#}");
    assert_eq!(delta("bytes_out"), 8001 * 100, "{s:#}");
    // Requests carry the method's name too, except a batched one repeating it.
    assert!(
        (8001 * 100..=8001 * 104).contains(&delta("bytes_in")),
        "{s:#}"
    );
    assert!(
        delta("calls") > 2 * delta("entries"),
        "pipelined calls were not batched\n{s:#}"
    );
    server.stop(Signal::TERM);
}

#[test]
fn ctl_wait_change_takes_effect_under_load() {
    let dir = TestDir::new("w");
    let service = "t.Wait";
    let server = start_server(&dir, service, &["--wait-mode", "spin"]);
    let load = ["ping", service, "--count", "60", "--interval-ms", "2"];
    let s = stat(&dir, service);
    assert_eq!(s["registers"]["wait"], "spin", "{s:#}");
    let before = counter(&s, "sleeps");

    // Spinning workers never sleep, however far apart the requests.
    run(&dir, &load, SHORT).ok();
    let s = stat(&dir, service);
    assert_eq!(counter(&s, "calls"), 60, "{s:#}");
    let spun = counter(&s, "sleeps");
    assert_eq!(spun, before, "a spinning worker slept\n{s:#}");

    // The same load after `wait=futex`: the worker sleeps between requests.
    let out = run(&dir, &["ctl", service, "set", "wait=futex"], SHORT).ok();
    assert!(out.stdout.contains("wait=futex "), "{}", out.describe());
    run(&dir, &load, SHORT).ok();
    let s = stat(&dir, service);
    assert_eq!(s["registers"]["wait"], "futex", "{s:#}");
    let slept = counter(&s, "sleeps") - spun;
    assert!(
        slept >= 20,
        "only {slept} sleeps over 60 requests 2 ms apart\n{s:#}"
    );
    server.stop(Signal::TERM);
}
