//! Two "hosts" on one machine: two network namespaces joined by a veth pair, each with its own
//! loopback, address and socket directory, as two machines on one link see each other. A
//! process runs on a host by joining its network namespace before `exec`; everything else
//! (file system, pids) stays shared, which is what the tests need to start and kill peers.
//! It never decides what the hosts run or what a test asserts.
//!
//! Needs root and `ip` (iproute2): [`TwoHosts::new`] says why it cannot make them, and the
//! caller skips with that message.

use std::fs::File;
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd as _;
use std::os::unix::process::CommandExt as _;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::{Proc, TestDir};

/// One host: a network namespace with an address on the link, and a socket directory.
#[derive(Debug)]
pub struct Host {
    /// The namespace's name (`ip netns`), also its file under `/run/netns`.
    pub name: String,
    /// Its address on the link between the two hosts.
    pub addr: Ipv4Addr,
    /// Its socket directory (`NETLESS_DIR` of every process started on it).
    pub dir: TestDir,
}

impl Host {
    /// `bin` as a command that runs on this host: in its network namespace, with its socket
    /// directory, in a process group of its own, stdin closed and output piped.
    pub fn command(&self, bin: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new(bin);
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        self.enter(&mut cmd);
        cmd
    }

    /// Makes `cmd` run on this host: in its network namespace (joined before `exec`), with
    /// `NETLESS_DIR` its socket directory. Nothing else of `cmd` changes.
    ///
    /// # Panics
    /// If the namespace's file cannot be opened (the hosts were torn down).
    pub fn enter<'c>(&self, cmd: &'c mut Command) -> &'c mut Command {
        let ns = File::open(format!("/run/netns/{}", self.name))
            .unwrap_or_else(|e| panic!("opening network namespace {}: {e}", self.name));
        cmd.env("NETLESS_DIR", &self.dir.path);
        // SAFETY: the closure runs in the forked child before `exec` and makes one system
        // call (setns) on a descriptor opened before the fork, which it owns and keeps open.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            })
        }
    }

    /// Takes this host's end of the link down, as a host that loses power or its network
    /// does: its peers see nothing more from it (no reset, no FIN), and its processes live on.
    ///
    /// # Panics
    /// If `ip` fails.
    pub fn cut_link(&self) {
        ip(&["-n", &self.name, "link", "set", "eth0", "down"])
            .unwrap_or_else(|e| panic!("cutting {}'s link: {e}", self.name));
    }

    /// Starts `bin <args>` on this host.
    pub fn spawn(&self, bin: &str, args: &[&str]) -> Proc {
        let mut cmd = self.command(bin);
        cmd.args(args);
        Proc::spawn_command(cmd, &format!("[{}] {bin} {}", self.name, args.join(" ")))
    }
}

/// Two hosts, `a` (10.77.0.1) and `b` (10.77.0.2), on one veth link; torn down on drop.
#[derive(Debug)]
pub struct TwoHosts {
    pub a: Host,
    pub b: Host,
}

impl TwoHosts {
    /// Makes the two namespaces and the link between them.
    ///
    /// # Errors
    /// Why they cannot be made here (not root, no `ip`, no network namespaces): the test
    /// prints it and skips.
    pub fn new(tag: &str) -> Result<TwoHosts, String> {
        if !rustix::process::geteuid().is_root() {
            return Err("making network namespaces needs root".into());
        }
        let ip_found = Command::new("ip")
            .arg("-V")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ip_found {
            return Err("`ip` (iproute2) is not installed".into());
        }
        sweep_stale();
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let stem = format!(
            "nl{}x{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let (na, nb) = (format!("{stem}a"), format!("{stem}b"));
        // Built before the namespaces exist, so that an error below tears down what was made.
        let mut hosts = TwoHosts {
            a: Host {
                name: String::new(),
                addr: Ipv4Addr::new(10, 77, 0, 1),
                dir: TestDir::new(&format!("{tag}-a")),
            },
            b: Host {
                name: String::new(),
                addr: Ipv4Addr::new(10, 77, 0, 2),
                dir: TestDir::new(&format!("{tag}-b")),
            },
        };
        ip(&["netns", "add", &na])?;
        hosts.a.name = na.clone();
        ip(&["netns", "add", &nb])?;
        hosts.b.name = nb.clone();
        // Made inside the namespaces, so the names never meet another test's in the root one.
        ip(&[
            "link", "add", "eth0", "netns", &na, "type", "veth", "peer", "name", "eth0", "netns",
            &nb,
        ])?;
        for host in [&hosts.a, &hosts.b] {
            let addr = format!("{}/24", host.addr);
            ip(&["-n", &host.name, "addr", "add", &addr, "dev", "eth0"])?;
            ip(&["-n", &host.name, "link", "set", "eth0", "up"])?;
            ip(&["-n", &host.name, "link", "set", "lo", "up"])?;
        }
        Ok(hosts)
    }
}

impl Drop for TwoHosts {
    fn drop(&mut self) {
        // Deleting a namespace deletes its end of the link, and so the link.
        for name in [&self.a.name, &self.b.name] {
            if !name.is_empty() {
                let _ = ip(&["netns", "del", name]);
            }
        }
    }
}

/// Runs `ip <args>`; the error says what failed and what `ip` printed.
fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running `ip {}`: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Deletes the namespaces of test processes that died without tearing theirs down (their
/// names carry the pid of the process that made them).
fn sweep_stale() {
    let Ok(entries) = std::fs::read_dir("/run/netns") else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = maker_of(&name) else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = ip(&["netns", "del", &name]);
        }
    }
}

/// The pid in a namespace name [`TwoHosts::new`] makes (`nl<PID>x<N>a` or `…b`), and only in
/// one of that exact shape: no other namespace is ever swept.
fn maker_of(name: &str) -> Option<i32> {
    let rest = name.strip_prefix("nl")?;
    let rest = rest.strip_suffix('a').or_else(|| rest.strip_suffix('b'))?;
    let (pid, n) = rest.split_once('x')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(pid) || !digits(n) {
        return None;
    }
    pid.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::maker_of;

    #[test]
    fn only_names_of_the_exact_shape_are_ours() {
        assert_eq!(maker_of("nl123x0a"), Some(123));
        assert_eq!(maker_of("nl123x45b"), Some(123));
        for other in [
            "nl99999", "nl123x0", "nl123x0c", "nlx0a", "nl12ax0a", "nl1x2x3a", "xnl1x0a",
        ] {
            assert_eq!(maker_of(other), None, "{other}");
        }
    }
}
