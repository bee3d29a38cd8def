//! The server processes the benchmarks spawn: started with their `LISTENING <what>`
//! line read, stopped and reaped when dropped.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};

/// How a [`Peer`] is asked to stop.
#[derive(Clone, Copy, Debug)]
pub enum Stop {
    /// Close its stdin (the `bench-peer` roles exit at EOF).
    CloseStdin,
    /// SIGTERM (`netless gateway` is a daemon and does not watch stdin).
    Sigterm,
}

/// A spawned server process; dropping it stops it (within 2 s, else SIGKILL) and reaps it.
pub struct Peer {
    child: Child,
    stop: Stop,
}

impl Peer {
    /// Runs `exe args...` and waits for its first line, `LISTENING <what>`; returns `what`.
    pub fn spawn(exe: &Path, args: &[&str], stop: Stop) -> anyhow::Result<(Peer, String)> {
        let mut child = Command::new(exe)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("spawning `{}`", args.join(" ")))?;
        let stdout = child.stdout.take().context("peer stdout")?;
        let peer = Peer { child, stop };
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line)?;
        let Some(what) = line.trim().strip_prefix("LISTENING ") else {
            bail!("`{}` did not start: {line:?}", args.join(" "));
        };
        Ok((peer, what.to_string()))
    }

    /// Its process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        if let Stop::Sigterm = self.stop {
            if let Some(pid) = rustix::process::Pid::from_raw(self.child.id() as i32) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
            }
        }
        reap(&mut self.child, Duration::from_secs(2));
    }
}

/// Closes the child's stdin, waits up to `grace` for it to exit, then kills and reaps it.
pub fn reap(child: &mut Child, grace: Duration) {
    drop(child.stdin.take());
    let deadline = Instant::now() + grace;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => return,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            _ => break,
        }
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// `netless gateway` on a free loopback port (pinned to `cpu`), and its address.
pub fn spawn_gateway(exe: &Path, cpu: Option<usize>, wait: &str) -> anyhow::Result<(Peer, String)> {
    let cpu = cpu.map(|c| c.to_string());
    let mut args = vec!["gateway", "--listen", "127.0.0.1:0", "--wait", wait];
    if let Some(cpu) = &cpu {
        args.extend(["--pin-cpu", cpu]);
    }
    Peer::spawn(exe, &args, Stop::Sigterm)
}

/// Pins every thread of process `pid` to CPU `cpu` (threads it starts later inherit the
/// affinity of the thread that starts them).
pub fn pin_process(pid: u32, cpu: usize) -> anyhow::Result<()> {
    let mut set = rustix::thread::CpuSet::new();
    set.set(cpu);
    for entry in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let Some(tid) = entry?
            .file_name()
            .to_str()
            .and_then(|t| t.parse::<i32>().ok())
            .and_then(rustix::process::Pid::from_raw)
        else {
            continue;
        };
        // A thread that exited meanwhile is not an error.
        match rustix::thread::sched_setaffinity(Some(tid), &set) {
            Ok(()) | Err(rustix::io::Errno::SRCH) => {}
            Err(e) => return Err(std::io::Error::from(e).into()),
        }
    }
    Ok(())
}

/// CPU time (user + system) a process has used so far.
pub fn cpu_time(pid: u32) -> Duration {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return Duration::ZERO;
    };
    let Some(close) = stat.rfind(')') else {
        return Duration::ZERO;
    };
    let fields: Vec<&str> = stat[close + 2..].split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let hz = rustix::param::clock_ticks_per_second().max(1);
    Duration::from_millis((ticks(11) + ticks(12)) * 1000 / hz)
}
