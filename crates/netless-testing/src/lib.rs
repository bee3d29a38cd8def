//! What the workspace's multi-process integration tests share: a private temp directory for
//! each test, a real executable (`netless`, a benchmark binary) run as a process with
//! bounded waits only, and a peer made pid 1 of a pid namespace of its own (`namespace`).
//! It never decides what a test asserts.
//!
//! Processes are started in their own process group so that a hung command can be killed
//! together with any peers it spawned (the benchmarks start several), and so that peers
//! left behind by a command that exited are swept too. Their stdout and stderr are read on
//! threads and collected with a timeout, so a pipe held open cannot hang a test either.

use std::io::Read;
use std::os::unix::fs::DirBuilderExt as _;
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, WaitId, WaitIdOptions};
use serde_json::Value;

mod namespace;
mod netns;
pub mod sockets;

pub use namespace::{in_container, in_new_pid_namespace, pid_namespace};
pub use netns::{Host, TwoHosts};

/// How long a short command (ping, stat, ctl, a usage error) may take before it counts as hung.
pub const SHORT: Duration = Duration::from_secs(30);
/// How long a server may take to come up and answer.
pub const STARTUP: Duration = Duration::from_secs(10);
/// How long a server may take to exit after SIGTERM/SIGINT.
pub const SHUTDOWN: Duration = Duration::from_secs(5);
/// How long the output of an exited process may take to arrive: its pipes may still be held
/// open by a grandchild outside its group.
const OUTPUT: Duration = Duration::from_secs(30);

/// A fresh mode-0700 directory under the system temp dir, removed on drop.
#[derive(Debug)]
pub struct TestDir {
    pub path: PathBuf,
}

