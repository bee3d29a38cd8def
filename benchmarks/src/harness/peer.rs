//! The peer processes a benchmark spawns, and the peer side of their conversation: this same
//! executable run again as `peer <role> …`. It owns starting them (waiting for their ready
//! line), talking to them by lines on stdin and stdout, and stopping and reaping them, every
//! wait bounded; it never decides what a peer serves or measures.
//!
//! Peers stay in the benchmark's process group, so that a signal to the group (Ctrl-C at a
//! terminal, a test killing a hung run) reaches them too, and each asks the kernel to kill
//! it when the benchmark dies ([`die_with_parent`]), so that none outlives a benchmark killed
//! alone. A peer's stdout is read on a thread of its own from the start: the peer never blocks
//! on a full pipe, and a wait for its next line can give up.

use std::ffi::OsStr;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};

/// How long a peer may take to print its ready line or to answer a command (a server
/// preloading a million keys in an unoptimised build is the slowest).
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(120);

/// How long a peer asked to stop may take to exit before it is killed.
pub const STOP_GRACE: Duration = Duration::from_secs(5);

/// How a [`Peer`] is asked to stop.
#[derive(Clone, Copy, Debug)]
pub enum Stop {
    /// Close its stdin (the benchmarks' own roles exit at EOF).
    CloseStdin,
    /// SIGTERM (the user's `echo-server` and `gateway` are daemons and do not watch stdin).
    Sigterm,
}

/// A spawned peer process; dropping it stops it (within [`STOP_GRACE`], else SIGKILL) and
/// reaps it.
#[derive(Debug)]
pub struct Peer {
    what: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    stop: Stop,
}

impl Peer {
    /// Runs `<this executable> peer ARGS…` and waits for its first line, which must start
    /// with `ready`; returns the rest of that line, trimmed (`LISTENING 127.0.0.1:5000` with
    /// `ready` = `LISTENING`: `127.0.0.1:5000`).
    pub fn spawn<S: AsRef<OsStr>>(
        args: &[S],
        ready: &str,
        stop: Stop,
    ) -> anyhow::Result<(Peer, String)> {
        let mut all: Vec<&OsStr> = vec![OsStr::new("peer")];
        all.extend(args.iter().map(AsRef::as_ref));
        Peer::spawn_exe(&self_exe()?, &all, ready, stop)
    }

    /// [`Peer::spawn`] of any executable.
    pub fn spawn_exe<S: AsRef<OsStr>>(
        exe: &Path,
        args: &[S],
        ready: &str,
        stop: Stop,
    ) -> anyhow::Result<(Peer, String)> {
        let words: Vec<_> = args.iter().map(|a| a.as_ref().to_string_lossy()).collect();
        let name = exe.file_name().unwrap_or(exe.as_os_str()).to_string_lossy();
        let what = format!("{name} {}", words.join(" "));
        let mut command = Command::new(exe);
        command.args(args);
        Peer::spawn_command(command, what, ready, stop)
    }

    /// [`Peer::spawn_exe`] of a command the caller has prepared (its program, arguments and
    /// environment; stdin and stdout are set here), named `what` in errors.
    pub fn spawn_command(
        mut command: Command,
        what: String,
        ready: &str,
        stop: Stop,
    ) -> anyhow::Result<(Peer, String)> {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("spawning `{what}`"))?;
        let stdout = child.stdout.take().context("peer stdout")?;
        let stdin = child.stdin.take();
        let (tx, lines) = mpsc::channel();
        std::thread::Builder::new()
            .name("peer-stdout".into())
            .spawn(move || {
                for line in std::io::BufRead::lines(std::io::BufReader::new(stdout)) {
                    let Ok(line) = line else { break };
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            })
            .context("spawning a peer's stdout reader")?;
        let mut peer = Peer {
            what,
            child,
            stdin,
            lines,
            stop,
        };
        let first = match peer.line() {
            Ok(line) => line,
            Err(e) => return Err(e.context(format!("`{}` was not ready", peer.what))),
        };
        let Some(rest) = first.strip_prefix(ready) else {
            bail!("`{}` printed {first:?} instead of `{ready} …`", peer.what);
        };
        let rest = rest.trim().to_string();
        Ok((peer, rest))
    }

