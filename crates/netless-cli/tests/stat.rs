//! End-to-end tests of `netless stat` and `netless ctl` against a real `netless echo-server`,
//! each in its own private socket directory (`NETLESS_DIR`), with bounded waits only.
//!
//! Processes run in their own process group and are killed with it if a test fails or a
//! command hangs; their output is read on threads and collected with a timeout.

use std::io::Read;
use std::os::unix::fs::DirBuilderExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_netless");

/// How long a short command (stat, ctl, ping) may take before it counts as hung.
const SHORT: Duration = Duration::from_secs(30);
/// How long a server may take to come up.
const STARTUP: Duration = Duration::from_secs(10);
/// How long a server may take to exit after SIGTERM.
const SHUTDOWN: Duration = Duration::from_secs(5);

/// A fresh mode-0700 directory under the system temp dir, removed on drop.
struct TestDir {
    path: PathBuf,
}

impl TestDir {
    fn new(tag: &str) -> TestDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        // Short: socket paths must fit in 107 bytes.
        let path = std::env::temp_dir().join(format!(
            "nl-st-{}-{}-{tag}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .unwrap_or_else(|e| panic!("creating {}: {e}", path.display()));
        TestDir { path }
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Reads `r` to its end on a thread; the text arrives on the returned channel.
fn read_on_thread(mut r: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = r.read_to_end(&mut buf);
        let _ = tx.send(String::from_utf8_lossy(&buf).into_owned());
    });
    rx
}

/// What a finished process printed and how it ended.
#[derive(Debug)]
struct Output {
    what: String,
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

impl Output {
    fn describe(&self) -> String {
        format!(
            "`{}`: {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.what, self.status, self.stdout, self.stderr
        )
    }

    /// Panics (with the output) unless the command exited with 0.
    fn ok(self) -> Output {
        assert_eq!(self.status.code(), Some(0), "{}", self.describe());
        self
    }

    /// Stdout parsed as JSON.
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON: {e}\n{}", self.describe()))
    }
}

/// A running `netless` process; killed with its process group if dropped while running.
struct Proc {
    what: String,
    child: Child,
    stdout: Option<mpsc::Receiver<String>>,
    stderr: Option<mpsc::Receiver<String>>,
    reaped: bool,
}

impl Proc {
    fn spawn(dir: &TestDir, args: &[&str]) -> Proc {
        let mut cmd = Command::new(BIN);
        cmd.args(args)
            .env("NETLESS_DIR", &dir.path)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let what = format!("netless {}", args.join(" "));
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawning `{what}`: {e}"));
        let stdout = child.stdout.take().map(read_on_thread);
        let stderr = child.stderr.take().map(read_on_thread);
        Proc {
            what,
            child,
            stdout,
            stderr,
            reaped: false,
        }
    }

    fn pid(&self) -> Pid {
        Pid::from_child(&self.child)
    }

