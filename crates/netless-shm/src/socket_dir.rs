//! Where service sockets live: the socket directory, opened once and checked, and the names
//! of services' sockets in it.
//!
//! This module owns choosing the directory, creating it (mode 0700) and deciding whether it
//! can be trusted. [`SocketDir`] opens it without following a symbolic link at its last
//! component (`O_NOFOLLOW | O_DIRECTORY`) and checks what it opened (`fstat`): a directory,
//! owned by us, by root, or by a uid the caller names (the server it expects), that no one
//! else may write (no group or other write bit). Every entry netless then binds, connects
//! to, locks or removes is reached through that open directory (`/proc/self/fd/N/NAME`
//! where such a path fits in a socket address), so a directory renamed or swapped after the
//! check cannot redirect it. It never decides who may connect (`peercred`) or which server
//! holds a name (`socket_claim`).

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

use crate::Error;

/// Longest accepted service name, in bytes.
pub const MAX_SERVICE_NAME: usize = 100;

/// `sizeof(sockaddr_un.sun_path)` minus the terminating NUL.
const MAX_SOCKET_PATH: usize = 107;

/// The socket directory, opened and checked: sockets, lock files and listings are reached
/// through the open directory, never by looking its path up again.
///
/// Who may own it: this process's effective uid; root (uid 0), which can read and write
/// every process's memory anyway, so a directory it owns adds no one to trust; and the uids
/// the caller trusts as servers (a client's expected server uid, a domain's ACL). Whoever
/// owns it, no one else may write it: a group or other write bit (a sticky one included)
/// would let another user take a service's name or replace its socket.
///
/// ```
/// use netless_shm::SocketDir;
///
/// let path = std::env::temp_dir().join(format!("netless-doc-dir-{}", std::process::id()));
/// let dir = SocketDir::resolve(Some(&path), &[])?; // created, mode 0700
/// assert_eq!(dir.owner(), rustix::process::geteuid().as_raw());
/// assert_eq!(dir.path(), path);
/// # std::fs::remove_dir(&path).ok();
/// # Ok::<(), netless_shm::Error>(())
/// ```
#[derive(Debug)]
pub struct SocketDir {
    fd: OwnedFd,
    path: PathBuf,
    owner: u32,
    /// Whether `/proc/self/fd/N` leads to the open directory (procfs is mounted), so that
    /// entries are reached through it rather than through `path`.
    via_proc: bool,
}

