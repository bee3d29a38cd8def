//! What `/proc` says about the processes under test, so that a slow window can be told from
//! a slow system: the CPU time a process used, involuntary context switches of a thread or a
//! process (another runnable task got the core) and the hypervisor's steal time (another
//! guest got the physical CPU). Reading costs tens of µs, so callers read outside their
//! measured loops; every reader gives 0 where `/proc` cannot say.

use std::time::Duration;

/// CPU time (user + system) process `pid` has used so far.
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
    Duration::from_millis((ticks(11) + ticks(12)) * 1000 / ticks_per_second())
}

/// Involuntary context switches of the calling thread so far.
pub fn thread_preemptions() -> u64 {
    std::fs::read_to_string("/proc/thread-self/status").map_or(0, |s| involuntary(&s))
}

/// Involuntary context switches so far of the live threads of process `pid` whose name
/// (`comm`) starts with `prefix` (`""`: every thread).
pub fn process_preemptions(pid: u32, prefix: &str) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter(|t| {
            prefix.is_empty()
                || std::fs::read_to_string(t.path().join("comm"))
                    .is_ok_and(|c| c.starts_with(prefix))
        })
        .filter_map(|t| std::fs::read_to_string(t.path().join("status")).ok())
        .map(|s| involuntary(&s))
        .sum()
}

/// Involuntary context switches so far of the main thread of process `pid` (the one that
/// runs `main`).
pub fn main_thread_preemptions(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/status")).map_or(0, |s| involuntary(&s))
}

/// Time the hypervisor gave CPU `cpu` (`None`: all CPUs together) to other guests so far,
/// ms (0 on bare metal).
pub fn steal_ms(cpu: Option<usize>) -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/stat") else {
        return 0.0;
    };
    let line = match cpu {
        Some(cpu) => format!("cpu{cpu} "),
        None => "cpu ".to_string(),
    };
    steal_ticks(&stat, &line) as f64 * 1000.0 / ticks_per_second() as f64
}

/// CPU time all CPUs together spent busy so far: the aggregate line of `/proc/stat` less
/// idle and iowait (zero where `/proc` cannot say).
pub fn machine_busy() -> Duration {
    let Ok(stat) = std::fs::read_to_string("/proc/stat") else {
        return Duration::ZERO;
    };
    let line = stat
        .lines()
        .find(|l| l.starts_with("cpu "))
        .unwrap_or_default();
    // cpu user nice system idle iowait irq softirq steal
    let busy: u64 = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .enumerate()
        .filter(|(i, _)| *i != 3 && *i != 4)
        .filter_map(|(_, t)| t.parse::<u64>().ok())
        .sum();
    Duration::from_millis(busy * 1000 / ticks_per_second())
}

fn ticks_per_second() -> u64 {
    rustix::param::clock_ticks_per_second().max(1)
}

/// The steal field (the 8th number) of the line of a `/proc/stat` text that starts with
/// `line` (`"cpu "`: the aggregate).
fn steal_ticks(stat: &str, line: &str) -> u64 {
    stat.lines()
        .find(|l| l.starts_with(line))
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
        assert_eq!(steal_ticks(stat, "cpu "), 335026);
        assert_eq!(steal_ticks(stat, "cpu0 "), 8);
        assert_eq!(steal_ticks("intr 1 2 3\n", "cpu "), 0);
        // This process has at least this thread; steal is never negative.
        let _ = process_preemptions(std::process::id(), "");
        let _ = main_thread_preemptions(std::process::id());
        let _ = thread_preemptions();
        assert!(steal_ms(None) >= 0.0);
        assert!(steal_ms(Some(0)) >= 0.0);
    }

    #[test]
    fn this_process_uses_cpu_time() {
        let started = std::time::Instant::now();
        let mut x = 0u64;
        while started.elapsed() < Duration::from_millis(50) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        assert!(cpu_time(std::process::id()) > Duration::ZERO);
    }
}
