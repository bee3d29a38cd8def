//! The domain's entries in the socket directory: its socket, the lock file its coordinator
//! holds, and the members file its members hold their liveness tokens in, all reached
//! through the checked directory (`netless_shm::SocketDir`). This module names and opens
//! them; it never decides who holds which lock.

use std::fs::File;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;

use netless_shm::SocketDir;
use rustix::fs::FlockOperation;

use crate::{DomainConfig, PoolError};

/// The files of domain `name` in the socket directory (the names of its entries).
pub(super) struct Paths {
    pub(super) dir: SocketDir,
    pub(super) socket: String,
    pub(super) lock: String,
    pub(super) members: String,
}

impl Paths {
    /// The socket's path, for messages.
    pub(super) fn socket_path(&self) -> PathBuf {
        self.dir.path().join(&self.socket)
    }

    /// Opens (creating) one of the domain's lock files. Readable by others: members of
    /// other uids the ACL admits lock them too.
    pub(super) fn open(&self, name: &str) -> Result<File, PoolError> {
        Ok(self.dir.open_lock_file(name, 0o644)?)
    }
}

pub(super) fn paths(config: &DomainConfig) -> Result<Paths, PoolError> {
    // A directory of a uid the ACL admits is as trusted as that uid's coordinator.
    let dir = SocketDir::resolve(config.dir.as_deref(), config.acl.uids())?;
    let stem = format!("netless-domain.{}", config.name);
    // Validates the name, and that the socket's path fits in a socket address.
    netless_shm::service_socket_path(dir.path(), &stem)?;
    Ok(Paths {
        socket: format!("{stem}.sock"),
        lock: format!("{stem}.lock"),
        members: format!("{stem}.members"),
        dir,
    })
}

pub(super) fn try_flock(file: &File, op: FlockOperation) -> bool {
    rustix::fs::flock(file, op).is_ok()
}

pub(super) fn bind(paths: &Paths) -> Result<UnixListener, String> {
    // We hold the domain's lock: any socket file there is a dead coordinator's.
    let socket = paths.socket_path();
    paths
        .dir
        .remove(&paths.socket)
        .map_err(|e| format!("removing {}: {e}", socket.display()))?;
    let listener = paths
        .dir
        .bind(&paths.socket)
        .map_err(|e| format!("bind {}: {e}", socket.display()))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("set_nonblocking: {e}"))?;
    Ok(listener)
}