    /// Polls for the exit status until `timeout`; `None` if still running.
    fn wait_for(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => {
                    self.reaped = true;
                    return Some(status);
                }
                Ok(None) if Instant::now() >= deadline => return None,
                Ok(None) => std::thread::sleep(Duration::from_millis(10)),
                Err(e) => panic!("waiting for `{}`: {e}", self.what),
            }
        }
    }

    /// SIGKILLs the whole process group and reaps the child.
    fn kill(&mut self) {
        if self.reaped {
            return;
        }
        // The group id is the child's pid, which cannot be reused before we reap it.
        let _ = rustix::process::kill_process_group(self.pid(), Signal::KILL);
        let _ = self.child.kill();
        if self.wait_for(Duration::from_secs(10)).is_none() {
            eprintln!("warning: `{}` survived SIGKILL for 10 s", self.what);
        }
    }

    /// Collects the output; the pipes may be held open by grandchildren, hence the timeout.
    fn collect(&mut self, status: ExitStatus) -> Output {
        let take = |rx: Option<mpsc::Receiver<String>>| {
            rx.map(|rx| {
                rx.recv_timeout(Duration::from_secs(5))
                    .unwrap_or_else(|_| "<output still open after 5 s>".to_string())
            })
            .unwrap_or_default()
        };
        Output {
            what: self.what.clone(),
            status,
            stdout: take(self.stdout.take()),
            stderr: take(self.stderr.take()),
        }
    }

    /// Waits up to `timeout` for the process to exit and returns its output; on timeout
    /// kills it and panics with what it printed.
    fn finish(mut self, timeout: Duration) -> Output {
        match self.wait_for(timeout) {
            Some(status) => self.collect(status),
            None => {
                self.kill();
                let status = self.child.wait().expect("reaping a killed child");
                let out = self.collect(status);
                panic!(
                    "did not exit within {timeout:?}; killed it\n{}",
                    out.describe()
                );
            }
        }
    }

    /// SIGTERMs the server and checks that it exits with 0.
    fn stop(mut self) {
        rustix::process::kill_process(self.pid(), Signal::TERM)
            .unwrap_or_else(|e| panic!("sending SIGTERM to `{}`: {e}", self.what));
        match self.wait_for(SHUTDOWN) {
            Some(status) => {
                let out = self.collect(status);
                assert_eq!(out.status.code(), Some(0), "{}", out.describe());
            }
            None => panic!("`{}` did not exit within {SHUTDOWN:?}", self.what),
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs `netless <args>` to completion.
fn run(dir: &TestDir, args: &[&str]) -> Output {
    Proc::spawn(dir, args).finish(SHORT)
}

/// Starts `netless echo-server --service <service> <extra>` and waits until `netless stat`
/// can read it (which makes no call, so the server's counters stay at zero).
fn start_server(dir: &TestDir, service: &str, extra: &[&str]) -> Proc {
    let mut args = vec!["echo-server", "--service", service];
    args.extend_from_slice(extra);
    let mut server = Proc::spawn(dir, &args);
    let started = Instant::now();
    loop {
        let out = run(dir, &["stat", service, "--json"]);
        if out.status.success() {
            return server;
        }
        if let Some(status) = server.wait_for(Duration::ZERO) {
            panic!(
                "the server exited early\n{}",
                server.collect(status).describe()
            );
        }
        assert!(
            started.elapsed() < STARTUP,
            "`{service}` not up within {STARTUP:?}; last stat:\n{}",
            out.describe()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `netless stat <service> --json`: the one replica's object.
fn stat(dir: &TestDir, service: &str) -> Value {
    let out = run(dir, &["stat", service, "--json"]).ok();
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
    let out = run(&dir, &["stat", "--count", "2", "--interval-ms", "50"]).ok();
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

    let out = run(&dir, &["ctl", service, "get"]).ok();
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

    let out = run(&dir, &["ctl", service, "set", "wait=futex"]).ok();
    assert!(out.stdout.contains("wait=futex "), "{}", out.describe());
    let out = run(&dir, &["ctl", service, "get"]).ok();
    assert!(out.stdout.contains("wait=futex "), "{}", out.describe());
    assert_eq!(stat(&dir, service)["registers"]["wait"], "futex");

    let out = run(&dir, &["ctl", service, "set", "colour=blue"]);
    assert_eq!(out.status.code(), Some(2), "{}", out.describe());
    assert!(
        out.stderr.contains("unknown register `colour`")
            && out.stderr.contains("known: batch, batch_mode, wait"),
        "{}",
        out.describe()
    );
    let out = run(&dir, &["ctl", service, "set", "batch=0"]);
    assert_eq!(out.status.code(), Some(2), "{}", out.describe());
    assert!(out.stderr.contains("1..=256"), "{}", out.describe());

    // Settings apply in order; the first refused one stops the command.
    let out = run(&dir, &["ctl", service, "set", "batch=4", "wait=never"]);
    assert_eq!(out.status.code(), Some(2), "{}", out.describe());
    assert!(out.stderr.contains("batch=4 applied"), "{}", out.describe());
    assert_eq!(stat(&dir, service)["registers"]["batch"], "4");

    let dir_name = dir.path.display().to_string();
    for args in [
        &["ctl", "t.Nobody", "get"][..],
        &["stat", "t.Nobody", "--json"],
        &["ctl", service, "--replica", "3", "get"],
    ] {
        let out = run(&dir, args);
        assert_eq!(out.status.code(), Some(2), "{}", out.describe());
        assert!(
            out.stderr.contains("not found in") && out.stderr.contains(&dir_name),
            "{}",
            out.describe()
        );
    }
    server.stop();
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
    run(&dir, &load).ok();
    let s = stat(&dir, service);
    assert_eq!(counter(&s, "calls"), 60, "{s:#}");
    let spun = counter(&s, "sleeps");
    assert_eq!(spun, before, "a spinning worker slept\n{s:#}");

    // The same load after `wait=futex`: the worker sleeps between requests.
    let out = run(&dir, &["ctl", service, "set", "wait=futex"]).ok();
    assert!(out.stdout.contains("wait=futex "), "{}", out.describe());
    run(&dir, &load).ok();
    let s = stat(&dir, service);
    assert_eq!(s["registers"]["wait"], "futex", "{s:#}");
    let slept = counter(&s, "sleeps") - spun;
    assert!(
        slept >= 20,
        "only {slept} sleeps over 60 requests 2 ms apart\n{s:#}"
    );
    server.stop();
}