    /// Its process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Its next line on stdout, waiting at most [`ANSWER_TIMEOUT`].
    pub fn line(&mut self) -> anyhow::Result<String> {
        match self.lines.recv_timeout(ANSWER_TIMEOUT) {
            Ok(line) => Ok(line),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                bail!("`{}` did not answer within {ANSWER_TIMEOUT:?}", self.what)
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                // Its stdout closed: it exited, or is about to.
                let status = wait_at_most(&mut self.child, Duration::from_secs(1))
                    .map_or("its stdout closed".to_string(), |s| s.to_string());
                bail!("`{}` exited ({status})", self.what)
            }
        }
    }

    /// Sends `command` as one line and parses the one-line JSON answer.
    pub fn ask<T: serde::de::DeserializeOwned>(&mut self, command: &str) -> anyhow::Result<T> {
        let stdin = self.stdin.as_mut().context("peer stdin closed")?;
        writeln!(stdin, "{command}")?;
        stdin.flush()?;
        let line = self.line()?;
        serde_json::from_str(&line)
            .with_context(|| format!("`{}` answered {command:?} with {line:?}", self.what))
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        if let Stop::Sigterm = self.stop {
            let _ = rustix::process::kill_process(
                rustix::process::Pid::from_child(&self.child),
                rustix::process::Signal::TERM,
            );
        }
        drop(self.stdin.take());
        reap(&mut self.child, STOP_GRACE);
    }
}

/// The child's exit status if it exits within `limit`.
fn wait_at_most(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(2)),
            _ => return None,
        }
    }
}

/// Closes the child's stdin, waits up to `grace` for it to exit, then kills and reaps it.
pub fn reap(child: &mut Child, grace: Duration) {
    drop(child.stdin.take());
    if wait_at_most(child, grace).is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// `<this executable> peer ARGS…`, for a peer whose stdio the caller sets up itself.
pub fn command<S: AsRef<OsStr>>(args: &[S]) -> anyhow::Result<Command> {
    let mut command = Command::new(self_exe()?);
    command.arg("peer").args(args);
    Ok(command)
}

/// The path of this executable, which the peers are.
pub fn self_exe() -> anyhow::Result<PathBuf> {
    std::env::current_exe().context("finding this executable to spawn its peers")
}

/// Peer side: prints the ready line `LISTENING <what>` and flushes it.
pub fn listening(what: impl std::fmt::Display) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "LISTENING {what}")?;
    out.flush()?;
    Ok(())
}

/// Peer side: returns when stdin reaches its end (the benchmark closed it, or died).
pub fn until_stdin_closes() {
    let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
}

/// Peer side: asks the kernel to SIGKILL this process when the thread that spawned it
/// exits (every benchmark spawns its peers from its main thread, so: when the benchmark
/// dies, even by SIGKILL).
pub fn die_with_parent() -> anyhow::Result<()> {
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
        .context("PR_SET_PDEATHSIG")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spawn_reports_a_peer_that_exits_before_it_is_ready() {
        let err = Peer::spawn_exe(
            Path::new("/bin/true"),
            &["x"],
            "LISTENING",
            Stop::CloseStdin,
        )
        .unwrap_err();
        assert!(format!("{err:#}").contains("was not ready"), "{err:#}");
        assert!(format!("{err:#}").contains("exited"), "{err:#}");
    }

    #[test]
    fn spawn_reports_a_peer_that_prints_something_else() {
        // /bin/echo prints its arguments.
        let err = Peer::spawn_exe(
            Path::new("/bin/echo"),
            &["grpc-server", "--listen", "127.0.0.1:0"],
            "LISTENING",
            Stop::CloseStdin,
        )
        .unwrap_err();
        assert!(format!("{err:#}").contains("instead of"), "{err:#}");
    }

    #[test]
    fn a_peer_answers_lines_and_stops_when_its_stdin_closes() {
        // `cat` echoes each command back: its ready line, then a JSON answer.
        let started = Instant::now();
        let (mut peer, rest) = Peer::spawn_exe(
            Path::new("/bin/sh"),
            &["-c", "echo 'READY 3'; exec cat"],
            "READY",
            Stop::CloseStdin,
        )
        .unwrap();
        assert_eq!(rest, "3");
        let answer: Vec<u32> = peer.ask("[1, 2]").unwrap();
        assert_eq!(answer, [1, 2]);
        drop(peer);
        assert!(started.elapsed() < STOP_GRACE, "cat stops at EOF");
    }
}
