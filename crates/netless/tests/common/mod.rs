//! Shared helpers for the multi-process tests: private socket directories, spawning this
//! test binary as a peer process in a given role, and the test service's handler.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use netless::{ClientConfig, Request, ResponseBuilder, ServerConfig, Status, WaitMode, WaitPolicy};

/// Env var naming the role a spawned child plays.
pub(crate) const ROLE: &str = "NETLESS_TEST_ROLE";
/// Env var carrying the socket directory to a child.
pub(crate) const DIR: &str = "NETLESS_TEST_DIR";
/// Env var carrying the service name to a child.
pub(crate) const SERVICE: &str = "NETLESS_TEST_SERVICE";

/// A fresh private socket directory, removed on drop.
pub(crate) struct TestDir(pub PathBuf);

impl TestDir {
    pub(crate) fn new(tag: &str) -> TestDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let path = std::env::temp_dir().join(format!(
            "netless-test-{}-{tag}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&path).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700)).unwrap();
        TestDir(path)
    }
    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Short spin budgets: tests run in parallel on two cores.
pub(crate) fn test_wait() -> WaitPolicy {
    WaitPolicy {
        mode: WaitMode::Adaptive,
        spin: Duration::from_micros(5),
    }
}

pub(crate) fn server_config(dir: &Path) -> ServerConfig {
    ServerConfig {
        workers: 2,
        wait: test_wait(),
        dir: Some(dir.to_path_buf()),
        ..ServerConfig::default()
    }
}

pub(crate) fn client_config(dir: &Path) -> ClientConfig {
    ClientConfig {
        wait: test_wait(),
        dir: Some(dir.to_path_buf()),
        ..ClientConfig::default()
    }
}

/// The test service: `Echo` echoes payload and `echo-*` metadata (`EchoRef` the payload
/// without copying it, via `reply_with`); `Fail` returns NOT_FOUND;
/// `Slow` sleeps for the number of milliseconds in its payload (u64 LE) then echoes; `Big`
/// returns as many bytes as its payload says (u64 LE).
pub(crate) fn test_handler<'a>(
    req: &Request<'a>,
    resp: &mut ResponseBuilder<'a>,
) -> Result<(), Status> {
    let number = || {
        req.payload
            .get(..8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
            .ok_or_else(|| Status::invalid_argument("payload must start with a u64"))
    };
    match req.method {
        "Echo" => {
            resp.payload.extend_from_slice(req.payload);
            for (k, v) in req.metadata.iter() {
                if k.starts_with("echo-") {
                    resp.metadata.insert(k, v);
                }
            }
            Ok(())
        }
        "EchoRef" => {
            resp.reply_with(req.payload);
            Ok(())
        }
        "Fail" => Err(Status::new(netless::Code::NotFound, "no such thing")),
        "Slow" => {
            std::thread::sleep(Duration::from_millis(number()?));
            resp.payload.extend_from_slice(req.payload);
            Ok(())
        }
        "Big" => {
            let n = number()? as usize;
            resp.payload.extend((0..n).map(|i| (i % 251) as u8));
            Ok(())
        }
        other => Err(Status::unimplemented(format!("no method {other}"))),
    }
}

/// Spawns this test binary running only `test_name`, in `role`.
pub(crate) fn spawn_role(test_name: &str, role: &str, dir: &Path, service: &str) -> Child {
    role_command(test_name, role, dir, service)
        .spawn()
        .expect("spawn child test process")
}

/// The command [`spawn_role`] runs, to add to (another uid, more environment).
pub(crate) fn role_command(test_name: &str, role: &str, dir: &Path, service: &str) -> Command {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args([
            "--exact",
            test_name,
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROLE, role)
        .env(DIR, dir)
        .env(SERVICE, service)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    command
}

/// Reads the child's stdout until a line equal to `marker` (the test harness prints its own
/// lines too); panics if the child exits first.
pub(crate) fn wait_for_line(stdout: &mut BufReader<ChildStdout>, marker: &str) {
    let mut line = String::new();
    loop {
        line.clear();
        let n = stdout.read_line(&mut line).unwrap();
        assert!(n > 0, "child exited before printing {marker}");
        if line.trim_end().ends_with(marker) {
            return;
        }
    }
}

/// Reads the rest of the child's stdout on a thread until it exits, for a caller done with
/// it: a child whose stdout is closed would fail its harness's last lines with EPIPE (and
/// print "io error when listing tests" into the parent's output).
pub(crate) fn drain_in_background(stdout: BufReader<ChildStdout>) {
    std::thread::spawn(move || {
        let mut stdout = stdout;
        let _ = std::io::copy(&mut stdout, &mut std::io::sink());
    });
}

/// The role this process was spawned for, if any.
pub(crate) fn role() -> Option<(String, PathBuf, String)> {
    let role = std::env::var(ROLE).ok()?;
    Some((
        role,
        PathBuf::from(std::env::var(DIR).unwrap()),
        std::env::var(SERVICE).unwrap(),
    ))
}

/// Sends SIGKILL.
pub(crate) fn sigkill(child: &Child) {
    rustix::process::kill_process(
        rustix::process::Pid::from_child(child),
        rustix::process::Signal::KILL,
    )
    .unwrap();
}

/// CPU time (user + system) a process has used, from /proc.
pub(crate) fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    let hz = rustix::param::clock_ticks_per_second();
    Duration::from_secs_f64(ticks as f64 / hz as f64)
}

/// Reads a child's stdout up to its `RESULT key=value …` line (anything before it on that
/// line, or on earlier lines, is skipped); fails if the child dies or `timeout` passes
/// between lines.
pub(crate) fn read_result(out: &mut BufReader<ChildStdout>, timeout: Duration) -> String {
    let deadline = std::time::Instant::now() + timeout;
    let mut line = String::new();
    while !line.starts_with("RESULT") {
        assert!(std::time::Instant::now() < deadline, "child hung");
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "child died");
        line = line.trim_start_matches(|c: char| c != 'R').to_string();
    }
    line
}

/// The value of `key=value` in a `RESULT` line.
pub(crate) fn field(line: &str, key: &str) -> u64 {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key} in {line}"))
        .parse()
        .unwrap()
}
