//! What else took the cores during a window, so that a slow window can be told from a slow
//! system: involuntary context switches of a thread or a process (another runnable task got
//! the core) and the hypervisor's steal time (another guest got the physical CPU), both read
//! from `/proc`. Reading costs tens of µs, so it is done outside the measured loops.

/// Involuntary context switches of the calling thread so far (0 if `/proc` cannot say).
pub(super) fn thread_preemptions() -> u64 {
    std::fs::read_to_string("/proc/thread-self/status").map_or(0, |s| involuntary(&s))
}

/// Involuntary context switches of every live thread of process `pid` so far (0 if
/// unknown).
pub(super) fn process_preemptions(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("status")).ok())
        .map(|s| involuntary(&s))
        .sum()
}

/// Time the hypervisor gave this machine's CPUs to others so far, all CPUs together, in
/// ms (0 if `/proc/stat` cannot say, as on bare metal).
pub(super) fn steal_ms() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/stat") else {
        return 0.0;
    };
    let ticks = steal_ticks(&stat);
    let hz = rustix::param::clock_ticks_per_second().max(1);
    ticks as f64 * 1000.0 / hz as f64
}

/// The steal field (the 8th number) of the aggregate `cpu` line of a `/proc/stat` text.
fn steal_ticks(stat: &str) -> u64 {
    stat.lines()
        .find(|l| l.starts_with("cpu "))
        .and_then(|l| l.split_whitespace().nth(8))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The `nonvoluntary_ctxt_switches` field of a `/proc/.../status` text.
fn involuntary(status: &str) -> u64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix("nonvoluntary_ctxt_switches:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// The server's preemptions and the machine's steal time at one instant.
#[derive(Clone, Copy, Debug)]
pub(super) struct Mark {
    server: u64,
    steal_ms: f64,
}

impl Mark {
    /// Reads them now; `server` is the server process's id.
    pub fn now(server: u32) -> Mark {
        Mark {
            server: process_preemptions(server),
            steal_ms: steal_ms(),
        }
    }

    /// (server preemptions, steal ms) since `self`.
    pub fn since(self, server: u32) -> (u64, f64) {
        let now = Mark::now(server);
        (
            now.server.saturating_sub(self.server),
            (now.steal_ms - self.steal_ms).max(0.0),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_parsed() {
        let status = "voluntary_ctxt_switches:\t5\nnonvoluntary_ctxt_switches:\t7\n";
        assert_eq!(involuntary(status), 7);
        assert_eq!(involuntary("Name: x\n"), 0);
        let stat =
            "cpu  2449502 28 561423 2575959 56939 0 70794 335026 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n";
        assert_eq!(steal_ticks(stat), 335026);
        assert_eq!(steal_ticks("intr 1 2 3\n"), 0);
        // This process has at least this thread; steal is never negative.
        let _ = process_preemptions(std::process::id());
        let _ = thread_preemptions();
        assert!(steal_ms() >= 0.0);
    }
}