impl SocketDir {
    /// The directory `dir` names, or if `None` the default one, created (mode 0700, parents
    /// included) if missing, then opened and checked as [`SocketDir::open`] does.
    ///
    /// The default is, in order: `$NETLESS_DIR` if set; `$XDG_RUNTIME_DIR/netless` if
    /// `XDG_RUNTIME_DIR` names an existing directory; otherwise `/tmp/netless-<euid>`.
    ///
    /// # Errors
    /// As [`SocketDir::open`]; [`Error::Io`] if it cannot be created.
    pub fn resolve(dir: Option<&Path>, trusted: &[u32]) -> Result<SocketDir, Error> {
        let path = match dir {
            Some(d) => d.to_path_buf(),
            None => default_path(),
        };
        // `recursive` succeeds on an existing directory, and on a symbolic link to one: the
        // open below refuses the link. Something else in the way is the open's to name.
        let created = std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&path);
        if let Err(source) = created {
            if std::fs::symlink_metadata(&path).is_err() {
                return Err(Error::Io {
                    op: "creating the netless socket directory",
                    source,
                });
            }
        }
        SocketDir::open(&path, trusted)
    }

    /// Opens the existing directory `path` and checks it: not a symbolic link (at its last
    /// component), a directory, owned by this process's effective uid, by root or by one of
    /// `trusted`, and not writable by its group or others.
    ///
    /// # Errors
    /// [`Error::SocketDir`] naming what is wrong and what to do; [`Error::Io`] if it cannot
    /// be opened.
    pub fn open(path: &Path, trusted: &[u32]) -> Result<SocketDir, Error> {
        let refuse = |reason: String| Error::SocketDir {
            path: path.to_owned(),
            reason,
        };
        let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = match rustix::fs::open(path, flags, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => {
                return Err(refuse(
                    "it does not exist: create it (mode 0700) or set NETLESS_DIR".to_owned(),
                ))
            }
            Err(Errno::NOTDIR | Errno::LOOP) => return Err(refuse(not_a_directory(path))),
            Err(e) => {
                return Err(Error::Io {
                    op: "open of the netless socket directory",
                    source: e.into(),
                })
            }
        };
        let st = rustix::fs::fstat(&fd).map_err(Error::os("fstat of the socket directory"))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
            return Err(refuse(not_a_directory(path)));
        }
        let euid = rustix::process::geteuid().as_raw();
        let owner = st.st_uid;
        if owner != euid && owner != 0 && !trusted.contains(&owner) {
            let expected = match trusted {
                [] => String::new(),
                [uid] => format!(" nor the expected server's (uid {uid})"),
                uids => format!(" nor an expected server's (uids {uids:?})"),
            };
            return Err(refuse(format!(
                "it is owned by uid {owner}, which is neither ours (uid {euid}) nor root's{expected}: \
                 another user may be intercepting connections; remove it, or set NETLESS_DIR \
                 to a directory of ours"
            )));
        }
        let mode = st.st_mode & 0o7777;
        if mode & 0o022 != 0 {
            return Err(refuse(format!(
                "users other than its owner may write it (mode {mode:04o}): any of them could \
                 take a service's name or replace its socket; `chmod go-w` it, or set \
                 NETLESS_DIR to a directory only its owner writes"
            )));
        }
        let via_proc = rustix::fs::stat(format!("/proc/self/fd/{}", fd.as_raw_fd()))
            .is_ok_and(|p| (p.st_dev, p.st_ino) == (st.st_dev, st.st_ino));
        Ok(SocketDir {
            fd,
            path: path.to_owned(),
            owner,
            via_proc,
        })
    }

    /// The directory's path, as it was named (for messages and for users: entries are
    /// reached through the open directory, not through this path).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory's owner: the uid a client expects its servers to run as, unless told
    /// otherwise.
    pub fn owner(&self) -> u32 {
        self.owner
    }

    /// A second handle on the same open directory.
    ///
    /// # Errors
    /// [`Error::Io`] if the descriptor cannot be duplicated.
    pub fn try_clone(&self) -> Result<SocketDir, Error> {
        let fd = self.fd.try_clone().map_err(|source| Error::Io {
            op: "dup of the socket directory",
            source,
        })?;
        let via_proc = self.via_proc;
        Ok(SocketDir {
            fd,
            path: self.path.clone(),
            owner: self.owner,
            via_proc,
        })
    }

    /// Connects to the socket `name` in the directory.
    ///
    /// # Errors
    /// The `connect` error ([`nobody_listens`] tells a missing or stale socket).
    pub fn connect(&self, name: &str) -> std::io::Result<UnixStream> {
        UnixStream::connect(self.reach(name)?)
    }

    /// Binds a listening socket `name` in the directory (it must not exist). The caller
    /// must own the name: hold its lock ([`SocketClaim`](crate::SocketClaim) does both).
    ///
    /// # Errors
    /// The `bind` error.
    pub fn bind(&self, name: &str) -> std::io::Result<UnixListener> {
        UnixListener::bind(self.reach(name)?)
    }

    /// Removes the entry `name` (not a directory); `Ok(false)` if there was none.
    ///
    /// # Errors
    /// The `unlinkat` error.
    pub fn remove(&self, name: &str) -> std::io::Result<bool> {
        match rustix::fs::unlinkat(&self.fd, entry(name)?, AtFlags::empty()) {
            Ok(()) => Ok(true),
            Err(Errno::NOENT) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Opens (creating it with `mode` if missing) the lock file `name`, read-only, which is
    /// all `flock` and a shared byte lock need. A symbolic link there is refused.
    ///
    /// # Errors
    /// [`Error::Io`] if it cannot be opened or created.
    pub fn open_lock_file(&self, name: &str, mode: u32) -> Result<File, Error> {
        let flags = OFlags::RDONLY | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let name = entry(name).map_err(|source| Error::Io {
            op: "naming a lock file",
            source,
        })?;
        rustix::fs::openat(&self.fd, name, flags, Mode::from_raw_mode(mode))
            .map(File::from)
            .map_err(Error::os("open of a lock file in the socket directory"))
    }

    /// The names of the directory's entries that are sockets.
    ///
    /// # Errors
    /// [`Error::Io`] if it cannot be listed.
    pub fn sockets(&self) -> Result<Vec<String>, Error> {
        let listing = rustix::fs::openat(
            &self.fd,
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(Error::os("open of the socket directory for listing"))?;
        let dir =
            rustix::fs::Dir::new(listing).map_err(Error::os("listing the socket directory"))?;
        let mut names = Vec::new();
        for entry in dir {
            let entry = entry.map_err(Error::os("listing the socket directory"))?;
            if entry.file_type() != FileType::Socket && entry.file_type() != FileType::Unknown {
                continue;
            }
            if let Ok(name) = entry.file_name().to_str() {
                let is_socket = || {
                    rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW)
                        .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Socket)
                };
                if entry.file_type() == FileType::Socket || is_socket() {
                    names.push(name.to_owned());
                }
            }
        }
        names.sort();
        Ok(names)
    }

    /// The identity (device, inode) of entry `name`, not following a symbolic link.
    pub(crate) fn entry_id(&self, name: &str) -> Option<(u64, u64)> {
        let st = rustix::fs::statat(&self.fd, entry(name).ok()?, AtFlags::SYMLINK_NOFOLLOW).ok()?;
        Some((st.st_dev, st.st_ino))
    }

    /// The path `bind` and `connect` use for entry `name`: through the open directory when
    /// that fits in a socket address, else (a long name) the directory's own path, whose
    /// length `service_socket_path` checked.
    fn reach(&self, name: &str) -> std::io::Result<PathBuf> {
        let name = entry(name)?;
        if self.via_proc {
            let through = format!("/proc/self/fd/{}/{name}", self.fd.as_raw_fd());
            if through.len() <= MAX_SOCKET_PATH {
                return Ok(through.into());
            }
        }
        Ok(self.path.join(name))
    }
}

