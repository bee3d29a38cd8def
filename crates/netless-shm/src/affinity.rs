//! CPU affinity: pinning the calling thread to one CPU (or a set), listing the CPUs it may
//! use, and the CPU it runs on.
//!
//! This module owns `sched_setaffinity`/`sched_getaffinity` for the calling thread. It never
//! changes the affinity of other threads or processes and never decides which CPU to use.

use rustix::thread::{sched_getaffinity, sched_getcpu, sched_setaffinity, CpuSet};

use crate::Error;

/// Pins the calling thread to CPU `cpu` (its index as the kernel numbers CPUs).
///
/// # Errors
/// [`Error::InvalidCpu`] if `cpu` is beyond the kernel's CPU set size, offline, or not in the
/// process's allowed set (cgroup cpuset, `taskset`).
///
/// ```
/// let cpu = netless_shm::allowed_cpus()[0];
/// std::thread::spawn(move || netless_shm::pin_current_thread(cpu))
///     .join()
///     .expect("thread")?;
/// # Ok::<(), netless_shm::Error>(())
/// ```
pub fn pin_current_thread(cpu: usize) -> Result<(), Error> {
    if cpu >= CpuSet::MAX_CPU {
        return Err(Error::InvalidCpu {
            cpu,
            reason: format!("the kernel CPU set holds only {} CPUs", CpuSet::MAX_CPU),
        });
    }
    let mut set = CpuSet::new();
    set.set(cpu);
    sched_setaffinity(None, &set).map_err(|errno| Error::InvalidCpu {
        cpu,
        reason: format!("sched_setaffinity failed: {}", std::io::Error::from(errno)),
    })
}

/// Lets the calling thread run on any of `cpus` (and no other), for a process that should
/// float over some CPUs while its parent is pinned to one of them.
///
/// # Errors
/// [`Error::InvalidCpu`] if `cpus` is empty, or names a CPU beyond the kernel's CPU set size
/// or none the process may use.
///
/// ```
/// let cpus = netless_shm::allowed_cpus();
/// std::thread::spawn(move || netless_shm::pin_current_thread_to(&cpus))
///     .join()
///     .expect("thread")?;
/// # Ok::<(), netless_shm::Error>(())
/// ```
pub fn pin_current_thread_to(cpus: &[usize]) -> Result<(), Error> {
    let mut set = CpuSet::new();
    for &cpu in cpus {
        if cpu >= CpuSet::MAX_CPU {
            return Err(Error::InvalidCpu {
                cpu,
                reason: format!("the kernel CPU set holds only {} CPUs", CpuSet::MAX_CPU),
            });
        }
        set.set(cpu);
    }
    let first = cpus.first().copied().ok_or(Error::InvalidCpu {
        cpu: 0,
        reason: "no CPU given".into(),
    })?;
    sched_setaffinity(None, &set).map_err(|errno| Error::InvalidCpu {
        cpu: first,
        reason: format!("sched_setaffinity failed: {}", std::io::Error::from(errno)),
    })
}

/// Number of CPUs the calling thread may run on (at least 1).
///
/// ```
/// assert!(netless_shm::available_cpus() >= 1);
/// ```
pub fn available_cpus() -> usize {
    match sched_getaffinity(None) {
        Ok(set) => (set.count() as usize).max(1),
        Err(_) => std::thread::available_parallelism().map_or(1, |n| n.get()),
    }
}

/// Indices of the CPUs the calling thread may run on, ascending (never empty).
///
/// ```
/// let cpus = netless_shm::allowed_cpus();
/// assert_eq!(cpus.len(), netless_shm::available_cpus());
/// ```
pub fn allowed_cpus() -> Vec<usize> {
    match sched_getaffinity(None) {
        Ok(set) => {
            let cpus: Vec<usize> = (0..CpuSet::MAX_CPU).filter(|&i| set.is_set(i)).collect();
            if cpus.is_empty() {
                vec![0]
            } else {
                cpus
            }
        }
        Err(_) => (0..available_cpus()).collect(),
    }
}

/// The CPU the calling thread runs on now: where it stays if it is pinned to one, a moment's
/// answer otherwise.
///
/// ```
/// let cpu = netless_shm::allowed_cpus()[0];
/// let here = std::thread::spawn(move || {
///     netless_shm::pin_current_thread(cpu)?;
///     Ok::<_, netless_shm::Error>(netless_shm::current_cpu())
/// })
/// .join()
/// .expect("thread")?;
/// assert_eq!(here, cpu);
/// # Ok::<(), netless_shm::Error>(())
/// ```
pub fn current_cpu() -> usize {
    sched_getcpu()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pin_to_each_allowed_cpu_in_a_thread() {
        let cpus = allowed_cpus();
        std::thread::spawn(move || {
            for &cpu in &cpus {
                pin_current_thread(cpu).unwrap();
                assert_eq!(allowed_cpus(), vec![cpu]);
                assert_eq!(available_cpus(), 1);
            }
        })
        .join()
        .unwrap();
    }

    #[test]
    fn pin_out_of_range_fails() {
        assert!(matches!(
            pin_current_thread(CpuSet::MAX_CPU),
            Err(Error::InvalidCpu { .. })
        ));
    }
}
