//! A peer in a pid namespace of its own, as a container runs it: pid 1 of a new pid
//! namespace, with its own `/proc`; or in a container of its own, which also has its own
//! mounts, IPC and network and shares one directory with the host through a bind mount. It
//! never decides what the peer runs or what a test asserts.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::Path;
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
            become_pid_one()?;
            // Pid 1 of the new namespace: its own /proc, without touching the host's mounts.
            let none = std::ptr::null();
            let flags = libc::MS_REC | libc::MS_PRIVATE;
            if libc::mount(none, c"/".as_ptr(), none, flags, none.cast()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            mount_proc()
        })
    }
}

/// Makes `cmd`'s process pid 1 of a container of its own, as a container runtime starts one:
/// new pid, mount, IPC and network namespaces, its own `/proc`, a private tmpfs on `/tmp`
/// (the host's `/tmp` is out of sight), and the host directory `shared` bind-mounted at
/// `/tmp/NAME` (`inside` is `NAME`: one path component, made mode 0700). Everything else of
/// the file system is the host's, read through a private copy of its mounts; a program
/// under `/tmp` (a checkout there) is bind-mounted back at its path. The process
/// tree is as for [`in_new_pid_namespace`]: spawn with `process_group(0)` and kill the group.
/// Needs root (`CAP_SYS_ADMIN`): `spawn` fails with the reason otherwise.
///
/// # Errors
/// If `inside` is not one plain path component, or a path holds a NUL; `spawn` fails if the
/// container cannot be made, with the reason.
pub fn in_container<'c>(
    cmd: &'c mut Command,
    shared: &Path,
    inside: &str,
) -> std::io::Result<&'c mut Command> {
    let invalid = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidInput, what);
    if inside.is_empty() || inside.contains('/') || inside == "." || inside == ".." {
        return Err(invalid(
            "the path inside the container must be one component",
        ));
    }
    let shared = CString::new(shared.as_os_str().as_bytes())?;
    let target = CString::new(format!("/tmp/{inside}"))?;
    let program = Program::under_tmp(cmd.get_program())?;
    // SAFETY: the closure runs in the forked child before `exec` and makes only system calls
    // that are safe there (no allocation, no locks): unshare, fork, close_range, waitpid,
    // _exit, open, mkdir and mount, with strings made before the fork or on the stack.
    unsafe {
        cmd.pre_exec(move || {
            let flags = libc::CLONE_NEWPID | libc::CLONE_NEWNS | libc::CLONE_NEWIPC;
            if libc::unshare(flags | libc::CLONE_NEWNET) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            become_pid_one()?;
            let none = std::ptr::null();
            let flags = libc::MS_REC | libc::MS_PRIVATE;
            if libc::mount(none, c"/".as_ptr(), none, flags, none.cast()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Opened before /tmp is covered, and in the new mount namespace (a bind mount
            // takes its source from the caller's own mounts): the bind mount reaches the
            // directory through its descriptor.
            let flags = libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC;
            let dir = libc::open(shared.as_ptr(), flags);
            if dir < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let source = fd_path(dir);
            // The program itself, if /tmp is about to hide it: opened now, put back below.
            let exe = match &program {
                Some(program) => {
                    let fd = libc::open(program.path.as_ptr(), libc::O_PATH | libc::O_CLOEXEC);
                    if fd < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Some(fd_path(fd))
                }
                None => None,
            };
            let tmpfs = c"tmpfs".as_ptr();
            let flags = libc::MS_NOSUID | libc::MS_NODEV;
            let data = c"mode=1777".as_ptr().cast();
            if libc::mount(tmpfs, c"/tmp".as_ptr(), tmpfs, flags, data) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::mkdir(target.as_ptr(), 0o700) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if let (Some(program), Some(exe)) = (&program, &exe) {
                program.put_back(exe)?;
            }
            // Through the host's /proc, still mounted: the descriptor names the host's
            // directory, which /tmp now covers.
            let source = source.as_ptr().cast();
            if libc::mount(source, target.as_ptr(), none, libc::MS_BIND, none.cast()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            mount_proc()
        })
    };
    Ok(cmd)
}

/// A program under `/tmp`, which a container's private `/tmp` would hide: its path, and the
/// directories from `/tmp` down to it, made before the fork so that the child allocates
/// nothing.
struct Program {
    path: CString,
    dirs: Vec<CString>,
}

impl Program {
    /// `None` if `program` is not an absolute path under `/tmp` (a bare name is looked up in
    /// `PATH`, which a private `/tmp` does not hide).
    fn under_tmp(program: &std::ffi::OsStr) -> std::io::Result<Option<Program>> {
        let path = Path::new(program);
        if !path.starts_with("/tmp") || path == Path::new("/tmp") {
            return Ok(None);
        }
        let mut dirs = Vec::new();
        let mut dir = path.parent();
        while let Some(d) = dir.filter(|d| *d != Path::new("/tmp")) {
            dirs.push(CString::new(d.as_os_str().as_bytes())?);
            dir = d.parent();
        }
        dirs.reverse();
        Ok(Some(Program {
            path: CString::new(path.as_os_str().as_bytes())?,
            dirs,
        }))
    }

    /// In the child, once the private `/tmp` is mounted: makes the program's directories
    /// and an empty file at its path, and bind-mounts the program (`exe`: the
    /// `/proc/self/fd/N` of the descriptor opened before) onto it. Only system calls.
    fn put_back(&self, exe: &[u8; 32]) -> std::io::Result<()> {
        // SAFETY: mkdir, open, close and mount on NUL-terminated strings made before the fork.
        unsafe {
            for dir in &self.dirs {
                if libc::mkdir(dir.as_ptr(), 0o755) != 0
                    && *libc::__errno_location() != libc::EEXIST
                {
                    return Err(std::io::Error::last_os_error());
                }
            }
            let flags = libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC;
            let file = libc::open(self.path.as_ptr(), flags, 0o700);
            if file < 0 {
                return Err(std::io::Error::last_os_error());
            }
            libc::close(file);
            let none = std::ptr::null();
            let source = exe.as_ptr().cast();
            if libc::mount(source, self.path.as_ptr(), none, libc::MS_BIND, none.cast()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

/// `/proc/self/fd/FD` as a NUL-terminated string, made without allocating.
fn fd_path(fd: libc::c_int) -> [u8; 32] {
    let mut out = [0u8; 32];
    let prefix = b"/proc/self/fd/";
    out[..prefix.len()].copy_from_slice(prefix);
    let mut digits = [0u8; 10];
    let (mut n, mut len) = (fd.unsigned_abs(), 0);
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for (i, d) in digits[..len].iter().rev().enumerate() {
        out[prefix.len() + i] = *d;
    }
    out
}

/// In the forked child, after `unshare(CLONE_NEWPID)`: forks pid 1 of the new namespace and
/// returns in it; the parent waits for it and exits with its status. Only system calls.
fn become_pid_one() -> std::io::Result<()> {
    // SAFETY: fork, close_range, waitpid and _exit, in a single-threaded child before exec.
    unsafe {
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
    }
    Ok(())
}

/// Mounts a `/proc` of the caller's pid namespace on `/proc`. Only system calls.
fn mount_proc() -> std::io::Result<()> {
    let proc = c"proc".as_ptr();
    let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    // SAFETY: mount with static strings and no data.
    if unsafe { libc::mount(proc, c"/proc".as_ptr(), proc, flags, std::ptr::null()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// This process's pid namespace: the inode of `/proc/self/ns/pid` (0 without `/proc`).
pub fn pid_namespace() -> u64 {
    rustix::fs::stat("/proc/self/ns/pid").map_or(0, |st| st.st_ino)
}
