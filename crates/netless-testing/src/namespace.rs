//! A peer in a pid namespace of its own, as a container runs it: pid 1 of a new pid
//! namespace, with its own `/proc`. It never decides what the peer runs or what a test
//! asserts.

use std::os::unix::process::CommandExt as _;
use std::process::Command;

/// Makes `cmd`'s process pid 1 of a new pid namespace with its own `/proc` (in a new mount
/// namespace, so the host's mounts are untouched). The spawned process unshares and forks;
/// its child execs the command, and it waits for that child and exits with its status.
/// `Child::kill` reaches only the waiting parent: spawn with `process_group(0)` and kill the
/// group. Needs root (`CAP_SYS_ADMIN`): `spawn` fails with the reason otherwise.
pub fn in_new_pid_namespace(cmd: &mut Command) -> &mut Command {
    // SAFETY: the closure runs in the forked child before `exec` and makes only system calls
    // that are safe there (no allocation, no locks): unshare, fork, close_range, waitpid,
    // _exit and mount with static strings.
    unsafe {
        cmd.pre_exec(|| {
            if libc::unshare(libc::CLONE_NEWPID | libc::CLONE_NEWNS) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let pid = libc::fork();
            if pid < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if pid > 0 {
                // The waiting parent closes the spawner's error pipe, so `spawn` returns once
                // the namespaced child has exec'd (or reports why it could not).
                libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32);
                let mut status = 0;
                while libc::waitpid(pid, &mut status, 0) == -1
                    && *libc::__errno_location() == libc::EINTR
                {}
                libc::_exit(if libc::WIFEXITED(status) {
                    libc::WEXITSTATUS(status)
                } else {
                    1
                });
            }
            // Pid 1 of the new namespace: its own /proc, without touching the host's mounts.
            let none = std::ptr::null();
            let flags = libc::MS_REC | libc::MS_PRIVATE;
            if libc::mount(none, c"/".as_ptr(), none, flags, none.cast()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let proc = c"proc".as_ptr();
            let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
            if libc::mount(proc, c"/proc".as_ptr(), proc, flags, none.cast()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

/// This process's pid namespace: the inode of `/proc/self/ns/pid` (0 without `/proc`).
pub fn pid_namespace() -> u64 {
    rustix::fs::stat("/proc/self/ns/pid").map_or(0, |st| st.st_ino)
}
