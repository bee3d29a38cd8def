//! The sockets a process holds, read from `/proc`: for tests that assert a process reaches
//! the network only through another one (a business-logic process behind the gateway's
//! egress holds Unix sockets and nothing else).
//!
//! A socket fd's link (`/proc/PID/fd/N` → `socket:[INODE]`) names only its inode; the
//! tables of the process's network namespace (`/proc/PID/net/unix`, `tcp`, `tcp6`, ...)
//! say which family each inode is. A socket found in no table (a family not read here) is
//! [`SocketKind::Other`], which is not Unix either: the check errs on the side of failing.

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::time::Duration;

/// The family of a socket, by the table that lists it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SocketKind {
    /// `AF_UNIX`.
    Unix,
    /// TCP over IPv4.
    Tcp,
    /// TCP over IPv6.
    Tcp6,
    /// UDP over IPv4.
    Udp,
    /// UDP over IPv6.
    Udp6,
    /// Raw IP sockets, v4 or v6.
    Raw,
    /// `AF_NETLINK`.
    Netlink,
    /// `AF_PACKET`.
    Packet,
    /// Listed in none of the tables above.
    Other,
}

/// The tables read, with their family and the column of the inode.
const TABLES: [(&str, SocketKind, usize); 9] = [
    ("unix", SocketKind::Unix, 6),
    ("tcp", SocketKind::Tcp, 9),
    ("tcp6", SocketKind::Tcp6, 9),
    ("udp", SocketKind::Udp, 9),
    ("udp6", SocketKind::Udp6, 9),
    ("raw", SocketKind::Raw, 9),
    ("raw6", SocketKind::Raw, 9),
    ("netlink", SocketKind::Netlink, 9),
    ("packet", SocketKind::Packet, 8),
];

/// One socket a process holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldSocket {
    /// The fd it is held by.
    pub fd: u32,
    /// Its inode, as `/proc/PID/fd/FD` names it.
    pub inode: u64,
    /// Its family.
    pub kind: SocketKind,
    /// Its line in the table that lists it (addresses, state), trimmed; empty for
    /// [`SocketKind::Other`].
    pub entry: String,
}

impl fmt::Display for HeldSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "fd {}: {:?} socket {}", self.fd, self.kind, self.inode)?;
        if !self.entry.is_empty() {
            write!(f, " ({})", self.entry)?;
        }
        Ok(())
    }
}

/// The socket fds of process `pid`: (fd, inode).
fn socket_fds(pid: u32) -> io::Result<Vec<(u32, u64)>> {
    let mut fds = Vec::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd"))? {
        let entry = entry?;
        let Some(fd) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        // An fd closed since the listing has no link any more: it holds nothing.
        let Ok(target) = std::fs::read_link(entry.path()) else {
            continue;
        };
        let target = target.to_string_lossy();
        let inode = target
            .strip_prefix("socket:[")
            .and_then(|rest| rest.strip_suffix(']'))
            .and_then(|n| n.parse().ok());
        if let Some(inode) = inode {
            fds.push((fd, inode));
        }
    }
    Ok(fds)
}

/// Every socket inode the tables of `pid`'s network namespace list, with its family and
/// table line.
fn listed(pid: u32) -> io::Result<HashMap<u64, (SocketKind, String)>> {
    let mut all = HashMap::new();
    for (table, kind, column) in TABLES {
        let text = match std::fs::read_to_string(format!("/proc/{pid}/net/{table}")) {
            Ok(text) => text,
            // A kernel without that family (no IPv6, say) has no table for it.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        for line in text.lines().skip(1) {
            let inode = line
                .split_whitespace()
                .nth(column)
                .and_then(|n| n.parse().ok());
            if let Some(inode) = inode {
                all.insert(inode, (kind, line.trim().to_string()));
            }
        }
    }
    Ok(all)
}

