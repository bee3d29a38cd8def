//! One live server per name: a service's socket bound under an exclusive `flock` on its lock
//! file (`NAME.lock`, beside the socket `NAME`), held for as long as the server serves.
//!
//! This module owns that protocol. Binding takes the lock first, so finding out whether a
//! server lives, removing a dead server's stale socket and binding are one step that no
//! second server can interleave with: a second server finds the lock held and is refused
//! ([`Error::AlreadyServed`]), and the kernel drops the lock when its holder dies, however it
//! dies. Releasing the claim removes the socket only while the name still holds the socket
//! this claim bound, and the lock file only while it is the one this claim locked. It never
//! accepts connections or decides who may connect.

use std::fs::File;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;

use rustix::fs::{AtFlags, FlockOperation, Mode};
use rustix::io::Errno;

use crate::{Error, SocketDir};

/// How often a lock file may be found replaced between opening and locking it before
/// binding gives up (each time, a server of that name stopped in between).
const LOCK_ATTEMPTS: usize = 16;

/// A name in the socket directory held by this process: its lock, and the socket bound
/// under it. Dropping it releases the name (see the module documentation).
///
/// ```
/// use netless_shm::{SocketClaim, SocketDir, Error};
///
/// let path = std::env::temp_dir().join(format!("netless-doc-claim-{}", std::process::id()));
/// let dir = SocketDir::resolve(Some(&path), &[])?;
/// let (claim, _listener) = SocketClaim::bind(&dir, "doc.Echo.sock")?;
/// // A second server of the same name is refused while the first holds it.
/// assert!(matches!(SocketClaim::bind(&dir, "doc.Echo.sock"), Err(Error::AlreadyServed { .. })));
/// drop(claim);
/// let (_again, _listener) = SocketClaim::bind(&dir, "doc.Echo.sock")?;
/// # drop(_again); std::fs::remove_dir(&path).ok();
/// # Ok::<(), Error>(())
/// ```
#[derive(Debug)]
pub struct SocketClaim {
    dir: SocketDir,
    name: String,
    lock_name: String,
    /// The locked file: the lock lasts as long as this descriptor.
    _lock: File,
    lock_id: (u64, u64),
    socket_id: Option<(u64, u64)>,
}

impl SocketClaim {
    /// Takes the name `name` (a socket file name such as `pkg.Echo.sock`) in `dir` and binds
    /// a listening socket there, replacing a dead server's stale socket.
    ///
    /// # Errors
    /// [`Error::AlreadyServed`] if a live process holds the name; [`Error::Io`] if the lock
    /// file cannot be opened or locked, a stale socket cannot be removed, or `bind` fails.
    pub fn bind(dir: &SocketDir, name: &str) -> Result<(SocketClaim, UnixListener), Error> {
        let dir = dir.try_clone()?;
        let lock_name = format!("{name}.lock");
        let (lock, lock_id) = lock(&dir, name, &lock_name)?;
        // Holding the lock: a socket there is a dead server's (a live one would hold it).
        dir.remove(name).map_err(|source| Error::Io {
            op: "removing a dead server's socket",
            source,
        })?;
        let listener = dir.bind(name).map_err(|source| Error::Io {
            op: "bind of the service's socket",
            source,
        })?;
        let socket_id = dir.entry_id(name);
        let claim = SocketClaim {
            dir,
            name: name.to_owned(),
            lock_name,
            _lock: lock,
            lock_id,
            socket_id,
        };
        Ok((claim, listener))
    }

    /// The socket's path, as users see it.
    pub fn socket_path(&self) -> PathBuf {
        self.dir.path().join(&self.name)
    }

    /// Sets the socket's permission bits (through the open directory), for a server that
    /// admits other users: connecting needs write permission on the socket.
    ///
    /// # Errors
    /// [`Error::Io`] if `chmod` fails.
    pub fn set_socket_mode(&self, mode: u32) -> Result<(), Error> {
        rustix::fs::chmodat(
            &self.dir,
            self.name.as_str(),
            Mode::from_raw_mode(mode),
            AtFlags::empty(),
        )
        .map_err(Error::os("chmod of a service's socket"))
    }
}

/// Opens and locks `lock_name`, the lock file of `name`; returns it and its identity.
fn lock(dir: &SocketDir, name: &str, lock_name: &str) -> Result<(File, (u64, u64)), Error> {
    for _ in 0..LOCK_ATTEMPTS {
        let file = dir.open_lock_file(lock_name, 0o600)?;
        match rustix::fs::flock(&file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(Errno::WOULDBLOCK) => {
                return Err(Error::AlreadyServed {
                    path: dir.path().join(name),
                })
            }
            Err(e) => {
                return Err(Error::Io {
                    op: "flock of a service's lock file",
                    source: e.into(),
                })
            }
        }
        let st = rustix::fs::fstat(&file).map_err(Error::os("fstat of a lock file"))?;
        let id = (st.st_dev, st.st_ino);
        // A server that stopped between our open and our lock removed the file we locked:
        // only the file the name holds now counts.
        if dir.entry_id(lock_name) == Some(id) {
            return Ok((file, id));
        }
    }
    Err(Error::Io {
        op: "locking a service's name",
        source: std::io::Error::other(format!(
            "{} was replaced {LOCK_ATTEMPTS} times while we locked it: servers of that name \
             keep starting and stopping",
            dir.path().join(lock_name).display()
        )),
    })
}

impl Drop for SocketClaim {
    fn drop(&mut self) {
        // Only what is still ours: another process may have removed our socket and bound
        // its own (the lock keeps netless servers out, not everyone with write access).
        if self.socket_id.is_some() && self.dir.entry_id(&self.name) == self.socket_id {
            let _ = self.dir.remove(&self.name);
        }
        // Removed while still locked: a server that opened this file before it went finds,
        // once it has the lock, that the name holds another file or none, and starts over
        // (see `lock`). The lock itself goes with the descriptor.
        if self.dir.entry_id(&self.lock_name) == Some(self.lock_id) {
            let _ = self.dir.remove(&self.lock_name);
        }
    }
}
