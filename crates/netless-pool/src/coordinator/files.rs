//! The domain's entries in the socket directory: its socket, the lock file its coordinator
//! holds, and the members file its members hold their liveness tokens in, all reached
//! through the checked directory (`netless_shm::SocketDir`). This module names, opens and
//! checks them; it never decides who holds which lock.
//!
//! Both files are the directory owner's alone (mode 0600): whoever can open one can hold its
//! locks, and a lock held by a process outside the domain would keep the domain from being
//! founded or taken over, or make dead members look alive. Only processes that can write the
//! directory (its owner, root) found or take over a domain, and they open the files
//! themselves; every member gets an open file of its own of the members file from the
//! coordinator, after the ACL admitted it (`admit`).

use std::fs::File;
use std::io::ErrorKind;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;

use netless_shm::{Acl, SocketDir};
use rustix::fs::{AtFlags, FileType, FlockOperation, Mode};

use crate::{DomainConfig, PoolError};

/// The files of domain `name` in the socket directory (the names of its entries).
pub(super) struct Paths {
    pub(super) dir: SocketDir,
    /// The domain's name, for messages.
    name: String,
    pub(super) socket: String,
    lock: String,
    members: String,
}

impl Paths {
    /// The socket's path, for messages.
    pub(super) fn socket_path(&self) -> PathBuf {
        self.dir.path().join(&self.socket)
    }

    /// The lock file's path, for messages.
    pub(super) fn lock_path(&self) -> PathBuf {
        self.dir.path().join(&self.lock)
    }

    /// Opens (creating) the domain's lock file, which its coordinator holds; `None` if this
    /// process may not (see [`Paths::open_members`]).
    pub(super) fn open_lock(&self) -> Result<Option<File>, PoolError> {
        self.open(&self.lock)
    }

    /// Opens (creating) the domain's members file, a new open file of it: a liveness token
    /// held on it is this open file's alone. `None` if this process may not: it runs as
    /// another uid than the directory's owner, and receives its members file from the
    /// coordinator instead.
    ///
    /// # Errors
    /// [`PoolError::Join`] if the file is not a regular file of mode 0600 (an older netless,
    /// or someone, made it readable by others: they may hold its locks already).
    pub(super) fn open_members(&self) -> Result<Option<File>, PoolError> {
        self.open(&self.members)
    }

    fn open(&self, name: &str) -> Result<Option<File>, PoolError> {
        let file = match self.dir.open_lock_file(name, 0o600) {
            Ok(file) => file,
            Err(netless_shm::Error::Io { source, .. })
                if source.kind() == ErrorKind::PermissionDenied =>
            {
                return Ok(None)
            }
            Err(e) => return Err(e.into()),
        };
        let refuse = |why: String| PoolError::Join {
            name: self.name.clone(),
            reason: format!("{}: {why}", self.dir.path().join(name).display()),
        };
        let st = rustix::fs::fstat(&file).map_err(|e| refuse(format!("fstat: {e}")))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(refuse("not a regular file: remove it".into()));
        }
        let mode = st.st_mode & 0o7777;
        if mode & 0o077 != 0 {
            return Err(refuse(format!(
                "other users may open it (mode {mode:04o}), and any of them could hold its locks \
                 and jam the domain: remove it while no member of the domain runs"
            )));
        }
        // Root founding or taking over in another user's directory leaves the files to that
        // user, whose processes may then take over in turn.
        let owner = self.dir.owner();
        if st.st_uid == 0 && owner != 0 && rustix::process::geteuid().is_root() {
            std::os::unix::fs::fchown(&file, Some(owner), None)
                .map_err(|e| refuse(format!("chown to uid {owner}: {e}")))?;
        }
        Ok(Some(file))
    }

    /// Binds the domain's socket, replacing a dead coordinator's: the caller holds the
    /// domain's lock. An ACL that admits other users gets a socket they can connect to.
    pub(super) fn bind(&self, acl: &Acl) -> Result<UnixListener, String> {
        let socket = self.socket_path();
        self.dir
            .remove(&self.socket)
            .map_err(|e| format!("removing {}: {e}", socket.display()))?;
        let listener = self
            .dir
            .bind(&self.socket)
            .map_err(|e| format!("bind {}: {e}", socket.display()))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| format!("set_nonblocking: {e}"))?;
        // The ACL, checked on every connection, is what keeps everyone else out.
        let me = rustix::process::geteuid().as_raw();
        if acl.uids().iter().any(|&u| u != me) || !acl.gids().is_empty() {
            rustix::fs::chmodat(
                &self.dir,
                self.socket.as_str(),
                Mode::from_raw_mode(0o666),
                AtFlags::empty(),
            )
            .map_err(|e| format!("chmod {}: {e}", socket.display()))?;
        }
        Ok(listener)
    }
}

pub(super) fn paths(config: &DomainConfig) -> Result<Paths, PoolError> {
    // A directory of a uid the ACL admits is as trusted as that uid's coordinator.
    let dir = SocketDir::resolve(config.dir.as_deref(), config.acl.uids())?;
    let stem = format!("netless-domain.{}", config.name);
    // Validates the name, and that the socket's path fits in a socket address.
    netless_shm::service_socket_path(dir.path(), &stem)?;
    Ok(Paths {
        name: config.name.clone(),
        socket: format!("{stem}.sock"),
        lock: format!("{stem}.lock"),
        members: format!("{stem}.members"),
        dir,
    })
}

pub(super) fn try_flock(file: &File, op: FlockOperation) -> bool {
    rustix::fs::flock(file, op).is_ok()
}
