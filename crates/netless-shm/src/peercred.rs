//! Peer credentials (`SO_PEERCRED`) and the access-control list checked against them.
//!
//! This module owns who may connect: it reads the kernel-attested pid/uid/gid of the process
//! at the other end of a Unix socket and decides whether an [`Acl`] admits it. It never
//! closes or answers the socket: the RPC layer acts on the decision.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;

use rustix::process::geteuid;

use crate::Error;

/// Credentials of the process at the other end of a Unix socket, as the kernel recorded
/// them when the connection was made (`SO_PEERCRED`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PeerCred {
    /// Process id of the peer (in our pid namespace; 0 if it is not visible there).
    pub pid: i32,
    /// Effective user id of the peer.
    pub uid: u32,
    /// Effective group id of the peer.
    pub gid: u32,
}

/// Reads the peer's credentials with `SO_PEERCRED`.
///
/// A peer whose pid does not exist in our pid namespace (it lives in an ancestor or
/// unrelated one) is reported with pid 0; its uid and gid are still the kernel's.
///
/// # Errors
/// [`Error::Io`] if the socket is not a connected Unix socket.
///
/// ```
/// use std::os::unix::net::UnixStream;
///
/// let (a, _b) = UnixStream::pair().expect("socketpair");
/// let cred = netless_shm::peer_cred(&a)?;
/// assert_eq!(cred.pid, std::process::id() as i32);
/// # Ok::<(), netless_shm::Error>(())
/// ```
pub fn peer_cred(sock: &UnixStream) -> Result<PeerCred, Error> {
    // Not rustix's `socket_peercred`: its pid type cannot be 0, so it fails for a peer
    // outside our pid namespace, whose uid we still need.
    let mut ucred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: the descriptor is open (borrowed from `sock`) and `ucred`/`len` are live,
    // writable and sized as SO_PEERCRED requires; the kernel writes at most `len` bytes.
    let r = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut ucred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(Error::Io {
            op: "getsockopt(SO_PEERCRED)",
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(PeerCred {
        pid: ucred.pid,
        uid: ucred.uid,
        gid: ucred.gid,
    })
}

/// Which peers may connect: a list of uids and gids; a peer is allowed if its uid or its gid
/// is listed.
///
/// Root (uid 0) gets no implicit pass: it is allowed only if listed (or if it is the same
/// user, for [`Acl::same_user`] in a root process).
///
/// ```
/// use netless_shm::{Acl, PeerCred};
///
/// let acl = Acl::new().allow_uid(1000).allow_gid(100);
/// assert!(acl.allows(&PeerCred { pid: 1, uid: 1000, gid: 5 }));
/// assert!(acl.allows(&PeerCred { pid: 1, uid: 7, gid: 100 }));
/// assert!(!acl.allows(&PeerCred { pid: 1, uid: 0, gid: 0 }));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acl {
    uids: Vec<u32>,
    gids: Vec<u32>,
}

impl Acl {
    /// An ACL that allows nobody; add entries with [`allow_uid`](Self::allow_uid) and
    /// [`allow_gid`](Self::allow_gid).
    pub fn new() -> Acl {
        Acl {
            uids: Vec::new(),
            gids: Vec::new(),
        }
    }

    /// An ACL that allows only the current effective uid. This is the default.
    ///
    /// ```
    /// let acl = netless_shm::Acl::same_user();
    /// assert_eq!(acl, netless_shm::Acl::default());
    /// ```
    pub fn same_user() -> Acl {
        Acl::new().allow_uid(geteuid().as_raw())
    }

    /// Also allows peers whose effective uid is `uid`.
    pub fn allow_uid(mut self, uid: u32) -> Acl {
        if !self.uids.contains(&uid) {
            self.uids.push(uid);
        }
        self
    }

    /// Also allows peers whose effective gid is `gid`.
    pub fn allow_gid(mut self, gid: u32) -> Acl {
        if !self.gids.contains(&gid) {
            self.gids.push(gid);
        }
        self
    }

    /// Whether a peer with these credentials may connect.
    pub fn allows(&self, cred: &PeerCred) -> bool {
        self.uids.contains(&cred.uid) || self.gids.contains(&cred.gid)
    }

    /// The allowed uids.
    pub fn uids(&self) -> &[u32] {
        &self.uids
    }

    /// The allowed gids.
    pub fn gids(&self) -> &[u32] {
        &self.gids
    }
}

impl Default for Acl {
    /// Same as [`Acl::same_user`].
    fn default() -> Acl {
        Acl::same_user()
    }
}