/// The sockets process `pid` holds, each with its family.
///
/// ```no_run
/// let held = netless_testing::sockets::sockets_of(std::process::id())?;
/// for socket in &held {
///     println!("{socket}");
/// }
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn sockets_of(pid: u32) -> io::Result<Vec<HeldSocket>> {
    let fds = socket_fds(pid)?;
    let mut tables = listed(pid)?;
    if fds.iter().any(|(_, inode)| !tables.contains_key(inode)) {
        // Made between the two reads: the tables list it now.
        tables = listed(pid)?;
    }
    let mut held = Vec::new();
    for (fd, inode) in fds {
        let (kind, entry) = tables
            .get(&inode)
            .cloned()
            .unwrap_or((SocketKind::Other, String::new()));
        held.push(HeldSocket {
            fd,
            inode,
            kind,
            entry,
        });
    }
    Ok(held)
}

/// The sockets process `pid` holds that are not Unix-domain ones (empty if there are
/// none). One not listed at first is looked up again a moment later, so that a socket
/// closed while the tables were read does not count.
pub fn non_unix_sockets(pid: u32) -> io::Result<Vec<HeldSocket>> {
    let first: Vec<HeldSocket> = sockets_of(pid)?
        .into_iter()
        .filter(|s| s.kind != SocketKind::Unix)
        .collect();
    if first.iter().all(|s| s.kind != SocketKind::Other) {
        return Ok(first);
    }
    std::thread::sleep(Duration::from_millis(20));
    let again = sockets_of(pid)?;
    Ok(first
        .into_iter()
        .filter_map(|s| {
            // Still held by the same fd: its kind now; gone: it no longer counts.
            let now = again.iter().find(|a| a.fd == s.fd && a.inode == s.inode)?;
            (now.kind != SocketKind::Unix).then(|| now.clone())
        })
        .collect())
}

/// Panics, listing them, unless every socket process `pid` holds is a Unix-domain one;
/// returns how many sockets it holds. `what` names the process in the message.
///
/// ```no_run
/// # let client = std::process::Command::new("true").spawn().unwrap();
/// // While the client process has a call in flight through the gateway:
/// netless_testing::sockets::assert_only_unix_sockets(client.id(), "the client");
/// ```
pub fn assert_only_unix_sockets(pid: u32, what: &str) -> usize {
    let held =
        sockets_of(pid).unwrap_or_else(|e| panic!("reading the sockets of {what} ({pid}): {e}"));
    let others = non_unix_sockets(pid)
        .unwrap_or_else(|e| panic!("reading the sockets of {what} ({pid}): {e}"));
    assert!(
        others.is_empty(),
        "{what} (pid {pid}) holds sockets other than Unix ones:\n{}",
        others
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n")
    );
    held.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_and_unix_sockets_are_told_apart() {
        let pid = std::process::id();
        let (unix, _peer) = std::os::unix::net::UnixStream::pair().unwrap();
        let held = sockets_of(pid).unwrap();
        let unix_inode = {
            use std::os::unix::fs::MetadataExt as _;
            let fd = std::os::fd::AsRawFd::as_raw_fd(&unix);
            std::fs::metadata(format!("/proc/self/fd/{fd}"))
                .unwrap()
                .ino()
        };
        let found = held.iter().find(|s| s.inode == unix_inode).unwrap();
        assert_eq!(found.kind, SocketKind::Unix, "{found}");
        assert!(non_unix_sockets(pid)
            .unwrap()
            .iter()
            .all(|s| s.inode != unix_inode));

        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let tcp = non_unix_sockets(pid).unwrap();
        let listening = tcp
            .iter()
            .find(|s| s.kind == SocketKind::Tcp)
            .unwrap_or_else(|| panic!("no TCP socket among {tcp:?}"));
        // 127.0.0.1 in the table's hex, little-endian.
        assert!(listening.entry.contains("0100007F:"), "{listening}");
        let message = std::panic::catch_unwind(|| assert_only_unix_sockets(pid, "this test"))
            .unwrap_err()
            .downcast::<String>()
            .unwrap();
        assert!(message.contains("Tcp socket"), "{message}");
        drop(listener);
    }
}
