//! Where a benchmark's threads and processes run: the two CPUs it places them on
//! ([`two_cpus`]) and pinning a whole peer process after it started ([`pin_process`]).
//! Which process goes where is the benchmark's choice; this module never makes it.

use anyhow::Context as _;

/// The first two CPUs this process may run on, or `None` on a one-CPU machine (then
/// nothing is pinned).
pub fn two_cpus() -> Option<(usize, usize)> {
    match netless_shm::allowed_cpus().as_slice() {
        [a, b, ..] => Some((*a, *b)),
        _ => None,
    }
}

/// Pins every thread of process `pid` to CPU `cpu` (threads it starts later inherit the
/// affinity of the thread that starts them).
pub fn pin_process(pid: u32, cpu: usize) -> anyhow::Result<()> {
    let mut set = rustix::thread::CpuSet::new();
    set.set(cpu);
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .with_context(|| format!("listing the threads of process {pid}"))?;
    for entry in tasks {
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