impl AsFd for SocketDir {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// `name` if it is a single, ordinary directory entry (no `/`, not `.` or `..`).
fn entry(name: &str) -> std::io::Result<&str> {
    if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\0']) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{name:?} is not a plain file name"),
        ));
    }
    Ok(name)
}

/// Why `path`, which is no directory we can open without following a link, is refused.
fn not_a_directory(path: &Path) -> String {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_symlink() => "it is a symbolic link, and netless \
             follows none there (whoever can change the link could redirect every \
             connection): name the directory itself, after checking who owns it"
            .to_owned(),
        Ok(meta) if meta.file_type().is_socket() => {
            "it is a socket, not a directory: set NETLESS_DIR to the directory holding it"
                .to_owned()
        }
        _ => "it exists but is not a directory; remove it or set NETLESS_DIR".to_owned(),
    }
}

/// The default directory's path (see [`SocketDir::resolve`]).
fn default_path() -> PathBuf {
    if let Some(dir) = std::env::var_os("NETLESS_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    if let Some(runtime) = std::env::var_os("XDG_RUNTIME_DIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .filter(|d| d.is_dir())
    {
        return runtime.join("netless");
    }
    let euid = rustix::process::geteuid().as_raw();
    PathBuf::from(format!("/tmp/netless-{euid}"))
}

/// Returns the directory holding service sockets, creating it if needed and checking it as
/// [`SocketDir::resolve`] does (with no other uid trusted).
///
/// # Errors
/// [`Error::SocketDir`] if it is not a directory, is a symbolic link, is owned by another
/// user or others may write it; [`Error::Io`] if it cannot be created or opened.
///
/// ```
/// let dir = netless_shm::socket_dir()?;
/// assert!(dir.is_dir());
/// # Ok::<(), netless_shm::Error>(())
/// ```
pub fn socket_dir() -> Result<PathBuf, Error> {
    Ok(SocketDir::resolve(None, &[])?.path)
}

/// Returns `dir/<service>.sock` after validating `service`.
///
/// A valid name has 1 to [`MAX_SERVICE_NAME`] characters from `A-Z a-z 0-9 . _ -` and does
/// not start with `.`, so it can never escape `dir` or hide.
///
/// # Errors
/// [`Error::InvalidName`] for a bad name; [`Error::SocketPathTooLong`] if the result does
/// not fit in a Unix socket address (107 bytes).
///
/// ```
/// use std::path::Path;
///
/// let path = netless_shm::service_socket_path(Path::new("/run/user/1000/netless"), "pkg.Echo")?;
/// assert_eq!(path, Path::new("/run/user/1000/netless/pkg.Echo.sock"));
/// assert!(netless_shm::service_socket_path(Path::new("/tmp"), "../etc").is_err());
/// # Ok::<(), netless_shm::Error>(())
/// ```
pub fn service_socket_path(dir: &Path, service: &str) -> Result<PathBuf, Error> {
    let invalid = |reason| Error::InvalidName {
        name: service.to_owned(),
        reason,
    };
    if service.is_empty() {
        return Err(invalid("it is empty"));
    }
    if service.len() > MAX_SERVICE_NAME {
        return Err(invalid("it is longer than 100 characters"));
    }
    if service.starts_with('.') {
        return Err(invalid("it starts with '.'"));
    }
    if !service
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err(invalid(
            "it contains a character other than A-Z a-z 0-9 . _ -",
        ));
    }
    let path = dir.join(format!("{service}.sock"));
    let len = path.as_os_str().len();
    if len > MAX_SOCKET_PATH {
        return Err(Error::SocketPathTooLong { path, len });
    }
    Ok(path)
}