impl TestDir {
    pub fn new(tag: &str) -> TestDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        // Short: socket paths must fit in 107 bytes. The test binary's name (`cli-<hash>`)
        // without its hash says which tests made it.
        let exe = std::env::current_exe().ok();
        let test = exe
            .as_deref()
            .and_then(Path::file_name)
            .and_then(|n| n.to_str())
            .and_then(|n| n.split('-').next())
            .unwrap_or("test");
        let path = std::env::temp_dir().join(format!(
            "nl-{test}-{}-{}-{tag}",
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

    pub fn socket(&self, service: &str) -> PathBuf {
        self.path.join(format!("{service}.sock"))
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

/// [`read_on_thread`] that also sends each line, as it comes, on the second channel.
fn read_lines_on_thread(
    r: impl Read + Send + 'static,
) -> (mpsc::Receiver<String>, mpsc::Receiver<String>) {
    let (all_tx, all_rx) = mpsc::channel();
    let (line_tx, line_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut reader = std::io::BufReader::new(r);
        let mut all = String::new();
        let mut line = Vec::new();
        while std::io::BufRead::read_until(&mut reader, b'\n', &mut line).unwrap_or(0) > 0 {
            let text = String::from_utf8_lossy(&line).into_owned();
            let _ = line_tx.send(text.trim_end().to_string());
            all.push_str(&text);
            line.clear();
        }
        let _ = all_tx.send(all);
    });
    (all_rx, line_rx)
}

/// What a finished process printed and how it ended.
#[derive(Debug)]
pub struct Output {
    pub what: String,
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    pub fn describe(&self) -> String {
        format!(
            "`{}`: {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.what, self.status, self.stdout, self.stderr
        )
    }

    /// Panics (with the output) unless the command exited with 0.
    pub fn ok(self) -> Output {
        assert_eq!(self.status.code(), Some(0), "{}", self.describe());
        self
    }

    /// Stdout parsed as JSON.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON: {e}\n{}", self.describe()))
    }
}

/// A running process of the binary under test; killed with its process group if dropped
/// while running.
#[derive(Debug)]
pub struct Proc {
    pub what: String,
    child: Child,
    stdout: Option<mpsc::Receiver<String>>,
    /// Each line of stdout as it comes.
    lines: Option<mpsc::Receiver<String>>,
    stderr: Option<mpsc::Receiver<String>>,
    reaped: bool,
}

impl Proc {
    /// Starts `bin <args>` in its own process group with `NETLESS_DIR` set to `dir`.
    pub fn spawn(bin: &str, dir: &TestDir, args: &[&str]) -> Proc {
        let mut cmd = Command::new(bin);
        cmd.args(args)
            .env("NETLESS_DIR", &dir.path)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let name = Path::new(bin)
            .file_name()
            .map_or(bin.into(), |n| n.to_string_lossy());
        Proc::spawn_command(cmd, &format!("{name} {}", args.join(" ")))
    }

    /// Starts `cmd`, which must be in a process group of its own (`process_group(0)`: the
    /// group is what [`Proc::kill`] kills) and pipe its output; `what` names it in messages.
    pub fn spawn_command(mut cmd: Command, what: &str) -> Proc {
        let what = what.to_string();
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawning `{what}`: {e}"));
        let (stdout, lines) = child.stdout.take().map(read_lines_on_thread).unzip();
        let stderr = child.stderr.take().map(read_on_thread);
        Proc {
            what,
            child,
            stdout,
            lines,
            stderr,
            reaped: false,
        }
    }

    fn pid(&self) -> Pid {
        Pid::from_child(&self.child)
    }

    /// The process id (of the group's leader).
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Waits up to `timeout` for a line of stdout that starts with `prefix` (skipping the
    /// lines before it) and returns the rest of that line, trimmed.
    ///
    /// # Panics
    /// If no such line comes in time, or stdout ends first (the process exited).
    pub fn wait_for_line(&mut self, prefix: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        let lines = self.lines.as_ref().expect("stdout is piped");
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match lines.recv_timeout(left) {
                Ok(line) => {
                    if let Some(rest) = line.strip_prefix(prefix) {
                        return rest.trim().to_string();
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    panic!(
                        "`{}` printed no `{prefix}` line within {timeout:?}",
                        self.what
                    )
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    panic!("`{}` closed its stdout before a `{prefix}` line", self.what)
                }
            }
        }
    }

    /// Polls for the exit status until `timeout`; `None` if still running. Once the process
    /// has exited, whatever is left of its group (peers it started) is SIGKILLed.
    pub fn wait_for(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        while !self.reaped {
            // Looks without reaping, so that the group is swept while the zombie still holds
            // its id: a reaped pid could be reused.
            let options = WaitIdOptions::EXITED | WaitIdOptions::NOHANG | WaitIdOptions::NOWAIT;
            match rustix::process::waitid(WaitId::Pid(self.pid()), options) {
                Ok(Some(_)) => {
                    let _ = rustix::process::kill_process_group(self.pid(), Signal::KILL);
                    self.reaped = true;
                }
                Ok(None) if Instant::now() >= deadline => return None,
                Ok(None) => std::thread::sleep(Duration::from_millis(10)),
                Err(e) => panic!("waiting for `{}`: {e}", self.what),
            }
        }
        // Immediate: the child has exited (and `Child` keeps the status once reaped).
        match self.child.wait() {
            Ok(status) => Some(status),
            Err(e) => panic!("reaping `{}`: {e}", self.what),
        }
    }

    /// Whether the process has exited (and with what), without waiting.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.wait_for(Duration::ZERO)
    }

    /// SIGKILLs the whole process group and reaps the child.
    pub fn kill(&mut self) {
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

    /// Collects the output, waiting at most `OUTPUT` (30 s) for each pipe.
    pub fn collect(&mut self, status: ExitStatus) -> Output {
        let take = |rx: Option<mpsc::Receiver<String>>| {
            rx.map(|rx| {
                rx.recv_timeout(OUTPUT)
                    .unwrap_or_else(|_| format!("<output still open after {OUTPUT:?}>"))
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
    pub fn finish(mut self, timeout: Duration) -> Output {
        match self.wait_for(timeout) {
            Some(status) => self.collect(status),
            None => {
                self.kill();
                let status = self.child.wait().expect("reaping a killed child");
                let out = self.collect(status);
                panic!(
                    "did not exit within {timeout:?}; killed its process group\n{}",
                    out.describe()
                );
            }
        }
    }

    /// Sends `signal` and checks that the process exits with status 0 within [`SHUTDOWN`].
    pub fn stop(mut self, signal: Signal) -> Output {
        assert!(!self.reaped, "`{}` already exited", self.what);
        rustix::process::kill_process(self.pid(), signal)
            .unwrap_or_else(|e| panic!("sending {signal:?} to `{}`: {e}", self.what));
        let Some(status) = self.wait_for(SHUTDOWN) else {
            self.kill();
            panic!(
                "`{}` did not exit within {SHUTDOWN:?} of {signal:?}",
                self.what
            );
        };
        let out = self.collect(status);
        assert_eq!(
            out.status.code(),
            Some(0),
            "after {signal:?} (signal: {:?})\n{}",
            out.status.signal(),
            out.describe()
        );
        out
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs `bin <args>` to completion (at most `timeout`).
pub fn run(bin: &str, dir: &TestDir, args: &[&str], timeout: Duration) -> Output {
    Proc::spawn(bin, dir, args).finish(timeout)
}

/// Runs `bin <args>` until it succeeds, for up to [`STARTUP`] while `server` comes up;
/// panics if the server exits or the command never succeeds.
pub fn run_until_ok(bin: &str, dir: &TestDir, server: &mut Proc, args: &[&str]) -> Output {
    let started = Instant::now();
    loop {
        let out = run(bin, dir, args, SHORT);
        if out.status.success() {
            return out;
        }
        if let Some(status) = server.exited() {
            let server_out = server.collect(status);
            panic!(
                "the server exited early\n{}\nlast attempt:\n{}",
                server_out.describe(),
                out.describe()
            );
        }
        assert!(
            started.elapsed() < STARTUP,
            "no success within {STARTUP:?}; last attempt:\n{}",
            out.describe()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
