//! Where service sockets live: the per-user socket directory and the socket path of a
//! service inside it.
//!
//! This module owns choosing, creating and securing the directory (mode 0700, owned by the
//! effective uid) and validating service names. It never binds, connects or removes sockets.

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::Error;

/// Longest accepted service name, in bytes.
pub const MAX_SERVICE_NAME: usize = 100;

/// `sizeof(sockaddr_un.sun_path)` minus the terminating NUL.
const MAX_SOCKET_PATH: usize = 107;

/// Returns the directory holding service sockets, creating and securing it if needed.
///
/// In order: `$NETLESS_DIR` if set; `$XDG_RUNTIME_DIR/netless` if `XDG_RUNTIME_DIR` names an
/// existing directory; otherwise `/tmp/netless-<euid>`. A missing directory is created with
/// mode 0700. An existing one must be a directory owned by the effective uid; group and other
/// permission bits are removed.
///
/// # Errors
/// [`Error::SocketDir`] if it is not a directory or is owned by another user;
/// [`Error::Io`] if it cannot be created or its mode fixed.
///
/// ```
/// let dir = netless_shm::socket_dir()?;
/// assert!(dir.is_dir());
/// # Ok::<(), netless_shm::Error>(())
/// ```
pub fn socket_dir() -> Result<PathBuf, Error> {
    let euid = rustix::process::geteuid().as_raw();
    let dir = if let Some(dir) = std::env::var_os("NETLESS_DIR").filter(|d| !d.is_empty()) {
        PathBuf::from(dir)
    } else if let Some(runtime) = std::env::var_os("XDG_RUNTIME_DIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .filter(|d| d.is_dir())
    {
        runtime.join("netless")
    } else {
        PathBuf::from(format!("/tmp/netless-{euid}"))
    };
    secure_dir(&dir, euid)?;
    Ok(dir)
}

fn secure_dir(dir: &Path, euid: u32) -> Result<(), Error> {
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|source| Error::Io {
                op: "creating the netless socket directory",
                source,
            })?;
    }
    // Follows symlinks on purpose: what matters is the directory sockets end up in, and the
    // ownership check below refuses one planted by another user.
    let meta = std::fs::metadata(dir).map_err(|source| Error::Io {
        op: "stat of the netless socket directory",
        source,
    })?;
    if !meta.is_dir() {
        return Err(Error::SocketDir {
            path: dir.to_owned(),
            reason: "it exists but is not a directory; remove it or set NETLESS_DIR".to_owned(),
        });
    }
    if meta.uid() != euid {
        return Err(Error::SocketDir {
            path: dir.to_owned(),
            reason: format!(
                "it is owned by uid {}, not by us (uid {euid}); another user may be \
                 intercepting connections: remove it or set NETLESS_DIR",
                meta.uid()
            ),
        });
    }
    if meta.mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(
            |source| Error::Io {
                op: "chmod 0700 of the netless socket directory",
                source,
            },
        )?;
    }
    Ok(())
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
}