/// Whether a failed `connect` to a Unix socket path means nobody serves it (no socket file,
/// or a stale one whose listener is gone), as opposed to a real error.
///
/// ```
/// let err = std::os::unix::net::UnixStream::connect("/nonexistent/netless.sock").unwrap_err();
/// assert!(netless_shm::nobody_listens(&err));
/// ```
pub fn nobody_listens(err: &std::io::Error) -> bool {
    matches!(
        err.kind(),
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_names() {
        let dir = Path::new("/d");
        assert_eq!(
            service_socket_path(dir, "a-b_c.D9").unwrap(),
            Path::new("/d/a-b_c.D9.sock")
        );
        // "/" + 100 + ".sock" = 106 bytes: fits in sun_path.
        assert!(service_socket_path(Path::new("/"), &"x".repeat(100)).is_ok());
        for bad in [
            "",
            ".hidden",
            "a/b",
            "..",
            "a b",
            "é",
            "a\0b",
            &"x".repeat(101),
        ] {
            assert!(
                matches!(
                    service_socket_path(dir, bad),
                    Err(Error::InvalidName { .. })
                ),
                "{bad:?} accepted"
            );
        }
        let long_dir = PathBuf::from(format!("/{}", "d".repeat(90)));
        assert!(matches!(
            service_socket_path(&long_dir, "sixteen-chars-xx"),
            Err(Error::SocketPathTooLong { .. })
        ));
    }

    #[test]
    fn entries_are_plain_names() {
        for bad in ["", ".", "..", "a/b", "/abs", "a\0"] {
            assert!(entry(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(entry("x.sock").unwrap(), "x.sock");
    }
}
